"""Default schedules: fast CPU code without tuning.

TVM 0.27's default CPU pipeline leaves every kernel as the naive loop nest that legalization wrote.
These rules schedule the fused kernels by what their main block computes, in the s_tir schedule
language MetaSchedule itself uses:

- conv2d (regular and grouped): output channels in SIMD registers, a register tile of output
  channels x output columns, weights repacked once at build time (O/v, I, H, W, v) so each step loads
  one vector of weights and broadcasts one input value; the epilogue (bias, batch norm, relu, residual
  add) is computed from the registers; parallel over channel blocks and rows.
- depthwise conv2d and pooling: vectorized over channels in NHWC (along output columns in NCHW),
  parallel over rows; in NHWC the window reads the input in place, its padding inlined.
- matmul / dense / batch matmul: a register tile of rows x vectors of columns, the weight repacked
  at build time when it is stored transposed, epilogue fused, parallel over tiles.
- softmax, layer norm, reductions: TVM's dlight CPU rules.
- everything else (elementwise, reshape, transpose): parallel outer loop, vectorized inner loop.

A kernel that no rule fits stays naive. A rule that fails on a kernel (TVM refuses its schedule,
or the rule has a bug) leaves it to the next rule, never failing the build. Each PrimFunc gets the
attribute SCHEDULE_ATTR naming the rule that scheduled it, for the result page, followed by the rules
that failed on it: "naive (reduction rule failed: ScheduleError: ...)".
"""

from __future__ import annotations

import contextvars

import numpy as np
import tvm
from tvm import relax, s_tir, tirx

from webapp.pipeline.rules import gpu as gpu_rules
from webapp.pipeline.rules.common import (
    extent,
    fuse,
    inline_epilogue,
    is_output,
    iter_kinds,
    largest_divisor,
    vector_width,
)
from webapp.targets import KINDS, kind_of

SCHEDULE_ATTR = "playground.schedule"
TVM_KERNEL = "TVM's own kernel"  # the label of a kernel TVM scheduled itself (its GPU sort and scan)
PREPROC = "meta_schedule.layout_rewrite_preproc"  # blocks SplitLayoutRewritePreproc moves out


def simd(target: tvm.target.Target) -> tuple[int, int]:
    """(float32 lanes per vector register, number of vector registers): the target's kind says."""
    return kind_of(target).vector_shape(target)


def loops_below(sch: s_tir.Schedule, block, loop) -> list:
    """The loops of `block` nested inside `loop`."""
    loops = sch.get_loops(block)
    at = [i for i, candidate in enumerate(loops) if sch.get(candidate).same_as(sch.get(loop))]
    return loops[at[0] + 1 :] if at else []


SERIAL_FLOPS, SERIAL_ELEMENTS = 1 << 19, 1 << 13  # a kernel under both runs on one thread
# Waking the other threads and joining them costs a few microseconds a parallel loop, and more when
# the thread pool's workers have gone to sleep: the mlp example's three kernels (0.4 MFLOP in all)
# took 13 us on one thread, and 9 to 24 us on two from one process to the next, measured here.
_serial = contextvars.ContextVar("serial", default=False)


def parallel(sch: s_tir.Schedule, loop) -> None:
    """sch.parallel(loop), unless the kernel being scheduled is too small to pay for its threads."""
    if not _serial.get():
        sch.parallel(loop)


def small(sch: s_tir.Schedule) -> bool:
    """Whether the kernel of `sch` has fewer than SERIAL_FLOPS arithmetic operations and writes fewer
    than SERIAL_ELEMENTS elements; False when that is not known (a symbolic shape, no estimate)."""
    shapes = [sch.get(b).writes[0].source.shape for b in sch.get_child_blocks(sch.get_sblock("root"))]
    try:
        flops = s_tir.analysis.estimate_tir_flops(sch.mod)
    except Exception:  # TVM's estimate refuses some kernels
        return False
    if not all(isinstance(d, tirx.IntImm) for shape in shapes for d in shape):
        return False
    elements = sum(int(np.prod([int(d) for d in shape])) for shape in shapes)
    return flops < SERIAL_FLOPS and elements < SERIAL_ELEMENTS


def parallel_outer(sch: s_tir.Schedule, block, count: int):
    outer = fuse(sch, sch.get_loops(block)[:count])
    parallel(sch, outer)
    return outer


_space = contextvars.ContextVar("space", default=None)  # a tuning design space's choices (design_spaces)


def choice(name: str, default):
    """A rule's discrete choice (a loop order, a register tile's vectors): `default`, or in a tuning
    design space the one that space stands for."""
    space = _space.get()
    return default if space is None else space.get(name, default)


def inner_split(sch: s_tir.Schedule, loop, default: int, limit: int):
    """`loop` split into (outer, inner): `default` inner iterations, or in a tuning design space an
    inner factor MetaSchedule samples, a divisor from 2 to `limit`. Not 1: the epilogue computed at
    the outer loop would then have one loop fewer, and MetaSchedule's replay of the space's trace
    fails on that (its perfect-tile sampling can draw 1)."""
    if _space.get() is None:
        return sch.split(loop, [None, default])
    n = extent(sch, loop)
    factors = [d for d in range(2, limit + 1) if n % d == 0] or [default]
    return sch.split(loop, [None, sch.sample_categorical(factors, [1 / len(factors)] * len(factors))])


def conv_block(sch: s_tir.Schedule, suffix: str):
    """The kernel's one conv2d block (named ...`suffix`: "conv2d_nchw", "conv2d_nhwc"), four output
    axes and three reduction axes over two inputs; None when the kernel has not exactly one."""
    blocks = [
        b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith(suffix)
    ]
    if len(blocks) != 1:
        return None
    stmt = sch.get(blocks[0])
    return blocks[0] if iter_kinds(stmt) == "SSSSRRR" and len(stmt.reads) == 2 else None


def conv2d(sch: s_tir.Schedule, target) -> str | None:
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
    if vectors == 2 and cols < 4:
        vectors, cols = 1, largest_divisor(ow, registers // 2)
    block_oc = vectors * lanes

    for pad in sch.get_producers(conv):  # the padded input: its own parallel loop nest
        parallel(sch, sch.fuse(*sch.get_loops(pad)[:2]))
    epilogue = inline_epilogue(sch, conv)
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


def nhwc_input_and_accumulator(sch: s_tir.Schedule, conv, epilogue):
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


def register_tile(width: int, blocks: int, accumulators: int) -> tuple[int, int]:
    """(vectors, columns) of an NHWC conv's register tile: columns dividing the output width, vectors
    dividing the output channels' `blocks` of one vector, at most `accumulators` of them, with the
    most FMAs per load (each step loads one input value per column and one weight vector per vector:
    MobileNetV2's 144 channels take 3 vectors x 4 columns, 1.7 FMAs a load, not 1 x 14, 0.9)."""
    options = [(v, largest_divisor(width, accumulators // v)) for v in range(1, 5) if blocks % v == 0]
    return max(options, key=lambda o: (o[0] * o[1] / (o[0] + o[1]), o[0]))


def conv2d_nhwc(sch: s_tir.Schedule, target) -> str | None:
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
    vectors, cols = register_tile(extent(sch, w_loop), oc // lanes, registers // 2)
    block_oc = lanes * vectors

    epilogue = inline_epilogue(sch, conv)
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


def finish_register_tile(
    sch: s_tir.Schedule, block, tile, epilogue, unrolled: list, vector, reduction
) -> None:
    """The end of a float register-tile rule: `tile` in parallel, `epilogue` computed at it, the tile's
    `unrolled` loops unrolled (each accumulator its own register), its `vector` loop vectorized, and
    the sums initialized in vectors before the `reduction` loop."""
    parallel(sch, tile)
    sch.reverse_compute_at(epilogue, tile)
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(vector)
    init = sch.decompose_reduction(block, reduction)
    sch.vectorize(sch.get_loops(init)[-1])


def winograd(sch: s_tir.Schedule, target) -> str | None:
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

    epilogue = inline_epilogue(sch, output)
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


# Integer dot-product instructions of every target kind (webapp/targets): name -> (int32 lanes per
# instruction, activation dtype, LLVM intrinsic, the target feature that has it). Each lane adds 4
# products of 8-bit values.
DOT_INSTRUCTIONS = {name: rest for cls in KINDS for name, *rest in getattr(cls, "dot_instructions", ())}


def dot_instruction(target, channels: int | None = None) -> str | None:
    """The integer dot-product instruction the target has (a DOT_INSTRUCTIONS key), if any."""
    return kind_of(target).dot_instruction(target, channels)


def register_dot(kind: str) -> str:
    """A tensor intrinsic for one dot-product instruction: `lanes` int32 += 4 activations x 4 int8
    weights each, accumulating in registers ("local"). TVM's own x86 one (`dot_16x4_vnni`) passes
    int32 vectors, which LLVM 22 rejects (it wants bytes), and accumulates in global memory."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    lanes, a_dtype, intrinsic, _ = DOT_INSTRUCTIONS[kind]
    name = f"playground_dot_{lanes}x4_{kind}"

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            # The 4 activation bytes as one int32, broadcast to every lane; written as one expression:
            # a value given a name here becomes a local buffer, which TVM allocates from its workspace
            # pool (a runtime call) at every use
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic),
                C.vload([0], dtype=f"int32x{lanes}"),
                T.reinterpret(
                    T.broadcast(T.reinterpret(A.vload([0], f"{a_dtype}x4"), dtype="int32"), lanes),
                    dtype=f"{a_dtype}x{4 * lanes}",
                ),
                B.vload([0, 0], dtype=f"int8x{4 * lanes}"),
                dtype=f"int32x{lanes}",
            )

    TensorIntrin.register(name, desc, impl, override=True)
    return name


def register_dots() -> None:
    """Every kind's dot-product intrinsics registered: a tuning record of an int8 kernel names one, and
    TVM replays its trace when it reads the database (webapp.pipeline.stages.tune.open_database)."""
    for kind in DOT_INSTRUCTIONS:
        register_dot(kind)


def multiplies_for_dot(stmt, target) -> bool:
    """Whether the block multiplies what the target's dot-product instruction does: its activation
    dtype (uint8 on x86, int8 on Arm) by int8 weights, into int32."""
    kind = dot_instruction(target)
    dtypes = tuple(str(r.source.dtype) for r in (*stmt.reads, *stmt.writes))
    return kind is not None and dtypes == (DOT_INSTRUCTIONS[kind][1], "int8", "int32")


def tile_vectors(channels: int, lanes: int) -> int:
    """Vectors of output channels in a register tile: 32 channels with 16 or 8 lanes (x86), 16 with
    4 (Arm), fewer when they do not divide the channels."""
    return next(v for v in (32 // lanes // (1 if lanes > 4 else 2), 2, 1) if channels % (lanes * v) == 0)


def conv2d_nhwc_int8(sch: s_tir.Schedule, target) -> str | None:
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
    kind = dot_instruction(target, oc)
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

    epilogue = inline_epilogue(sch, conv)
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(
        conv, ("read", 1), lambda h, w, i, o: (o // block_oc, h, w, i // 4, o % block_oc, i % 4)
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
    parallel(sch, tile)
    sch.reverse_compute_at(epilogue, tile)
    init = sch.decompose_reduction(conv, kh_loop)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(w_i)
    sch.unroll(oc_v)
    sch.tensorize(oc_i, register_dot(kind))
    tail = loops_below(sch, epilogue, tile)
    width = vector_width(extent(sch, tail[-1]), 16) if tail else 0
    if width:
        sch.vectorize(sch.split(tail[-1], [None, width])[-1])
    return f"default rule: int8 conv2d NHWC ({kind})"


def conv2d_int8(sch: s_tir.Schedule, target) -> str | None:
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
    kind = dot_instruction(target, oc)
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

    epilogue = inline_epilogue(sch, conv)
    pack = sch.cache_read(conv, 1, "global")
    sch.transform_layout(
        conv, ("read", 1), lambda o, i, h, w: (o // block_oc, i // 4, h, w, o % block_oc, i % 4)
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


def matmul_int8(sch: s_tir.Schedule, target) -> str | None:
    """8-bit [.., M, K] x int8 [K, N] -> int32 (quantized dense layers) on the target's dot-product
    instruction (see conv2d_int8): `lanes` columns x 4 of K an instruction, a register tile of rows x
    column vectors, the weight repacked (N/lanes, K/4, lanes, 4) at build time."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint]
    if len(blocks) != 1:
        return None
    block = blocks[0]
    stmt = sch.get(block)
    kinds = iter_kinds(stmt)
    if not kinds.endswith("SSR") or "R" in kinds[:-1] or len(stmt.reads) != 2:
        return None
    if not multiplies_for_dot(stmt, target):
        return None
    b = stmt.reads[1].source
    *_, j_var, k_var = [iv.var for iv in stmt.iter_vars]
    b_idx = index_vars(stmt.reads[1])
    if len(b.shape) != 2 or b_idx[0] is None or not b_idx[0].same_as(k_var) or not b_idx[1].same_as(j_var):
        return None
    k, n = int(b.shape[0]), int(b.shape[1])
    kind = dot_instruction(target, n)
    if k % 4 or kind is None:
        return None
    lanes = DOT_INSTRUCTIONS[kind][0]
    _, registers = simd(target)
    *batch_loops, i_loop, j_loop, k_loop = sch.get_loops(block)
    vectors = choice("vectors", next(v for v in (4, 2, 1) if n % (lanes * v) == 0))
    if n % (lanes * vectors):
        return None
    rows = largest_divisor(extent(sch, i_loop), max(1, registers // 2 // vectors))

    epilogue = inline_epilogue(sch, block)
    pack = sch.cache_read(block, 1, "global")
    sch.transform_layout(block, ("read", 1), lambda kk, jj: (jj // lanes, kk // 4, jj % lanes, kk % 4))
    sch.annotate(pack, PREPROC, True)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    i_o, i_i = inner_split(sch, i_loop, rows, registers // vectors - 2)
    j_o, j_v, j_l = sch.split(j_loop, [None, vectors, lanes])
    k_o, k_i = sch.split(k_loop, [None, 4])
    sch.reorder(*batch_loops, i_o, j_o, k_o, i_i, j_v, j_l, k_i)
    tile = sch.fuse(*batch_loops, i_o, j_o)
    parallel(sch, tile)
    sch.reverse_compute_at(epilogue, tile)
    init = sch.decompose_reduction(block, k_o)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(i_i)
    sch.unroll(j_v)
    sch.tensorize(j_l, register_dot(kind))
    return f"default rule: int8 matmul ({kind})"


def vector_split(sch: s_tir.Schedule, loop, lanes: int):
    """Splits off an inner loop of vector_width iterations; None when there is no such width."""
    width = vector_width(extent(sch, loop), lanes)
    return sch.split(loop, [None, width]) if width else None


WINDOW_TILE = 8  # output vectors a windowed reduction accumulates at once


def windowed(sch: s_tir.Schedule, target, block, kind: str) -> str | None:
    """A reduction over a small window or axis per output element (depthwise conv, pooling, mean):
    the innermost output axis is vectorized with the reduction loops outside it, accumulating in
    registers, the epilogue fused; the other output axes run in parallel."""
    stmt = sch.get(block)
    kinds = iter_kinds(stmt)
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if spatial == 0 or "S" in kinds[spatial:]:
        return None
    lanes, _ = simd(target)
    loops = sch.get_loops(block)
    if len(loops) != len(kinds):
        return None
    producers = sch.get_producers(block)  # padding
    epilogue = inline_epilogue(sch, block)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")
    # Parallel over the leading output axes (batch, channels), rows and columns inside.
    lead = max(1, min(2, spatial - 1))
    outer = fuse(sch, loops[:lead])
    parallel(sch, outer)
    for producer in producers:  # the padded input
        source, padded = sch.get(producer).reads[0].source, sch.get(producer).writes[0].source
        if str(source.shape[-1]) == str(padded.shape[-1]):
            # The vectorized axis (channels, NHWC) is not padded: the window reads the input where it
            # lies, each vector all inside the border or all outside. Measured here on MobileNetV2's
            # depthwise convs: 0.44 ms in the model, against 0.86 padding each thread's rows first.
            sch.compute_inline(producer)
            continue
        sch.compute_at(producer, outer)  # pad the rows a thread reads (NCHW), by that thread
        split = vector_split(sch, sch.get_loops(producer)[-1], lanes)
        if split:
            sch.vectorize(split[1])
    rows = loops[lead : spatial - 1]
    split = vector_split(sch, loops[spatial - 1], lanes) if spatial > lead else None
    reductions = loops[spatial:]
    if split is None:
        sch.reverse_compute_at(epilogue, outer)
        return f"default rule: {kind}"
    col_o, col_v = split
    # `tile` vectors of neighbouring outputs along the next axis out (columns in NHWC, rows in NCHW)
    # accumulate at once: one accumulator waits on each FMA of its window in turn (measured here on a
    # padded 3x3 depthwise conv, 14x14x384 NHWC: 24 us with one accumulator, 21 with 7).
    tile = largest_divisor(extent(sch, rows[-1]), WINDOW_TILE) if rows and reductions else 1
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


def index_vars(region) -> list:
    """The block variables that index each dimension of a buffer access (None where not a plain var)."""
    return [r.min if isinstance(r.min, tirx.Var) else None for r in region.region]


def same_vars(indices: list, variables: list) -> bool:
    return all(i is not None and i.same_as(v) for i, v in zip(indices, variables, strict=True))


def matmul(sch: s_tir.Schedule, target) -> str | None:
    """Dense, matmul and batch matmul: C[.., i, j] += A[.., i, k] * B[.., k, j] (or B[.., j, k])."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint]
    if len(blocks) != 1:
        return None
    block = blocks[0]
    stmt = sch.get(block)
    kinds = iter_kinds(stmt)
    if not kinds.endswith("SSR") or "R" in kinds[:-1] or len(stmt.reads) != 2:
        return None
    *batch, i_var, j_var, k_var = [iv.var for iv in stmt.iter_vars]
    a_idx, b_idx = index_vars(stmt.reads[0]), index_vars(stmt.reads[1])
    # Both operands matrices (or stacks of them): A[.., i, k], B[.., k, j] or B[.., j, k]. A vector
    # operand (matrix x vector) has no such pair of axes.
    if len(a_idx) < 2 or len(b_idx) < 2 or not same_vars(a_idx[-2:], [i_var, k_var]):
        return None
    b_last = b_idx[-1]
    if not (same_vars(b_idx[-2:], [k_var, j_var]) or same_vars(b_idx[-2:], [j_var, k_var])):
        return None
    lanes, registers = simd(target)
    loops = sch.get_loops(block)
    if len(loops) != len(kinds):
        return None
    *batch_loops, i_loop, j_loop, k_loop = loops
    n = extent(sch, j_loop)
    width = vector_width(n, lanes)
    if not width:
        return None
    vectors = next((v for v in (4, 2, 1) if n % (v * width) == 0), 1)
    rows = largest_divisor(extent(sch, i_loop), max(1, registers // 2 // vectors))
    block_n = vectors * width

    epilogue = inline_epilogue(sch, block)
    # B repacked as (.., N / block_n, K, block_n): each tile streams one contiguous panel.
    pack = sch.cache_read(block, 1, "global")
    if b_last.same_as(j_var):
        sch.transform_layout(
            block, ("read", 1), lambda *ix: (*ix[:-2], ix[-1] // block_n, ix[-2], ix[-1] % block_n)
        )
    else:
        sch.transform_layout(
            block, ("read", 1), lambda *ix: (*ix[:-2], ix[-2] // block_n, ix[-1], ix[-2] % block_n)
        )
    sch.annotate(pack, PREPROC, True)
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "global")
    sch.set_scope(block, 0, "local")

    i_o, i_i = sch.split(i_loop, [None, rows])
    j_o, j_v, j_l = sch.split(j_loop, [None, vectors, width])
    sch.reorder(*batch_loops, i_o, j_o, k_loop, i_i, j_v, j_l)
    parallel(sch, sch.fuse(*batch_loops, i_o, j_o))
    tile = sch.get_loops(block)[0]
    sch.reverse_compute_at(epilogue, tile)
    sch.unroll(i_i)
    sch.unroll(j_v)
    sch.vectorize(j_l)
    init = sch.decompose_reduction(block, k_loop)
    sch.vectorize(sch.get_loops(init)[-1])
    tail = loops_below(sch, epilogue, tile)
    if tail:
        inner = sch.split(tail[-1], [None, width])[-1] if extent(sch, tail[-1]) % width == 0 else tail[-1]
        sch.vectorize(inner)
    return "default rule: batch matmul" if len(b_idx) > 2 else "default rule: matmul"


def transpose_in_vectors(sch: s_tir.Schedule, block, loops: list, lanes: int):
    """A transpose whose output's innermost axis is too short for a vector (NCHW to NHWC with 3
    channels: an image model's input): the vector loop is instead the axis innermost in the input,
    read in whole vectors and written with a stride, the axes after it unrolled (the 1x3x224x224
    input took 6 us, against 95 gathering lane by lane). Returns the loop outside the vectors (for
    the caller to run in parallel); None, the schedule unchanged, when no read has such an axis."""
    stmt = sch.get(block)
    if len(loops) != len(stmt.iter_vars):
        return None
    variables = [iv.var for iv in stmt.iter_vars]
    for read in stmt.reads:
        last = index_vars(read)[-1] if read.region else None
        if last is None:
            continue
        at = next((i for i, v in enumerate(variables) if v.same_as(last)), None)
        if at is None or at == len(loops) - 1:
            continue
        width = vector_width(extent(sch, loops[at]), lanes, minimum=4)
        inside = int(np.prod([extent(sch, loop) for loop in loops[at + 1 :]]))
        if not width or not 0 < inside <= 16:
            continue
        rest, inner = sch.split(loops[at], [None, width])
        sch.reorder(rest, *loops[at + 1 :], inner)
        for loop in loops[at + 1 :]:
            sch.unroll(loop)
        sch.vectorize(inner)
        return fuse(sch, [*loops[:at], rest])
    return None


def elementwise(sch: s_tir.Schedule, target) -> str | None:
    """Kernels of spatial blocks only (elementwise, broadcast, reshape, transpose): each remaining
    block after inlining runs its loops fused, parallel outside and vectorized inside."""
    root = sch.get_sblock("root")
    if any("R" in iter_kinds(sch.get(b)) for b in sch.get_child_blocks(root)):
        return None
    func = sch.mod["main"]
    for block in sch.get_child_blocks(root)[:-1]:
        if not is_output(func, sch.get(block).writes[0].source):
            try:
                sch.compute_inline(block)
            except RuntimeError:
                pass  # stays its own loop nest
    lanes, _ = simd(target)
    for block in sch.get_child_blocks(root):
        loops = sch.get_loops(block)
        if not loops:  # a 0-d result: one value, nothing to run in parallel or in vectors
            continue
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
    return "default rule: elementwise"


def reduction(sch: s_tir.Schedule, target) -> str | tuple[s_tir.Schedule, str] | None:
    """Softmax, layer norm and other row reductions (dlight's CPU rule), else a single reduction block
    with its epilogue (pooling, mean) as a windowed reduction."""
    from tvm.s_tir.dlight.cpu import Reduction

    root = sch.get_sblock("root")
    main = [b for b in sch.get_child_blocks(root) if "R" in iter_kinds(sch.get(b))]
    name = sch.get(main[0]).name_hint if len(main) == 1 else ""
    pooling = "pool" in name
    # Pooling and depthwise convolutions have a window per output, not a row: dlight would serialize
    # them in NHWC. dlight's loops are parallel: a small kernel's one reduction goes to windowed too.
    if not pooling and "conv2d" not in name and not (_serial.get() and len(main) == 1):
        scheduled = Reduction().apply(sch.mod["main"], target, False)
        if scheduled is not None:
            return scheduled, "default rule: row reduction"
    if len(main) != 1:
        return None
    kind = "pooling" if pooling else conv_kind(sch.get(main[0])) if "conv2d" in name else "reduction"
    return windowed(sch, target, main[0], kind)


def conv_kind(stmt) -> str:
    """ "conv2d", "grouped conv2d" or "depthwise conv2d", from a conv block's input and weights
    (NCHW with OIHW weights, or NHWC with HWIO)."""
    data, weight = (r.source.shape for r in stmt.reads[:2])
    nhwc = "nhwc" in stmt.name_hint
    channels, per_group = int(data[3 if nhwc else 1]), int(weight[2 if nhwc else 1])
    return "conv2d" if per_group == channels else "depthwise conv2d" if per_group == 1 else "grouped conv2d"


RULES = (
    conv2d_nhwc_int8,
    conv2d_int8,
    matmul_int8,
    winograd,
    conv2d_nhwc,
    conv2d,
    matmul,
    reduction,
    elementwise,
)

# The choices a tuning design space fixes, per rule; MetaSchedule samples the register tile's other
# side inside each (inner_split). The default rule is one point of these spaces.
SPACES = {
    conv2d_nhwc_int8: [{"vectors": v, "channels_outer": o} for v in (1, 2, 4) for o in (False, True)],
    matmul_int8: [{"vectors": v} for v in (1, 2, 4)],
}


def design_spaces(sch: s_tir.Schedule, target) -> list[s_tir.Schedule]:
    """MetaSchedule's design spaces for a kernel that a rule of SPACES schedules (the int8 kernels, on
    the target's dot-product instruction, which MetaSchedule's own rules do not use): one copy of
    `sch` per choice the rule takes, []  when no such rule fits (webapp.pipeline.stages.tune)."""
    serial = _serial.set(small(sch))
    try:
        for rule, choices in SPACES.items():
            spaces = [space for chosen in choices if (space := in_space(sch, target, rule, chosen))]
            if spaces:
                return spaces
        return []
    finally:
        _serial.reset(serial)


def in_space(sch: s_tir.Schedule, target, rule, chosen: dict) -> s_tir.Schedule | None:
    """A copy of `sch` scheduled by `rule` with the choices `chosen`; None when it does not fit."""
    space, copy = _space.set(chosen), sch.copy()
    try:
        return copy if rule(copy, target) is not None else None
    except Exception:  # a choice TVM refuses is left out of the spaces
        return None
    finally:
        _space.reset(space)


def failure(rule, error: Exception) -> str:
    """What a rule's failure on a kernel looks like in its label: the rule and the error's first line."""
    kind, lines = type(error).__name__, str(error).strip().splitlines()
    reason = kind if not lines else lines[0] if lines[0].startswith(kind) else f"{kind}: {lines[0]}"
    return f"{rule.__name__} rule failed: {reason[:100]}"


def schedule_kernel(func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """The kernel scheduled by the first rule that fits, labelled; unchanged (labelled naive) when
    none does. A rule that raises, whatever the error (TVM refusing its schedule, or a bug of the
    rule's own), leaves the kernel to the next rule, and the label says so, e.g.
    "default rule: elementwise (matmul rule failed: IndexError: ...)": it never fails the build."""
    rules = RULES
    if kind_of(target).gpu:
        if gpu_rules.bound_already(func):
            return func.with_attrs({"tirx.is_scheduled": True, SCHEDULE_ATTR: TVM_KERNEL})
        rules = gpu_rules.RULES
    try:
        probe = s_tir.Schedule(func)
        probe.get_sblock("root")
    except Exception:  # an opaque kernel (cumsum, sort, scatter: loops inside one block): no rule fits
        return func.with_attr(SCHEDULE_ATTR, "naive")
    serial = _serial.set(not kind_of(target).gpu and small(probe))
    try:
        return first_rule(func, target, rules)
    finally:
        _serial.reset(serial)


def first_rule(func: tirx.PrimFunc, target, rules) -> tirx.PrimFunc:
    failures = []
    for rule in rules:
        try:
            sch = s_tir.Schedule(func)
            result = rule(sch, target)
        except Exception as e:  # any failure of one rule leaves the kernel to the next
            failures.append(failure(rule, e))
            continue
        if result is None:
            continue
        sch, label = result if isinstance(result, tuple) else (sch, result)
        return sch.mod["main"].with_attrs(
            {"tirx.is_scheduled": True, SCHEDULE_ATTR: with_failures(label, failures)}
        )
    return func.with_attr(SCHEDULE_ATTR, with_failures("naive", failures))


def with_failures(label: str, failures: list[str]) -> str:
    return f"{label} ({'; '.join(failures)})" if failures else label


def is_scheduled(func) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled"))


@tvm.transform.module_pass(opt_level=0, name="PlaygroundDefaultSchedules")
def default_schedules(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Schedules every kernel not scheduled yet (tuned kernels keep their schedule)."""
    target = tvm.target.Target.current(allow_none=False)
    updates = {
        gv: schedule_kernel(func, target)
        for gv, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc) and not is_scheduled(func)
    }
    mod = mod.clone()  # the caller's module stays as it was
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def repacks_weights(func) -> bool:
    """Whether a kernel has weight repacking blocks (marked PREPROC by a rule, or by a tuning
    record's layout rewrite) for SplitLayoutRewritePreproc to move into a kernel of their own."""
    if not isinstance(func, tirx.PrimFunc):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # a kernel TVM cannot schedule has no such blocks
        return False
    return any(PREPROC in sch.get(b).annotations for b in blocks)


def split_weight_repacking(mod: tvm.IRModule) -> tvm.IRModule:
    """The weight repacking blocks of the kernels that have them moved into kernels of their own
    (`<name>_weight_prepack`), called before their kernel, which keeps its name (TVM's pass renames
    it `<name>_prepacked`; the graph, the tuning table and the kernel list then disagree). TVM's
    pass checks the form of every kernel and fails on some with no repacking at all (an opaque
    block, as a cumsum's), so it sees only the kernels that repack."""
    repacking = {gv for gv, f in mod.functions_items() if repacks_weights(f)}
    if not repacking:
        return mod
    others = [gv for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and gv not in repacking]
    split = mod.clone()
    for gv in others:
        del split[gv]
    split = relax.transform.SplitLayoutRewritePreproc()(split)
    prepacked = [gv for gv in split.get_global_vars() if gv.name_hint.endswith("_prepacked")]
    out = split.clone()
    left = {gv.name_hint for gv in split.get_global_vars()}
    for gv in [*prepacked, *repacking]:  # the kernels as they were are no longer called
        if gv.name_hint in left:
            del out[gv.name_hint]
    bb = relax.BlockBuilder(out)
    renamed = {gv: bb.add_func(split[gv], gv.name_hint.removesuffix("_prepacked")) for gv in prepacked}
    for gv in others:
        bb.update_func(gv, mod[gv])
    for gv, func in split.functions_items():
        if isinstance(func, relax.Function):
            bb.update_func(gv, rename_calls(func, renamed))
    return bb.get()


def rename_calls(func: relax.Function, renamed: dict) -> relax.Function:
    """The function calling the kernels `renamed` maps by their new GlobalVars."""

    @relax.expr_functor.mutator
    class Rename(relax.PyExprMutator):
        def visit_global_var_(self, gv):
            return renamed.get(gv, gv)

    return Rename().visit_expr(func)


def labels(mod: tvm.IRModule) -> dict[str, str]:
    """Kernel name -> how it was scheduled ("tuned", "default rule: ...", "naive")."""
    return {
        gv.name_hint: str(func.attrs.get(SCHEDULE_ATTR, TVM_KERNEL if is_scheduled(func) else "naive"))
        if func.attrs
        else "naive"
        for gv, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
