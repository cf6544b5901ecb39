"""Runs a job's stages in order inside the sandbox, recording each stage's status, seconds and
progress in progress.json and the results so far in result.json, both in the job folder.

The stages themselves know nothing of timing, progress files or error reporting: that is here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from webapp.catalog import STAGES
from webapp.pipeline.job import Job, Progress, Results


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
        from webapp.pipeline.stages.quantize.variants import quantize_job

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
        from webapp.pipeline.stages.build import fuse
        from webapp.pipeline.stages.tune import tune

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

    from webapp.pipeline.stages.build import build_job

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

    from webapp.pipeline.reports.model_explorer import write_model_explorer
    from webapp.pipeline.stages.inspect import error_graphs, inspect_build, time_graphs

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
        from webapp.pipeline.stages.remote import prepare_remote

        results.save(
            **stage(
                "benchmark",
                lambda report: prepare_remote(built, quantized, model, job, target, report),
            )
        )
        return  # the worker runs the remote stage next, in a sandbox that may reach the tracker

    from webapp.pipeline.stages.bench import benchmark_job, timed_kernels

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
    from webapp.pipeline.stages.importers import import_model

    model = import_model(job.model, job.options.input_shapes)
    (job.dir / "views").mkdir(exist_ok=True)
    (job.dir / "views" / "imported.py").write_text(model.mod.script())
    return model


def optimize_stage(model, tvm_target, job_dir: Path, report):
    """The optimized model, and its graphs drawn at once: the page shows them while the job goes on."""
    from webapp.pipeline.stages.inspect import draw_graphs
    from webapp.pipeline.stages.optimize import optimize

    optimized = optimize(model.mod, tvm_target, job_dir, report, model.layers)
    return optimized, draw_graphs(model.mod, optimized.fused, job_dir, optimized.fusion)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
