"""Small helpers on TIR schedules that every family of schedule rules uses (CPU and GPU alike)."""

from __future__ import annotations

from tvm import s_tir, tirx


def extent(sch: s_tir.Schedule, loop) -> int:
    value = sch.get(loop).extent
    return int(value) if isinstance(value, tirx.IntImm) else -1


def vector_width(n: int, lanes: int, minimum: int = 2) -> int:
    """The widest of lanes, lanes/2, lanes/4 (at least `minimum`) that divides n; 0 when none does.
    Powers of two only: LLVM splits odd-width vectors into pieces."""
    return next((w for w in (lanes, lanes // 2, lanes // 4) if w >= minimum and n % w == 0), 0)


def fuse(sch: s_tir.Schedule, loops: list):
    """One loop for `loops` (the loop itself when there is one)."""
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def iter_kinds(block: tirx.SBlock) -> str:
    return "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in block.iter_vars)


def is_output(func: tirx.PrimFunc, buffer: tirx.Buffer) -> bool:
    return any(p.same_as(buffer) for p in func.params)


def inline_epilogue(sch: s_tir.Schedule, main) -> object | None:
    """Inlines the elementwise blocks after `main` into the block that writes the output, and returns
    that block (None when `main` writes the output itself). Raises when that is not possible."""
    func = sch.mod["main"]
    if is_output(func, sch.get(main).writes[0].source):
        return None
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    at = [i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(main))][0]
    for block in blocks[at + 1 :]:
        if not is_output(func, sch.get(block).writes[0].source):
            sch.compute_inline(block)
    consumers = sch.get_consumers(main)
    if len(consumers) != 1:
        raise ValueError("the result feeds more than one output")
    return consumers[0]
