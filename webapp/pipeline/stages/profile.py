"""Where a build's run time goes: each compiled kernel's calls timed by the VM's instrument hook and
the VM's own work between them (`profile_kernels`), the kernel table's times from it, and the same
calls as a trace file.

Interleaved rounds of three runs: without the hook (U, `run_ms`), hooked (W, `hooked_ms`, n calls each)
and with every kernel skipped (S, `skipped_ms`). The hook costs time itself: it is called before and
after every call the VM makes (its builtins too; only before a call it skips), c per invocation amid
the kernels, c = (W - U) / 2n (`hook_us`). A kernel's timed span holds about one invocation (the end of
the one before, the start of the one after), so each kernel's `ms` is its spans' sum less c a call, the
median over the rounds (`measured_ms` keeps the spans' own). The VM's own work (`vm_ms`): S less the
hook's invocations in it, each at its cost in hot caches (`skip_hook_us`, timed on a program of builtin
calls alone: amid the kernels an invocation costs several times as much, its code out of the caches);
None where the VM reads values its kernels compute (DATA_DEPENDENT). `kernels_ms` is the kernels' sum:
with vm_ms it is measured apart from U and agrees with it within a few percent
(benchmarks/kernel_times.py). A kernel's `share` is of kernels_ms + vm_ms (of U where vm_ms is None).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from webapp.machine import timing_slot

if TYPE_CHECKING:
    import tvm
    from tvm import relax

# The VM reads a value a kernel computed (an If's condition, a shape from a tensor): a run with its
# kernels skipped would decide on stale memory, so the VM's own work is not measured that way
DATA_DEPENDENT = re.compile(r"vm\.builtin\.(read_if_cond|tensor_to_shape)\b")


def profile_kernels(
    executable: tvm.runtime.Executable,
    inputs: dict[str, np.ndarray],
    dev: tvm.runtime.Device | None = None,
    runs: int = 5,
    trace: list | None = None,
) -> dict:
    """Where one whole-model run's time goes, each part measured (the module's docstring says how), in
    interleaved rounds of a run without the hook, a run whose instrument hook times every kernel call
    (TVM 0.27 has no vm.profile) and a run with every kernel skipped (the VM's own work), so that a slow
    spell of the machine falls on all three alike: at least `runs` rounds, more while they take under
    ROUNDS_S. `trace`, where given, gets each timed call: (run, kernel, start s, end s)."""
    import tvm

    from webapp.targets import host

    dev = dev or host().device()
    on_host = dev.dlpack_device_type() == host().device().dlpack_device_type()
    args = [tvm.runtime.tensor(a, dev) for a in inputs.values()]
    hooked = HookedRuns(executable, dev, (lambda: None) if on_host else dev.sync)
    with timing_slot.hold("kernel profile"):
        hooked.rounds(args, runs, skip=not DATA_DEPENDENT.search(executable.as_text()))
        skip_hook_s = hooked.hook_cost_s() if hooked.skipped else 0.0
    if trace is not None:  # only a whole profile's calls
        trace.extend(hooked.timeline)
    rounds, calls = len(hooked.times), hooked.calls
    run_s, hooked_s = float(np.median(hooked.plain)), float(np.median(hooked.times))
    # c, the hook's cost an invocation amid the kernels (their data pushes its code out of the caches)
    extra = np.array(hooked.times) - np.array(hooked.plain)
    hook_s = max(0.0, float(np.median(extra)) / (2 * max(hooked.invocations, 1)))
    measured = {name: float(np.median(ts)) * 1e3 for name, ts in hooked.per_run.items()}
    ms = {name: max(0.0, t - hook_s * 1e3 * (calls[name] // rounds)) for name, t in measured.items()}
    skipped_ms = float(np.median(hooked.skipped)) * 1e3 if hooked.skipped else None
    # the runs with every kernel skipped hold the hook's own invocations, each in hot caches there
    vm_ms = max(0.0, skipped_ms - hooked.skip_invocations * skip_hook_s * 1e3) if skipped_ms else None
    kernels_ms = sum(ms.values())
    whole = kernels_ms + vm_ms if vm_ms is not None else run_s * 1e3
    kernel_calls = sum(calls.values()) // rounds
    return {
        "runs": rounds,
        "run_ms": run_s * 1e3,
        "hooked_ms": hooked_s * 1e3,
        "hook_us": hook_s * 1e6,
        "calls": hooked.invocations,
        "vm_calls": hooked.invocations - kernel_calls,  # the builtins' calls of a run: allocations, copies
        "kernels_ms": kernels_ms,
        "skipped_ms": skipped_ms,
        "skip_hook_us": skip_hook_s * 1e6,
        "vm_ms": vm_ms,
        "vm_share": vm_ms / whole if vm_ms is not None and whole else None,
        "kernels": {
            name: {
                "calls": calls[name] // rounds,
                "ms": t,
                "measured_ms": measured[name],
                "share": t / (whole or 1.0),
            }
            for name, t in sorted(ms.items(), key=lambda kv: -kv[1])
        },
    }


ROUNDS_S = 0.5  # a profile's rounds: at least `runs`, more while they take under this, at most MAX_ROUNDS
MAX_ROUNDS = 30
CALIBRATION_CALLS = 400  # builtin calls in the program that times the hook's own cost (hook_cost_s)


class HookedRuns:
    """Interleaved rounds of three runs of a VM (`rounds`): one without the hook (`plain`: seconds of
    each), one whose instrument hook times every call of a compiled kernel (`times`; each run's seconds
    per kernel in `per_run`, the calls of each, every timed call in `timeline`: run, kernel, start,
    end; the hook's invocations in one run, builtins' calls too) and one with every kernel skipped
    (`skipped`, and the hook's invocations in one such run)."""

    def __init__(
        self, executable: tvm.runtime.Executable, dev: tvm.runtime.Device, sync: Callable[[], object]
    ):
        from tvm import relax

        self.executable, self.dev = executable, dev
        self.vm = relax.VirtualMachine(executable, dev)
        self.no_op, self.skip_run = relax.VMInstrumentReturnKind.NO_OP, relax.VMInstrumentReturnKind.SKIP_RUN
        self.sync = sync
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.started: dict[str, float] = {}
        self.run_at: list[float] = []  # when each timed run began
        self.timeline: list[tuple] = []
        self.per_run: dict[str, list[float]] = {}
        self.plain: list[float] = []
        self.times: list[float] = []
        self.skipped: list[float] = []
        self.invocations = 0  # the hook's calls of one run (before each call), builtins' too
        self.skip_invocations = 0  # the hook's invocations in one run with the kernels skipped
        self.counted = self.invoked = 0  # of the run going on
        self.skip = False  # every kernel skipped (SKIP_RUN): the VM's own work alone

    def hook(
        self, func: object, symbol: str, before_run: bool, ret_value: object, *call_args: object
    ) -> relax.VMInstrumentReturnKind:
        self.counted += before_run
        self.invoked += 1
        if "." in symbol:  # a vm.builtin.* call, not a compiled kernel (fused_conv2d_add, ...)
            return self.no_op
        if self.skip:
            return self.skip_run
        self.sync()  # a GPU kernel ends when the device is done
        if before_run:
            self.started[symbol] = time.perf_counter()
        elif symbol in self.started:
            begun, ended = self.started.pop(symbol), time.perf_counter()
            self.seconds[symbol] = self.seconds.get(symbol, 0.0) + ended - begun
            self.calls[symbol] = self.calls.get(symbol, 0) + 1
            if self.run_at:
                start = self.run_at[-1]
                self.timeline.append((len(self.run_at) - 1, symbol, begun - start, ended - start))
        return self.no_op

    def rounds(self, args: list, runs: int, skip: bool) -> None:
        """At least `runs` rounds, more while they take under ROUNDS_S; the runs with every kernel
        skipped only where `skip` (they stop at the first that fails: a shape the VM checks that a
        skipped kernel never wrote)."""
        from tvm import relax

        plain = relax.VirtualMachine(self.executable, self.dev)
        plain["main"](*args)  # warm-ups, untimed
        self.vm["main"](*args)
        self.vm.set_instrument(self.hook)
        began = time.perf_counter()
        try:
            while len(self.times) < runs or (
                time.perf_counter() - began < ROUNDS_S and len(self.times) < MAX_ROUNDS
            ):
                self.plain.append(self.timed(lambda: plain["main"](*args)))
                self.seconds.clear()
                self.counted = 0
                self.run_at.append(time.perf_counter())
                self.times.append(self.timed(lambda: self.vm["main"](*args), self.run_at[-1]))
                for name, t in self.seconds.items():
                    self.per_run.setdefault(name, []).append(t)
                self.invocations = self.counted
                skip = skip and self.skipped_run(args)
        finally:
            self.close()

    def close(self) -> None:
        """The VM let go: its instrument hook holds this object, which holds the VM, a cycle through TVM
        that Python's collector cannot see (it kept the model's weights alive for the rest of the job)."""
        self.vm = None

    def timed(self, run: Callable[[], object], begun: float | None = None) -> float:
        begun = begun or time.perf_counter()
        run()
        self.sync()
        return time.perf_counter() - begun

    def skipped_run(self, args: list) -> bool:
        """One run with every kernel skipped, timed; False where it fails."""
        self.skip, self.invoked = True, 0
        try:
            self.skipped.append(self.timed(lambda: self.vm["main"](*args)))
            self.skip_invocations = self.invoked
            return True
        except Exception as exc:
            print(f"the VM's own work not measured: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            self.skipped.clear()
            return False
        finally:
            self.skip = False

    def hook_cost_s(self) -> float:
        """The seconds of one invocation of the hook where the caches hold it, as in the runs with
        every kernel skipped: a program of CALIBRATION_CALLS builtin calls (four arguments each, no
        kernel) timed with and without the hook on this CPU, in interleaved rounds, the median."""
        import tvm
        from tvm import relax

        builder = relax.ExecBuilder()
        with builder.function("main", num_inputs=1):
            for _ in range(CALIBRATION_CALLS):
                builder.emit_call("vm.builtin.make_tuple", args=[builder.r(0)] * 4, dst=builder.r(1))
            builder.emit_ret(builder.r(0))
        program, cpu = builder.get(), tvm.cpu()
        x = tvm.runtime.tensor(np.zeros(1, "float32"), cpu)
        plain, hooked = relax.VirtualMachine(program, cpu), relax.VirtualMachine(program, cpu)
        hooked.set_instrument(self.hook)
        extra = []
        for _ in range(30):
            t0 = time.perf_counter()
            plain["main"](x)
            t1 = time.perf_counter()
            hooked["main"](x)
            extra.append((time.perf_counter() - t1) - (t1 - t0))
        return max(0.0, float(np.median(extra)) / (2 * CALIBRATION_CALLS))


def timed_kernels(kernels: list[dict], profiles: list[dict]) -> list[dict]:
    """The inspect stage's kernels with each one's measured ms a run and share of a run, from the profile
    of the build the page shows (profile_kernels), and its calls as the profile counted them; slowest
    first (a kernel the VM never calls, last, with None)."""
    shown = next((p for p in profiles if p.get("shown")), {})
    if "kernels" not in shown:  # the profile failed: the kernels stay as they were
        return kernels
    rows = []
    for k in kernels:
        timed = shown["kernels"].get(k["name"], {})
        # calls as the run made them: the graph does not have a repacking of an activation (a
        # matmul's second operand computed by the model), split off its kernel, yet it runs each time
        rows.append(
            {**k, "calls": timed.get("calls", k["calls"]), "ms": timed.get("ms"), "share": timed.get("share")}
        )
    return sorted(rows, key=lambda k: (k["ms"] is None, -(k["ms"] or 0)))  # untimed last


def with_benchmark_ms(profile: dict, benchmarks: list[dict], variant: str, tuned: bool) -> dict:
    """A profile with its build's benchmark median (benchmark_ms: its fastest round's) and how much of it
    the profile's parts account for (accounted: the kernels' and the VM's own work's measured ms over it;
    None where the VM's own work could not be measured apart), and of the profile's own run without the
    hook, timed in the same rounds as the hooked runs (accounted_of_run)."""
    if "kernels" not in profile:
        return profile
    median = next(
        (
            b["median_ms"]
            for b in benchmarks
            if (b["runtime"], b["variant"], b["tuned"]) == ("tvm", variant, tuned)
        ),
        None,
    )
    parts = profile["kernels_ms"] + profile["vm_ms"] if profile.get("vm_ms") is not None else None
    return profile | {
        "benchmark_ms": median,
        "accounted_ms": parts,
        "accounted": parts / median if parts and median else None,
        "accounted_of_run": parts / profile["run_ms"] if parts and profile.get("run_ms") else None,
    }


def profile_or_why(
    executable: tvm.runtime.Executable,
    inputs: dict[str, np.ndarray],
    dev: tvm.runtime.Device | None,
    trace: list | None = None,
) -> dict:
    """A build's kernel profile, or why there is none: a profile never fails the job."""
    try:
        return profile_kernels(executable, inputs, dev, trace=trace)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def profile_builds(
    executables: dict,
    inputs: dict[str, np.ndarray],
    dev: tvm.runtime.Device | None,
    benchmarks: list[dict],
    shown: tuple[str, bool] | None,
    files: Path,
) -> list[dict]:
    """Each build's profile (`shown`: the build whose kernels the page lists, model.so), with its
    benchmark median, in one hold of the timing slot; their calls written to files/TRACE_FILE."""
    traces: dict[str, list] = {}
    profiles = []
    with timing_slot.hold("kernel profile"):
        for (variant, tuned), ex in sorted(executables.items()):
            trace = traces.setdefault(f"TVM {variant}, {'tuned' if tuned else 'default rules'}", [])
            profile = with_benchmark_ms(profile_or_why(ex, inputs, dev, trace), benchmarks, variant, tuned)
            profiles.append(
                {"variant": variant, "tuned": tuned, "shown": (variant, tuned) == shown, **profile}
            )
    try:
        write_trace(files / TRACE_FILE, traces)
    except OSError as exc:  # a trace never fails the job
        print(f"kernel trace not written: {exc}", flush=True)
    return profiles


TRACE_FILE = "kernel-trace.json"


def write_trace(path: Path, traces: dict[str, list]) -> None:
    """The kernel profiles as a trace in Chrome's trace event format, which Perfetto (ui.perfetto.dev)
    and chrome://tracing open: a process per build, a track per run, a slice per kernel call, each
    run's track from 0 (so the runs line up). Nothing is written where no build was profiled."""
    events: list[dict] = []
    for pid, (build, calls) in enumerate(((b, c) for b, c in traces.items() if c), 1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": build}})
        for run in sorted({c[0] for c in calls}):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": run + 1,
                           "args": {"name": f"run {run + 1}"}})  # fmt: skip
        events += [
            {
                "name": kernel,
                "cat": "kernel",
                "ph": "X",
                "pid": pid,
                "tid": run + 1,
                "ts": round(start * 1e6, 3),
                "dur": round((end - start) * 1e6, 3),
            }  # fmt: skip
            for run, kernel, start, end in calls
        ]
    if any(calls for calls in traces.values()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
