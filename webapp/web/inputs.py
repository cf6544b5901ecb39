"""A result's model on the user's own input: the form's and the API's submission (the upload saved
as a queued run, webapp/jobs/own_input.py runs it), the run's page, its JSON and its outputs."""

from __future__ import annotations

import re
import secrets
import shutil
import time
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


def create_run(config: Config, job: dict, upload: IO[bytes], filename: str) -> str:
    """Saves the upload as a new queued run of `job`; returns its id (raises SubmitError)."""
    why = why_not(job)
    if why:
        raise SubmitError(why)
    suffix = Path(filename or "").suffix.lower()
    if suffix != ".npz" and suffix not in IMAGES:
        raise SubmitError("Send an .npz of the model's inputs, or an image (" + ", ".join(IMAGES) + ").")
    if len(list(runs_dir(config, job["id"]).glob("*.status.json"))) >= MAX_RUNS_PER_JOB:
        raise SubmitError(f"This result has run {MAX_RUNS_PER_JOB} inputs already, this server's limit.")
    run_id = secrets.token_urlsafe(9)
    folder = run_dir(config, job["id"], run_id)
    (folder / "input").mkdir(parents=True)
    path = folder / "input" / f"upload{suffix}"
    try:
        save_upload(upload, b"", path, MAX_INPUT_MB)
        if suffix == ".npz":
            check_zip(path, "The .npz", config.max_unzipped_mb)
    except BaseException:  # refused, or the upload broke off: nothing of it stays
        shutil.rmtree(folder)
        raise
    status = {"status": "queued", "created": time.time(), "filename": Path(filename).name[:200]}
    write_json_atomic(status_file(folder), status)
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
    result = read_untrusted_json(folder / "result.json") if done else None
    if isinstance(result, dict):
        view |= clean_result(result)
    view["outputs_file"] = done and safe_job_file(folder, "files/outputs.npz") is not None
    return view


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


@bp.post("/r/<job_id>/inputs")
def submit(job_id: str) -> tuple[str, int] | BaseResponse:
    """The result page's own-input form: a bad file answers with why and the way back to the form."""
    try:
        run_id = submitted(job_id)
    except BadRequest as e:
        back = {
            "href": url_for("pages.result", job_id=job_id) + "#own-input",
            "text": "Back to the result, to try another file",
        }
        return render_template(
            "error.html", status=400, title="This file cannot be run", message=e.description, back=back
        ), 400
    return redirect(url_for("inputs.page", job_id=job_id, run_id=run_id), 303)


@bp.post("/api/jobs/<job_id>/inputs")
def api_submit(job_id: str) -> tuple[Response, int]:
    run_id = submitted(job_id)
    urls = {k: url_for(f"inputs.{k}", job_id=job_id, run_id=run_id, _external=True) for k in ("page", "json")}
    return jsonify({"id": run_id, "url": urls["page"], "api_url": urls["json"]}), 202


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
    return render_template("own_input.html", job=job, run=run, job_title=job_title(job))


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
