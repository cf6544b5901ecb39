"""Static analysis of each kernel's hot loop with llvm-mca, LLVM's Machine Code Analyzer (Debian's
llvm-19): the loop's assembly (webapp.asm.loop_body: the innermost loop with the most arithmetic)
simulated on the scheduling model of the target's CPU (its `mcpu`: znver4, haswell, cortex-a72,
cortex-a76, sifive-x280 ...), 100 iterations. From its report: cycles per iteration, instructions per
cycle, and the bottleneck (the busiest execution port, data dependencies, or the dispatch width).

The kernel's predicted time: its operations (counted on the TIR as it executes them) divided by those
of one iteration of the hot loop (its multiply-add instructions, counted by their vector width: the
target's dialect), times the cycles per iteration, at the CPU's clock (this machine's for x86, the board's
nominal clock for an Arm board), shared among the threads as if they scaled perfectly. It assumes the
hot loop does all of the kernel's arithmetic from the L1 cache, and knows only the model's clock, not a
turbo: an estimate from the loop alone (ResNet-18 on this 2-core EPYC: 0.96-2.1x the measured times).
On an emulated board it is the honest per-kernel figure, since QEMU's times are not a real board's.

llvm-mca reads only the assembly text (it runs nothing); it still runs here, in the job's sandbox."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from webapp.asm import Dialect, loop_body, loop_ops
from webapp.catalog import code_file

if TYPE_CHECKING:
    from webapp.targets import Target

ITERATIONS = 100
TIMEOUT_S = 20  # a loop
BUDGET_S = 90  # all the kernels of a job: the rest are left unanalysed, said in their view


def tool() -> str | None:
    return shutil.which("llvm-mca-19") or shutil.which("llvm-mca")


def parse(report: str) -> dict:
    """The figures of llvm-mca's summary and bottleneck analysis."""

    def number(label: str) -> float | None:
        m = re.search(rf"^{label}:\s+([\d.]+)", report, re.M)
        return float(m.group(1)) if m else None

    iterations, cycles = number("Iterations"), number("Total Cycles")
    out: dict[str, float | str | None] = {
        "cycles_per_iteration": cycles / iterations if cycles and iterations else None,
        "instructions_per_iteration": (number("Instructions") or 0) / (iterations or 1),
        "ipc": number("IPC"),
        "uops_per_cycle": number("uOps Per Cycle"),
        "dispatch_width": number("Dispatch Width"),
        "block_rthroughput": number("Block RThroughput"),
    }
    out["limit"], out["bottleneck"] = bottleneck(report, out)
    return out


def bottleneck(report: str, figures: dict) -> tuple[str, str]:
    """(in a word or two, in a sentence): the resource (execution port) under the most pressure, data
    dependencies, or the dispatch width, as llvm-mca's bottleneck analysis finds them."""
    pressure = re.search(r"Resource Pressure\s+\[\s*([\d.]+)%\s*\]", report)
    data = re.search(r"Data Dependencies:\s+\[\s*([\d.]+)%\s*\]", report)
    if pressure or data:
        resource_share = float(pressure.group(1)) if pressure else 0.0
        data_share = float(data.group(1)) if data else 0.0
        if resource_share >= data_share:
            section = report[cast(re.Match[str], pressure).end() : data.start() if data else len(report)]
            units = re.findall(r"-\s+(\S+)\s+\[\s*([\d.]+)%\s*\]", section)
            if units:
                unit, share = max(units, key=lambda u: float(u[1]))
                return f"port {unit}", f"execution port {unit}, busy in {float(share):.0f}% of the cycles"
            return "resources", f"execution resources, {resource_share:.0f}% of the cycles"
        return "dependencies", f"data dependencies, waited on in {data_share:.0f}% of the cycles"
    uops, width = figures.get("uops_per_cycle"), figures.get("dispatch_width")
    if uops and width and uops >= 0.9 * width:
        return "dispatch", f"dispatch: {uops:.2f} of the {width:.0f} micro-ops a cycle the core can issue"
    return "none found", "none that llvm-mca finds: the loop issues below the core's width, no port busy"


def analyse(asm: str, dialect: Dialect, triple: str, cpu: str) -> tuple[dict | None, str]:
    """(figures, llvm-mca's report with its timeline) of the hot loop of a kernel's assembly as the page
    shows it (filtered); (None, why) when it has none or llvm-mca cannot read it."""
    mca = tool()
    if mca is None:
        return None, "llvm-mca is not installed on this server (Debian: apt-get install llvm-19)"
    found = loop_body(asm, dialect)
    if found is None:
        return None, "no loop with vector instructions in this kernel's assembly: nothing to analyse"
    body, span = found
    if not loop_ops(body, dialect) and loop_ops(asm, dialect):
        return None, "its multiply-adds are in no loop (unrolled whole): no loop holds its arithmetic"
    command = [mca, f"-mtriple={triple}", f"-mcpu={cpu}", f"-iterations={ITERATIONS}", "-bottleneck-analysis"]
    command += ["-timeline", "-timeline-max-iterations=2", "-timeline-max-cycles=120"]
    try:
        run = subprocess.run(command, input=body, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"llvm-mca took over {TIMEOUT_S} s on this loop"
    except OSError as exc:
        return None, f"llvm-mca did not start: {exc}"
    if run.returncode != 0:
        return None, f"llvm-mca could not read this loop: {run.stderr.strip()[:300]}"
    figures = parse(run.stdout)
    if figures["cycles_per_iteration"] is None:
        return None, "llvm-mca gave no cycle count for this loop"
    figures |= {"lines": list(span), "ops_per_iteration": loop_ops(body, dialect)}
    shown = " ".join([Path(mca).name, *command[1:]])
    header = f"{shown} <lines {span[0]}-{span[1]} of the kernel's assembly (the Assembly view marks them)\n\n"
    return figures, header + run.stdout


def predicted_ms(figures: dict, flop: float, calls: int, clock: float | None, threads: int) -> float | None:
    """The kernel's predicted ms per model run (all its calls): flop / ops per iteration iterations of
    the hot loop at its simulated cycles, at the clock, shared among the threads as if they scaled
    perfectly. None where the loop has no counted arithmetic, the kernel no flop count, or the clock
    is unknown."""
    ops = figures.get("ops_per_iteration")
    if not ops or not flop or not clock or not calls:
        return None
    return flop / ops * figures["cycles_per_iteration"] / (clock * 1e9) * calls * 1e3 / max(threads, 1)


def analyse_kernels(
    kernels: list[dict], texts: dict, job_dir: Path, target: Target, flop: dict, threads: int
) -> dict | None:
    """Each CPU kernel's hot loop analysed: `kernels` (the kernel table's rows) gain "mca", and each
    one's report is its "mca" code view. `texts`: each kernel's (TIR, assembly as the page shows it);
    `flop`: the operations each executes (a Winograd kernel's own, not the direct convolution's that
    the table counts); `threads`: the threads its runs use. Returns what the page says above the
    table (tool, cpu, clock, threads), None for a target llvm-mca does not model."""
    if target.dialect is None:
        return None
    cpu, clock, clock_source = target.mca_cpu()
    mca = tool()
    deadline = time.monotonic() + BUDGET_S
    for k in kernels:
        if time.monotonic() > deadline:
            figures, text = None, f"not analysed: llvm-mca's {BUDGET_S} s for this job's kernels were spent"
        else:
            try:
                figures, text = analyse(texts[k["name"]][1], target.dialect, target.mca_triple, cpu)
            except Exception as exc:  # an analysis that fails leaves the kernel unanalysed, never the job
                figures, text = None, f"llvm-mca's analysis failed: {type(exc).__name__}: {exc}"
        if figures is not None:
            ops = flop.get(k["name"]) or 0
            figures["predicted_ms"] = predicted_ms(figures, ops, k.get("calls") or 0, clock, threads)
            k["mca"] = figures
        (job_dir / code_file("mca", k["name"])).write_text(text if figures is not None else text + "\n")
    return {
        "tool": Path(mca).name if mca else None,
        "cpu": cpu,
        "clock_ghz": clock,
        "threads": threads,
        "clock_source": clock_source,
        "analysed": sum(1 for k in kernels if "mca" in k),
    }
