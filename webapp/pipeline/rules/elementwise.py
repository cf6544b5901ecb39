"""The CPU rule of kernels with no reduction (elementwise, broadcast, reshape, transpose), and the
epilogue of the CPU rules' reductions, which is such a kernel's loops when it broadcasts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tvm.sym
from tvm import s_tir, tirx

from webapp.pipeline.rules.common import (
    extent,
    fuse,
    has_reduction,
    inline,
    inline_epilogue,
    is_output,
    parallel,
    simd,
    vector_width,
)

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from webapp.targets import Target


def unit_stride_axis(stmt: s_tir.SBlock, read: tirx.BufferRegion) -> int | None:
    """The block axis along which `read` steps one element of its innermost dimension (its index
    simplified within the axes' ranges: a reshape-transpose-reshape chain inlined reads
    q[0, t, h * 64 + d] through nested divisions); None when no axis does."""
    variables = [iv.var for iv in stmt.iter_vars]
    analyzer = tvm.sym.Analyzer()
    for iv in stmt.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    index = analyzer.simplify(read.region[-1].min)
    coefficients = tvm.sym.detect_linear_equation(index, variables)
    return next((i for i, c in enumerate(coefficients[:-1]) if analyzer.can_prove_equal(c, 1)), None)


def transpose_in_vectors(
    sch: s_tir.Schedule, block: SBlockRV, loops: list[LoopRV], lanes: int
) -> LoopRV | None:
    """A transpose whose output's innermost axis has no vector width (NCHW to NHWC with 3 channels:
    an image model's input; attention's keys transposed to (heads, 64, 197 tokens)): the vector loop
    is instead the axis along which the input is contiguous, read in whole vectors and written with
    a stride; the axes after it unrolled when they are few, else left inside (the 1x3x224x224 input
    took 6 us, against 95 gathering lane by lane; ViT's keys 24 us against 141). Returns the loop
    outside the vectors (for the caller to run in parallel); None, the schedule unchanged, when no
    read has such an axis."""
    stmt = sch.get(block)
    if len(loops) != len(stmt.iter_vars):
        return None
    for read in stmt.reads:
        at = unit_stride_axis(stmt, read) if read.region else None
        if at is None or at == len(loops) - 1:
            continue
        width = vector_width(extent(sch, loops[at]), lanes, minimum=4)
        inside = int(np.prod([extent(sch, loop) for loop in loops[at + 1 :]]))
        if not width:
            continue
        rest, inner = sch.split(loops[at], [None, width])
        sch.reorder(rest, *loops[at + 1 :], inner)
        if inside <= 16:
            for loop in loops[at + 1 :]:
                sch.unroll(loop)
        sch.vectorize(inner)
        return fuse(sch, [*loops[:at], rest])
    return None


def elementwise(sch: s_tir.Schedule, target: Target) -> str | None:
    """Kernels of spatial blocks only (elementwise, broadcast, reshape, transpose): each remaining
    block after inlining runs its loops fused, parallel outside and vectorized inside."""
    if has_reduction(sch):
        return None
    root, func = sch.get_sblock("root"), sch.mod["main"]
    for block in sch.get_child_blocks(root)[:-1]:
        if not is_output(func, sch.get(block).writes[0].source):
            try:
                inline(sch, block)
            except RuntimeError:
                pass  # stays its own loop nest
    for block in sch.get_child_blocks(root):
        spread(sch, block, target)
    return "default rule: elementwise"


def spread(sch: s_tir.Schedule, block: SBlockRV, target: Target) -> None:
    """A spatial block's loops fused, parallel outside (from 4,096 elements) and vectorized inside."""
    lanes, _ = simd(target)
    loops = sch.get_loops(block)
    if not loops:  # a 0-d result: one value, nothing to run in parallel or in vectors
        return
    total = int(np.prod([extent(sch, loop) for loop in loops]))
    # The vector loop is split off the innermost axis, not off all axes fused: through the
    # fused index's div/mod LLVM sees no contiguous access and gathers lane by lane.
    width = vector_width(extent(sch, loops[-1]), lanes, minimum=4)
    # no vector width in the output: vectors along the input's innermost axis, if it has one
    outer = None if width else transpose_in_vectors(sch, block, loops, lanes)
    if outer is None and width and total >= 4 * lanes:
        rest, inner = sch.split(loops[-1], [None, width])
        outer = fuse(sch, [*loops[:-1], rest])
        sch.vectorize(inner)
    elif outer is None:
        outer = fuse(sch, loops)
        if total >= 4 * lanes and total % lanes == 0:
            outer, inner = sch.split(outer, [None, lanes])
            sch.vectorize(inner)
    if total >= 4096:
        parallel(sch, outer)


def fused_epilogue(sch: s_tir.Schedule, main: SBlockRV, target: Target) -> SBlockRV | None:
    """A CPU rule's inline_epilogue, but for an epilogue that broadcasts main's result to a larger
    output (a squeeze-and-excite block's last 1x1 conv, its hard sigmoid, times the feature map):
    that one is inlined into the output block and scheduled apart, after main, as an elementwise
    kernel's loops, and None returned, as for main writing the output. In main's register tiles it
    wrote the map a vector of channels at a time, each thread across every row (PP-OCR's direction
    classifier: 0.030 ms a call, against ~0.010 as a kernel of its own)."""
    out = sch.get(sch.get_child_blocks(sch.get_sblock("root"))[-1]).writes[0].source
    grows = 0 <= size(sch.get(main).writes[0].source) < size(out)  # < 0: a symbolic shape
    epilogue = inline_epilogue(sch, main)
    if epilogue is None or not grows:
        return epilogue
    spread(sch, epilogue, target)
    return None


def size(buffer: tirx.Buffer) -> int:
    """Elements of a buffer of fixed shape (-1 for a symbolic one)."""
    dims = [int(d) if isinstance(d, tirx.IntImm) else -1 for d in buffer.shape]
    return int(np.prod(dims)) if -1 not in dims else -1
