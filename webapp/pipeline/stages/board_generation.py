"""The generate stage of a job timed on a board of the device pool (a Raspberry Pi): llama-bench's text
generation measured where the code is for. One point, decode with a cache of BOARD_POINT.past tokens,
built here for the board in float and with its weights quantized in int8 and int4 (as the generate
stage builds a decode point for this server, webapp/pipeline/stages/generation.py); each build's
kernels estimated by llvm-mca on the board core's scheduling model (reports/mca.py), and what the
remote stage needs to time the builds on the board: the libraries, the step's inputs and ONNX Runtime's
logits of them on this server (remote/generate.json and its files). The remote stage adds the board's
rows (webapp/pipeline/stages/remote.py: time_generation).

An emulated board's times are QEMU's on this server's cores, not a Pi's: the page says so, and
llvm-mca's per-kernel estimate for the board's core stands beside them. Prefill and longer caches are
left to a job on a server: each point would be four more builds for the board and its runs under QEMU.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.stages.generation import Point, build_point, generator_file
from webapp.pipeline.stages.inspect import kernel_estimates
from webapp.pipeline.stages.lm_inputs import onnx_signature

BOARD_POINT = Point("decode", 1, 128)


def board_generation_stage(ctx: Context, report: Report) -> Given[None]:
    """BOARD_POINT's builds for the board, each with llvm-mca's estimate, and remote/generate.json for the
    remote stage; the result's generation section, its rows to come from the board."""
    from webapp.pipeline.stages import bench

    path = generator_file(ctx)
    sig = onnx_signature(path) if path else None
    assert path is not None and sig is not None  # why_not_generated() is None
    point, target, folder = BOARD_POINT, ctx.target, ctx.dir / "remote"
    values = sig.values(point.tokens, point.past)
    session = bench.onnxruntime_session(path, bench.bench_threads())
    folder.mkdir(exist_ok=True)
    np.savez(folder / "generate-inputs.npz", *values.values())
    np.save(folder / "generate-expected.npy", session.run(None, values)[0])  # the logits, on this server
    report(0.1)

    def analyse(executable: Any, fused: Any, lowered: Any) -> dict:
        return kernel_estimates(executable, fused, lowered, target)

    builds = build_point(path, sig, point, target, analyse)
    files = {v: f"generate-{v}.so" for v in builds}
    for v, build in builds.items():
        target.export_library(build["executable"], str(folder / files[v]))
    plan = {"past": point.past, "builds": [{"variant": v, "file": f} for v, f in files.items()]}
    (folder / "generate.json").write_text(json.dumps(plan, indent=1))
    variants = {
        v: {
            "build_s": b["build_s"],
            "streamed_bytes": b["packed"].streamed,
            "model_bytes": sig.weight_bytes - b["packed"].replaced + b["packed"].packed,
            "mca": b["analysis"],
        }
        for v, b in builds.items()
    }
    record = {"phase": point.phase, "tokens": point.tokens, "past": point.past, "variants": variants}
    generation = {
        "board": target.timed_on_board,
        "builds": (
            f"one point built for {target.name}, decode with {point.past} tokens in the cache, in float "
            f"and with its weights quantized ({', '.join(v for v in builds if v != 'fp32')})"
        ),
        "variants": list(builds),
        "weight_bytes": sig.weight_bytes,
        "points": [record],
        "rows": [],  # the board's, added by the remote stage
    }
    return Given(None, {"generation": generation})
