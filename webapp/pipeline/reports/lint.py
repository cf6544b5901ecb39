"""The kernel linter: each kernel checked for hazards that cost time, each finding with its evidence and
the code line it points at (a code view and a line of it, as the page numbers them).

What the build shows (`static_findings`, run by the inspect stage on each kernel's TIR and assembly):
- "naive": no schedule rule took the kernel: TVM's default schedule, serial and unvectorized;
- "scalar loop": a kernel with arithmetic whose innermost loops have no vector instruction;
- "int8 without the dot product": an int8 convolution or matmul whose assembly lacks the instruction the
  target's int8 kernels multiply with (vpdpbusd, sdot, vpmaddubsw ...);
- "allocation in a parallel loop": TVMBackendAllocWorkspace called inside a parallel lambda, a runtime
  allocation by every thread at every chunk;
- "call in a loop": a call to a named function inside an innermost loop (a libm `expf`, a `memset`);
- "matmul on the reduction rule": a matrix multiply scheduled as a plain reduction, one dot product at a
  time;
- "register spills": a GPU kernel that ptxas spills to local memory.
What the benchmark shows (`rate_findings`, from the timed kernels, in the facts):
- "far below sgemm": a convolution or matmul that takes at least 2% of a run at under a tenth of this
  machine's sgemm reference rate (results.sgemm, measured by the benchmark)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from webapp.asm import inner_loops

if TYPE_CHECKING:
    from webapp.asm import Dialect
    from webapp.targets import LLVMCPU, Target

HAZARDS = {
    "naive": "left on TVM's naive schedule",
    "scalar loop": "no vector instructions in its loops",
    "int8 without the dot product": "int8 without the target's multiply instruction",
    "allocation in a parallel loop": "a runtime allocation inside a parallel loop",
    "call in a loop": "a function call inside an inner loop",
    "matmul on the reduction rule": "a matmul on the reduction rule",
    "register spills": "register spills (ptxas)",
    "far below sgemm": "far below the sgemm reference for its flops",
    "unchecked": "not checked: the linter failed on it",
}
SLOW_SHARE = 0.02  # a kernel below this share of a run is not worth a finding for its rate
COUNTED_SHARE = 0.01  # the headline counts findings on kernels of at least this share of a run
SLOW_OF_SGEMM = 0.10
WEIGHTY = re.compile(r"conv2d|matmul|dense")  # the kernels whose rate is set against sgemm
# a direct call to a named function (libm's expf, memset); not TVM's error path (__tvm_set_raised), and
# not the calls through a register that launch the parallel lambdas outside any hot loop
CALL = re.compile(r"^\s+(callq?|bl)\s+(?!__tvm_set_raised)([A-Za-z_][\w.@]*)\s*$")


def finding(hazard: str, evidence: str, view: str | None = None, line: int | None = None) -> dict:
    return {"hazard": hazard, "title": HAZARDS[hazard], "evidence": evidence, "view": view, "line": line}


def findings_or_why(kernel: dict, tir: str, asm: str, target: Target) -> list[dict]:
    """static_findings, or where the linter fails on the kernel one finding that says so: it never
    fails the job."""
    try:
        return static_findings(kernel, tir, asm, target)
    except Exception as exc:
        return [finding("unchecked", f"the linter failed on it: {type(exc).__name__}: {exc}")]


def static_findings(kernel: dict, tir: str, asm: str, target: Target) -> list[dict]:
    """The hazards a kernel's build shows. `asm` is its assembly as the page shows it (filtered), so
    that a finding's line is the page's line; `kernel` its kernel-table row."""
    lines = asm.splitlines()
    loops = inner_loops(asm)
    arithmetic = bool(kernel.get("flop"))
    out = []
    if kernel.get("schedule") == "naive" and arithmetic:
        out.append(finding("naive", "no schedule rule took it: TVM's default, serial, unvectorized", "tir"))
    dialect = target.dialect
    if arithmetic and loops and dialect and not any(has_vectors(lines, span, dialect) for span in loops):
        first, last = max(loops, key=lambda span: span[1] - span[0])
        evidence = f"no vector register in its innermost loops; the longest: lines {first + 1}-{last + 1}"
        out.append(finding("scalar loop", evidence, "asm", first + 1))
    # a GPU's assembly is its host's
    # an assembly dialect is a CPU kind's (LLVMCPU)
    mnemonic = cast("LLVMCPU", target).int8_mnemonic() if dialect is not None and asm.strip() else None
    # a depthwise (grouped) convolution reduces over no input channels: a dot product has nothing to add up
    int8 = WEIGHTY.search(kernel["name"]) and re.search(r'"u?int8"', tir) and "group_conv2d" not in tir
    if mnemonic and int8 and not re.search(rf"^\s+{mnemonic}\b", asm, re.M):
        evidence = f"no {mnemonic} in its {len(lines):,} lines of assembly, though {target.name} has it"
        out.append(finding("int8 without the dot product", evidence, "asm"))
    if dialect is None:  # the host side's, which launches the kernels: no hot loops there
        loops, lines = [], []
    alloc = allocation_in_lambda(lines)
    if alloc:
        line, lambda_line = alloc
        evidence = f"TVMBackendAllocWorkspace at line {line}, in the parallel lambda at line {lambda_line}"
        out.append(finding("allocation in a parallel loop", evidence, "asm", line))
    calls = [(j, CALL.match(lines[j]), span) for span in loops for j in range(span[0], span[1] + 1)]
    call = next(((j, m, span) for j, m, span in calls if m), None)
    if call:
        j, m, (first, last) = call
        evidence = f"{m.group(1)} {m.group(2)} at line {j + 1}, in the loop of lines {first + 1}-{last + 1}"
        out.append(finding("call in a loop", evidence, "asm", j + 1))
    if "matmul" in kernel["name"] and "reduction" in kernel.get("schedule", ""):
        out.append(finding("matmul on the reduction rule", f"scheduled by '{kernel['schedule']}'", "tir"))
    spills = (kernel.get("gpu") or {}).get("spill_bytes")
    if spills:
        out.append(finding("register spills", f"ptxas: {spills:,} bytes of spill stores and loads", "sass"))
    return out


def has_vectors(lines: list[str], span: tuple[int, int], dialect: Dialect) -> bool:
    """Whether the lines of `span` hold an instruction on whole vectors (the dialect's `packed`)."""
    return any(dialect.packed.search(line) for line in lines[span[0] : span[1] + 1])


def allocation_in_lambda(lines: list[str]) -> tuple[int, int] | None:
    """(line of the call, line of the lambda), 1-based: TVMBackendAllocWorkspace inside a parallel
    lambda (from its label to the next function's)."""
    inside = None
    for i, line in enumerate(lines):
        if line.startswith(".L__tvm_parallel_lambda"):
            inside = i
        elif re.match(r"^[\w$][\w.$]*:", line):  # another function (not a local .L label)
            inside = None
        elif inside is not None and "TVMBackendAllocWorkspace" in line:
            return i + 1, inside + 1
    return None


def rate_findings(kernel: dict, sgemm: dict | None) -> list[dict]:
    """ "far below sgemm", from the kernel's measured ms (a share of the benchmark's median) and its
    flop, against the machine's sgemm reference at the same threads."""
    ms, flop, share = kernel.get("ms"), kernel.get("flop"), kernel.get("share") or 0
    if not (sgemm and ms and flop and share >= SLOW_SHARE and WEIGHTY.search(kernel["name"])):
        return []
    gflops = flop * kernel.get("calls", 1) / (ms * 1e-3) / 1e9
    if gflops >= SLOW_OF_SGEMM * sgemm["gflops"]:
        return []
    evidence = (
        f"{gflops:.1f} GFLOP/s, {100 * gflops / sgemm['gflops']:.0f}% of this machine's sgemm reference "
        f"({sgemm['gflops']:.0f} GFLOP/s at {sgemm['threads']} threads), in {100 * share:.0f}% of a run"
    )
    return [finding("far below sgemm", evidence, "tir")]


def summary(results: dict) -> dict | None:
    """Every kernel's findings (the build's and the benchmark's) and their counts, for the page's top
    line and its findings table; None before the inspect stage."""
    kernels = results.get("kernels")
    if not kernels:
        return None
    findings = [
        {"kernel": k["name"], **f, "share": k.get("share"), "counted": counted(k)}
        for k in kernels
        for f in [*(k.get("lint") or []), *rate_findings(k, results.get("sgemm"))]
    ]
    by_hazard: dict[str, int] = {}
    for f in findings:
        if f["counted"]:
            by_hazard[f["title"]] = by_hazard.get(f["title"], 0) + 1
    return {
        "count": sum(f["counted"] for f in findings),
        "kernels": len({f["kernel"] for f in findings if f["counted"]}),
        "checked": len(kernels),
        "by_hazard": sorted(by_hazard.items(), key=lambda kv: -kv[1]),
        "minor": sum(not f["counted"] for f in findings),  # listed, not counted
        "counted_share": COUNTED_SHARE,
        "findings": sorted(findings, key=lambda f: not f["counted"]),  # the counted first, in kernel order
    }


def counted(kernel: dict) -> bool:
    """Whether a kernel's findings count in the headline: it takes at least COUNTED_SHARE of a run, or
    its share was not measured (a build not profiled here: the findings may matter)."""
    share = kernel.get("share")
    return share is None or share >= COUNTED_SHARE
