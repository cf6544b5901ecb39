"""Mixed precision chosen by accuracy and measured time (JobOptions.accuracy_budget): which layers of an
int8 job stay in float.

Where the target's code runs here, the build stage has the int8 build's layers timed against the float
build's (stages.fallback: each layer's kernel in both profiles), and quantization knows the SQNR
against fp32 of each layer's input and output in the integer model. Each layer is ranked by the error
it adds (its output's noise less its input's, ranking()) against the time its int8 kernel saves; a
layer int8 makes slower comes first (float costs nothing there). The points tried keep the first k
layers of that ranking in float: k = 0 (the int8 build), then 1, 2, 4, ... until a point keeps the
budget, then halving between the last that did not and the first that did (at most MAX_POINTS builds).
Each point is built as the job builds a variant, its outputs compared with the float build's on the
calibration inputs (SQNR, top-1 agreement), and all of them timed in turn with the float build
(bench.time_models). The fastest point within the budget becomes the job's int8 build; where that is
the float build, the int8 build stays as quantized and the choice is model-fp32.so. The points, their
Pareto front (time against the budget's measure) and the chosen one go to quantization.precision_search.

Only float and int8 are searched: "int4" (layer_precision) gives a layer 4-bit weights on the same
8-bit kernels, which saves bytes but no time on these CPUs, so it could never be a faster point.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from webapp.options import budget_of
from webapp.pipeline.errors import error_message
from webapp.pipeline.stages.bench import bench_threads, model_inputs, run_all, time_models
from webapp.pipeline.stages.fidelity import fidelity

if TYPE_CHECKING:
    from webapp.pipeline.stages.fallback import Build
    from webapp.pipeline.stages.quantize import Quantized
    from webapp.pipeline.stages.quantize.variants import QuantizedJob
    from webapp.targets import Target

PREQUANTIZED = "the model came quantized by another tool: its layers run as it quantized them"
MAX_POINTS = 8  # builds a search tries besides the int8 build and the float one
SAMPLES = 32  # calibration inputs each point's outputs are compared on


def not_searched(target: Target) -> str | None:
    """Why a job with an accuracy budget gets no search on this target, or None: the points are timed
    where the code runs here, else estimated by llvm-mca for the core the code is for (Estimate)."""
    if target.runs_cpu_code_here or (target.timed_on_board and target.dialect and target.mca_cpu()[1]):
        return None
    return (
        f"the points are timed where the code runs, or for a board estimated by llvm-mca for its core; "
        f"{target.name}'s code runs neither on this server nor on a board of the pool, so every layer stays "
        "as quantized"
    )


def search(
    variant: Build,
    float_build: Build,
    job: QuantizedJob,
    target: Target,
    rebuild: Callable[[Quantized], Build],
) -> Build:
    """The variant with the layers the budget keeps in float (or as it was, with why in
    precision_search's "error"): never the build's failure."""
    from webapp.pipeline.stages.fallback import why_not_tried

    q = variant.quantized
    assert q is not None  # a quantized variant is searched
    why = not_searched(target) or (float_build.fusion is None and "the float build's layers were not traced")
    if why_not_tried(job, q) == "prequantized":
        why = PREQUANTIZED
    if why:
        q.precision = {"budget": q.options.accuracy_budget, "error": why}
        return variant
    try:
        return choose(variant, float_build, job, target, rebuild)
    except Exception as exc:  # noqa: BLE001 - the variant as built is kept
        traceback.print_exc()
        q.precision = {"budget": q.options.accuracy_budget, "error": error_message(exc)}
        return variant


def ranking(errors: list[dict], saved: dict[str, float]) -> list[dict]:
    """The quantized layers in the order they go to float: those int8 makes slower first, then by the
    error each adds per ms its int8 kernel saves (`saved`: layer -> ms, Clock.saved), most first. The
    error a layer adds: the noise of its output (relative to the signal, from its SQNR against fp32 in
    the integer model: quantize.layer_errors) less the lower of its input's and the layer before's
    output's: an input stored in 8 bits has the noise of its own quantization, which the layer reading
    it brings (a float layer reads the float value); the layer before is the one most layers read."""

    def noise(sqnr_db: float | None) -> float:
        return 10 ** (-sqnr_db / 10) if sqnr_db is not None else 0.0

    rows, before = [], 0.0
    for e in errors:
        added = max(noise(e.get("sqnr_db")) - min(noise(e.get("input_sqnr_db")), before), 0.0)
        rows.append({"layer": e["layer"], "added_noise": added, "saved_ms": saved.get(e["layer"])})
        before = noise(e.get("sqnr_db"))

    def first(row: dict) -> tuple:
        if row["saved_ms"] is not None and row["saved_ms"] <= 0:
            return (0, -row["added_noise"])
        return (1, -row["added_noise"] / max(row["saved_ms"] or 0.0, 1e-6))

    return sorted(rows, key=first)


def outputs_on(runs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Each output over the runs of the samples, concatenated along the first axis (a classifier's
    scores, one row an input)."""
    return [np.concatenate([np.atleast_1d(run[i]) for run in runs]) for i in range(len(runs[0]))]


class Clock:
    """How a search's points are run and timed where the target's code runs on this server: each
    point's build run on the samples, its layers' times the layer timing's (stages.fallback), the
    points timed in turn with the float build (bench.time_models)."""

    by = "measured"

    def __init__(
        self, target: Target, job: QuantizedJob, samples: list[dict[str, np.ndarray]], fused: object
    ):
        self.target, self.job, self.samples = target, job, samples
        self.device = target.device_name()
        self.inputs = model_inputs(fused)  # type: ignore[arg-type]  # a fused IRModule
        if self.inputs is None:  # said before any point is built
            raise ValueError("an input has no fixed shape, so the points cannot be timed")

    def outputs(self, build: Build) -> list[np.ndarray]:
        return outputs_on(run_all(build.built.executable, self.samples))  # type: ignore[arg-type]  # an Executable

    def saved(self, variant: Build, float_build: Build) -> dict[str, float]:
        """Layer -> the ms its int8 kernel saves against its float kernel."""
        rows = self.layer_rows(variant, float_build)
        return {row["layer"]: row["fp32_ms"] - row["quant_ms"] for row in rows}

    def layer_rows(self, variant: Build, float_build: Build) -> list[dict]:
        """The layer timing's rows (stages.fallback.layer_times of the two profiles)."""
        assert variant.quantized is not None  # the variant searched is a quantized one
        return (variant.quantized.layer_speed or {}).get("layers", [])

    def times(self, builds: dict) -> dict:
        executables = {k: b.built.executable for k, b in builds.items()}
        return time_models(executables, self.inputs, self.target.device())  # type: ignore[arg-type]  # checked

    def notes(self, k: object) -> dict:
        return {}


class Estimate(Clock):
    """A board's points (its code does not run here): each point's integer model run on this server's
    CPU (the target's integer arithmetic, as quantize.layer_errors runs it), the float model's as the
    reference; each point's build for the board estimated by llvm-mca on the board's core
    (inspect.estimate_kernels), its layers' times those of their kernels in the estimates of the int8 and
    float builds. The board times the build chosen after the build stage (the remote stage)."""

    by = "llvm-mca"

    def __init__(self, target: Target, job: QuantizedJob, samples: list[dict[str, np.ndarray]]):
        self.target, self.job, self.samples = target, job, samples
        cpu, clock, _ = target.mca_cpu()
        threads = target.analysis_threads(bench_threads())  # as estimate_kernels assumes
        self.device = f"{target.name}: llvm-mca's estimate for {cpu} at {clock:g} GHz, {threads} cores"
        self.seen: dict = {}  # llvm-mca's figures by a kernel's assembly: points repeat most kernels
        self.estimates: dict[int, tuple[list[dict], dict]] = {}
        self.shares: dict[object, float | None] = {}

    def outputs(self, build: Build) -> list[np.ndarray]:
        return outputs_on(self.job.run_here(build.quantized, self.samples))

    def estimate(self, build: Build) -> tuple[list[dict], dict]:
        from webapp.pipeline.stages.inspect import estimate_kernels

        if id(build) not in self.estimates:
            b = build.built
            self.estimates[id(build)] = estimate_kernels(
                b.executable, b.fused, b.lowered, self.target, self.seen
            )
        return self.estimates[id(build)]

    def layer_rows(self, variant: Build, float_build: Build) -> list[dict]:
        """fallback.layer_times of the two builds' estimates, each as a profile of its kernels."""
        from webapp.pipeline.stages.fallback import layer_times

        assert variant.quantized is not None  # the variant searched is a quantized one
        profiles = [
            {
                "kernels": {
                    k["name"]: {"ms": k["predicted_ms"], "calls": k["calls"]} for k in self.estimate(b)[0]
                }
            }
            for b in (float_build, variant)
        ]
        return layer_times(variant.quantized.layers, float_build, variant, (profiles[0], profiles[1]))

    def times(self, builds: dict) -> dict:
        out = {}
        for k, build in builds.items():
            kernels, flop = self.estimate(build)
            out[k] = sum(row["predicted_ms"] for row in kernels)
            self.shares[k] = round(flop["analysed"] / flop["all"], 3) if flop["all"] else None
            if not out[k]:
                raise ValueError(f"llvm-mca analysed none of the {k} build's kernels: no time to compare")
        return out

    def notes(self, k: object) -> dict:
        return {"analysed_flop_share": self.shares.get(k)}


class Points:
    """The points a search builds: k layers of the ranking in float -> (its Build, its fidelity)."""

    def __init__(self, variant: Build, job: QuantizedJob, order: list[str], compared: tuple, rebuild):
        self.variant, self.job, self.order, self.rebuild = variant, job, order, rebuild
        self.clock, self.reference = compared  # how outputs are had, and the float build's
        self.built: dict[int, tuple[Build, dict]] = {}

    def at(self, k: int) -> dict:
        if k not in self.built:
            q = self.variant.quantized
            assert q is not None  # the variant searched is a quantized one
            floated = {layer.name for layer in q.skipped} | set(self.order[:k])
            point = self.variant if k == 0 else self.rebuild(self.job.without(q, floated, errors=False))
            ours = self.clock.outputs(point)
            self.built[k] = (point, fidelity(ours, self.reference, classifier=True))
        return self.built[k][1]


def exact(measured: dict) -> bool:
    """Outputs equal to fp32's (no SQNR: no noise), not outputs that could not be compared."""
    return measured.get("max_abs_err") == 0


def keeps(measured: dict, metric: str, least: float) -> bool:
    value = measured.get(metric)
    if metric == "sqnr_db" and exact(measured):
        return True
    return value is not None and value >= least


def walk(points: Points, n: int, metric: str, least: float) -> None:
    """Points k = 0, 1, 2, 4, ... (and n - 1, the last before every layer is float: the float build)
    until one keeps the budget, then halving between the last that did not and the first that did,
    within MAX_POINTS builds."""
    if keeps(points.at(0), metric, least):
        return
    low, high, k = 0, None, 1
    while k < n and len(points.built) <= MAX_POINTS:
        if keeps(points.at(k), metric, least):
            high = k
            break
        if k == n - 1:
            break
        low, k = k, min(2 * k, n - 1)
    while high is not None and high - low > 1 and len(points.built) <= MAX_POINTS:
        mid = (low + high) // 2
        low, high = (low, mid) if keeps(points.at(mid), metric, least) else (mid, high)


def choose(
    variant: Build,
    float_build: Build,
    job: QuantizedJob,
    target: Target,
    rebuild: Callable[[Quantized], Build],
) -> Build:
    q = variant.quantized
    assert q is not None  # a quantized variant is searched
    metric, least = budget_of(q.options.accuracy_budget)
    samples = job.inputs[2][:SAMPLES]
    clock = (
        Clock(target, job, samples, variant.fused)
        if target.runs_cpu_code_here
        else Estimate(target, job, samples)
    )
    reference = clock.outputs(float_build)
    if metric == "top1_agree" and not (reference[0].ndim == 2 and reference[0].shape[1] > 1):
        raise ValueError("a top-1 budget needs a classifier's scores ([inputs, classes]); give it in dB")
    if q.errors is None:  # each layer's error as it accumulates (kept: complete_errors then has them)
        q.errors = job.without(q, {layer.name for layer in q.skipped}).errors
    order = ranking(q.errors or [], clock.saved(variant, float_build))
    points = Points(variant, job, [row["layer"] for row in order], (clock, reference), rebuild)
    walk(points, len(order), metric, least)
    times = clock.times({"fp32": float_build} | {k: point for k, (point, _) in points.built.items()})
    rows = point_rows(points, times, metric, least, clock.notes)
    chosen = min((row for row in rows if row["keeps"]), key=lambda row: row["ms"])
    kept = variant if chosen["k"] is None else points.built[chosen["k"]][0]
    record = kept.quantized
    assert record is not None  # every point is a quantized build
    record.layer_speed = record.layer_speed or q.layer_speed
    record.precision = {
        "budget": q.options.accuracy_budget,
        "metric": metric,
        "least": least,
        "device": clock.device,
        "timed_by": clock.by,
        "samples": len(samples),
        "ranking": order,
        "points": rows,
        "chosen": rows.index(chosen),
        # the float build chosen: model.so stays the int8 build as quantized, model-fp32.so is the choice
        "library": "model-fp32.so" if chosen["k"] is None else "model.so",
        "quantized_within": sum(1 for row in rows if row["k"] is not None and row["keeps"]),
        "max_points": MAX_POINTS,
    }
    if kept is not variant:
        job.replace(q, record)
    return kept


def point_rows(
    points: Points, times: dict, metric: str, least: float, notes: Callable[[object], dict] = lambda k: {}
) -> list[dict]:
    """The points tried, with the float build (k None) last: each one's layers in float, ms, speedup
    over fp32, SQNR and top-1 against fp32, whether it keeps the budget and lies on the Pareto front
    (and the clock's notes on its time: Estimate's analysed share)."""
    rows = []
    for k, (point, measured) in sorted(points.built.items()):
        pq = point.quantized
        assert pq is not None  # every point is a quantized build
        floated = sorted(layer.name for layer in pq.skipped)
        rows.append(
            {
                "k": k,
                "float_layers": floated,
                "int8_layers": len(pq.layers),
                "ms": times[k],
                "speedup_vs_fp32": times["fp32"] / times[k],
                "sqnr_db": measured.get("sqnr_db"),
                "exact": exact(measured),
                "top1_agree": measured.get("top1_agree"),
                "keeps": keeps(measured, metric, least),
                "layer_precision": dict.fromkeys(floated, "float"),
            }
            | notes(k)
        )
    q = points.variant.quantized
    assert q is not None
    everything = len(q.layers) + len(q.skipped)
    rows.append(
        {"k": None, "float_layers": None, "int8_layers": 0, "ms": times["fp32"], "speedup_vs_fp32": 1.0}
        | {"sqnr_db": None, "exact": True, "top1_agree": 1.0, "keeps": True, "layer_precision": None}
        | {"layers": everything}
        | notes("fp32")
    )
    for row in rows:
        row["pareto"] = not any(dominates(other, row, metric) for other in rows)
    return rows


def accuracy(row: dict, metric: str) -> float:
    """A point's measure of the budget's kind: exact outputs above any, none (not comparable) below."""
    if metric == "sqnr_db" and row["exact"]:
        return math.inf
    return -math.inf if row[metric] is None else row[metric]


def dominates(a: dict, b: dict, metric: str) -> bool:
    """a is at least as fast and as accurate as b, and better in one."""
    sa, sb = accuracy(a, metric), accuracy(b, metric)
    return a["ms"] <= b["ms"] and sa >= sb and (a["ms"] < b["ms"] or sa > sb)
