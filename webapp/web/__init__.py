"""Blueprints: thin views over webapp.jobs; no TVM here."""

from __future__ import annotations

from flask import abort, current_app, request

from webapp.jobs.store import job_view
from webapp.jobs.submit import TUNING_UPLOADS, submit_job
from webapp.options import SubmitError


def ctx():
    """(config, store, queue) of the running app."""
    ext = current_app.extensions["playground"]
    return ext["config"], ext["store"], ext["queue"]


def view_or_404(job_id: str, url_root: str = "") -> dict:
    _, store, _ = ctx()
    view = job_view(store, job_id, url_root)
    if view is None:
        abort(404)
    return view


def retry_headers(e: SubmitError) -> dict:
    return {"Retry-After": str(e.retry_after)} if e.retry_after else {}


def submit_from_request() -> tuple[str, bool]:
    """Submit the job this request describes (form fields, optional `model` file); returns its id and
    whether it is an earlier identical job's. Raises SubmitError for a request refused at once."""
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
        upload.filename if upload else "",
        tuning,
        calibration.stream if calibration is not None and calibration.filename else None,
        request.remote_addr or "",
    )
