"""Runs a job's stages in order inside the sandbox. Each stage is `stage(ctx, report, *inputs)`
(webapp.pipeline.job.Context): it records what it found in result.json; the context records its
status, seconds and progress in progress.json and ends the job with its message if it fails."""

from __future__ import annotations

import sys
from pathlib import Path

from webapp.catalog import STAGES
from webapp.pipeline.job import Context
from webapp.pipeline.stages.bench import benchmark_stage
from webapp.pipeline.stages.build import build_stage
from webapp.pipeline.stages.importers import import_stage
from webapp.pipeline.stages.inspect import inspect_stage
from webapp.pipeline.stages.optimize import optimize_stage
from webapp.pipeline.stages.quantize.variants import quantize_stage, quantizes
from webapp.pipeline.stages.remote import prepare_remote_stage
from webapp.pipeline.stages.tune import tune_stage, tunes


def run(job_dir: Path) -> None:
    ctx = Context.open(job_dir, STAGES)
    model = ctx.stage("import", import_stage)
    optimized = ctx.stage("optimize", optimize_stage, model)
    quantized = ctx.stage("quantize", quantize_stage, model, when=quantizes(ctx, model))
    ctx.stage("tune", tune_stage, optimized, quantized, when=tunes(ctx))
    built = ctx.stage("build", build_stage, model, optimized, quantized)
    ctx.stage("inspect", inspect_stage, model, optimized, built, quantized)
    if ctx.target.board:  # timed on a board: the worker runs the remote stage next
        ctx.stage("benchmark", prepare_remote_stage, model, built, quantized)
    else:  # a benchmark that cannot run is marked failed; the job is done with its build and views
        ctx.stage("benchmark", benchmark_stage, model, built, required=False)
        ctx.skip("remote")


if __name__ == "__main__":
    run(Path(sys.argv[1]))
