"""Where a build's run time goes: each compiled kernel's calls timed by the VM's instrument hook
(`profile_kernels`), the kernel table's times from it, and the same calls as a trace file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from webapp import timing_slot


def profile_kernels(
    executable, inputs: dict[str, np.ndarray], dev=None, runs: int = 5, trace: list | None = None
) -> dict:
    """Where one whole-model run's time goes: the VM's instrument hook times every call of a
    compiled kernel (TVM 0.27 has no vm.profile). Per kernel: its calls per run, ms per run (the
    median over `runs` runs), and share of the kernels' time in a run (the shares add up to 1).
    `run_ms` is a whole run timed by time_evaluator without the hook, `kernels_ms` the kernels'
    total by the hook: their ratio says how much of a run the kernels are (below 1: the VM's own
    work, allocations and calls; above 1: the hook's own cost, a few microseconds a call, which
    shows on a small model). `trace`, where given, gets each timed call: (run, kernel, start s, end s),
    start and end from the run's start."""
    import tvm
    from tvm import relax

    from webapp.targets import host

    dev = dev or host().device()
    on_host = dev.dlpack_device_type() == host().device().dlpack_device_type()
    args = [tvm.runtime.tensor(a, dev) for a in inputs.values()]
    with timing_slot.hold("kernel profile"):
        plain = relax.VirtualMachine(executable, dev)
        plain.set_input("main", *args)
        plain["invoke_stateful"]("main")  # warm-up
        timer = plain.time_evaluator("invoke_stateful", dev, number=1, repeat=max(runs, 5), min_repeat_ms=20)
        run_ms = float(np.median(timer("main").results)) * 1e3

        vm = relax.VirtualMachine(executable, dev)
        seconds: dict[str, float] = {}
        calls: dict[str, int] = {}
        started: dict[str, float] = {}
        run_at: list[float] = []  # when each timed run began
        timeline: list[tuple] = []  # each timed call: (run, kernel, start, end)

        def hook(func, symbol, before_run, ret_value, *call_args):
            if "." not in symbol:  # a compiled kernel (fused_conv2d_add, ...), not a vm.builtin.* call
                if not on_host:
                    dev.sync()  # a GPU kernel ends when the device is done
                if before_run:
                    started[symbol] = time.perf_counter()
                elif symbol in started:
                    begun, ended = started.pop(symbol), time.perf_counter()
                    seconds[symbol] = seconds.get(symbol, 0.0) + ended - begun
                    calls[symbol] = calls.get(symbol, 0) + 1
                    if run_at:
                        timeline.append((len(run_at) - 1, symbol, begun - run_at[-1], ended - run_at[-1]))
            return relax.VMInstrumentReturnKind.NO_OP

        vm["main"](*args)  # warm-up, untimed
        vm.set_instrument(hook)
        per_run: dict[str, list[float]] = {}
        for _ in range(runs):
            seconds.clear()
            run_at.append(time.perf_counter())
            vm["main"](*args)
            for name, t in seconds.items():
                per_run.setdefault(name, []).append(t)
    if trace is not None:  # only a whole profile's calls
        trace.extend(timeline)
    # each kernel's median over the runs: a run another process interrupted does not count
    ms = {name: float(np.median(ts)) * 1e3 for name, ts in per_run.items()}
    total = sum(ms.values()) or 1.0
    return {
        "runs": runs,
        "run_ms": run_ms,
        "kernels_ms": sum(ms.values()),
        "kernels": {
            name: {"calls": calls[name] // runs, "ms": t, "share": t / total}
            for name, t in sorted(ms.items(), key=lambda kv: -kv[1])
        },
    }


def timed_kernels(kernels: list[dict], profiles: list[dict]) -> list[dict]:
    """The inspect stage's kernels with each one's share of the kernels' time, from the profile of the
    build the page shows, and its ms: that share of the build's benchmark median (benchmark_ms), so
    the kernels' ms add up to the benchmark's figure, and its calls as the profile counted them;
    slowest first (a kernel the VM never calls, last, with None)."""
    shown = next((p for p in profiles if p.get("shown")), {})
    if "kernels" not in shown:  # the profile failed: the kernels stay as they were
        return kernels
    times, whole = shown["kernels"], shown.get("benchmark_ms")
    rows = []
    for k in kernels:
        timed = times.get(k["name"], {})
        share = timed.get("share")
        ms = None if share is None else share * whole if whole else timed["ms"]
        # calls as the run made them: the graph does not have a repacking of an activation (a
        # matmul's second operand computed by the model), split off its kernel, yet it runs each time
        rows.append({**k, "calls": timed.get("calls", k["calls"]), "ms": ms, "share": share})
    return sorted(rows, key=lambda k: -(k["ms"] or 0))


def with_benchmark_ms(profile: dict, benchmarks: list[dict], variant: str, tuned: bool) -> dict:
    """A profile with its build's benchmark median (benchmark_ms: what its kernels' ms are scaled to)
    and the share of a run the hooked kernels took (kernels_of_run, their ms over a run's without the
    hook: below 1 the VM's own work, above 1 the hook's own cost)."""
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
    return profile | {"benchmark_ms": median, "kernels_of_run": profile["kernels_ms"] / profile["run_ms"]}


def profile_or_why(executable, inputs: dict[str, np.ndarray], dev, trace: list | None = None) -> dict:
    """A build's kernel profile, or why there is none: a profile never fails the job."""
    try:
        return profile_kernels(executable, inputs, dev, trace=trace)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def profile_builds(
    executables: dict, inputs: dict[str, np.ndarray], dev, benchmarks: list[dict], shown, files: Path
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
