"""Small helpers on TIR schedules that every family of schedule rules uses (CPU and GPU alike)."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from tvm import s_tir, tirx

from webapp.targets import Target

if TYPE_CHECKING:
    from tvm.s_tir.schedule import LoopRV, SBlockRV

ChoiceT = TypeVar("ChoiceT")


def extent(sch: s_tir.Schedule, loop: LoopRV) -> int:
    value = sch.get(loop).extent
    return int(value) if isinstance(value, tirx.IntImm) else -1


def vector_width(n: int, lanes: int, minimum: int = 2) -> int:
    """The widest of lanes, lanes/2, lanes/4 (at least `minimum`) that divides n; 0 when none does.
    Powers of two only: LLVM splits odd-width vectors into pieces."""
    return next((w for w in (lanes, lanes // 2, lanes // 4) if w >= minimum and n % w == 0), 0)


def fuse(sch: s_tir.Schedule, loops: list[LoopRV]) -> LoopRV:
    """One loop for `loops` (the loop itself when there is one)."""
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def iter_kinds(block: s_tir.SBlock) -> str:
    return "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in block.iter_vars)


def has_reduction(sch: s_tir.Schedule) -> bool:
    """Whether a block of the kernel (a child of its root) reduces."""
    return any("R" in iter_kinds(sch.get(b)) for b in sch.get_child_blocks(sch.get_sblock("root")))


def one_matmul_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The kernel's one matmul block, C[.., i, j] += A[.., i, k] * B[.., k, j] (or B[.., j, k]): its
    spatial loops then one reduction, two operands; None where the kernel has none or several."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint]
    if len(blocks) != 1:
        return None
    stmt = sch.get(blocks[0])
    kinds = iter_kinds(stmt)
    if not kinds.endswith("SSR") or "R" in kinds[:-1] or len(stmt.reads) != 2:
        return None
    return blocks[0]


def is_output(func: tirx.PrimFunc, buffer: tirx.Buffer) -> bool:
    return any(p.same_as(buffer) for p in func.params)


# The most an inlined expression may grow a consumer's body to (its printed TIR, in characters).
# A block read several times by its consumer (fast_exp reads its input five times) copies itself
# into each read: a chain of 300 sigmoids inlined into one another grew without bound (the build
# ran out of memory after minutes). Past this the block stays a loop nest of its own.
MAX_INLINED_CHARS = 20_000


def inline(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """sch.compute_inline, unless inlining would grow a consumer's expression past
    MAX_INLINED_CHARS; then it raises RuntimeError, as compute_inline does for a block it cannot
    inline."""
    stmt = sch.get(block)
    if not isinstance(stmt.body, tirx.BufferStore):
        sch.compute_inline(block)  # TVM says why not
        return
    produced, size = stmt.writes[0].source, len(str(stmt.body.value))
    for consumer in sch.get_consumers(block):
        body = str(sch.get(consumer).body)
        reads = body.count(f"{produced.name}[")
        if len(body) + reads * size > MAX_INLINED_CHARS:
            raise RuntimeError(f"inlining {stmt.name_hint} would grow {sch.get(consumer).name_hint} too far")
    sch.compute_inline(block)


def inline_epilogue(sch: s_tir.Schedule, main: SBlockRV) -> SBlockRV | None:
    """Inlines the elementwise blocks after `main` into the block that writes the output, and returns
    that block (None when `main` writes the output itself). Raises when that is not possible. Blocks
    before `main` that only the epilogue reads are inlined into it too where they can be: left apart,
    they keep the epilogue from moving into main's loops (an LSTM step's matmul, whose epilogue adds a
    squeezed slice of the input projection, fell to a slower rule). Blocks that feed main, directly or
    not, stay (a Winograd transform inlined into its batched matmul is computed again for every
    output channel)."""
    func = sch.mod["main"]
    if is_output(func, sch.get(main).writes[0].source):
        return None
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    at = [i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(main))][0]
    after = {sch.get(b).name_hint for b in blocks[at + 1 :]}  # by name: inlining remakes a block
    for block in reversed(blocks[:at]):  # the last first: its readers are known by then
        readers = sch.get_consumers(block)
        if readers and all(sch.get(r).name_hint in after for r in readers):
            written = sch.get(block).writes[0].source
            if not is_output(func, written):
                try:
                    inline(sch, block)
                except Exception:  # noqa: BLE001 - left where it is: then the epilogue may not move
                    continue
    for block in blocks[at + 1 :]:
        if not is_output(func, sch.get(block).writes[0].source):
            inline(sch, block)
    consumers = sch.get_consumers(main)
    if len(consumers) != 1:
        raise ValueError("the result feeds more than one output")
    return consumers[0]


PREPROC = "meta_schedule.layout_rewrite_preproc"  # blocks SplitLayoutRewritePreproc moves out


def simd(target: Target) -> tuple[int, int]:
    """(float32 lanes per vector register, number of vector registers): the target says."""
    return target.vector_shape()


def loops_below(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> list[LoopRV]:
    """The loops of `block` nested inside `loop`."""
    loops = sch.get_loops(block)
    at = [i for i, candidate in enumerate(loops) if sch.get(candidate).same_as(sch.get(loop))]
    return loops[at[0] + 1 :] if at else []


SERIAL_FLOPS, SERIAL_ELEMENTS = 1 << 19, 1 << 13  # a kernel under both runs on one thread


# Waking the other threads and joining them costs a few microseconds a parallel loop, and more when
# the thread pool's workers have gone to sleep: the mlp example's three kernels (0.4 MFLOP in all)
# took 13 us on one thread, and 9 to 24 us on two from one process to the next, measured here.
serial_kernel = contextvars.ContextVar("serial", default=False)


def parallel(sch: s_tir.Schedule, loop: LoopRV) -> None:
    """sch.parallel(loop), unless the kernel being scheduled is too small to pay for its threads."""
    if not serial_kernel.get():
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


def parallel_outer(sch: s_tir.Schedule, block: SBlockRV, count: int) -> LoopRV:
    outer = fuse(sch, sch.get_loops(block)[:count])
    parallel(sch, outer)
    return outer


space_choices: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "space", default=None
)  # a tuning design space's choices (design_spaces)


def choice(name: str, default: ChoiceT) -> ChoiceT:
    """A rule's discrete choice (a loop order, a register tile's vectors): `default`, or in a tuning
    design space the one that space stands for."""
    space = space_choices.get()
    return default if space is None else space.get(name, default)


def inner_split(sch: s_tir.Schedule, loop: LoopRV, default: int, limit: int) -> list[LoopRV]:
    """`loop` split into (outer, inner): `default` inner iterations, or in a tuning design space an
    inner factor MetaSchedule samples, a divisor from 2 to `limit`. Not 1: the epilogue computed at
    the outer loop would then have one loop fewer, and MetaSchedule's replay of the space's trace
    fails on that (its perfect-tile sampling can draw 1)."""
    if space_choices.get() is None:
        return sch.split(loop, [None, default])
    n = extent(sch, loop)
    factors = [d for d in range(2, limit + 1) if n % d == 0] or [default]
    return sch.split(loop, [None, sch.sample_categorical(factors, [1 / len(factors)] * len(factors))])


def register_tile(width: int, blocks: int, accumulators: int) -> tuple[int, int]:
    """(vectors, columns) of an NHWC conv's register tile: columns dividing the output width, vectors
    dividing the output channels' `blocks` of one vector, at most `accumulators` of them, with the
    most FMAs per load (each step loads one input value per column and one weight vector per vector:
    MobileNetV2's 144 channels take 3 vectors x 4 columns, 1.7 FMAs a load, not 1 x 14, 0.9)."""
    options = [(v, largest_divisor(width, accumulators // v)) for v in range(1, 5) if blocks % v == 0]
    return max(options, key=lambda o: (o[0] * o[1] / (o[0] + o[1]), o[0]))


def finish_register_tile(
    sch: s_tir.Schedule,
    block: SBlockRV,
    tile: LoopRV,
    epilogue: SBlockRV,
    unrolled: list[LoopRV],
    vector: LoopRV,
    reduction: LoopRV,
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


def vector_split(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> list[LoopRV] | None:
    """Splits off an inner loop of vector_width iterations; None when there is no such width."""
    width = vector_width(extent(sch, loop), lanes)
    return sch.split(loop, [None, width]) if width else None
