"""A result's model on the user's own input: the form's and the API's submission (the upload saved
as a queued run, webapp/jobs/own_input.py runs it), the run's page, its JSON and its outputs."""

from __future__ import annotations

import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from flask import Blueprint, Response, abort, jsonify, redirect, render_template, request, send_file, url_for
from werkzeug.exceptions import BadRequest
from werkzeug.wrappers import Response as BaseResponse

from webapp import targets
from webapp.codeviews import safe_job_file
from webapp.config import Config
from webapp.jobs.own_input import BEAT_S, run_dir, runs_dir, status_file
from webapp.jobs.store import read_untrusted_json
from webapp.jobs.submit import check_zip, save_upload
from webapp.jsonfile import write_json_atomic
from webapp.options import SubmitError
from webapp.web import ctx, view_or_404
from webapp.web.compare import job_title

IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
MAX_RUNS_PER_JOB = 50
MAX_INPUT_MB = 200
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{12}$")


def why_not(job: dict) -> str | None:
    """Why this result cannot run an input here, or None: it must be done, its files kept, and its
    code for this server's CPU (a board's or a GPU's library does not run here)."""
    r, target = job.get("results") or {}, targets.TARGETS.get(job["options"].get("target", ""))
    if job["status"] != "done" or job.get("expired") or "model.so" not in (r.get("files") or []):
        return "The result has no library kept to run."
    if target is None or not target.runs_cpu_code_here:
        where = target.name if target else "?"
        return f"Own inputs run on this server's CPU; this result's code is for {where}."
    if r.get("not_timed"):
        return f"This result's code does not run on this server: {r['not_timed']}"
    return None


MAX_PROMPT_CHARS = 20_000
MAX_TOKENIZER_MB = 50


def why_not_generate(job: dict) -> str | None:
    """Why this result cannot generate from a prompt here, or None: its generate stage kept its decode
    builds (a causal LM with an attention mask, timed on this server's CPU) and they are still kept."""
    kept = ((job.get("results") or {}).get("generation") or {}).get("generate")
    if job["status"] != "done" or not isinstance(kept, dict) or not isinstance(kept.get("slots"), int):
        return "The result kept no decode build to generate with."
    libraries = kept.get("libraries")
    if not isinstance(libraries, dict) or not libraries:
        return "The result kept no decode build to generate with."
    if job.get("expired") or not set(libraries.values()) <= set(job["results"].get("files") or []):
        return "This result's decode libraries were removed (the server's retention policy)."
    return None


def new_run(config: Config, job: dict) -> tuple[str, Path]:
    """A new run's id and folder (its input/ made); raises SubmitError at the limit. Its status is
    written last, once its input is saved (a worker takes a run with a status)."""
    if len(list(runs_dir(config, job["id"]).glob("*.status.json"))) >= MAX_RUNS_PER_JOB:
        raise SubmitError(f"This result has run {MAX_RUNS_PER_JOB} inputs already, this server's limit.")
    run_id = secrets.token_urlsafe(9)
    folder = run_dir(config, job["id"], run_id)
    (folder / "input").mkdir(parents=True)
    return run_id, folder


def queued(folder: Path, status: dict) -> None:
    write_json_atomic(status_file(folder), {"status": "queued", "created": time.time()} | status)


def create_generation(
    config: Config, job: dict, prompt: str, new_tokens: str, tokenizer: IO[bytes] | None
) -> str:
    """Saves a prompt (token ids, or text with the model's tokenizer.json) as a new queued generation run
    of `job`; returns its id (raises SubmitError)."""
    why = why_not_generate(job)
    if why:
        raise SubmitError(why)
    slots = job["results"]["generation"]["generate"]["slots"]
    if not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise SubmitError(f"Type a prompt (at most {MAX_PROMPT_CHARS:,} characters).")
    if tokenizer is None and not re.fullmatch(r"[\d\s,]+", prompt):
        raise SubmitError(
            "Type token ids (whole numbers separated by spaces), or send the model's tokenizer.json "
            "with text."
        )
    if not new_tokens.isdigit() or not 1 <= int(new_tokens) < slots:
        raise SubmitError(f"Ask for 1 to {slots - 1} new tokens.")
    run_id, folder = new_run(config, job)
    try:
        if tokenizer is not None:
            save_upload(tokenizer, b"", folder / "input" / "upload-tokenizer.json", MAX_TOKENIZER_MB)
        asked = {"prompt": prompt, "new_tokens": int(new_tokens)}
        write_json_atomic(folder / "input" / "upload-prompt.json", asked)
    except BaseException:  # refused, or the upload broke off: nothing of it stays
        shutil.rmtree(folder)
        raise
    queued(folder, {"kind": "generate", "filename": "your prompt"})
    return run_id


def create_run(config: Config, job: dict, upload: IO[bytes], filename: str) -> str:
    """Saves the upload as a new queued run of `job`; returns its id (raises SubmitError)."""
    why = why_not(job)
    if why:
        raise SubmitError(why)
    suffix = Path(filename or "").suffix.lower()
    if suffix != ".npz" and suffix not in IMAGES:
        raise SubmitError("Send an .npz of the model's inputs, or an image (" + ", ".join(IMAGES) + ").")
    run_id, folder = new_run(config, job)
    path = folder / "input" / f"upload{suffix}"
    try:
        save_upload(upload, b"", path, MAX_INPUT_MB)
        if suffix == ".npz":
            check_zip(path, "The .npz", config.max_unzipped_mb)
    except BaseException:  # refused, or the upload broke off: nothing of it stays
        shutil.rmtree(folder)
        raise
    queued(folder, {"filename": Path(filename).name[:200]})
    return run_id


def run_view(config: Config, job_id: str, run_id: str) -> dict | None:
    """A run as its page and JSON show it: the worker's status, and what the sandbox found (only the
    fields the page reads, each of its type)."""
    folder = run_dir(config, job_id, run_id) if RUN_ID.match(run_id) else None
    status = read_untrusted_json(status_file(folder)) if folder else None
    if not isinstance(status, dict):
        return None
    assert folder is not None  # the status was read from it
    view = {
        "id": run_id,
        "job": job_id,
        **{k: status.get(k) for k in ("status", "filename", "created", "error")},
    }
    alive = status.get("beat") or status.get("started")
    if view["status"] == "running" and isinstance(alive, float) and time.time() - alive > 6 * BEAT_S:
        # its worker stopped mid-run: it rewrites a running run's status every BEAT_S
        view |= {
            "status": "failed",
            "error": "The run was interrupted (its worker stopped): send the input again.",
        }
    done = status.get("status") == "done"
    if status.get("kind") == "generate":  # its tokens as they come: read while it runs too
        begun = view["status"] in ("running", "done")
        result = read_untrusted_json(folder / "result.json") if begun else None
        return view | {"kind": "generate"} | clean_generation(result if isinstance(result, dict) else {})
    result = read_untrusted_json(folder / "result.json") if done else None
    if isinstance(result, dict):
        view |= clean_result(result)
    view["outputs_file"] = done and safe_job_file(folder, "files/outputs.npz") is not None
    return view


def clean_generation(result: dict) -> dict:
    """A generation run's result.json (webapp/pipeline/own_prompt.py) reduced to what its page shows."""

    def ints(x: object, n: int) -> list[int]:
        return [v for v in items(x, n) if type(v) is int]

    rows = []
    for row in items(result.get("runtimes"), 8):
        if not isinstance(row, dict):
            continue
        against = cast(dict, row.get("against")) if isinstance(row.get("against"), dict) else None
        rows.append(
            {
                "runtime": text(row.get("runtime")),
                "tokens": ints(row.get("tokens"), 1000),
                "text": text(row.get("text")),
                "step_ms": [number(v) for v in items(row.get("step_ms"), 1000)],
                **{k: number(row.get(k)) for k in ("first_token_ms", "median_ms", "tokens_per_s")},
                "against": against
                and {
                    "reference": text(against.get("reference")),
                    "same_share": number(against.get("same_share")),
                    "first_difference": against.get("first_difference")
                    if type(against.get("first_difference")) is int
                    else None,
                },
            }
        )
    return {
        "prompt": ints(result.get("prompt"), 1000),
        "prompt_text": text(result.get("prompt_text")),
        **{k: v if type(v := result.get(k)) is int else None for k in ("new_tokens", "slots", "threads")},
        "runtimes": rows,
    }


def text(x: object) -> str | None:
    return str(x)[:2000] if x is not None else None


def number(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def items(x: object, n: int) -> list:
    return x[:n] if isinstance(x, list) else []


def clean_result(result: dict) -> dict:
    """The sandbox's result.json reduced to what the page shows, each value of its type."""

    def shapes(xs) -> list[dict]:
        return [
            {"name": text(i.get("name")), "dtype": text(i.get("dtype"))}
            | {"shape": [d if isinstance(d, int) else text(d) for d in items(i.get("shape"), 8)]}
            for i in items(xs, 64)
            if isinstance(i, dict)
        ]

    kind = result.get("reading") if result.get("reading") in ("text", "boxes") else None

    def reading(xs) -> list:  # each input's text, or its boxes [x0, y0, x1, y1]
        if kind == "text":
            return [text(x) for x in items(xs, 200)]
        return [
            [[int(v) for v in b] for b in items(boxes, 200) if isinstance(b, list) and len(b) == 4
             and all(isinstance(v, int) for v in b)]
            for boxes in items(xs, 200)
        ]  # fmt: skip

    rows = []
    for row in items(result.get("runtimes"), 8):
        if not isinstance(row, dict):
            continue
        against = cast(dict, row.get("against")) if isinstance(row.get("against"), dict) else {}
        top5 = [c for c in items(row.get("top5"), 5) if isinstance(c, list) and len(c) == 2]
        rows.append(
            {
                "runtime": text(row.get("runtime")),
                "error": text(row.get("error")),
                "outputs": shapes(row.get("outputs")),
                "first_values": [number(v) for v in items(row.get("first_values"), 8)],
                "top5": [[text(c), p] for c, p in ((c[0], number(c[1])) for c in top5) if p is not None],
                "top1": [v for v in items(row.get("top1"), 5000) if isinstance(v, int)],
                "against": {
                    k: number(against.get(k)) for k in ("max_abs_err", "cosine", "sqnr_db", "top1_agree")
                }
                | {"reference": text(against.get("reference")), "error": text(against.get("error"))}
                | agreement(against.get("reading")),
            }
            | ({"reading": reading(row.get("reading"))} if kind and "reading" in row else {})
        )
    return {
        "inputs": shapes(result.get("inputs")),
        "runs": result["runs"] if isinstance(result.get("runs"), int) else None,
        "prepared": text(result.get("prepared")),
        "reference": text(result.get("reference")),
        "classifier": result.get("classifier") is True,
        **({"reading": kind} if kind else {}),
        "runtimes": rows,
    }


def agreement(reading: object) -> dict:
    """How a runtime's reading agrees with the reference's (webapp.pipeline.reports.readings.agreement)."""
    if not isinstance(reading, dict):
        return {}
    counts = {k: reading.get(k) for k in ("lines", "lines_same", "boxes", "reference_boxes")}
    return {
        "reading": {k: v if type(v) is int else None for k, v in counts.items()}
        | {k: number(reading.get(k)) for k in ("mean_iou", "min_iou")}
    }


bp = Blueprint("inputs", __name__)


bp.add_app_template_global(why_not, "own_input_why_not")
bp.add_app_template_global(why_not_generate, "generate_why_not")


def submitted(job_id: str) -> str:
    config, _, queue = ctx()
    job = view_or_404(job_id)
    upload = request.files.get("file")
    try:
        if upload is None or not upload.filename:
            raise SubmitError("Choose a file: an .npz of the model's inputs, or an image.")
        run_id = create_run(config, job, upload.stream, upload.filename)
    except SubmitError as e:
        abort(400, str(e))
    queue.enqueue_input(job_id, run_id)
    return run_id


def generation_submitted(job_id: str) -> str:
    config, _, queue = ctx()
    job = view_or_404(job_id)
    tokenizer = request.files.get("tokenizer")
    try:
        run_id = create_generation(
            config,
            job,
            request.form.get("prompt", ""),
            request.form.get("new_tokens", "").strip(),
            tokenizer.stream if tokenizer and tokenizer.filename else None,
        )
    except SubmitError as e:
        abort(400, str(e))
    queue.enqueue_input(job_id, run_id)
    return run_id


def submitted_or_why(
    submit: Callable[[str], str], job_id: str, title: str, back: tuple[str, str]
) -> tuple[str, int] | BaseResponse:
    """A form's run, shown on its page; a bad input answers with why and the way back to the form."""
    try:
        run_id = submit(job_id)
    except BadRequest as e:
        link = {"href": url_for("pages.result", job_id=job_id) + back[0], "text": back[1]}
        return render_template("error.html", status=400, title=title, message=e.description, back=link), 400
    return redirect(url_for("inputs.page", job_id=job_id, run_id=run_id), 303)


def accepted(job_id: str, run_id: str) -> tuple[Response, int]:
    """The API's answer to a queued run: its page and its JSON."""
    urls = {k: url_for(f"inputs.{k}", job_id=job_id, run_id=run_id, _external=True) for k in ("page", "json")}
    return jsonify({"id": run_id, "url": urls["page"], "api_url": urls["json"]}), 202


@bp.post("/r/<job_id>/generate")
def generate(job_id: str) -> tuple[str, int] | BaseResponse:
    """The generation section's form: a bad prompt answers with why and the way back to the form."""
    back = ("#generate", "Back to the result")
    return submitted_or_why(generation_submitted, job_id, "This prompt cannot be run", back)


@bp.post("/api/jobs/<job_id>/generate")
def api_generate(job_id: str) -> tuple[Response, int]:
    return accepted(job_id, generation_submitted(job_id))


@bp.post("/r/<job_id>/inputs")
def submit(job_id: str) -> tuple[str, int] | BaseResponse:
    """The result page's own-input form: a bad file answers with why and the way back to the form."""
    back = ("#own-input", "Back to the result, to try another file")
    return submitted_or_why(submitted, job_id, "This file cannot be run", back)


@bp.post("/api/jobs/<job_id>/inputs")
def api_submit(job_id: str) -> tuple[Response, int]:
    return accepted(job_id, submitted(job_id))


def run_or_404(job_id: str, run_id: str) -> tuple[dict, dict]:
    job = view_or_404(job_id)
    run = run_view(ctx()[0], job_id, run_id)
    if run is None:
        abort(404)
    # an example's weights (random or trained), as its result says them: the outputs mean what they can
    run["weights"] = ((job.get("results") or {}).get("model") or {}).get("weights")
    return job, run


@bp.get("/r/<job_id>/inputs/<run_id>.json")
def json(job_id: str, run_id: str) -> Response:
    return jsonify(run_or_404(job_id, run_id)[1])


@bp.get("/r/<job_id>/inputs/<run_id>")
def page(job_id: str, run_id: str) -> str:
    job, run = run_or_404(job_id, run_id)
    page = "generated.html" if run.get("kind") == "generate" else "own_input.html"
    return render_template(page, job=job, run=run, job_title=job_title(job))


@bp.get("/r/<job_id>/inputs/<run_id>/outputs.npz")
def outputs(job_id: str, run_id: str) -> Response:
    _, run = run_or_404(job_id, run_id)
    if not run["outputs_file"]:
        abort(404)
    path = safe_job_file(run_dir(ctx()[0], job_id, run_id), "files/outputs.npz")
    if path is None:
        abort(404)
    return send_file(
        path, mimetype="application/octet-stream", as_attachment=True, download_name="outputs.npz"
    )
