"""A result's model on the user's own input (webapp/jobs/own_input.py): the form's and the API's
submission, the run's page, its JSON and its outputs."""

from __future__ import annotations

from flask import Blueprint, abort, jsonify, redirect, render_template, request, send_file, url_for

from webapp.codeviews import safe_job_file
from webapp.jobs.own_input import create_run, run_dir, run_view, why_not
from webapp.options import SubmitError
from webapp.web import ctx, view_or_404
from webapp.web.compare import job_title

bp = Blueprint("inputs", __name__)


@bp.app_template_global()
def own_input_why_not(job: dict) -> str | None:
    return why_not(job)


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
def submit(job_id: str):
    return redirect(url_for("inputs.page", job_id=job_id, run_id=submitted(job_id)), 303)


@bp.post("/api/jobs/<job_id>/inputs")
def api_submit(job_id: str):
    run_id = submitted(job_id)
    urls = {k: url_for(f"inputs.{k}", job_id=job_id, run_id=run_id, _external=True) for k in ("page", "json")}
    return jsonify({"id": run_id, "url": urls["page"], "api_url": urls["json"]}), 202


def run_or_404(job_id: str, run_id: str) -> tuple[dict, dict]:
    job = view_or_404(job_id)
    run = run_view(ctx()[0], job_id, run_id)
    if run is None:
        abort(404)
    return job, run


@bp.get("/r/<job_id>/inputs/<run_id>.json")
def json(job_id: str, run_id: str):
    return jsonify(run_or_404(job_id, run_id)[1])


@bp.get("/r/<job_id>/inputs/<run_id>")
def page(job_id: str, run_id: str):
    job, run = run_or_404(job_id, run_id)
    return render_template("own_input.html", job=job, run=run, job_title=job_title(job))


@bp.get("/r/<job_id>/inputs/<run_id>/outputs.npz")
def outputs(job_id: str, run_id: str):
    _, run = run_or_404(job_id, run_id)
    if not run["outputs_file"]:
        abort(404)
    path = safe_job_file(run_dir(ctx()[0], job_id, run_id), "files/outputs.npz")
    if path is None:
        abort(404)
    return send_file(
        path, mimetype="application/octet-stream", as_attachment=True, download_name="outputs.npz"
    )
