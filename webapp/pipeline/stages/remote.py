"""The remote stage: a target whose board is not this server is timed on a board of the device pool.

Two halves. `prepare_remote` runs as the pipeline's benchmark stage, inside the pipeline's sandbox
(no network): it writes into remote/ each build as a library for the board, the inputs, and what
the board's outputs are checked against: the frameworks' fp32 outputs on this server and, for each
quantized variant, this server's own build of the same integer model (plain `tvm.compile`). Then
`python -m webapp.pipeline.stages.remote JOB_DIR` runs the stage itself, in a sandbox of its own that can
reach the tracker: it never reads the user's model, only those libraries and arrays. It asks the
tracker for a free board of the target's key, uploads every build, checks its outputs and times it
with `time_evaluator`, fp32 and quantized in the same session on the same board.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from webapp.machine import timing_slot
from webapp.pipeline.errors import StageError
from webapp.pipeline.job import Context, Given, Report

if TYPE_CHECKING:
    import tvm
    from tvm import relax, rpc

    from webapp.pipeline.job import Job
    from webapp.pipeline.stages.build import Built
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.pipeline.stages.quantize.variants import QuantizedJob
    from webapp.targets import Target

SESSION_TIMEOUT_S = 3600  # the board ends a session that runs longer
MAX_ARGS_BYTES = 1 << 30  # a kernel whose arguments take more is not timed alone


def slug(variant: str, tuned: bool) -> str:
    return variant.replace(" ", "-") + ("-tuned" if tuned else "")


# ---------------------------------------------------------------- in the pipeline's sandbox


def prepare_remote_stage(
    ctx: Context, report: Report, model: ImportedModel, built: Built, quantized: QuantizedJob | None
) -> Given[None]:
    """The benchmark stage of a job timed on a board of the device pool: here only what the board's
    run is checked against; the worker runs the remote stage next, in a sandbox that may reach the
    tracker."""
    return Given(None, prepare_remote(built, quantized, model, ctx.job, ctx.target, report))


def on_this_server(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of `mod` built by TVM's default pipeline for this server's CPU, on `inputs`."""
    import tvm
    from tvm import relax

    from webapp import targets
    from webapp.pipeline.stages.bench import flatten_outputs

    host, dev = targets.host().tvm, targets.host().device()
    ex = tvm.compile(mod, target=host, relax_pipeline=relax.get_default_pipeline(host))
    vm = relax.VirtualMachine(ex, dev)
    return flatten_outputs(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs.values()]))


def prepare_remote(
    built: Built,
    quantized: QuantizedJob | None,
    model: ImportedModel,
    job: Job,
    target: Target,
    report: Callable[..., None],
) -> dict:
    """remote/: a library per build, inputs.npz, expected.npz (reference outputs), plan.json."""
    import os

    from webapp.pipeline.stages.bench import is_classifier, job_inputs

    folder = job.dir / "remote"
    folder.mkdir(exist_ok=True)
    inputs = job_inputs(model, job)
    expected, unavailable = reference_outputs(job, quantized, inputs, report)
    builds = []
    layers = built.board_plan
    for (variant, tuned), executable in sorted(built.executables.items()):
        file = f"{slug(variant, tuned)}.so"
        (folder / file).unlink(missing_ok=True)
        if (variant, tuned) in built.libraries:  # exported by the build stage already
            os.link(built.libraries[(variant, tuned)], folder / file)
        else:
            target.export_library(executable, str(folder / file))
        builds.append({"variant": variant, "tuned": tuned, "file": file})
        if layers and not tuned and variant in layers["kernels"]:  # its kernels alone, to time one by one
            builds[-1]["kernels_file"] = f"{slug(variant, tuned)}-kernels.so"
            target.export_library(executable.mod.imports[0], str(folder / builds[-1]["kernels_file"]))
    np.savez(folder / "inputs.npz", *inputs.values())
    arrays = {f"{k}|{i}": a for k, outs in expected.items() for i, a in enumerate(outs)}
    np.savez(folder / "expected.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub: a key may be allow_pickle
    plan = {"builds": builds, "references": list(expected), "classifier": is_classifier(model.outputs)}
    plan |= {"layers": layers} if layers else {}
    if quantized:  # what the board's layer times join (quantization.layer_speed)
        plan["quantization"] = quantized.to_json()["quantization"]
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    report(1.0)
    return {"unavailable_runtimes": unavailable, "classifier": plan["classifier"]}


def reference_outputs(
    job: Job, quantized: QuantizedJob | None, inputs: dict[str, np.ndarray], report: Callable[..., None]
) -> tuple[dict[str, list[np.ndarray]], list[dict]]:
    """The outputs a board's run is checked against, computed on this server: the frameworks' fp32
    ones, and each quantized variant's integer model built for this server; with the runtimes that
    could not run and why."""
    from webapp.pipeline.stages.bench import (
        bench_threads,
        flatten_outputs,
        onnxruntime_runner,
        pytorch_runner,
        torch_outputs,
    )

    expected, unavailable = {}, []
    runners: dict[str, Callable[..., Callable[[], object]]] = {
        "pytorch": pytorch_runner,
        "onnxruntime": onnxruntime_runner,
    }
    for name, path in job.references.items():
        try:
            out = runners[name](path, inputs, bench_threads())()
        except Exception as exc:
            unavailable.append({"runtime": name, "reason": f"{type(exc).__name__}: {str(exc)[:500]}"})
            continue
        expected[name] = torch_outputs(out) if name == "pytorch" else flatten_outputs(out)
    report(0.3)
    for q in quantized.variants if quantized else []:
        expected[f"{q.variant} on this server"] = on_this_server(q.mod, inputs)
    report(0.6)
    return expected, unavailable


# ---------------------------------------------------------------- the remote stage's own process


def load_expected(path: Path) -> dict[str, list[np.ndarray]]:
    out: dict[str, list[np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in sorted(data.files, key=lambda k: (k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1]))):
            out.setdefault(key.rsplit("|", 1)[0], []).append(data[key])
    return out


def board_of(session: rpc.RPCSession, key: str, host: str, port: int) -> dict:
    """What the board says it is (an emulated board of the pool answers playground.board_info); a
    board without that function is a real one running TVM's stock rpc_server."""
    try:
        info = json.loads(session.get_function("playground.board_info")())
    except Exception:
        info = {"name": f"{key} (real board at {host}:{port})", "key": key, "emulated": False}
        info["threads"] = int(session.get_function("runtime.NumThreads")())  # TVM's thread pool there
    return info | {"address": f"{host}:{port}"}


def timed(vm: relax.VirtualMachine, dev: tvm.runtime.Device, budget_s: float, first_s: float) -> dict:
    """time_evaluator on the board, as many runs as fit in the budget (at least 3) after its own
    warm-up call, of the stateful call on the inputs already set (run_timed); first_s, the time of the
    call that fetched the outputs, sizes it."""
    from webapp.pipeline.stages.timing import summarize

    runs = int(max(3, min(50, budget_s / max(first_s, 1e-6))))
    timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=runs)
    return summarize([t * 1e3 for t in timer("main").results])


def run_timed(
    session: rpc.RPCSession, dev: tvm.runtime.Device, library: Path, inputs: list[np.ndarray], budget_s: float
) -> tuple[list[np.ndarray], dict]:
    """A library of remote/ uploaded to the board, run on `inputs`: (its outputs, timed())."""
    import tvm
    from tvm import relax

    from webapp.pipeline.stages.bench import flatten_outputs

    session.upload(str(library))
    vm = relax.VirtualMachine(session.load_module(library.name), dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    started = time.perf_counter()
    vm.set_input("main", *args)  # the stateful calls: over RPC a tuple comes back only by get_outputs
    vm.invoke_stateful("main")
    outputs = flatten_outputs(vm.get_outputs("main"))
    return outputs, timed(vm, dev, budget_s, time.perf_counter() - started)


def load_arrays(path: Path) -> list[np.ndarray]:
    """The arrays of an .npz written by np.savez(*arrays), in order."""
    with np.load(path, allow_pickle=False) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def refuse_outside(files: list, plan: str) -> None:
    """A plan the pipeline wrote names libraries of remote/ only: one outside it ends the stage."""
    if not all(LIBRARY_NAME.fullmatch(str(f)) for f in files):
        raise StageError(f"remote/{plan} names a library outside remote/: refused.")


@dataclass(frozen=True)
class Remote:
    """What the worker (jobs/worker.py: run_remote_stage) tells the remote stage on its command line,
    from its own configuration: not from the job folder, which the pipeline could have written."""

    job_dir: Path
    tracker: str  # host:port
    key: str  # the boards' key, e.g. rpi5
    wait_s: float  # for a free board
    budget_s: float  # timing budget per build

    @classmethod
    def from_argv(cls, argv: list[str]) -> Remote:
        job_dir, tracker, key, wait_s, budget_s = argv
        return cls(Path(job_dir), tracker, key, float(wait_s), float(budget_s))


LIBRARY_NAME = re.compile(r"[\w.-]+\.so")


def run_remote(job: Remote, report: Callable[..., None], generation: dict | None = None) -> dict:
    """The job's builds timed on a board (and the generate stage's decode builds, added to its
    `generation` section)."""
    from tvm import rpc

    from webapp.devices.tracker import Tracker, TrackerError

    folder = job.job_dir / "remote"
    plan = json.loads((folder / "plan.json").read_text())
    files = [b.get(k) for b in plan["builds"] for k in ("file", "kernels_file") if k == "file" or k in b]
    refuse_outside(files, "plan.json")
    inputs = load_arrays(folder / "inputs.npz")
    expected = load_expected(folder / "expected.npz")
    key, wait_s = job.key, job.wait_s
    report(0.0, {"waiting": f"for a free '{key}' board (up to {wait_s:.0f} s)"})
    try:
        tracker = Tracker(job.tracker)
        host, port, matchkey = tracker.request(key, wait_s)
    except TrackerError as exc:
        raise StageError(str(exc)) from None
    try:
        session = rpc.connect(host, port, matchkey, session_timeout=SESSION_TIMEOUT_S)
    except Exception as exc:
        raise StageError(
            f"The tracker gave the {key!r} board at {host}:{port}, which did not answer: {exc}"
        ) from None
    tracker.close()
    board = board_of(session, key, host, port)
    report(0.05, {"board": board["name"]})
    dev = session.cpu()
    # an emulated board's QEMU runs on this machine's cores: its runs hold the machine's timing slot
    slot = timing_slot.hold("board") if board.get("emulated", True) else nullcontext()
    with slot:
        rows, outs = [], {}
        for i, build in enumerate(plan["builds"]):
            what = f"the {build['variant']} build"
            try:
                outs[build["variant"], build["tuned"]], timing = run_timed(
                    session, dev, folder / build["file"], inputs, job.budget_s
                )
            except Exception as exc:
                raise StageError(crash_message(board, what, exc)) from None
            threads = board.get("threads")
            rows.append({"runtime": "tvm", "variant": build["variant"], "tuned": build["tuned"]}
                        | {"device": board["name"], "threads": threads, **timing})  # fmt: skip
            report((i + 1) / len(plan["builds"]), {"board": board["name"]})
        speed = time_layers(session, dev, folder, plan, board)
        generated = time_generation(session, dev, folder, board, job.budget_s, generation)
    fid = board_fidelity(outs, expected, board["key"], plan["classifier"])
    out = {"benchmarks": rows, "fidelity": fid, "device": board, "threads": board.get("threads")}
    if speed and plan.get("quantization"):  # the quantized layers, as timed on the board
        out["quantization"] = plan["quantization"] | {"layer_speed": speed}
    return out | ({"generation": generated} if generated else {})


def time_generation(
    session: rpc.RPCSession,
    dev: tvm.runtime.Device,
    folder: Path,
    board: dict,
    budget_s: float,
    generation: dict | None,
) -> dict | None:
    """The generate stage's decode builds for the board (remote/generate.json, board_generation.py) run
    and timed on it: `generation`, the stage's section, with the board's rows (tokens per second) and
    each build's logits against ONNX Runtime's on this server (fp32) and the board's fp32 (quantized).
    None where the stage left no builds; a failure is said in the section, the job's timings stand."""
    from webapp.pipeline.stages.fidelity import fidelity

    if not generation or not (folder / "generate.json").is_file():
        return None
    plan = json.loads((folder / "generate.json").read_text())
    logits, rows = {}, []
    try:
        refuse_outside([b["file"] for b in plan["builds"]], "generate.json")
        inputs = load_arrays(folder / "generate-inputs.npz")
        expected = np.load(folder / "generate-expected.npy", allow_pickle=False)
        for build in plan["builds"]:
            variant = build["variant"]
            outputs, timing = run_timed(session, dev, folder / build["file"], inputs, budget_s)
            logits[variant] = outputs[0]
            reference = expected if variant == "fp32" else logits["fp32"]
            rows.append(
                {"runtime": "tvm", "variant": variant, "phase": "decode", "tokens": 1, "past": plan["past"]}
                | {f: timing[f] for f in ("median_ms", "p90_ms", "runs")}
                | {"tokens_per_s": round(1e3 / timing["median_ms"], 2), "device": board["name"]}
                | {"logits_sqnr_db": fidelity([logits[variant]], [reference], classifier=False)["sqnr_db"]}
            )
    except Exception as exc:  # noqa: BLE001 - the job's own timings on the board stand
        return generation | {"rows": rows, "error": crash_message(board, "the decode builds", exc)}
    fp32_ms = next(r["median_ms"] for r in rows if r["variant"] == "fp32")
    rows = [r | {"speedup_vs_tvm_fp32": round(fp32_ms / r["median_ms"], 3)} for r in rows]
    return generation | {"rows": rows, "device": board["name"], "threads": board.get("threads")}


def board_fidelity(outs: dict, expected: dict, board_key: str, classifier: bool) -> list[dict]:
    """Each build's outputs on the board against the references computed on this server (a quantized
    build's own also against the same integer model built for this server, and the board's fp32)."""
    from webapp.pipeline.stages.fidelity import fidelity

    fid = []
    for (variant, tuned), out in outs.items():
        own = f"{variant} on this server"
        checks = {k: v for k, v in expected.items() if not k.endswith(" on this server") or k == own}
        if variant != "fp32" and ("fp32", False) in outs:
            checks[f"TVM fp32 on {board_key}"] = outs[("fp32", False)]
        for ref, ref_out in checks.items():
            row = fidelity(out, ref_out, classifier)
            fid.append({"variant": variant, "tuned": tuned, "reference": ref, **row})
    return fid


def time_layers(
    session: rpc.RPCSession, dev: tvm.runtime.Device, folder: Path, plan: dict, board: dict
) -> dict | None:
    """The quantized layers timed against float on the board (quantization.layer_speed): each
    layer's kernel in both builds, alone, on random inputs of its arguments' shapes (`time_evaluator`,
    the median of 3 repeats of at least 20 ms), from each build's library of kernels. A failure
    leaves the job as timed whole, with the message."""
    from webapp.pipeline.stages.fallback import board_speed

    layers = plan.get("layers")
    if not layers:
        return None
    rng = np.random.default_rng(0)
    times: dict[str, dict[str, float]] = {}
    try:
        for build in plan["builds"]:
            if "kernels_file" not in build:
                continue
            session.upload(str(folder / build["kernels_file"]))
            kernels = session.load_module(build["kernels_file"])
            own = times.setdefault(build["variant"], {})
            for name, args in layers["kernels"][build["variant"]].items():
                if sum(np.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in args) > MAX_ARGS_BYTES:
                    continue  # a plan the pipeline wrote is not trusted with this machine's memory
                arrays = [tvm_tensor(rng, shape, dtype, dev) for shape, dtype in args]
                timer = kernels.time_evaluator(name, dev, number=1, repeat=3, min_repeat_ms=20)
                own[name] = float(np.median(timer(*arrays).results)) * 1e3
        return board_speed(layers, times, board["name"])
    except Exception as exc:  # noqa: BLE001 - the model's own timings stand
        return {"device": board["name"], "error": crash_message(board, "the layers' kernels", exc)}


def tvm_tensor(
    rng: np.random.Generator, shape: list[int], dtype: str, dev: tvm.runtime.Device
) -> tvm.runtime.Tensor:
    """Random values of a kernel argument (small integers for integer dtypes), on the board."""
    import tvm

    if dtype.startswith(("int", "uint")):
        values: np.ndarray = rng.integers(0 if dtype.startswith("uint") else -8, 8, size=shape)
    else:
        values = rng.standard_normal(shape)
    return tvm.runtime.tensor(values.astype(dtype), dev)


def crash_message(board: dict, what: str, exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    detail = text[-1] if text else type(exc).__name__
    if any(w in str(exc) for w in ("kShutdown", "connection", "Connection", "closed", "Broken pipe")):
        return (
            f"The board {board['name']} stopped while running {what}: the session ended ({detail[:300]}). "
            "A kernel may have used an instruction the board's core lacks (SIGILL), or the board was "
            "stopped. An emulated board serves on after a crashed session (the pool restarts one that "
            "died); submit the job again."
        )
    return f"Running {what} on the board {board['name']} failed: {detail[:500]}"


def main(argv: list[str]) -> None:
    from webapp.catalog import STAGES
    from webapp.pipeline.job import Progress, Results

    job = Remote.from_argv(argv)
    progress, results = Progress(job.job_dir, STAGES, resume=True), Results(job.job_dir, resume=True)
    generation = results.data.get("generation")
    results.save(**(progress.run_stage("remote", lambda report: run_remote(job, report, generation)) or {}))


if __name__ == "__main__":
    main(sys.argv[1:])
