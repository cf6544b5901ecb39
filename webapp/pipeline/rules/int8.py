"""The int8 rules: conv2d (NHWC and NCHW) and matmul, tensorized with the tensor intrinsic of the
target's int8 instruction form, one module each: a dot-product instruction (int8_dot: x86 VNNI and
AVX-VNNI `vpdpbusd`, Arm `sdot`), x86 without one (int8_pairs: `vpmaddubsw` + `vpmaddwd`, AVX2 and
AVX-512BW), Arm NEON without one (int8_neon: `smull` + `smlal` + `sadalp`, the Pi 4)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import tvm
from tvm import s_tir, tirx

from webapp.pipeline.rules import int8_dot, int8_mmla, int8_neon, int8_pairs
from webapp.pipeline.rules.common import (
    PREPROC,
    choice,
    extent,
    inner_split,
    largest_divisor,
    loops_below,
    one_matmul_block,
    parallel,
    parallel_outer,
    simd,
    space_choices,
    vector_width,
)
from webapp.pipeline.rules.cpu import (
    conv_block,
    index_vars,
    nhwc_input_and_accumulator,
    padded_operands,
    same_vars,
)
from webapp.pipeline.rules.elementwise import fused_epilogue
from webapp.targets import KINDS

if TYPE_CHECKING:
    from tvm.ir import Expr
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from webapp.targets import LLVMCPU

# the modules of the forms other than one dot-product instruction, by their tag
FORMS = {"vpmaddubsw": int8_pairs, "smull": int8_neon, "smmla": int8_mmla}

# The int8 instruction forms of every target kind (webapp/targets): name -> (int32 lanes per
# intrinsic, activation dtype, the LLVM intrinsic of a dot-product instruction or a form of several
# (its tag in FORMS, then their LLVM names), the target feature that has it). Each lane adds 4
# products of 8-bit values.
DOT_INSTRUCTIONS = {name: rest for cls in KINDS for name, *rest in getattr(cls, "dot_instructions", ())}


def form(kind: str) -> ModuleType:
    """The module of the instruction's form: one dot-product instruction (int8_dot), x86's
    vpmaddubsw + vpmaddwd (int8_pairs), Arm NEON's smull + smlal + sadalp (int8_neon), Arm i8mm's
    smmla (int8_mmla)."""
    intrinsic = DOT_INSTRUCTIONS[kind][2]
    return int8_dot if isinstance(intrinsic, str) else FORMS[intrinsic[0]]


@functools.cache  # once a process: each registration parses TVMScript (0.4 s; 78 of them for one OCR model)
def register_dot(kind: str) -> str:
    """The tensor intrinsic of one of the target's int8 instructions (its form's), registered."""
    lanes, a_dtype, intrinsic, _ = DOT_INSTRUCTIONS[kind]
    return form(kind).register(f"playground_dot_{lanes}x4_{kind}", lanes, a_dtype, intrinsic)


def weight_tile(kind: str, o: Expr, i: Expr, lanes: int, vectors: bool = True) -> tuple:
    """Where output channel o (within its register tile: several vectors, or one when not `vectors`)
    and input channel i (within its 4) lie in the repacked weights, as the form's intrinsic reads them."""
    return form(kind).weight_tile(o, i, lanes, vectors)


def register_dots() -> None:
    """Every kind's dot-product intrinsics registered: a tuning record of an int8 kernel names one, and
    TVM replays its trace when it reads the database (webapp.pipeline.stages.tune.open_database)."""
    for kind in DOT_INSTRUCTIONS:
        register_dot(kind)


def multiplies_for_dot(stmt: s_tir.SBlock, target: LLVMCPU) -> bool:
    """Whether the block multiplies what the target's dot-product instruction does: its activation
    dtype (uint8 on x86, int8 on Arm) by int8 weights, into int32."""
    kind = target.dot_instruction()
    dtypes = tuple(str(r.source.dtype) for r in (*stmt.reads, *stmt.writes))
    return kind is not None and dtypes == (DOT_INSTRUCTIONS[kind][1], "int8", "int32")


def tile_vectors(channels: int, lanes: int) -> int:
    """Vectors of output channels in a register tile: 32 channels with 16 or 8 lanes (x86), 16 with
    4 (Arm), fewer when they do not divide the channels."""
    return next(v for v in (32 // lanes // (1 if lanes > 4 else 2), 2, 1) if channels % (lanes * v) == 0)


def conv2d_nhwc_int8(sch: s_tir.Schedule, target: LLVMCPU) -> str | None:
    """8-bit conv2d in NHWC with HWIO weights (the quantized model's layout, webapp.pipeline.stages.quantize)
    on the target's dot-product instruction: input channels are innermost, so each instruction reads
    4 consecutive input bytes where they lie, and the epilogue writes whole vectors of output
    channels. A register tile of output columns x channel vectors; weights repacked
    (O/v, KH, KW, I/4, v, 4) at build time; parallel over rows x column tiles x channel blocks."""
    conv = conv_block(sch, "conv2d_nhwc")
    if conv is None or not multiplies_for_dot(sch.get(conv), target):
        return None
    stmt = sch.get(conv)
    data, weight = stmt.reads[0].source, stmt.reads[1].source
    ic, oc = int(weight.shape[2]), int(weight.shape[3])
    kind = target.dot_instruction(oc)
    if kind is not None and form(kind) is int8_mmla:
        if mmla_fits(sch, conv, ic):
            return conv2d_nhwc_mmla(sch, target, conv, kind)
        kind = target.dot_instruction(oc, skip=(kind,))
    if int(data.shape[3]) != ic or kind is None or ic % 4:
        return None
    lanes = DOT_INSTRUCTIONS[kind][0]
    _, registers = simd(target)
    n_loop, h_loop, w_loop, oc_loop, kh_loop, kw_loop, ic_loop = sch.get_loops(conv)
    vectors = choice("vectors", tile_vectors(oc, lanes))
    if oc % (lanes * vectors):
        return None
    # Accumulators in every vector register but the weight vectors', a broadcast's and one spare:
    # the inner loop is one load per vector of weights, one broadcast per column and a dot product
    # per accumulator, so more columns are fewer weight loads per dot product, and fewer epilogues
    # begun per input row. On AVX-512 that is 14 columns x 2 vectors where half the registers gave
    # 8 x 2; measured here (in-process A/B, the int8 models built both ways and timed in turn, 6
    # rounds): MobileNetV2 1.77-2.09 ms against 1.88-2.20, faster in every round; ResNet-50 faster
    # in 5 of 6 rounds (median 2.4%), its small 1x1 convolutions by 5-11%. Tuning tries up to all
    # but two registers' worth.
    cols = largest_divisor(extent(sch, w_loop), (registers - vectors - 2) // vectors)
    block_oc = lanes * vectors

    epilogue = fused_epilogue(sch, conv, target)
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(
        conv,
        ("read", 1),
        lambda h, w, i, o: (o // block_oc, h, w, i // 4, *weight_tile(kind, o % block_oc, i % 4, lanes)),
    )
    sch.annotate(pack, PREPROC, True)
    epilogue = nhwc_input_and_accumulator(sch, conv, epilogue)
    oc_o, oc_v, oc_i = sch.split(oc_loop, [None, vectors, lanes])
    w_o, w_i = inner_split(sch, w_loop, cols, registers // vectors - 2)
    ic_o, ic_i = sch.split(ic_loop, [None, 4])
    # The channel blocks inside the rows: a thread's input rows stay in the L1 cache while it sweeps
    # the channel blocks' weights. Channel blocks outermost, as the float rule has them where the
    # weights are large, ran ResNet-50 slower here (17.9 ms against 14.5, int8 weights are a quarter
    # of the size); tuning tries both.
    if choice("channels_outer", False):
        sch.reorder(n_loop, oc_o, h_loop, w_o, kh_loop, kw_loop, ic_o, w_i, oc_v, oc_i, ic_i)
    else:
        sch.reorder(n_loop, h_loop, w_o, oc_o, kh_loop, kw_loop, ic_o, w_i, oc_v, oc_i, ic_i)
    tile = sch.fuse(*sch.get_loops(conv)[:4])
    finish_dot_tile(sch, conv, epilogue, tile, kh_loop, (w_i, oc_v), oc_i, kind)
    return f"default rule: int8 conv2d NHWC ({kind})"


def finish_dot_tile(
    sch: s_tir.Schedule,
    block: SBlockRV,
    epilogue: SBlockRV,
    tile: LoopRV,
    reduction: LoopRV,
    unrolled: tuple[LoopRV, ...],
    dot: LoopRV,
    kind: str,
) -> None:
    """The int8 rules' common end: the tiles' loop in parallel, the epilogue computed in each tile, the
    accumulators zeroed in vectors before `reduction`, the register tile's loops `unrolled`, the `dot`
    loop made the target's dot-product instruction, and the epilogue's innermost loop vectorized."""
    parallel(sch, tile)
    sch.reverse_compute_at(epilogue, tile)
    init = sch.decompose_reduction(block, reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    for loop in unrolled:
        sch.unroll(loop)
    sch.tensorize(dot, register_dot(kind))
    tail = loops_below(sch, epilogue, tile)
    width = vector_width(extent(sch, tail[-1]), 16) if tail else 0
    if width:
        sch.vectorize(sch.split(tail[-1], [None, width])[-1])


def mmla_fits(sch: s_tir.Schedule, conv: SBlockRV, ic: int) -> bool:
    """Whether smmla's 2 pixels x 8 input channels fit an NHWC conv: input channels in 8s, ungrouped, an
    even row of output pixels a stride of 1 apart (the two rows of the instruction, one input pixel
    apart). Other convs (a first layer's 4 channels, stride 2, odd rows of 7) take the dot product."""
    stmt = sch.get(conv)
    data, weight = stmt.reads[0].source, stmt.reads[1].source
    column = stmt.reads[0].region[2].min  # the input column a pixel reads: w * stride + kw
    linear = tvm.sym.pattern.detect_linear_equation(column, [stmt.iter_vars[2].var])
    stride_1 = len(linear) == 2 and isinstance(linear[0], tirx.IntImm) and int(linear[0]) == 1
    return (
        ic % 8 == 0
        and int(data.shape[3]) == ic
        and int(weight.shape[2]) == ic
        and stride_1
        and (extent(sch, sch.get_loops(conv)[2]) % 2 == 0)
    )


def conv2d_nhwc_mmla(sch: s_tir.Schedule, target: LLVMCPU, conv: SBlockRV, kind: str) -> str:
    """conv2d_nhwc_int8 on Arm's smmla: a register tile of pixel pairs x channel pairs (4 x 4: 16
    accumulators of 2 x 2, 4 vectors of weights, 4 of two pixels' input bytes), weights repacked
    (O/v, KH, KW, I/8, v/2, 2, 8), the sums kept as (pixels/2, channels/2, 2, 2) and written out by
    an unrolled epilogue (the tile's sums stay in registers)."""
    n_loop, h_loop, w_loop, oc_loop, kh_loop, kw_loop, ic_loop = sch.get_loops(conv)
    oc = extent(sch, oc_loop)
    pairs = choice("vectors", next(p for p in (4, 2, 1) if oc % (2 * p) == 0))
    if oc % (2 * pairs):
        raise ValueError(f"{oc} channels in blocks of {2 * pairs}")
    block_oc = 2 * pairs
    epilogue = fused_epilogue(sch, conv, target)
    pack = sch.cache_read(conv, 1, "global")
    tile = int8_mmla.weight_tile
    sch.transform_layout(
        conv, ("read", 1), lambda h, w, i, o: (o // block_oc, h, w, i // 8, *tile(o % block_oc, i % 8, pairs))
    )
    sch.annotate(pack, PREPROC, True)
    epilogue = nhwc_input_and_accumulator(sch, conv, epilogue)
    sch.transform_layout(conv, ("write", 0), lambda n, h, w, c: (n, h, w // 2, c // 2, w % 2, c % 2))
    w_p, w_2 = sch.split(w_loop, [None, 2])
    w_o, w_p = inner_split(sch, w_p, largest_divisor(extent(sch, w_p), 4), 8)
    oc_o, oc_p, oc_2 = sch.split(oc_loop, [None, pairs, 2])
    ic_o, ic_8 = sch.split(ic_loop, [None, 8])
    if choice("channels_outer", False):  # as conv2d_nhwc_int8: tuning tries both orders
        sch.reorder(n_loop, oc_o, h_loop, w_o, kh_loop, kw_loop, ic_o, w_p, oc_p, w_2, oc_2, ic_8)
    else:
        sch.reorder(n_loop, h_loop, w_o, oc_o, kh_loop, kw_loop, ic_o, w_p, oc_p, w_2, oc_2, ic_8)
    mmla_tile(sch, conv, epilogue, sch.fuse(*sch.get_loops(conv)[:4]), kh_loop, (w_p, oc_p, w_2), kind)
    return f"default rule: int8 conv2d NHWC ({kind})"


def mmla_tile(
    sch: s_tir.Schedule,
    block: SBlockRV,
    epilogue: SBlockRV,
    tile: LoopRV,
    reduction: LoopRV,
    pairs: tuple[LoopRV, LoopRV, LoopRV],
    kind: str,
) -> None:
    """The register tile of both smmla rules: parallel over `tile`, the sums zeroed before the
    `reduction` loop (4 lanes at a time), the pairs of rows and of columns unrolled, smmla at the
    pair of rows, and the epilogue unrolled (it reads the tile's sums where they lie, in registers)."""
    row_pairs, column_pairs, rows = pairs
    parallel(sch, tile)
    sch.reverse_compute_at(epilogue, tile)
    init = sch.decompose_reduction(block, reduction)
    sch.vectorize(sch.fuse(*sch.get_loops(init)[-2:]))
    sch.unroll(row_pairs)
    sch.unroll(column_pairs)
    sch.tensorize(rows, register_dot(kind))
    for loop in loops_below(sch, epilogue, tile):
        sch.unroll(loop)


def conv2d_int8(sch: s_tir.Schedule, target: LLVMCPU) -> str | None:
    """8-bit conv2d with int32 accumulation (NCHW, OIHW, no padding inside: webapp.pipeline.stages.quantize
    pads with the zero point first when it is not 0) on the target's dot-product instruction: AVX-512
    VNNI `vpdpbusd` (uint8 x int8, 16 output channels x 4 input channels an instruction) or Arm `sdot`
    (int8 x int8, 4 x 4); a register tile of channel vectors x output columns. The input is copied to
    (N, C/4, H, W, 4) at each call (legalization copies it anyway), the weights repacked
    (O/v, I/4, KH, KW, v, 4) at build time."""
    conv = conv_block(sch, "conv2d_nchw")
    if conv is None or not multiplies_for_dot(sch.get(conv), target):
        return None
    stmt = sch.get(conv)
    data, weight = stmt.reads[0].source, stmt.reads[1].source
    oc, ic = int(weight.shape[0]), int(weight.shape[1])
    kind = target.dot_instruction(oc)
    if int(data.shape[1]) != ic or kind is None or ic % 4:
        return None
    lanes = DOT_INSTRUCTIONS[kind][0]
    _, registers = simd(target)
    n_loop, oc_loop, oh_loop, ow_loop, ic_loop, kh_loop, kw_loop = sch.get_loops(conv)
    vectors = tile_vectors(oc, lanes)
    cols = largest_divisor(extent(sch, ow_loop), registers // 2 // vectors)
    if vectors > 1 and cols < 4:
        vectors, cols = 1, largest_divisor(extent(sch, ow_loop), registers // 2)
    block_oc = lanes * vectors

    epilogue = fused_epilogue(sch, conv, target)
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(
        conv,
        ("read", 1),
        lambda o, i, h, w: (o // block_oc, i // 4, h, w, *weight_tile(kind, o % block_oc, i % 4, lanes)),
    )
    sch.annotate(pack, PREPROC, True)
    # The input in (N, C/4, H, W, 4): legalization's padding block writes it so (a copy when the
    # padding is 0).
    producers = sch.get_producers(conv)
    copy = producers[0] if producers else sch.cache_read(conv, 0, "global")
    sch.transform_layout(conv, ("read", 0), lambda n, c, h, w: (n, c // 4, h, w, c % 4))
    parallel(sch, sch.fuse(*sch.get_loops(copy)[:2]))
    if epilogue is None:
        epilogue = sch.cache_write(conv, 0, "global")
    sch.set_scope(conv, 0, "local")
    sch.transform_layout(conv, ("write", 0), lambda n, c, h, w: (n, c // block_oc, h, w, c % block_oc))

    oc_o, oc_v, oc_i = sch.split(oc_loop, [None, vectors, lanes])
    ow_o, ow_i = sch.split(ow_loop, [None, cols])
    ic_o, ic_i = sch.split(ic_loop, [None, 4])
    sch.reorder(n_loop, oc_o, oh_loop, ow_o, ic_o, kh_loop, kw_loop, oc_v, ow_i, oc_i, ic_i)
    parallel_outer(sch, conv, 3)
    sch.reverse_compute_at(epilogue, ow_o)
    init = sch.decompose_reduction(conv, ic_o)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(oc_v)
    sch.unroll(ow_i)
    sch.tensorize(oc_i, register_dot(kind))
    return f"default rule: int8 conv2d ({kind})"


def matmul_int8(sch: s_tir.Schedule, target: LLVMCPU) -> str | None:
    """8-bit [.., M, K] x int8 [K, N] (or [N, K], a weight stored transposed: nn.Linear's, a tied LM
    head's) -> int32 (quantized dense layers) on the target's dot-product instruction (see
    conv2d_int8): `lanes` columns x 4 of K an instruction, a register tile of rows x column vectors,
    the weight repacked (N/lanes, K/4, lanes, 4) at build time. Rows and columns that do not divide
    into tiles are padded as the float rule pads them (cpu.padded_operands: GPT-2's 50,257 words,
    ViT's 197 tokens), and the column panels are outside the rows, so that an LM head's weight is
    streamed from memory once, not once per row tile."""
    block = one_matmul_block(sch)
    if block is None:
        return None
    stmt = sch.get(block)
    if not multiplies_for_dot(stmt, target):
        return None
    b = stmt.reads[1].source
    *_, j_var, k_var = [iv.var for iv in stmt.iter_vars]
    b_idx = index_vars(stmt.reads[1])
    if len(b.shape) != 2 or not (same_vars(b_idx, [k_var, j_var]) or same_vars(b_idx, [j_var, k_var])):
        return None
    transposed = b_idx[1].same_as(k_var)
    *batch_loops, i_loop, j_loop, k_loop = sch.get_loops(block)
    m, n, k = (extent(sch, loop) for loop in (i_loop, j_loop, k_loop))
    kind = target.dot_instruction(n) or target.dot_instruction()
    if kind is not None and form(kind) is int8_mmla:
        if k % 8 == 0 and n % 2 == 0:
            return matmul_mmla(sch, target, block, transposed, kind)
        kind = target.dot_instruction(n, skip=(kind,)) or target.dot_instruction(skip=(kind,))
    if k % 4 or kind is None:
        return None
    lanes = DOT_INSTRUCTIONS[kind][0]
    _, registers = simd(target)
    # the most vectors of columns (up to 4) that pad the columns by at most 3%
    waste = {v: -(-n // (lanes * v)) * lanes * v - n for v in (4, 2, 1)}
    vectors = choice("vectors", next(v for v in (4, 2, 1) if waste[v] <= 0.03 * n or v == 1))
    rows = min(m, max(1, registers // 2 // vectors))
    if space_choices.get() is not None and (m % rows or n % (lanes * vectors)):
        # MetaSchedule measures a candidate without its weight repacking (RemoveWeightLayoutRewrite
        # Block), which must be a plain copy: a padded one fails the search, so no design space pads
        return None

    epilogue, pack = padded_operands(sch, target, block, rows, lanes * vectors, lanes)
    layout: Callable[[Any, Any], tuple]
    if transposed:
        layout = lambda jj, kk: (jj // lanes, kk // 4, *weight_tile(kind, jj % lanes, kk % 4, lanes, False))  # noqa: E731
    else:
        layout = lambda kk, jj: (jj // lanes, kk // 4, *weight_tile(kind, jj % lanes, kk % 4, lanes, False))  # noqa: E731
    sch.transform_layout(block, ("read", 1), layout)
    sch.annotate(pack, PREPROC, True)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    *batch_loops, i_loop, j_loop, k_loop = sch.get_loops(block)
    i_o, i_i = inner_split(sch, i_loop, rows, registers // vectors - 2)
    j_o, j_v, j_l = sch.split(j_loop, [None, vectors, lanes])
    k_o, k_i = sch.split(k_loop, [None, 4])
    sch.reorder(*batch_loops, j_o, i_o, k_o, i_i, j_v, j_l, k_i)
    tile = sch.fuse(*batch_loops, j_o, i_o)
    finish_dot_tile(sch, block, epilogue, tile, k_o, (i_i, j_v), j_l, kind)
    return f"default rule: int8 matmul ({kind})"


def matmul_mmla(
    sch: s_tir.Schedule, target: LLVMCPU, block: SBlockRV, transposed: bool, kind: str
) -> str | None:
    """matmul_int8 on Arm's smmla: a register tile of row pairs x column pairs (4 x 4 where they
    divide), the weight repacked (N/v, K/8, v/2, 2, 8), the sums kept as (rows/2, columns/2, 2, 2)
    and written out by an unrolled epilogue; rows and columns padded to the tile as matmul_int8 pads."""
    *_, i_loop, j_loop, _ = sch.get_loops(block)
    m, n = extent(sch, i_loop), extent(sch, j_loop)
    waste = {p: -(-n // (2 * p)) * 2 * p - n for p in (4, 2, 1)}  # padded columns, as matmul_int8
    pairs = choice("vectors", next(p for p in (4, 2, 1) if waste[p] <= 0.03 * n or p == 1))
    rows = 2 * min(4, -(-m // 2))
    if space_choices.get() is not None and (m % rows or n % (2 * pairs)):
        return None  # as matmul_int8: no design space pads
    block_n = 2 * pairs
    epilogue, pack = padded_operands(sch, target, block, rows, block_n, 4)
    packed = int8_mmla.weight_tile
    layout: Callable[[Any, Any], tuple]
    if transposed:
        layout = lambda jj, kk: (jj // block_n, kk // 8, *packed(jj % block_n, kk % 8, pairs))  # noqa: E731
    else:
        layout = lambda kk, jj: (jj // block_n, kk // 8, *packed(jj % block_n, kk % 8, pairs))  # noqa: E731
    sch.transform_layout(block, ("read", 1), layout)
    sch.annotate(pack, PREPROC, True)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    sch.transform_layout(
        block, ("write", 0), lambda *x: (*x[:-2], x[-2] // 2, x[-1] // 2, x[-2] % 2, x[-1] % 2)
    )
    *batch_loops, i_loop, j_loop, k_loop = sch.get_loops(block)
    i_o, i_p, i_2 = sch.split(i_loop, [None, rows // 2, 2])
    j_o, j_p, j_2 = sch.split(j_loop, [None, pairs, 2])
    k_o, k_8 = sch.split(k_loop, [None, 8])
    sch.reorder(*batch_loops, j_o, i_o, k_o, i_p, j_p, i_2, j_2, k_8)
    mmla_tile(sch, block, epilogue, sch.fuse(*batch_loops, j_o, i_o), k_o, (i_p, j_p, i_2), kind)
    return f"default rule: int8 matmul ({kind})"
