"""Default schedules: fast CPU code without tuning.

TVM 0.27's default CPU pipeline leaves every kernel as the naive loop nest that legalization wrote.
These rules schedule the fused kernels by what their main block computes, in the s_tir schedule
language MetaSchedule itself uses:

- conv2d (regular and grouped): output channels in SIMD registers, a register tile of output
  channels x output columns, weights repacked once at build time (O/v, I, H, W, v) so each step loads
  one vector of weights and broadcasts one input value; the epilogue (bias, batch norm, relu, residual
  add) is computed from the registers; parallel over channel blocks and rows.
- depthwise conv2d and pooling: vectorized over channels in NHWC (along output columns in NCHW),
  parallel over rows; in NHWC the window reads the input in place, its padding inlined
  (reductions.windowed).
- matmul / dense / batch matmul: a register tile of rows x vectors of columns, the weight repacked
  at build time when it is stored transposed, epilogue fused, parallel over tiles.
- softmax, layer norm, RMSNorm: a row at a time, the elementwise work inlined, reductions summing
  vectors of partial results; other reductions: TVM's dlight CPU rule, or windowed (pooling); all in
  reductions.py.
- everything else (elementwise, reshape, transpose): parallel outer loop, vectorized inner loop.

A kernel that no rule fits stays naive. A rule that fails on a kernel (TVM refuses its schedule,
or the rule has a bug) leaves it to the next rule, never failing the build. Each PrimFunc gets the
attribute SCHEDULE_ATTR naming the rule that scheduled it, for the result page, followed by the rules
that failed on it: "naive (reduction rule failed: ScheduleError: ...)"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm import s_tir, tirx

from webapp.pipeline.rules.common import (
    PREPROC,
    extent,
    finish_register_tile,
    fuse,
    iter_kinds,
    largest_divisor,
    loops_below,
    one_matmul_block,
    parallel,
    parallel_outer,
    register_tile,
    simd,
    vector_split,
    vector_width,
)
from webapp.pipeline.rules.elementwise import fused_epilogue
from webapp.pipeline.rules.reductions import windowed

if TYPE_CHECKING:
    from tvm.s_tir.schedule import SBlockRV

    from webapp.targets import Target


def conv_block(sch: s_tir.Schedule, suffix: str) -> SBlockRV | None:
    """The kernel's one conv2d block (named ...`suffix`: "conv2d_nchw", "conv2d_nhwc"), four output
    axes and three reduction axes over two inputs; None when the kernel has not exactly one."""
    blocks = [
        b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith(suffix)
    ]
    if len(blocks) != 1:
        return None
    stmt = sch.get(blocks[0])
    return blocks[0] if iter_kinds(stmt) == "SSSSRRR" and len(stmt.reads) == 2 else None


def conv2d(sch: s_tir.Schedule, target: Target) -> str | None:
    """Regular and grouped conv2d in NCHW with OIHW weights (topi's conv2d_nchw / group_conv2d_nchw)."""
    conv = conv_block(sch, "conv2d_nchw")
    if conv is None:
        return None
    stmt = sch.get(conv)
    lanes, registers = simd(target)
    weight = stmt.reads[1].source
    oc, ic_per_group = int(weight.shape[0]), int(weight.shape[1])
    groups = int(stmt.reads[0].source.shape[1]) // ic_per_group if stmt.reads[0].source.shape[1] else 1
    oc_per_group = oc // max(groups, 1)
    lanes = vector_width(oc_per_group, lanes, minimum=4)
    if not lanes:
        return windowed(sch, target, conv, "depthwise conv2d" if oc_per_group == 1 else "grouped conv2d")
    n_loop, oc_loop, oh_loop, ow_loop, ic_loop, kh_loop, kw_loop = sch.get_loops(conv)
    ow = extent(sch, ow_loop)
    # Register tile: `vectors` vectors of output channels x `cols` output columns, in at most half the
    # vector registers (measured on ResNet-50 here: 28 accumulators spill, 16 run twice as fast).
    vectors = 2 if oc_per_group % (2 * lanes) == 0 else 1
    cols = largest_divisor(ow, registers // 2 // vectors)
    if cols < 4 and ow > registers:  # a width of few divisors (an audio encoder's 1,599 or 799
        cols = registers // 2 // vectors  # samples): full tiles, the last one cut short
    elif vectors == 2 and cols < 4:
        vectors, cols = 1, largest_divisor(ow, registers // 2)
    block_oc = vectors * lanes

    for pad in sch.get_producers(conv):  # the padded input: its own parallel loop nest
        parallel(sch, sch.fuse(*sch.get_loops(pad)[:2]))
    epilogue = fused_epilogue(sch, conv, target)
    # Weights repacked to (O / block_oc, I, KH, KW, block_oc), once, at build time.
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(conv, ("read", 1), lambda o, i, h, w: (o // block_oc, i, h, w, o % block_oc))
    sch.annotate(pack, PREPROC, True)

    if epilogue is None:
        epilogue = sch.cache_write(conv, 0, "global")
    sch.set_scope(conv, 0, "local")
    sch.transform_layout(conv, ("write", 0), lambda n, c, h, w: (n, c // block_oc, h, w, c % block_oc))

    oc_o, oc_v, oc_i = sch.split(oc_loop, [None, vectors, lanes])
    ow_o, ow_i = sch.split(ow_loop, [None, cols])
    sch.reorder(n_loop, oc_o, oh_loop, ow_o, ic_loop, kh_loop, kw_loop, oc_v, ow_i, oc_i)
    parallel_outer(sch, conv, 3)
    sch.reverse_compute_at(epilogue, ow_o)
    sch.unroll(oc_v)
    sch.unroll(ow_i)
    sch.vectorize(oc_i)
    init = sch.decompose_reduction(conv, ic_loop)
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    kind = "grouped conv2d" if groups > 1 else "conv2d"
    return f"default rule: {kind}"


def nhwc_input_and_accumulator(sch: s_tir.Schedule, conv: SBlockRV, epilogue: SBlockRV | None) -> SBlockRV:
    """An NHWC conv's input and accumulator, for both NHWC rules: legalization's copy of the input
    inlined (the conv reads it where it lies) or its padding run in parallel, and the sums kept in
    registers. Returns the block that writes the output (`epilogue`, or a copy-out made here)."""
    for pad in sch.get_producers(conv):  # legalization's padding of the input, or its plain copy
        copied, padded = sch.get(pad).reads[0].source, sch.get(pad).writes[0].source
        if [int(d) for d in copied.shape] == [int(d) for d in padded.shape]:
            sch.compute_inline(pad)  # a copy: the conv reads the input where it is
        else:
            parallel(sch, sch.fuse(*sch.get_loops(pad)[:2]))
    if epilogue is None:
        epilogue = sch.cache_write(conv, 0, "global")
    sch.set_scope(conv, 0, "local")
    return epilogue


L1_WEIGHT_BYTES = 32 * 1024  # a conv's weight block this small stays in the L1 cache


def conv2d_nhwc(sch: s_tir.Schedule, target: Target) -> str | None:
    """Regular conv2d in NHWC with HWIO weights (the float layout CPU targets convert to,
    webapp.pipeline.stages.optimize.cpu_layout): an implicit GEMM over the channel axis. Input channels are
    innermost, so each step broadcasts one input value where it lies and loads one vector of repacked
    weights (O/v, KH, KW, I, v); a 1x1 convolution is a blocked GEMM of (pixels x input channels) by
    (input channels x output channels). A register tile of output columns x channel vectors in half
    the vector registers, the epilogue written as whole vectors of output channels; parallel over
    rows x column tiles x channel blocks."""
    conv = conv_block(sch, "conv2d_nhwc")
    if conv is None:
        return None
    stmt = sch.get(conv)
    data, weight = stmt.reads[0].source, stmt.reads[1].source
    if len(weight.shape) != 4 or any(str(r.source.dtype) != "float32" for r in (*stmt.reads, *stmt.writes)):
        return None
    ic, oc = int(weight.shape[2]), int(weight.shape[3])
    if int(data.shape[3]) != ic:  # grouped: left to the windowed / naive rules
        return None
    lanes, registers = simd(target)
    lanes = vector_width(oc, lanes, minimum=4)
    if not lanes:
        return None
    n_loop, h_loop, w_loop, oc_loop, kh_loop, kw_loop, ic_loop = sch.get_loops(conv)
    # A 1-D conv along the rows (a Keras export's (length, 1) image: Magika's): rows take the columns'
    # place in the register tile.
    if extent(sch, w_loop) == 1 < extent(sch, h_loop):
        h_loop, w_loop = w_loop, h_loop
    vectors, cols = register_tile(extent(sch, w_loop), oc // lanes, registers // 2)
    block_oc = lanes * vectors

    epilogue = fused_epilogue(sch, conv, target)
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(conv, ("read", 1), lambda h, w, i, o: (o // block_oc, h, w, i, o % block_oc))
    sch.annotate(pack, PREPROC, True)
    epilogue = nhwc_input_and_accumulator(sch, conv, epilogue)
    oc_o, oc_v, oc_i = sch.split(oc_loop, [None, vectors, lanes])
    w_o, w_i = sch.split(w_loop, [None, cols])
    # Channel blocks outermost where a block's repacked weights are large: they stay in the cache
    # while its thread sweeps the rows (measured on ResNet-50 here: 41 ms against 45 with rows
    # outermost). Rows outermost where they fit the L1 cache anyway (MobileNetV2's 1x1 convs): a row's
    # input stays in the cache for every channel block (4.3 ms against 4.6 there).
    if int(weight.shape[0]) * int(weight.shape[1]) * ic * block_oc * 4 <= L1_WEIGHT_BYTES:
        sch.reorder(n_loop, h_loop, oc_o, w_o, kh_loop, kw_loop, ic_loop, w_i, oc_v, oc_i)
    else:
        sch.reorder(n_loop, oc_o, h_loop, w_o, kh_loop, kw_loop, ic_loop, w_i, oc_v, oc_i)
    tile = sch.fuse(*sch.get_loops(conv)[:4])
    finish_register_tile(sch, conv, tile, epilogue, [w_i, oc_v], oc_i, kh_loop)
    tail = loops_below(sch, epilogue, tile)
    width = vector_width(extent(sch, tail[-1]), lanes) if tail else 0
    if width:
        sch.vectorize(sch.split(tail[-1], [None, width])[-1])
    return "default rule: conv2d NHWC"


def winograd(sch: s_tir.Schedule, target: Target) -> str | None:
    """The Winograd convolution (webapp.pipeline.passes.winograd): the input transform parallel over tiles,
    vectorized over input channels; the 16 GEMMs as the NHWC conv's register tile of tiles x vectors
    of output channels (transformed weights repacked at build time), parallel over positions x tile
    blocks x channel blocks; the output transform computed with the epilogue, 2x2 outputs at a time,
    vectorized over output channels, parallel over rows."""
    from webapp.pipeline.passes.winograd import NAMES

    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    if not all(name in blocks for name in NAMES):
        return None
    lanes, registers = simd(target)
    transform, gemm, output = (blocks[name] for name in NAMES)
    sch.compute_inline(blocks["winograd_pad"])
    a, b, p, c = sch.get_loops(transform)
    sch.reorder(p, a, b, c)
    parallel(sch, p)
    sch.unroll(a)
    sch.unroll(b)
    split = vector_split(sch, c, lanes)
    if split:
        sch.vectorize(split[1])

    epilogue = fused_epilogue(sch, output, target)
    if epilogue is not None:
        sch.compute_inline(output)
        output = epilogue
    n, h, w, co = sch.get_loops(output)
    h_o, h_i = sch.split(h, [None, 2])
    w_o, w_i = sch.split(w, [None, 2])
    sch.reorder(n, h_o, w_o, h_i, w_i, co)
    parallel(sch, sch.fuse(n, h_o))
    sch.unroll(h_i)
    sch.unroll(w_i)
    split = vector_split(sch, co, lanes)
    if split:
        sch.vectorize(split[1])

    a, b, p, co, k = sch.get_loops(gemm)
    channels = extent(sch, co)
    lanes = vector_width(channels, lanes, minimum=4)
    if not lanes:
        return None
    vectors, rows = register_tile(extent(sch, p), channels // lanes, registers // 2)
    block_co = lanes * vectors
    pack = sch.cache_read(gemm, 1, "global")
    sch.transform_layout(gemm, ("read", 1), lambda a, b, k, o: (a, b, o // block_co, k, o % block_co))
    sch.annotate(pack, PREPROC, True)
    p_o, p_i = sch.split(p, [None, rows])
    co_o, co_v, co_i = sch.split(co, [None, vectors, lanes])
    sch.reorder(a, b, co_o, p_o, k, p_i, co_v, co_i)
    tile = sch.fuse(a, b, co_o, p_o)
    copy = sch.cache_write(gemm, 0, "local")  # the register tile, written out once its sums are done
    finish_register_tile(sch, gemm, tile, copy, [p_i, co_v], co_i, k)
    sch.vectorize(sch.get_loops(copy)[-1])
    return "default rule: Winograd conv2d"


def index_vars(region: tirx.BufferRegion) -> list:
    """The block variables that index each dimension of a buffer access (None where not a plain var)."""
    return [r.min if isinstance(r.min, tirx.Var) else None for r in region.region]


def same_vars(indices: list, variables: list) -> bool:
    return all(i is not None and i.same_as(v) for i, v in zip(indices, variables, strict=True))


# A matmul's register tile: rows x vectors of columns, about 16 accumulators with 32 vector registers
# (AVX-512, NEON: 4 x 4, 8 x 2, 16 x 1), 9 with 16 (AVX2: 3 x 3), the rest holding a row of B's vectors
# and A's broadcast values. Measured here (EPYC znver4, 2 threads, BERT's and ViT's shapes): 4 x 4 to
# 8 x 3 all ran at 200-215 GFLOP/s under AVX-512; under AVX2 3 x 3 at 191-198, 2 x 4 at 142-182.
def accumulators(registers: int) -> int:
    return 16 if registers >= 32 else 9


def tile_vectors(n: int, width: int, registers: int) -> int:
    """Vectors of columns in a matmul's register tile: the most (4 with 32 registers, else 3) whose
    tile pads `n` columns by at most 3%, else the one that pads it least (ViT's 197 keys: 13 vectors
    of 16 in 1 x 16-column tiles, not 16 in 4 x 16)."""
    options = range(min(4 if registers >= 32 else 3, -(-n // width)), 0, -1)
    waste = {v: -(-n // (v * width)) * v * width - n for v in options}
    fits = [v for v in options if waste[v] <= 0.03 * n]
    return fits[0] if fits else min(options, key=lambda v: waste[v])


def padded_operands(
    sch: s_tir.Schedule, target: Target, block: SBlockRV, rows: int, block_n: int, lanes: int
) -> tuple[SBlockRV | None, SBlockRV]:
    """A matmul block's rows padded to a multiple of `rows` and its columns to one of `block_n` where
    they are not (pad_einsum): B's padded copy, zeros in the extra columns, is the block that repacks
    B (a weight's is made once, at build time), A's padded rows a copy per call, parallel over rows
    and vectorized; the extra results are never written. Returns the epilogue (the block that writes
    the output, None when the matmul does itself) and B's repacking block, for the caller to give
    its layout."""
    epilogue = fused_epilogue(sch, block, target)
    loops = sch.get_loops(block)
    m, n = extent(sch, loops[-3]), extent(sch, loops[-2])
    pad_m, pad_n = -(-m // rows) * rows, -(-n // block_n) * block_n
    if (pad_m, pad_n) != (m, n):
        batch = [1] * (len(loops) - 3)
        sch.pad_einsum(block, [*batch, rows if pad_m != m else 1, block_n if pad_n != n else 1, 1])
        if epilogue is None:  # the copy of the padded result into the output
            epilogue = sch.get_consumers(block)[0]
        else:
            sch.compute_inline(sch.get_consumers(block)[0])
    if pad_n != n:
        padded_b = sch.get(block).reads[1].source
        pack = next(p for p in sch.get_producers(block) if sch.get(p).writes[0].source.same_as(padded_b))
    else:
        pack = sch.cache_read(block, 1, "global")
    for producer in sch.get_producers(block):  # A's padded rows
        if not sch.get(producer).same_as(sch.get(pack)):
            copy = sch.get_loops(producer)
            parallel(sch, fuse(sch, copy[:-1]))
            split = vector_split(sch, copy[-1], lanes)
            if split:
                sch.vectorize(split[1])
    return epilogue, pack


def shape_of(sch: s_tir.Schedule, block: SBlockRV) -> list[int]:
    """The shape of the buffer `block` writes."""
    return [int(d) for d in sch.get(block).writes[0].source.shape]


def b_transposed(stmt: s_tir.SBlock) -> bool | None:
    """Whether a matmul block reads B[.., j, k] (True) or B[.., k, j] (False); None where either operand
    is no matrix (or stack of them) over i, k and k, j: a vector operand (matrix x vector)."""
    *batch, i_var, j_var, k_var = [iv.var for iv in stmt.iter_vars]
    a_idx, b_idx = index_vars(stmt.reads[0]), index_vars(stmt.reads[1])
    if len(a_idx) < 2 or len(b_idx) < 2 or not same_vars(a_idx[-2:], [i_var, k_var]):
        return None
    if not (same_vars(b_idx[-2:], [k_var, j_var]) or same_vars(b_idx[-2:], [j_var, k_var])):
        return None
    return bool(b_idx[-1].same_as(k_var))


def matmul(sch: s_tir.Schedule, target: Target) -> str | None:
    """Dense, matmul and batch matmul of any shape: C[.., i, j] += A[.., i, k] * B[.., k, j] (or
    B[.., j, k], a weight stored transposed, as nn.Linear's and a tied LM head's). A register tile of
    `rows` x `vectors` vectors of columns; B repacked as (.., N / block_n, K, block_n) panels, once
    at build time where B is a weight; parallel over tiles with the panels outside the rows, so that
    each panel is read from memory once and stays in the cache while the rows sweep it (an LM head's
    154 MB weight is streamed once, not once per row tile). Rows and columns that do not divide into
    tiles are padded (GPT-2's 50,257-word vocabulary, ViT's 197 tokens): the padded weight is made
    with the repacking, the padded rows of A copied per call, the extra results never written."""
    block = one_matmul_block(sch)
    if block is None:
        return None
    stmt = sch.get(block)
    transposed = b_transposed(stmt)
    if transposed is None:
        return None
    lanes, registers = simd(target)
    loops = sch.get_loops(block)
    if len(loops) != len(stmt.iter_vars) or any(extent(sch, loop) < 1 for loop in loops):
        return None
    m, n = extent(sch, loops[-3]), extent(sch, loops[-2])
    shape = shape_of(sch, block)
    width = lanes if n >= lanes else vector_width(n, lanes) or lanes
    vectors = tile_vectors(n, width, registers)
    block_n = vectors * width
    # the rest of the registers hold one row of B's vectors and a broadcast A value
    rows = min(m, max(1, accumulators(registers) // vectors))

    epilogue, pack = padded_operands(sch, target, block, rows, block_n, lanes)
    if transposed:
        layout = lambda *ix: (*ix[:-2], ix[-2] // block_n, ix[-1], ix[-2] % block_n)  # noqa: E731
    else:
        layout = lambda *ix: (*ix[:-2], ix[-1] // block_n, ix[-2], ix[-1] % block_n)  # noqa: E731
    sch.transform_layout(block, ("read", 1), layout)
    sch.annotate(pack, PREPROC, True)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")

    *batch_loops, i_loop, j_loop, k_loop = sch.get_loops(block)
    i_o, i_i = sch.split(i_loop, [None, rows])
    j_o, j_v, j_l = sch.split(j_loop, [None, vectors, width])
    sch.reorder(*batch_loops, j_o, i_o, k_loop, i_i, j_v, j_l)
    parallel(sch, sch.fuse(*batch_loops, j_o, i_o))
    tile = sch.get_loops(block)[0]
    if shape_of(sch, epilogue) == shape:
        sch.reverse_compute_at(epilogue, tile)
    else:  # an epilogue of another shape (scores padded to whole vectors, passes/attention.py) is
        tile = parallel_outer(sch, epilogue, len(shape) - 1)  # not the tile's: its own loops after
    sch.unroll(i_i)
    sch.unroll(j_v)
    sch.vectorize(j_l)
    init = sch.decompose_reduction(block, k_loop)
    sch.vectorize(sch.get_loops(init)[-1])
    tail = loops_below(sch, epilogue, tile)
    if tail:
        inner = sch.split(tail[-1], [None, width])[-1] if extent(sch, tail[-1]) % width == 0 else tail[-1]
        sch.vectorize(inner)
    return "default rule: batch matmul" if len(index_vars(stmt.reads[1])) > 2 else "default rule: matmul"
