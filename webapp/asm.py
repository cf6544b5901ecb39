"""Reading a kernel's assembly, with the standard library alone: the text as Compiler Explorer shows it
(filter_asm), its innermost loops, the hot one, that loop's instructions and the arithmetic one
iteration does. The sandboxed pipeline reads its kernels with it (the hot loop each kernel's row says,
llvm-mca's input, the linter's loops); the web shows what the pipeline found.

What differs between instruction sets is a Dialect, which each CPU kind of target gives
(webapp/targets: its `dialect`): its comment sign, its vector registers, its calls and returns, and how
many operations an instruction does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison


@dataclass(frozen=True)
class Dialect:
    name: str  # the architecture, as the target says it
    comment: str  # what starts a comment
    vector: re.Pattern  # a vector register among an instruction's operands
    call: re.Pattern  # a call or return: a span that holds one is an error path, not a loop
    packed: re.Pattern  # an instruction on whole vectors (not a scalar in a vector register)
    # the arithmetic operations of a run of instructions, each as (mnemonic, operands): a multiply-add
    # counts two, times its vector's lanes, as the kernels' flop counts do; the rest count 0
    ops: Callable[[list[tuple[str, str]]], float]


def per_instruction(op: Callable[[str, str], float]) -> Callable[[list[tuple[str, str]]], float]:
    """A Dialect's `ops` for an instruction set whose instructions each say their own operations
    (`op(mnemonic, operands)`), with no state carried from one to the next (RISC-V's vsetvli is)."""
    return lambda instructions: sum(op(mnemonic, operands) for mnemonic, operands in instructions)


LABEL = re.compile(r"^([.\w$]+):")
DIRECTIVE = re.compile(r"^\s*\.[a-zA-Z_]\w*\b")
LOCAL_LABEL = re.compile(r"\.L[\w$.]+")
# a jump to a basic block: an instruction whose last operand is the block's label (x86 `jne .LBB0_3`,
# Arm `b.ne .LBB0_3` and `cbnz x8, .LBB0_3`, RISC-V `bnez a0, .LBB0_3`)
JUMP = re.compile(r"^\s+\S+\s+(?:[^#/]*,\s*)?(\.LBB[\w$.]+)\s*(?:(?:#|//).*)?$")


def filter_asm(text: str) -> str:
    """The assembly without assembler directives (.cfi_*, .p2align, .type, ...) and without the local
    labels nothing jumps to (.Ltmp*, .Lfunc_end*): what Compiler Explorer shows by default."""
    lines = text.splitlines()
    return "\n".join(lines[i] for i in kept_lines(text)) + "\n"


def kept_lines(text: str) -> list[int]:
    """The indexes (0-based) of the lines filter_asm keeps."""
    lines = text.splitlines()
    code = [line for line in lines if not LABEL.match(line) and not DIRECTIVE.match(line)]
    used = {label for line in code for label in LOCAL_LABEL.findall(line)}
    out = []
    for i, line in enumerate(lines):
        label = LABEL.match(line)
        if label:
            if label.group(1).startswith(".L") and label.group(1) not in used:
                continue
        elif DIRECTIVE.match(line):
            continue
        out.append(i)
    return out


def inner_loops(text: str) -> list[tuple[int, int]]:
    """The innermost loops of an assembly text: (first, last) line indexes (0-based) of a label and the
    last jump back up to it, with no other such loop inside."""
    lines = text.splitlines()
    last_jump = {}  # label -> the last line that jumps to it
    for j, line in enumerate(lines):
        jump = JUMP.match(line)
        if jump:
            last_jump[jump.group(1)] = j
    loops = []
    for i, line in enumerate(lines):
        label = LABEL.match(line)
        if label and label.group(1).startswith(".L") and last_jump.get(label.group(1), -1) > i:
            loops.append((i, last_jump[label.group(1)]))
    return [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]


def vector_lines(lines: list[str], dialect: Dialect) -> int:
    """How many of the lines use a vector register."""
    return sum(1 for line in lines if dialect.vector.search(line.split(dialect.comment)[0]))


def hot_loop(
    text: str, dialect: Dialect, weight: Callable[[list[str]], SupportsRichComparison] | None = None
) -> tuple[int, int] | None:
    """The lines (1-based, inclusive) of the kernel's hot loop: of its innermost loops with vector
    instructions, the one with the most, or the greatest `weight(lines)` where given; None when the code
    has no loop with vector instructions."""
    lines = text.splitlines()
    inner = [span for span in inner_loops(text) if vector_lines(lines[span[0] : span[1] + 1], dialect)]
    key = weight or (lambda span_lines: vector_lines(span_lines, dialect))
    best = max(inner, key=lambda span: key(lines[span[0] : span[1] + 1]), default=None)
    return (best[0] + 1, best[1] + 1) if best else None


def instructions(lines: list[str], dialect: Dialect) -> list[str]:
    """The instructions among assembly lines: labels, directives and comments left out."""
    body = [line.split(dialect.comment)[0].rstrip() for line in lines]
    return [line for line in body if line[:1] in (" ", "\t") and line.strip()[:1] not in ("", ".")]


def loop_ops(body: str, dialect: Dialect) -> float:
    """The arithmetic operations of one pass through `body` (instructions): 0 when it has none counted."""
    parts = [line.split(None, 1) for line in body.splitlines() if line.strip()]
    return dialect.ops([(p[0], p[1] if len(p) > 1 else "") for p in parts])


def loop_body(text: str, dialect: Dialect) -> tuple[str, tuple[int, int]] | None:
    """The hot loop's instructions, and its lines (1-based) in `text` (filtered by filter_asm): the
    loop with the most arithmetic (a convolution's, not its padding copy's), then the most lines. None
    when the kernel has no loop with vector instructions, or the span found holds a call or a return."""

    def weight(lines: list[str]) -> tuple[float, int]:
        return loop_ops("\n".join(instructions(lines, dialect)), dialect), len(lines)

    span = hot_loop(text, dialect, weight)
    if span is None:
        return None
    body = instructions(text.splitlines()[span[0] - 1 : span[1]], dialect)
    if any(dialect.call.match(line) for line in body):
        return None
    return "\n".join(body) + "\n", span
