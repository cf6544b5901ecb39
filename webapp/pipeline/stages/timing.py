"""How the benchmark times: every runtime in interleaved rounds (measure_interleaved), watched for what
else ran on the machine meanwhile (conditions.Watch), and timed again, after waiting for the machine to
be quiet, when something disturbed it (measure_watched): the headline states only a figure that
repeats, or says by how much it is uncertain (reports/facts.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from webapp.pipeline.memory import heap_while_timed
from webapp.pipeline.stages.conditions import Watch

# A timing is disturbed when other processes kept cores busy or the hypervisor stole CPU time meanwhile
# (conditions.BUSY_CORES, STEAL_SHARE), or when the medians of its rounds lie more than this share of its
# median apart. Measured with `benchmarks/spreads.py /tmp /work` over this machine's stored results (the
# 2-vCPU Xeon, AVX-512 VNNI): rows timed while the machine was quiet had spreads p50 4.6%, p95 12.3%,
# max 18.3% (112 rows); rows timed beside other work p50 10.3%, p90 66%, max 112% (39 rows). No quiet
# row passes 20%; a timing past it is timed again, which costs one more timing.
SPREAD_LIMIT = 0.20
TIMINGS = 3  # at most, a job's first included
QUIET_WINDOW_S = 0.5  # how long the machine must be quiet before a timing starts again


def free_cores(threads: int, window_s: float = 0.5) -> int:
    """Of `threads`, how many to use now: the cores no other process keeps busy (the others' CPU use
    over window_s, rounded to whole cores, taken from all cores), at least 1."""
    with Watch() as watch:
        time.sleep(window_s)
    busy = round(watch.conditions()["others_cores"] or 0)
    return max(1, min(threads, (os.cpu_count() or 1) - busy))


SETTLE_S = 0.05


def measure_interleaved(
    runs: dict[Any, Callable[[], object]],
    budget_s: float = 3.0,
    rounds: int = 4,
    report: Callable[..., None] = lambda f: None,
) -> dict:
    """Time each of `runs` ({key: fn}, each already called once) in `rounds` rounds that take every
    fn in turn, a slice of budget_s / rounds each (at least one call), `budget_s` in all per fn. A
    slow spell of a shared machine (another tenant on the other core) then falls on every runtime
    alike, not on whichever ran during it, and the ratios between runtimes hold. Each slice starts
    after a pause in which the other runtimes' thread pools stop spinning, and lasts a fraction of a
    second, not a count of calls (measured here on cnn-small, TVM / ONNX Runtime in one process:
    slices of 40 calls 88 / 38 us; 0.5 s slices without the pause 77 / 53; with it 45 / 38, the
    figures each gives alone). Returns {key: summarize(...)} of all of each fn's calls, except that its
    `median_ms` is the median of its fastest round: a spell of the machine that slows every call (on a
    2-vCPU VM here, both threads of a runtime slow 15-20% for seconds at a time, all runtimes alike:
    docs/benchmarks.md "The same job three times") slows a round and never speeds one, so the fastest
    round is the nearest to the machine's unhindered speed (a drift longer than the whole timing moves
    it all the same, as measured there). `rounds_ms` holds each round's median, and `spread` how far
    apart they lie, (largest - smallest) / `median_ms`."""
    with heap_while_timed():  # PyTorch's tensors of a few MB a call from glibc's heap (memory.py)
        return timed_rounds(runs, budget_s, rounds, report)


def timed_rounds(
    runs: dict[Any, Callable[[], object]], budget_s: float, rounds: int, report: Callable[..., None]
) -> dict:
    """measure_interleaved's rounds."""
    times: dict = {key: [] for key in runs}
    medians: dict = {key: [] for key in runs}  # of each round
    for done in range(rounds):
        for key, fn in runs.items():
            time.sleep(SETTLE_S)  # the other runtimes' idle threads stop spinning and go to sleep
            fn()  # the warm-up of this slice
            end = time.perf_counter() + budget_s / rounds
            first = len(times[key])
            while True:
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                times[key].append((t1 - t0) * 1e3)
                if t1 >= end:
                    break
            medians[key].append(float(np.median(times[key][first:])))
        report((done + 1) / rounds)
    out = {}
    for key, ts in times.items():
        fastest = min(medians[key])
        out[key] = summarize(ts) | {
            "median_ms": fastest,
            "rounds_ms": medians[key],
            "spread": round((max(medians[key]) - fastest) / fastest, 4),
        }
    return out


def disturbance(conditions: dict, spread: float) -> str | None:
    """What disturbed a timing (other processes, stolen time, rounds far apart: `spread`, its rows'
    largest), or None."""
    why = [conditions["what"]] if conditions["quiet"] is False else []
    if spread > SPREAD_LIMIT:
        why.append(f"its rounds' medians lay up to {spread:.0%} apart")
    return "; ".join(why) or None


def wait_quiet(wait_s: float) -> float:
    """Waits, up to wait_s, until the machine has been quiet for QUIET_WINDOW_S; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < wait_s:
        with Watch() as watch:
            time.sleep(min(QUIET_WINDOW_S, max(0.05, wait_s - (time.monotonic() - started))))
        if watch.conditions()["quiet"] is not False:
            break
    return round(time.monotonic() - started, 2)


def measure_watched(
    runs: dict[Any, Callable[[], object]],
    budget_s: float,
    report: Callable[..., None],
    wait_s: float,
    timings: int = TIMINGS,
) -> tuple[dict, dict]:
    """measure_interleaved, with how busy the machine was meanwhile (conditions.Watch). A disturbed
    timing (`disturbance`) is timed again, up to `timings` in all, each after waiting for the machine to
    be quiet, all waits together at most wait_s; the first undisturbed one is kept, else the one whose
    rounds lie closest together. Returns its timings and conditions, with
    `disturbed` (None: it was not), `spread` (its rows' largest), which of them it is (`kept`, from 1),
    `waited_s` and every timing's conditions (`timings`)."""
    deadline, tried, kept = time.monotonic() + wait_s, [], None
    for n in range(timings):
        waited = wait_quiet(deadline - time.monotonic()) if n else 0.0
        with Watch() as watch:
            timed = measure_interleaved(runs, budget_s, report=lambda f, n=n: report((n + f) / timings))
        conditions = watch.conditions()
        spread = max((t["spread"] for t in timed.values()), default=0.0)
        conditions |= {"spread": spread, "disturbed": disturbance(conditions, spread), "waited_s": waited}
        tried.append(conditions)
        if kept is None or not conditions["disturbed"] or spread < kept[1]["spread"]:
            kept = (timed, conditions | {"kept": n + 1})
        if not conditions["disturbed"]:
            break
    report(1.0)
    assert kept is not None  # the first timing is always kept (timings >= 1)
    return kept[0], kept[1] | {"waited_s": sum(c["waited_s"] for c in tried), "timings": tried}


def summarize(times_ms: list[float]) -> dict:
    """median / p90 / min of timed runs, in ms, as every benchmark row states them."""
    times = sorted(times_ms)
    return {
        "median_ms": float(np.median(times)),
        "p90_ms": float(np.percentile(times, 90)),
        "min_ms": times[0],
        "runs": len(times),
    }
