"""Runs a job's stages in order inside the sandbox. Each stage is `stage(ctx, report, *inputs)`
(webapp.pipeline.job.Context): it records what it found in result.json; the context records its
status, seconds and progress in progress.json and ends the job with its message if it fails."""

from __future__ import annotations

import sys
from pathlib import Path

from webapp.catalog import STAGES
from webapp.pipeline.job import Context
from webapp.pipeline.memory import let_go, map_large_allocations
from webapp.pipeline.stages.bench import benchmark_stage
from webapp.pipeline.stages.bisect import NOT_ASKED, bisect_stage, why_not_bisected
from webapp.pipeline.stages.board_generation import board_generation_stage
from webapp.pipeline.stages.build import build_stage
from webapp.pipeline.stages.generation import generation_stage, why_not_generated
from webapp.pipeline.stages.importers import import_stage
from webapp.pipeline.stages.inspect import inspect_stage
from webapp.pipeline.stages.optimize import optimize_stage
from webapp.pipeline.stages.quantize.variants import quantize_stage, quantizes
from webapp.pipeline.stages.remote import prepare_remote_stage
from webapp.pipeline.stages.tune import tune_stage, tunes


def run(job_dir: Path) -> None:
    map_large_allocations()  # weights freed leave the address space the sandbox limits (memory.py)
    ctx = Context.open(job_dir, STAGES)
    ctx.results.save(limits=ctx.job.limits)
    # the generate stage builds the model again at each of its points: the records of the stages before
    # it (the model's modules and builds, its weights several times over) are let go when this returns
    build_and_time(ctx)
    let_go()
    if ctx.target.timed_on_board:  # built for the board here; the remote stage times them there
        ctx.stage("generate", board_generation_stage, skip=why_not_generated(ctx), required=False)
    else:
        ctx.stage("generate", generation_stage, skip=why_not_generated(ctx), required=False)
        ctx.skip("remote", "timed on this server, not on a board of the device pool")


def build_and_time(ctx: Context) -> None:
    """The stages from import to benchmark."""
    model = ctx.stage("import", import_stage)
    optimized = ctx.stage("optimize", optimize_stage, model)
    no_quantize = "no quantization asked (quantize: none), and the model has no scales of its own"
    quantized = ctx.stage(
        "quantize", quantize_stage, model, skip=None if quantizes(ctx, model) else no_quantize
    )
    no_tune = f"no tuning trials asked, and no shared tuning records for {ctx.target.name}"
    tuned = ctx.stage("tune", tune_stage, optimized, quantized, skip=None if tunes(ctx) else no_tune)
    built = ctx.stage("build", build_stage, model, optimized, quantized, tuned)
    inspected = ctx.stage("inspect", inspect_stage, model, optimized, built, quantized)
    if ctx.target.timed_on_board:  # timed on a board: the worker runs the remote stage after generate
        ctx.stage("benchmark", prepare_remote_stage, model, built, quantized)
        ctx.skip("bisect", why_not_bisected(ctx) or "")
        return
    # a benchmark that cannot run is marked failed; the job is done with its build and views
    why = ctx.target.why_not_timed()
    if why:  # built for a device this server lacks: said in the benchmark section too
        ctx.results.save(benchmarks=[], fidelity=[], not_timed=why)
    ctx.stage("benchmark", benchmark_stage, model, built, inspected, skip=why, required=False)
    why = why_not_bisected(ctx)
    if why == NOT_ASKED:  # the page offers it: the same job again, with the bisection
        ctx.results.save(bisect_offered=True)
    ctx.stage("bisect", bisect_stage, model, optimized, quantized, built, skip=why, required=False)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
