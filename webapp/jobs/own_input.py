"""A finished result's model run on the user's own input: a run of its own (/r/<job>/inputs/<run>),
kept in the job's folder under runs/<run>/, queued like a job and run in the sandbox like one
(webapp/pipeline/own_input.py reads the upload and runs the builds). The web process only saves
the upload; the worker copies in what the sandbox may read (the job's libraries and model files,
read-only) and records the run's status, which the sandbox cannot write."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path

from webapp import targets
from webapp.catalog import EXAMPLES
from webapp.codeviews import safe_job_file
from webapp.config import Config
from webapp.jobs.store import job_store, job_view, read_untrusted_json
from webapp.jobs.submit import check_zip, save_upload
from webapp.jsonfile import write_json_atomic
from webapp.options import SubmitError
from webapp.sandbox import run_sandboxed

IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
MAX_RUNS_PER_JOB = 50
MAX_INPUT_MB = 200
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{12}$")
# how an image is prepared for an example (the others: [0, 1] alone); the digits' class names
PREPARE = {"digits-cnn": "digits", "cnn-small": "imagenet", "resnet18": "imagenet", "resnet50": "imagenet"}
PREPARE |= {"mobilenet-v2": "imagenet"}


def why_not(job: dict) -> str | None:
    """Why this result cannot run an input here, or None: it must be done, and its code for this
    server's CPU (a board's or a GPU's library does not run here)."""
    r, target = job.get("results") or {}, targets.TARGETS.get(job["options"].get("target", ""))
    if job["status"] != "done" or "model.so" not in (r.get("files") or []):
        return "The result has no finished library to run."
    if target is None or target.board or (r.get("target") or {}).get("tvm", {}).get("kind") != "llvm":
        where = target.name if target else "?"
        return f"Own inputs run on this server's CPU; this result's code is for {where}."
    if r.get("not_timed"):
        return f"This result's code does not run on this server: {r['not_timed']}"
    return None


def run_dir(config: Config, job_id: str, run_id: str) -> Path:
    """The run's folder, the sandbox's to write; its status (the worker's) lies beside it."""
    return job_store(config).job_dir(job_id) / "runs" / run_id


def status_file(folder: Path) -> Path:
    return folder.with_name(folder.name + ".status.json")


def create_run(config: Config, job: dict, upload, filename: str) -> str:
    """Saves the upload as a new queued run of `job`; returns its id (raises SubmitError)."""
    why = why_not(job)
    if why:
        raise SubmitError(why)
    suffix = Path(filename or "").suffix.lower()
    if suffix != ".npz" and suffix not in IMAGES:
        raise SubmitError("Send an .npz of the model's inputs, or an image (" + ", ".join(IMAGES) + ").")
    runs = job_store(config).job_dir(job["id"]) / "runs"
    if runs.is_dir() and len(list(runs.glob("*.status.json"))) >= MAX_RUNS_PER_JOB:
        raise SubmitError(f"This result has run {MAX_RUNS_PER_JOB} inputs already, this server's limit.")
    run_id = secrets.token_urlsafe(9)
    folder = run_dir(config, job["id"], run_id)
    (folder / "input").mkdir(parents=True)
    path = folder / "input" / f"upload{suffix}"
    try:
        save_upload(upload, b"", path, MAX_INPUT_MB)
        if suffix == ".npz":
            check_zip(path, "The .npz", config.max_unzipped_mb)
    except SubmitError:
        shutil.rmtree(folder)
        raise
    status = {"status": "queued", "created": time.time(), "filename": Path(filename).name[:200]}
    write_json_atomic(status_file(folder), status)
    return run_id


def model_references(options: dict) -> dict[str, str]:
    """The reference runtimes' model files in a job's input/ (as the worker prepared the job)."""
    if options.get("example") in EXAMPLES:
        return {"pytorch": "input/reference.pt2", "onnxruntime": "input/model.onnx"}
    model = options["model_file"]
    return {"pytorch" if model.endswith(".pt2") else "onnxruntime": f"input/{model}"}


def prepare(config: Config, job: dict, folder: Path) -> None:
    """input/run.json and copies of what the run reads: the job's libraries and model files."""
    job_dir, r = job_store(config).job_dir(job["id"]), job["results"]
    variant = re.sub(r"[^\w.-]", "", str((r.get("quantization") or {}).get("variant") or ""))[:20]
    files = {"model-fp32.so": "TVM fp32", "model.so": f"TVM {variant or 'fp32'}"}
    spec: dict = {"libraries": {}, "references": {}, "upload": next((folder / "input").glob("upload*")).name}
    for name, label in files.items():
        path = safe_job_file(job_dir, f"files/{name}")
        if path is not None:
            shutil.copyfile(path, folder / "input" / name)
            spec["libraries"][label] = f"input/{name}"
    for runtime, rel in model_references(job["options"]).items():
        path = safe_job_file(job_dir, rel)
        if path is not None:
            shutil.copyfile(path, folder / "input" / path.name)
            spec["references"][runtime] = f"input/{path.name}"
    example = EXAMPLES.get(job["options"].get("example") or "")
    spec |= {
        "upload": f"input/{spec['upload']}",
        "kind": "npz" if spec["upload"].endswith(".npz") else "image",
        "inputs": (r.get("model") or {}).get("inputs") or [],
        "classifier": bool(example.classifier) if example else True,
        "classes": [str(i) for i in range(10)] if example and example.dataset == "digits" else None,
        "prepare": {"kind": PREPARE.get(example.name if example else "", "plain")},
        "threads": config.bench_threads,
    }
    write_json_atomic(folder / "input" / "run.json", spec)


def run_input(config: Config, job_id: str, run_id: str) -> None:
    """The worker's part: claim the run once, prepare it, run it in the sandbox, record its end."""
    store = job_store(config)
    folder = run_dir(config, job_id, run_id)
    try:
        os.close(os.open(folder.with_name(run_id + ".claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:  # run by another worker already, or gone
        return
    status = json.loads((status_file(folder)).read_text())
    write_json_atomic(status_file(folder), status | {"status": "running", "started": time.time()})
    error = None
    try:
        prepare(config, job_view(store, job_id), folder)
        command = [sys.executable, "-m", "webapp.pipeline.own_input", str(folder)]
        outcome = run_sandboxed(folder, config, command)
        result = read_untrusted_json(folder / "result.json")
        if outcome.limit or not isinstance(result, dict) or result.get("status") != "done":
            error = outcome.limit or (result or {}).get("error") or "The run ended without a result."
    except Exception as exc:  # our bug: said on the run's page
        error = f"Could not run the input: {exc}"
    status |= {"status": "failed" if error else "done", "ended": time.time()}
    write_json_atomic(status_file(folder), status | ({"error": str(error)[:4000]} if error else {}))


def run_view(config: Config, job_id: str, run_id: str) -> dict | None:
    """A run as its page and JSON show it: the worker's status, and what the sandbox found (only the
    fields the page reads, each of its type)."""
    folder = run_dir(config, job_id, run_id) if RUN_ID.match(run_id) else None
    status = read_untrusted_json(status_file(folder)) if folder else None
    if not isinstance(status, dict):
        return None
    view = {
        "id": run_id,
        "job": job_id,
        **{k: status.get(k) for k in ("status", "filename", "created", "error")},
    }
    result = read_untrusted_json(folder / "result.json") if status.get("status") == "done" else None
    if isinstance(result, dict):
        view |= clean_result(result)
    done = status.get("status") == "done"
    view["outputs_file"] = done and safe_job_file(folder, "files/outputs.npz") is not None
    return view


def text(x) -> str | None:
    return str(x)[:2000] if x is not None else None


def number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def clean_result(result: dict) -> dict:
    """The sandbox's result.json reduced to what the page shows, each value of its type."""

    def shapes(xs) -> list[dict]:
        keep = [i for i in (xs or [])[:64] if isinstance(i, dict)]
        return [
            {
                "name": text(i.get("name")),
                "shape": [d if isinstance(d, int) else text(d) for d in i.get("shape", [])][:8],
            }
            | {"dtype": text(i.get("dtype"))}
            for i in keep
        ]

    rows = []
    for row in (result.get("runtimes") or [])[:8]:
        if not isinstance(row, dict):
            continue
        against = row.get("against") if isinstance(row.get("against"), dict) else {}
        rows.append(
            {
                "runtime": text(row.get("runtime")),
                "error": text(row.get("error")),
                "outputs": shapes(row.get("outputs")),
                "first_values": [number(v) for v in (row.get("first_values") or [])[:8]],
                "top5": [
                    [text(c[0]), number(c[1])]
                    for c in (row.get("top5") or [])[:5]
                    if isinstance(c, list) and len(c) == 2
                ],
                "top1": [int(v) for v in (row.get("top1") or [])[:5000] if isinstance(v, int)],
                "against": {
                    k: number(against.get(k)) for k in ("max_abs_err", "cosine", "sqnr_db", "top1_agree")
                }
                | {"reference": text(against.get("reference")), "error": text(against.get("error"))},
            }
        )
    return {
        "inputs": shapes(result.get("inputs")),
        "runs": result["runs"] if isinstance(result.get("runs"), int) else None,
        "prepared": text(result.get("prepared")),
        "reference": text(result.get("reference")),
        "classifier": result.get("classifier") is True,
        "runtimes": rows,
    }
