"""Blueprints: thin views over webapp.jobs; no TVM here."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from flask import abort, current_app, request, url_for

from webapp.jobs.storage import delete_job
from webapp.jobs.store import job_view
from webapp.jobs.submit import TUNING_UPLOADS, Submitted, submit_job
from webapp.options import SubmitError

if TYPE_CHECKING:
    from webapp.config import Config
    from webapp.jobs.queue import JobQueue
    from webapp.jobs.store import JobStore


def ctx() -> tuple[Config, JobStore, JobQueue]:
    """(config, store, queue) of the running app."""
    ext = current_app.extensions["playground"]
    return ext["config"], ext["store"], ext["queue"]


def view_or_404(job_id: str, url_root: str = "") -> dict:
    _, store, _ = ctx()
    view = job_view(store, job_id, url_root)
    if view is None:
        abort(404)
    if view["status"] == "deleted":
        abort(410)
    return view


def delete_url(job_id: str, token: str) -> str:
    """The submitter's delete link (its page asks before it deletes)."""
    return url_for("pages.confirm_delete", job_id=job_id, token=token, _external=True)


def delete_with_token(job_id: str, token: str) -> None:
    """Delete a finished or queued job's result: 403 for a wrong token, 409 while it runs."""
    config, store, _ = ctx()
    job = view_or_404(job_id)
    if not store.may_delete(job_id, token):
        abort(403, "This is not the delete link of this result.")
    if job["status"] == "running":
        abort(409, "The job is running: cancel its tuning or wait until it has finished, then delete it.")
    delete_job(config, job_id)


def retry_headers(e: SubmitError) -> dict:
    return {"Retry-After": str(e.retry_after)} if e.retry_after else {}


def submit_from_request() -> Submitted:
    """Submit the job this request describes (form fields, optional `model` file). Raises
    SubmitError for a request refused at once."""
    config, store, queue = ctx()
    upload = request.files.get("model")
    if upload is not None and not upload.filename:
        upload = None
    form = dict(request.form)
    if upload is not None:
        form.pop("example", None)  # a file, when given, wins over an example
    tuning = {
        field: request.files[field].stream
        for field in TUNING_UPLOADS
        if field in request.files and request.files[field].filename
    }
    calibration = request.files.get("calibration_data")
    return submit_job(
        config,
        store,
        queue,
        form,
        upload.stream if upload else None,
        cast(str, upload.filename) if upload else "",  # an upload without a filename was dropped above
        tuning,
        calibration.stream if calibration is not None and calibration.filename else None,
        request.remote_addr or "",
    )
