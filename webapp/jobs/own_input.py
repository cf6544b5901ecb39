"""A finished result's model run on the user's own input: a run of its own (/r/<job>/inputs/<run>),
kept under data/runs/<job>/<run>/, queued like a job and run in the sandbox like one
(webapp/pipeline/own_input.py reads the upload and runs the builds). The web process only saves
the upload; the worker copies in what the sandbox may read (the job's libraries and model files,
read-only) and records the run's status, which the sandbox cannot write."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import cast

from webapp.catalog import EXAMPLES
from webapp.codeviews import safe_job_file
from webapp.config import Config
from webapp.jobs.store import job_store, job_view, read_untrusted_json
from webapp.jsonfile import write_json_atomic
from webapp.machine.sandbox import run_sandboxed

BEAT_S = 10  # the worker rewrites a running run's status this often
# how an image is prepared for an example (the others: [0, 1] alone); the digits' class names
PREPARE = {"digits-cnn": "digits", "cnn-small": "imagenet", "resnet18": "imagenet", "resnet50": "imagenet"}
PREPARE |= {"mobilenet-v2": "imagenet"}


def runs_dir(config: Config, job_id: str) -> Path:
    """A job's own-input runs: not in the job's folder, which the job's own sandbox could write (a
    link planted there)."""
    return runs_root(config) / job_id


def runs_root(config: Config) -> Path:
    return config.data_dir / "runs"


def run_dir(config: Config, job_id: str, run_id: str) -> Path:
    """The run's folder, the sandbox's to write; its status and claim (the worker's) lie beside it."""
    return runs_dir(config, job_id) / run_id


def status_file(folder: Path) -> Path:
    return folder.with_name(folder.name + ".status.json")


def claim_file(folder: Path) -> Path:
    return folder.with_name(folder.name + ".claimed")


def claim(folder: Path) -> dict | None:
    """A worker's claim on a queued run folder (an own-input run, a kernel lab build), taken once: its
    status, now "running" and written so; None where another worker took it, or it is gone."""
    try:
        os.close(os.open(claim_file(folder), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:  # run by another worker already, or gone
        return None
    status = json.loads(status_file(folder).read_text()) | {"status": "running", "started": time.time()}
    write_json_atomic(status_file(folder), status)
    return status


def waiting_runs(config: Config) -> list[tuple[str, str]]:
    """(job, run) of every run not yet claimed by a worker: queued again at a worker's start, as
    jobs are (a queue that lost its messages loses no run; a repeated message is a no-op)."""
    runs = []
    for status in sorted(runs_root(config).glob("*/*.status.json")):
        folder = status.with_name(status.name.removesuffix(".status.json"))
        if not claim_file(folder).exists():
            runs.append((folder.parent.name, folder.name))
    return runs


# an uploaded archive's model (an .onnx with its external data files), as the import stage unpacks it
UNPACKED_MODEL = "unpacked/model.onnx"


def model_references(options: dict) -> dict[str, str]:
    """The reference runtimes' model files in a job's folder (as the worker prepared the job)."""
    if options.get("example") in EXAMPLES:
        return {"pytorch": "input/reference.pt2", "onnxruntime": "input/model.onnx"}
    model = options["model_file"]
    if model.endswith(".zip"):
        return {"onnxruntime": UNPACKED_MODEL}
    return {"pytorch" if model.endswith(".pt2") else "onnxruntime": f"input/{model}"}


def copy_libraries(job_dir: Path, named: dict[str, str], folder: Path) -> dict[str, str]:
    """The job's libraries ({label: file name in its files/}) copied into the run's input/, those still
    there: {label: path in the run's folder}."""
    out = {}
    for label, name in named.items():
        path = safe_job_file(job_dir, f"files/{name}")
        if path is not None:
            shutil.copyfile(path, folder / "input" / path.name)
            out[label] = f"input/{path.name}"
    return out


def copy_model(job_dir: Path, rel: str, folder: Path) -> str | None:
    """A model file of the job copied into the run's input/ (an unpacked model with its external data
    files); its path there, or None where the job has none."""
    path = safe_job_file(job_dir, rel)
    if path is None:
        return None
    if rel != UNPACKED_MODEL:
        shutil.copyfile(path, folder / "input" / path.name)
        for data in sorted(path.parent.glob("*.onnx.data")):  # an example's weights past 2 GB, a .pt2's
            kept = safe_job_file(job_dir, str(Path(rel).parent / data.name))
            if kept is not None:
                shutil.copyfile(kept, folder / "input" / data.name)
        return f"input/{path.name}"
    for part in sorted((job_dir / "unpacked").rglob("*")):
        inside = part.relative_to(job_dir)
        kept = safe_job_file(job_dir, str(inside))
        if kept is not None:
            (folder / "input" / inside).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept, folder / "input" / inside)
    return f"input/{rel}"


def prepare_generation(config: Config, job: dict, folder: Path) -> None:
    """input/run.json of a generation run (webapp/pipeline/own_prompt.py), and copies of the decode
    libraries the generate stage kept and of the model ONNX Runtime runs."""
    job_dir = job_store(config).job_dir(job["id"])
    kept = ((job["results"].get("generation") or {}).get("generate")) or {}
    asked = json.loads((folder / "input" / "upload-prompt.json").read_text())
    named = {
        f"TVM {v}": name
        for v, name in (kept.get("libraries") or {}).items()
        if re.fullmatch(r"[\w.-]{1,40}", v)
    }
    spec: dict = {"slots": int(kept["slots"]), "threads": config.bench_threads}
    spec["libraries"] = copy_libraries(job_dir, named, folder)
    example = job["options"].get("example")
    model = kept.get("model") or (  # what the generate stage ran ONNX Runtime on (results before it: guessed)
        "input/generator.onnx" if example in EXAMPLES else model_references(job["options"])["onnxruntime"]
    )
    spec["model"] = copy_model(job_dir, model, folder)
    if spec["model"] is None or not spec["libraries"]:
        raise FileNotFoundError("the result's decode libraries or its model are gone")
    tokenizer = folder / "input" / "upload-tokenizer.json"
    spec |= {
        "example": example if example in EXAMPLES else None,
        "prompt": str(asked["prompt"]),
        "new_tokens": int(asked["new_tokens"]),
        "tokenizer": f"input/{tokenizer.name}" if tokenizer.exists() else None,
    }
    write_json_atomic(folder / "input" / "run.json", spec)


def prepare(config: Config, job: dict, folder: Path) -> None:
    """input/run.json and copies of what the run reads: the job's libraries and model files."""
    job_dir, r = job_store(config).job_dir(job["id"]), job["results"]
    variant = re.sub(r"[^\w.-]", "", str((r.get("quantization") or {}).get("variant") or ""))[:20]
    files = {"model-fp32.so": "TVM fp32", "model.so": f"TVM {variant or 'fp32'}"}
    spec: dict = {"references": {}, "upload": next((folder / "input").glob("upload*")).name}
    spec["libraries"] = copy_libraries(job_dir, {label: name for name, label in files.items()}, folder)
    for runtime, rel in model_references(job["options"]).items():
        copied = copy_model(job_dir, rel, folder)
        if copied:
            spec["references"][runtime] = copied
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
    status = claim(folder)
    if status is None:
        return
    error = None
    try:
        # the run's job (a run is made for one): a job gone meanwhile fails in prepare, said below
        generating = status.get("kind") == "generate"
        (prepare_generation if generating else prepare)(config, cast(dict, job_view(store, job_id)), folder)
        module = "webapp.pipeline.own_prompt" if generating else "webapp.pipeline.own_input"
        command = [sys.executable, "-m", module, str(folder)]
        last = [time.monotonic()]

        def beat() -> None:  # the worker's heartbeat, so that the page tells a stopped worker from a long run
            if time.monotonic() - last[0] > BEAT_S:
                last[0] = time.monotonic()
                write_json_atomic(status_file(folder), status | {"beat": time.time()})

        outcome = run_sandboxed(folder, config, command, stop=beat)
        result = read_untrusted_json(folder / "result.json")
        if outcome.limit or not isinstance(result, dict) or result.get("status") != "done":
            error = outcome.limit or (result or {}).get("error") or "The run ended without a result."
    except Exception as exc:  # our bug: said on the run's page
        error = f"Could not run the input: {exc}"
    for path in (folder / "input").iterdir():  # the copies of the job's files go; the upload stays
        if path.name != "run.json" and not path.name.startswith("upload"):
            path.unlink()
    status |= {"status": "failed" if error else "done", "ended": time.time()}
    write_json_atomic(status_file(folder), status | ({"error": str(error)[:4000]} if error else {}))
