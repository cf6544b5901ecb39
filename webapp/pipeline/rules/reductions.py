"""The CPU rules of reductions: softmax, layer norm and RMSNorm a row at a time (`rows`), and the
reductions with a window per output (depthwise and grouped convolutions, pooling, a mean) vectorized
along the output (`windowed`); other row reductions on TVM's dlight CPU rule (`reduction`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tvm import s_tir

from webapp.pipeline.rules.common import (
    extent,
    fuse,
    inline,
    is_output,
    iter_kinds,
    largest_divisor,
    loops_below,
    parallel,
    serial_kernel,
    simd,
    vector_split,
    vector_width,
)
from webapp.pipeline.rules.elementwise import fused_epilogue

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from webapp.targets import Target

WINDOW_TILE = 8  # output vectors a windowed reduction accumulates at once


def windowed(sch: s_tir.Schedule, target: Target, block: SBlockRV, kind: str) -> str | None:
    """A reduction over a small window or axis per output element (depthwise conv, pooling, mean):
    the innermost output axis is vectorized with the reduction loops outside it, accumulating in
    registers, the epilogue fused; the other output axes run in parallel."""
    stmt = sch.get(block)
    kinds = iter_kinds(stmt)
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if spatial == 0 or "S" in kinds[spatial:]:
        return None
    lanes, _ = simd(target)
    # 8-bit inputs (an int8 depthwise conv, into int32): two registers of sums a vector (and half the
    # tile of them), so that 8 channels multiply at once into int16 and widen as they add (NEON: one
    # smull, then saddw and saddw2, where 4 channels took a load, two widenings and an smlal)
    wide = 2 if all(str(r.source.dtype) in ("int8", "uint8") for r in stmt.reads) else 1
    lanes *= wide
    loops = sch.get_loops(block)
    if len(loops) != len(kinds):
        return None
    producers = sch.get_producers(block)  # padding
    epilogue = fused_epilogue(sch, block, target)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    # Parallel over the leading output axes (batch, channels), rows and columns inside.
    lead = max(1, min(2, spatial - 1))
    outer = fuse(sch, loops[:lead])
    rows = loops[lead : spatial - 1]
    split = vector_split(sch, loops[spatial - 1], lanes) if spatial > lead else None
    # One output row (a max over a sequence, Magika's: 1 x 1 x 512): its vectors in parallel instead.
    threads = split[0] if split and not rows and extent(sch, outer) == 1 else outer
    parallel(sch, threads)
    place_padding(sch, producers, outer, lanes)
    reductions = loops[spatial:]
    if split is None:
        sch.reverse_compute_at(epilogue, outer)
        return f"default rule: {kind}"
    col_o, col_v = split
    # `tile` vectors of neighbouring outputs along the next axis out (columns in NHWC, rows in NCHW)
    # accumulate at once: one accumulator waits on each FMA of its window in turn (measured here on a
    # padded 3x3 depthwise conv, 14x14x384 NHWC: 24 us with one accumulator, 21 with 7).
    tile = largest_divisor(extent(sch, rows[-1]), WINDOW_TILE // wide) if rows and reductions else 1
    tiled = []
    if tile > 1:
        rows[-1], row_i = sch.split(rows[-1], [None, tile])
        tiled = [row_i]
    sch.reorder(*rows, col_o, *reductions, *tiled, col_v)
    sch.reverse_compute_at(epilogue, col_o)
    sch.vectorize(col_v)
    init = sch.decompose_reduction(block, reductions[0])
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    tail = loops_below(sch, epilogue, col_o)
    if tiled:  # the tile's vectors unrolled: each its own register
        for loop in (row_i, init_loops[-2], tail[0]):
            sch.unroll(loop)
        tail = tail[1:]
    if tail:
        sch.vectorize(fuse(sch, tail))
    return f"default rule: {kind}"


def place_padding(sch: s_tir.Schedule, producers: list[SBlockRV], outer: LoopRV, lanes: int) -> None:
    """A windowed reduction's padded input: read where it lies where the vectorized axis (channels,
    NHWC) is not padded, each vector all inside the border or all outside (MobileNetV2's depthwise
    convs here: 0.44 ms in the model, against 0.86 padding each thread's rows first); else the rows a
    thread reads (NCHW) padded by that thread, in vectors."""
    for producer in producers:
        source, padded = sch.get(producer).reads[0].source, sch.get(producer).writes[0].source
        if str(source.shape[-1]) == str(padded.shape[-1]):
            sch.compute_inline(producer)
            continue
        sch.compute_at(producer, outer)
        split = vector_split(sch, sch.get_loops(producer)[-1], lanes)
        if split:
            sch.vectorize(split[1])


def inline_elementwise(sch: s_tir.Schedule) -> None:
    """Every block without a reduction inlined where it can be, but the output's: the rest stays its
    own block, computed per row."""
    func = sch.mod["main"]
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        if "R" not in iter_kinds(stmt) and not is_output(func, stmt.writes[0].source):
            try:
                inline(sch, block)
            except RuntimeError:
                pass


def rows(sch: s_tir.Schedule, target: Target) -> str | None:
    """Softmax, layer norm, RMSNorm: reductions along each row (the last axes) and the elementwise
    work around them (a quantized layer's rounding and clipping after a layer norm), one row at a
    time. The elementwise blocks are inlined, so nothing row-sized is kept between them (dlight's
    rule kept six, each a workspace allocated per row: ViT's layer norm with its quantization took
    1.4 ms a call); each reduction sums a vector of partial results (rfactor) instead of one scalar
    chain, the output is written in vectors; parallel over rows."""
    root = sch.get_sblock("root")
    inline_elementwise(sch)
    *inner, out = sch.get_child_blocks(root)
    reductions = [b for b in inner if "R" in iter_kinds(sch.get(b))]
    if not reductions or "R" in iter_kinds(sch.get(out)):
        return None
    if any(word in sch.get(b).name_hint for b in reductions for word in ("pool", "conv")):
        return None  # a window per output, not a row: the windowed rule's (reduction)

    # The row axes: each reduction's spatial axes (less the unit axes a keepdims mean ends with), the
    # output's leading axes of the same extents.
    def row_shape(block) -> tuple:
        shape = [int(iv.dom.extent) for iv in sch.get(block).iter_vars if iv.iter_type == 0]
        while shape and shape[-1] == 1:
            shape.pop()
        return tuple(shape)

    shapes = {row_shape(b) for b in reductions}
    loops = sch.get_loops(out)
    if len(shapes) != 1 or len(loops) != len(sch.get(out).iter_vars):
        return None
    (shape,) = shapes
    r = max(len(shape), 1)  # one row (a decoded token's layer norm): the output's first, unit, axis
    extents = [extent(sch, loop) for loop in loops]
    if r >= len(loops) or tuple(extents[: len(shape)]) != shape or np.prod(extents[:r]) != np.prod(shape):
        return None
    lanes, _ = simd(target)
    partials = []
    for block in reductions:  # a vector of partial results, summed at the end of the row
        reduce_loops = sch.get_loops(block)[iter_kinds(sch.get(block)).count("S") :]
        k = fuse(sch, reduce_loops)
        width = vector_width(extent(sch, k), lanes)
        if width:
            partials.append(sch.rfactor(sch.split(k, [None, width])[1], 0))
    inner = sch.get_child_blocks(root)[:-1]
    row = fuse(sch, loops[:r])
    split = vector_split(sch, fuse(sch, loops[r:]), lanes)
    if split:
        sch.vectorize(split[1])
    for block in reversed(inner):
        sch.compute_at(block, row, preserve_unit_loops=False)
    if int(np.prod(shape)) > 1:  # before the partial sums lose their init (parallel checks them)
        parallel(sch, row)
    for partial in partials:  # compute_at puts the partial results' axis first: it goes inside
        k_lanes, k_outer = loops_below(sch, partial, row)[-2:]
        sch.reorder(k_outer, k_lanes)
        sch.vectorize(k_lanes)
        init = sch.decompose_reduction(partial, k_outer)
        sch.vectorize(sch.get_loops(init)[-1])
    return "default rule: row reduction"


def columns(sch: s_tir.Schedule, target: Target) -> str | None:
    """Softmax and the like over an axis that is not the last (YOLOv8's box distribution: 16 bins on
    axis 1 of 1 x 16 x 4 x 2100): a vector of neighbours along the last axis at a time, the reduced
    axis a loop around each vector, so that each reduction keeps a vector of results in registers;
    parallel over the other axes. dlight's rule recomputed every reduction for each of the 16 bins
    (1.66 ms a call in NudeNet's int8 build)."""
    root = sch.get_sblock("root")
    inline_elementwise(sch)
    *inner, out = sch.get_child_blocks(root)
    reductions = [b for b in inner if "R" in iter_kinds(sch.get(b))]
    if not reductions or "R" in iter_kinds(sch.get(out)):
        return None
    loops = sch.get_loops(out)
    extents = [extent(sch, loop) for loop in loops]
    if len(loops) != len(sch.get(out).iter_vars) or len(extents) < 2:
        return None
    axis = reduced_axis(sch, reductions, extents)
    if axis is None:
        return None
    lanes, _ = simd(target)
    # the widest whole number of columns up to a vector and a quarter (20 of 2100 with 16 lanes: LLVM
    # splits it into a vector and a quarter, where the widest power of two, 4, took 0.34 ms to 0.31)
    width = largest_divisor(extents[-1], lanes + lanes // 4)
    if width < 2:
        return None
    split = sch.split(loops[-1], [None, width])
    others = [loop for i, loop in enumerate(loops[:-1]) if i != axis]
    sch.reorder(*others, split[0], loops[axis], split[1])
    row = fuse(sch, [*others, split[0]])
    sch.vectorize(split[1])
    for block in reversed(inner):
        sch.compute_at(block, row, preserve_unit_loops=False)
    parallel(sch, row)
    for block in inner:
        below = loops_below(sch, block, row)
        if "R" not in iter_kinds(sch.get(block)):
            sch.vectorize(below[-1])
            continue
        *vector, k = below  # the reduced axis inside the vector's: each lane a result of its own
        sch.reorder(k, *vector)
        sch.vectorize(fuse(sch, vector))
        init = sch.decompose_reduction(block, k)
        sch.vectorize(sch.get_loops(init)[-1])
    return "default rule: column reduction"


def reduced_axis(sch: s_tir.Schedule, reductions: list[SBlockRV], extents: list[int]) -> int | None:
    """The output axis every reduction runs along, when it is not the last: each reduction's spatial
    extents are the output's without it, and its one reduced extent is that axis's."""
    shapes = []  # each reduction's (spatial extents, reduced extents)
    for block in reductions:
        ivs = sch.get(block).iter_vars
        shapes.append(
            (
                [int(iv.dom.extent) for iv in ivs if iv.iter_type == 0],
                [int(iv.dom.extent) for iv in ivs if iv.iter_type != 0],
            )
        )
    for axis in range(len(extents) - 1):
        rest = extents[:axis] + extents[axis + 1 :]
        if all(spatial == rest and reduced == [extents[axis]] for spatial, reduced in shapes):
            return axis
    return None


def reduction(sch: s_tir.Schedule, target: Target) -> str | tuple[s_tir.Schedule, str] | None:
    """Row reductions `rows` does not fit (dlight's CPU rule), else a single reduction block with its
    epilogue (pooling, mean) as a windowed reduction."""
    from tvm.s_tir.dlight.cpu import Reduction

    root = sch.get_sblock("root")
    main = [b for b in sch.get_child_blocks(root) if "R" in iter_kinds(sch.get(b))]
    name = sch.get(main[0]).name_hint if len(main) == 1 else ""
    pooling = "pool" in name
    # Pooling and depthwise convolutions have a window per output, not a row: dlight would serialize
    # them in NHWC. dlight's loops are parallel: a small kernel's one reduction goes to windowed too.
    if not pooling and "conv2d" not in name and not (serial_kernel.get() and len(main) == 1):
        scheduled = Reduction().apply(sch.mod["main"], target.tvm, False)
        if scheduled is not None:
            return scheduled, "default rule: row reduction (dlight)"
    if len(main) != 1:
        return None
    kind = "pooling" if pooling else conv_kind(sch.get(main[0])) if "conv2d" in name else "reduction"
    if kind == "reduction":  # each input read once: the elementwise work before it (a max over a
        inline_elementwise(sch)  # sequence of GELUs, Magika's) computed as it is read, in vectors
        main = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint == name]
    return windowed(sch, target, main[0], kind)


def conv_kind(stmt: s_tir.SBlock) -> str:
    """ "conv2d", "grouped conv2d" or "depthwise conv2d", from a conv block's input and weights
    (NCHW with OIHW weights, or NHWC with HWIO)."""
    data, weight = (r.source.shape for r in stmt.reads[:2])
    nhwc = "nhwc" in stmt.name_hint
    channels, per_group = int(data[3 if nhwc else 1]), int(weight[2 if nhwc else 1])
    return "conv2d" if per_group == channels else "depthwise conv2d" if per_group == 1 else "grouped conv2d"
