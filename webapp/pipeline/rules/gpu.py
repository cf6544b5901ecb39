"""Default GPU schedules: every kernel bound to GPU threads, the fast ones first.

A kernel that is not bound to blocks and threads does not compile for a GPU at all, so the last rule
(dlight's Fallback) binds whatever the others leave. In order:

- int8 convolutions and matmuls on CUDA (the quantized model's): one thread per output, the
  reduction over channels four at a time with `__dp4a` (4 int8 products summed into an int32);
- matmul, dense, batch matmul and regular conv2d (as an implicit GEMM: shared-memory tiles of the
  input windows and the weights): dlight's Matmul and GEMV rules;
- depthwise conv2d and pooling: one thread per output, its window read from global memory, the
  epilogue computed from the thread's register;
- softmax, layer norm and other row reductions: dlight's Reduction and GeneralReduction rules;
- elementwise, reshape, transpose: the producers inlined into the output, one thread per output
  element in order, so neighbouring threads write neighbouring addresses (coalesced);
- anything else: dlight's Fallback.

The labels follow the CPU rules' ("default rule: ...", with the rules that failed on a kernel).
TVM's own GPU kernels (sort and scan, dispatched by DispatchSortScan) arrive bound already.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.script import tirx as T
from tvm.tirx import IndexMap

from webapp.pipeline.rules.common import extent, fuse, has_reduction, inline_epilogue, is_output, iter_kinds

if TYPE_CHECKING:
    from tvm.ir import Range
    from tvm.s_tir.dlight import ScheduleRule
    from tvm.s_tir.schedule import LoopRV, SBlockRV

    from webapp.targets import Target
    from webapp.targets.gpu import GPU

THREADS = 256  # threads per block of the rules here (dlight picks its own)


def bind_threads(sch: s_tir.Schedule, loop: LoopRV, threads: int = THREADS) -> LoopRV:
    """`loop` spread over blocks of `threads` threads, consecutive iterations on consecutive threads;
    returns the thread loop."""
    n = extent(sch, loop)
    block_x, thread_x = sch.split(loop, [None, min(threads, n) if n > 0 else threads])
    sch.bind(block_x, "blockIdx.x")
    sch.bind(thread_x, "threadIdx.x")
    return thread_x


def blocks_of(sch: s_tir.Schedule) -> list[SBlockRV]:
    return sch.get_child_blocks(sch.get_sblock("root"))


def one_reduction(sch: s_tir.Schedule) -> tuple[SBlockRV | None, list[SBlockRV]]:
    """The kernel's single reduction block and the blocks before it; (None, []) unless one."""
    blocks = blocks_of(sch)
    reductions = [i for i, b in enumerate(blocks) if "R" in iter_kinds(sch.get(b))]
    if len(reductions) != 1:
        return None, []
    return blocks[reductions[0]], blocks[: reductions[0]]


def thread_per_output(sch: s_tir.Schedule, main: SBlockRV, producers: list[SBlockRV]) -> LoopRV:
    """Producers inlined, one thread per output of `main` with its reduction loops inside the thread,
    the epilogue computed per thread from a register. Returns the thread loop."""
    for block in producers:
        sch.compute_inline(block)
    consumer = inline_epilogue(sch, main)
    spatial = iter_kinds(sch.get(main)).count("S")
    thread = bind_threads(sch, fuse(sch, sch.get_loops(main)[:spatial]))
    if consumer is not None:
        sch.reverse_compute_at(consumer, thread)
        sch.set_scope(main, 0, "local")
    return thread


# ---------------------------------------------------------------- int8 with dp4a (CUDA)

DP4A = "playground_dp4a_s8s8s32_local"


@T.prim_func(s_tir=True)
def dp4a_desc(
    A: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="local"),
    B: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="local"),
    C: T.Buffer((1,), "int32", offset_factor=1, align=4, scope="local"),
) -> None:
    with T.sblock("root"):
        T.reads(C[0], A[0:4], B[0:4])
        T.writes(C[0])
        for i in range(0, 4):
            with T.sblock("update"):
                vi = T.axis.remap("R", [i])
                C[0] = C[0] + T.cast(A[vi], "int32") * T.cast(B[vi], "int32")


@T.prim_func(s_tir=True)
def dp4a_impl(
    A: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="local"),
    B: T.Buffer((4,), "int8", offset_factor=1, align=4, scope="local"),
    C: T.Buffer((1,), "int32", offset_factor=1, align=4, scope="local"),
) -> None:
    with T.sblock("root"):
        T.reads(C[0], A[0:4], B[0:4])
        T.writes(C[0])
        C[0] += T.call_pure_extern(
            "__dp4a", A.vload([0], "int8x4"), B.vload([0], "int8x4"), T.int32(0), dtype="int32"
        )


# TVM's own dp4a intrinsics take their operands from shared memory; these take them from registers.
s_tir.TensorIntrin.register(DP4A, dp4a_desc, dp4a_impl, override=True)


def region_axis(region: Sequence[Range], var: tirx.Var) -> int | None:
    """The axis of a buffer region indexed by `var` alone (None when no axis is)."""
    for axis, r in enumerate(region):
        if isinstance(r.min, tirx.Var) and r.min.same_as(var):
            return axis
    return None


def permutation(perm: list[int]) -> Callable[..., list]:
    return lambda *indices: [indices[p] for p in perm]


def int8_dp4a(sch: s_tir.Schedule, target: GPU) -> str | None:
    """int8 x int8 -> int32 convolutions and matmuls on CUDA: a thread per output, the innermost
    reduction (the channels, in the NHWC / HWIO layout the quantizer picks) four at a time."""
    if target.int8_dot != "dp4a":
        return None
    main, producers = one_reduction(sch)
    if main is None:
        return None
    stmt = sch.get(main)
    if len(stmt.reads) != 2 or [str(r.source.dtype) for r in stmt.reads] != ["int8", "int8"]:
        return None
    if str(stmt.writes[0].source.dtype) != "int32":
        return None
    reduce_vars = [iv for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    # the innermost reduction both operands index directly, in fours
    chosen = [
        i
        for i, iv in enumerate(reduce_vars)
        if int(iv.dom.extent) % 4 == 0 and all(region_axis(r.region, iv.var) is not None for r in stmt.reads)
    ]
    if not chosen:
        return None
    j = chosen[-1]
    axes = [region_axis(r.region, reduce_vars[j].var) for r in stmt.reads]
    # the operands' copies in registers, the reduced axis last (four adjacent int8: one 32-bit word)
    caches = [sch.cache_read(main, k, "local") for k in range(2)]
    for block in producers:  # a padding now feeds the input's copy
        sch.compute_inline(block)
    for cache, axis, read in zip(caches, axes, stmt.reads, strict=True):
        assert axis is not None  # chosen: every read indexes the reduced axis
        ndim = len(read.source.shape)
        if axis != ndim - 1:
            perm = [*range(axis), *range(axis + 1, ndim), axis]
            index_map = IndexMap.from_func(permutation(perm), ndim=ndim)
            sch.transform_layout(cache, ("write", 0), index_map)
    # the sums in a register, written out (through the epilogue) by the thread that made them
    consumer = inline_epilogue(sch, main)
    if consumer is None:
        consumer = sch.cache_write(main, 0, "local")
    else:
        sch.set_scope(main, 0, "local")
    loops = sch.get_loops(main)
    spatial, reduce_loops = loops[: len(loops) - len(reduce_vars)], loops[len(loops) - len(reduce_vars) :]
    sch.reverse_compute_at(consumer, spatial[-1])
    outer, inner = sch.split(reduce_loops[j], [None, 4])
    sch.reorder(outer, *reduce_loops[j + 1 :], inner)
    above = sch.get_loops(main)[-2]
    for cache in caches:
        sch.compute_at(cache, above)
    dot = sch.blockize(inner)  # the four products of one dp4a, a block of their own
    bind_threads(sch, fuse(sch, spatial))
    sch.decompose_reduction(dot, reduce_loops[0] if j else outer)
    sch.tensorize(dot, DP4A)
    return "default rule: int8 dot product (dp4a)"


# ---------------------------------------------------------------- windows, elementwise


def windowed(sch: s_tir.Schedule, target: Target) -> str | None:
    """Depthwise conv2d and pooling: one thread per output, its window read from global memory."""
    main, producers = one_reduction(sch)
    if main is None:
        return None
    stmt = sch.get(main)
    name = stmt.name_hint
    if "pool" in name:
        kind = "pooling"
    elif "conv2d" in name and len(stmt.reads) == 2:
        weight = stmt.reads[1].source.shape
        in_channels = weight[1] if "nchw" in name else weight[2] if "nhwc" in name else None
        if in_channels is None or int(in_channels) != 1:
            return None
        kind = "depthwise conv2d"
    else:
        return None
    thread_per_output(sch, main, producers)
    return f"default rule: {kind} (GPU, a thread per output)"


def elementwise(sch: s_tir.Schedule, target: Target) -> str | None:
    """No reduction: everything inlined into the one output, one thread per element in order."""
    if has_reduction(sch):
        return None
    blocks = blocks_of(sch)
    func = sch.mod["main"]
    outputs = [b for b in blocks if is_output(func, sch.get(b).writes[0].source)]
    if len(outputs) != 1:
        return None
    for block in blocks:
        if not sch.get(block).same_as(sch.get(outputs[0])):
            sch.compute_inline(block)
    loops = sch.get_loops(outputs[0])
    if not loops:
        return None
    bind_threads(sch, fuse(sch, loops))
    return "default rule: elementwise (GPU, coalesced)"


# ---------------------------------------------------------------- dlight's rules


def from_dlight(
    rule: ScheduleRule, label: str
) -> Callable[[s_tir.Schedule, Target], tuple[s_tir.Schedule, str] | None]:
    def apply(sch: s_tir.Schedule, target: Target) -> tuple[s_tir.Schedule, str] | None:
        scheduled = rule.apply(sch.mod["main"], target.tvm, False)
        if isinstance(scheduled, list):
            scheduled = scheduled[0] if scheduled else None
        return None if scheduled is None else (scheduled, label)

    apply.__name__ = label.removeprefix("dlight rule: ").split(" ")[0]
    return apply


def matmul_label(sch: s_tir.Schedule, target: Target) -> tuple[s_tir.Schedule, str] | None:
    """dlight's Matmul, labelled an implicit GEMM where the kernel is a convolution."""
    main, _ = one_reduction(sch)
    conv = main is not None and "conv" in sch.get(main).name_hint
    label = "dlight rule: implicit GEMM (shared-memory tiles)" if conv else "dlight rule: matmul"
    return from_dlight(dlight.gpu.Matmul(), label)(sch, target)


matmul_label.__name__ = "matmul"

RULES = (
    int8_dp4a,
    matmul_label,
    from_dlight(dlight.gpu.GEMV(), "dlight rule: GEMV"),
    windowed,
    from_dlight(dlight.gpu.Reduction(), "dlight rule: reduction"),
    from_dlight(dlight.gpu.GeneralReduction(), "dlight rule: general reduction"),
    elementwise,
    from_dlight(dlight.gpu.Fallback(), "dlight rule: fallback"),
)


def bound_already(func: tirx.PrimFunc) -> bool:
    """Whether a kernel binds GPU threads itself (TVM's GPU sort and scan kernels)."""
    text = func.script()
    return "T.launch_thread" in text or "T.thread_binding" in text
