"""Runs a job's stages in order inside the sandbox, recording each stage's status, seconds and
progress in progress.json and the results so far in result.json, both in the job folder.

The stages themselves know nothing of timing, progress files or error reporting: that is here.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from webapp.catalog import STAGES
from webapp.jsonfile import write_json_atomic
from webapp.options import JobOptions
from webapp.pipeline import facts
from webapp.pipeline.errors import error_message


@dataclass
class Job:
    """job.json, as the worker prepared it: the options and where the job's files are."""

    dir: Path
    options: JobOptions
    model: Path
    references: dict[str, Path]  # {"pytorch": .pt2, "onnxruntime": .onnx}, whichever it has
    dataset: str | None  # labelled data of an example (accuracy, calibration)
    calibration_data: Path | None  # the user's .npz
    bench_budget_s: float

    @classmethod
    def load(cls, job_dir: Path) -> Job:
        spec = json.loads((job_dir / "job.json").read_text())
        return cls(
            job_dir,
            JobOptions.from_json(spec["options"]),
            job_dir / spec["model"],
            {k: job_dir / v for k, v in (spec.get("references") or {}).items()},
            spec.get("dataset"),
            job_dir / spec["calibration_data"] if spec.get("calibration_data") else None,
            float(spec.get("bench_budget_s", 3.0)),
        )


def run(job_dir: Path) -> None:
    from webapp import targets

    job, results = Job.load(job_dir), Results(job_dir)
    progress = Progress(job_dir, STAGES)
    stage = progress.run_stage
    target = targets.get(job.options.target)
    tvm_target = target.tvm_target()

    model = stage("import", lambda report: import_stage(job))
    results.save(
        model=model.to_json(), target={"preset": target.name, "tvm": targets.target_json(tvm_target)}
    )

    optimized, graphs = stage("optimize", lambda report: optimize_stage(model, tvm_target, job_dir, report))
    results.save(passes=[vars(p) for p in optimized.passes], graphs=graphs)

    quantized = None
    if job.options.quantize != "none" or (model.prequantized or {}).get("layers"):  # the model's own scales
        from webapp.pipeline.quantize.variants import quantize_job

        quantized = stage(
            "quantize",
            lambda report: quantize_job(
                model, tvm_target, job.options, job_dir, job.calibration_data, job.dataset, report
            ),
        )
        results.save(**quantized.to_json())
    else:
        progress.skip("quantize")

    tuning_dir = job_dir / "tuning"
    records = tuning_dir / "database_tuning_record.json"
    if job.options.tune_trials > 0 or (records.is_file() and records.stat().st_size > 0):
        from webapp.pipeline.build import fuse
        from webapp.pipeline.tune import tune

        cancelled = (job_dir / "cancel").exists
        trials = job.options.tune_trials
        # The first quantized variant's kernels too (a sweep's others share its workloads).
        qfused = {q.variant: fuse(q.mod, tvm_target) for q in quantized.variants[:1]} if quantized else None
        tuned = stage(
            "tune",
            lambda report: tune(optimized.fused, tvm_target, tuning_dir, trials, report, cancelled, qfused),
        )
        results.save(tuning=tuned.to_json())
    else:
        progress.skip("tune")

    from webapp.pipeline.build import build_job

    tuned_records = tuning_dir if "tuning" in results.data else None
    built = stage(
        "build",
        lambda report: build_job(
            optimized.fused, quantized, tvm_target, tuned_records, job_dir, report, model.layers
        ),
    )
    results.save(
        **built.to_json(job_dir / "files" / "model.so"), **(quantized.to_json() if quantized else {})
    )

    from webapp.pipeline.inspect import error_graphs, inspect_build, time_graphs
    from webapp.pipeline.model_explorer import write_model_explorer

    graphs = None if quantized else graphs  # the page then shows the quantized model's fused graph
    results.save(
        **stage(
            "inspect",
            lambda report: inspect_build(
                model.mod,
                built.fused,
                built.lowered,
                built.executable,
                job_dir,
                built.labels,
                tvm_target,
                report,
                graphs,
                built.fusion or optimized.fusion,
            ),
        )
    )

    if quantized:  # the graphs coloured by each quantized layer's error against fp32
        summary = results.data.get("quantization_summary") or {}
        worst = (summary.get("worst_layer") or {}).get("layer")
        error_graphs(job_dir, results.data["quantization"].get("layer_errors", []), worst, model.layers)

    write_model_explorer(job_dir)  # written again with the times after the benchmark

    if target.board:  # timed on a board of the device pool: here only what the board is checked against
        from webapp.pipeline.remote import prepare_remote

        results.save(
            **stage(
                "benchmark",
                lambda report: prepare_remote(built, quantized, model, job, target, report),
            )
        )
        return  # the worker runs the remote stage next, in a sandbox that may reach the tracker

    from webapp.pipeline.bench import benchmark_job, timed_kernels

    shown = next(key for key, ex in built.executables.items() if ex is built.executable)
    measured = stage(
        "benchmark",
        lambda report: benchmark_job(built.executables, model, job, target, tvm_target, report, shown),
    )
    kernels = timed_kernels(results.data.get("kernels", []), measured.get("profiles", []))
    time_graphs(job_dir, kernels)
    write_model_explorer(job_dir)
    results.save(**measured, kernels=kernels)
    progress.skip("remote")


def import_stage(job: Job):
    """The model as Relax, its imported IR kept for the code view."""
    from webapp.pipeline.importers import import_model

    model = import_model(job.model, job.options.input_shapes)
    (job.dir / "views").mkdir(exist_ok=True)
    (job.dir / "views" / "imported.py").write_text(model.mod.script())
    return model


def optimize_stage(model, tvm_target, job_dir: Path, report):
    """The optimized model, and its graphs drawn at once: the page shows them while the job goes on."""
    from webapp.pipeline.inspect import draw_graphs
    from webapp.pipeline.optimize import optimize

    optimized = optimize(model.mod, tvm_target, job_dir, report, model.layers)
    return optimized, draw_graphs(model.mod, optimized.fused, job_dir, optimized.fusion)


class Results:
    """result.json: what the job found so far, with the facts the page states derived from it."""

    def __init__(self, job_dir: Path, resume: bool = False):
        self.job_dir, self.data = job_dir, {}
        if resume:  # a later process (the remote stage) adds to what the pipeline found
            self.data = json.loads((job_dir / "result.json").read_text())

    def save(self, **update) -> None:
        self.data.update(update)
        files = self.job_dir / "files"
        self.data["files"] = sorted(p.name for p in files.iterdir() if p.is_file()) if files.is_dir() else []
        self.data.update(facts.derive(self.data))
        write_json_atomic(self.job_dir / "result.json", self.data)


class Progress:
    """progress.json: the stages' live status, as the job page shows it."""

    def __init__(self, job_dir: Path, stages: tuple[str, ...], resume: bool = False):
        self.path = job_dir / "progress.json"
        self.stages = [{"name": s, "status": "pending", "seconds": None, "progress": None} for s in stages]
        self.error = None
        if resume:  # a later process (the remote stage) goes on where the pipeline stopped
            self.stages = json.loads(self.path.read_text())["stages"]
        self.started = 0.0
        self.last_write = 0.0
        self.lock = threading.Lock()  # a stage may report from a helper thread (tune.watch_dispatch)
        self.write()

    def stage(self, name: str) -> dict:
        return next(s for s in self.stages if s["name"] == name)

    def write(self) -> None:
        with self.lock:
            write_json_atomic(self.path, {"stages": self.stages, "error": self.error})
            self.last_write = time.monotonic()

    def run_stage(self, name: str, fn):
        """fn(report) with its status, seconds and progress recorded; a failure ends the job with its
        message on this stage."""
        self.start(name)
        try:
            out = fn(lambda fraction, detail=None: self.report(name, fraction, detail))
        except BaseException as exc:
            traceback.print_exc()
            self.finish(name, "failed", error_message(exc))
            raise SystemExit(1) from None
        self.finish(name)
        return out

    def start(self, name: str) -> None:
        self.started = time.monotonic()
        self.stage(name).update(status="running", progress=0.0)
        self.write()

    def report(self, name: str, fraction: float, detail: dict | None = None) -> None:
        self.stage(name).update(
            progress=round(min(max(fraction, 0.0), 1.0), 3), seconds=round(time.monotonic() - self.started, 2)
        )
        if detail is not None:
            self.stage(name)["detail"] = detail
        if detail is not None or time.monotonic() - self.last_write > 0.5:
            self.write()

    def skip(self, name: str) -> None:
        self.stage(name).update(status="skipped")
        self.write()

    def finish(self, name: str, status: str = "done", error: str | None = None) -> None:
        self.stage(name).update(
            status=status,
            seconds=round(time.monotonic() - self.started, 2),
            progress=1.0 if status == "done" else self.stage(name)["progress"],
        )
        if error is not None:
            self.error = {"stage": name, "message": error}
        self.write()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
