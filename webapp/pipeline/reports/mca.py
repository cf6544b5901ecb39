"""Static analysis of each kernel's hot loop with llvm-mca, LLVM's Machine Code Analyzer (Debian's
llvm-19): the loop's assembly (webapp.codeviews.hot_loop: the innermost loop with the most vector
instructions) simulated on the scheduling model of the target's CPU (its `mcpu`: znver4, haswell,
cortex-a72, cortex-a76 ...), 100 iterations. From its report: cycles per iteration, instructions per
cycle, and the bottleneck (the busiest execution port, data dependencies, or the dispatch width).

The kernel's predicted time: its operations (counted on the TIR as it executes them) divided by those
of one iteration of the hot loop (its multiply-add instructions, counted by their vector width: OPS
below), times the cycles per iteration, at the CPU's clock (this machine's for x86, the board's
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

from webapp.catalog import code_file
from webapp.codeviews import hot_loop

ITERATIONS = 100
TIMEOUT_S = 20  # a loop
BUDGET_S = 90  # all the kernels of a job: the rest are left unanalysed, said in their view
MAX_FREQ = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"  # kHz

# Operations per instruction (a multiply-add counts as two, as the kernel's flop count does), by the
# instruction and its vector: x86 by the register (xmm, ymm, zmm bits / element bits), Arm by the
# destination's arrangement (.4s: 4 lanes). An int8 dot product counts its 4 multiply-adds per lane.
X86_OPS = {  # mnemonic pattern -> (element bits, operations per element)
    r"vf(n)?m(add|sub)\d+p[s]": (32, 2),
    r"vf(n)?m(add|sub)\d+p[d]": (64, 2),
    r"vf(n)?m(add|sub)\d+s[s]": (None, 2),
    r"vpdpbusds?": (32, 8),
    r"vpdpwssds?": (32, 4),
    r"vpmaddubsw": (8, 2),  # u8 x s8 products summed in pairs: one multiply-add per byte
}
ARM_OPS = {  # mnemonic -> operations per destination lane
    "fmla": 2,
    "fmls": 2,
    "sdot": 8,
    "udot": 8,
    "smmla": 16,  # 2x8 by 8x2 into 2x2: 8 multiply-adds per int32 lane
    "ummla": 16,
    "smull": 2,
    "smull2": 2,
    "smlal": 2,
    "smlal2": 2,
    "umull": 2,
    "umlal": 2,
}
X86_WIDTH = {"xmm": 128, "ymm": 256, "zmm": 512}


def tool() -> str | None:
    return shutil.which("llvm-mca-19") or shutil.which("llvm-mca")


def loop_body(text: str, arch: str) -> tuple[str, tuple[int, int]] | None:
    """The hot loop's instructions (labels, directives and comments left out), and its lines (1-based)
    in the kernel's assembly as the page shows it (`text`, filtered by codeviews.filter_asm); None when
    the kernel has no loop with vector instructions, or the span found holds a call or a return (error
    paths, not a loop)."""
    comment = "//" if arch == "aarch64" else "#"

    def instructions(lines: list[str]) -> list[str]:
        body = [line.split(comment)[0].rstrip() for line in lines]
        return [line for line in body if line[:1] in (" ", "\t") and line.strip()[:1] not in ("", ".")]

    # the loop with the most multiply-adds (a conv's, not its padding copy's), then the most lines
    span = hot_loop(text, lambda lines: (loop_ops("\n".join(instructions(lines)), arch), len(lines)))
    if span is None:
        return None
    body = instructions(text.splitlines()[span[0] - 1 : span[1]])
    if any(re.match(r"\s+(callq?|retq?|bl|blr|br)\b", line) for line in body):
        return None
    return "\n".join(body) + "\n", span


def loop_ops(body: str, arch: str) -> float:
    """The arithmetic operations of one iteration of the loop (OPS above); 0 when it has none counted."""
    total = 0.0
    for line in body.splitlines():
        parts = line.split(None, 1)
        if not parts:
            continue
        mnemonic, operands = parts[0], parts[1] if len(parts) > 1 else ""
        if arch == "aarch64":
            per_lane = ARM_OPS.get(mnemonic)
            lanes = re.match(r"\s*v\d+\.(\d+)[bhsd]", operands)
            if per_lane and lanes:
                total += per_lane * int(lanes.group(1))
            continue
        for pattern, (bits, per_element) in X86_OPS.items():
            if re.fullmatch(pattern, mnemonic):
                register = re.findall(r"%([xyz]mm)\d+", operands)
                width = X86_WIDTH[register[-1]] if register else 128
                total += per_element * (width // bits if bits else 1)
                break
    return total


def parse(report: str) -> dict:
    """The figures of llvm-mca's summary and bottleneck analysis."""

    def number(label: str) -> float | None:
        m = re.search(rf"^{label}:\s+([\d.]+)", report, re.M)
        return float(m.group(1)) if m else None

    iterations, cycles = number("Iterations"), number("Total Cycles")
    out = {
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
            section = report[pressure.end() : data.start() if data else len(report)]
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


def analyse(asm: str, triple: str, cpu: str) -> tuple[dict | None, str]:
    """(figures, llvm-mca's report with its timeline) of the hot loop of a kernel's assembly as the page
    shows it (filtered); (None, why) when it has none or llvm-mca cannot read it."""
    mca = tool()
    if mca is None:
        return None, "llvm-mca is not installed on this server (Debian: apt-get install llvm-19)"
    arch = "aarch64" if triple.startswith("aarch64") else "x86_64"
    found = loop_body(asm, arch)
    if found is None:
        return None, "no loop with vector instructions in this kernel's assembly: nothing to analyse"
    body, span = found
    if not loop_ops(body, arch) and loop_ops(asm, arch):
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
    figures |= {"lines": list(span), "ops_per_iteration": loop_ops(body, arch)}
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


def host_clock_ghz() -> float | None:
    """This machine's clock: its cores' top frequency where the kernel says it (cpufreq), else
    /proc/cpuinfo's first `cpu MHz` (the current one; a virtual machine reports its nominal clock)."""
    try:
        return int(Path(MAX_FREQ).read_text()) / 1e6
    except (OSError, ValueError):
        pass
    try:
        m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) / 1000 if m else None


def analyse_kernels(
    kernels: list[dict], texts: dict, job_dir: Path, target, flop: dict, threads: int
) -> dict | None:
    """Each CPU kernel's hot loop analysed: `kernels` (the kernel table's rows) gain "mca", and each
    one's report is its "mca" code view. `texts`: each kernel's (TIR, assembly as the page shows it);
    `flop`: the operations each executes (a Winograd kernel's own, not the direct convolution's that
    the table counts); `threads`: the threads its runs use. Returns what the page says above the
    table (tool, cpu, clock, threads), None for a target llvm-mca does not model."""
    if getattr(target, "arch", None) not in ("x86_64", "aarch64"):
        return None
    triple = "aarch64-linux-gnu" if target.arch == "aarch64" else "x86_64-linux-gnu"
    cpu = str(target.tvm.attrs.get("mcpu", "generic"))
    clock = target.clock_ghz or (host_clock_ghz() if target.arch == "x86_64" else None)
    mca = tool()
    deadline = time.monotonic() + BUDGET_S
    for k in kernels:
        if time.monotonic() > deadline:
            figures, text = None, f"not analysed: llvm-mca's {BUDGET_S} s for this job's kernels were spent"
        else:
            try:
                figures, text = analyse(texts[k["name"]][1], triple, cpu)
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
        "clock_source": "the board's nominal clock"
        if target.clock_ghz
        else "this machine's, as Linux reports it",
        "analysed": sum(1 for k in kernels if "mca" in k),
    }
