"""The JSON API (contract in docs/api.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Blueprint, Response, abort, jsonify, request, send_file

from webapp.catalog import EXAMPLES, TARGETS
from webapp.devices.status import pool_status
from webapp.jobs.submit import SubmitError, Submitted, point_changes, submit_again
from webapp.jobs.worker import ensure_example_files, example_archive
from webapp.web import ctx, delete_url, delete_with_token, retry_headers, submit_from_request, view_or_404
from webapp.web.cache import job_json

if TYPE_CHECKING:
    from werkzeug.exceptions import HTTPException

bp = Blueprint("api", __name__, url_prefix="/api")


@bp.errorhandler(SubmitError)
def refused(e: SubmitError) -> tuple[Response, int, dict]:
    return jsonify({"error": str(e)}), e.status, retry_headers(e)


@bp.errorhandler(413)
def too_large(e: HTTPException) -> tuple[Response, int]:
    # The contract answers 400 for every request refused at once, a too large file included.
    config, _, _ = ctx()
    message = f"The file is larger than this server's limit of {config.max_upload_mb} MB."
    return jsonify({"error": message}), 400


@bp.errorhandler(404)
def not_found(e: HTTPException) -> tuple[Response, int]:
    return jsonify({"error": "Not found."}), 404


@bp.get("/examples")
def examples() -> Response:
    return jsonify(
        [
            {
                "name": e.name,
                "title": e.title,
                "description": e.description,
                "input_shape": list(e.input_shape),
                "files": {fmt: f"/api/examples/{e.name}.{fmt}" for fmt in ("onnx", "pt2")},
            }
            for e in EXAMPLES.values()
        ]
    )


@bp.get("/examples/<name>.<fmt>")
def example_file(name: str, fmt: str) -> Response:
    if name not in EXAMPLES or fmt not in ("onnx", "pt2"):
        abort(404)
    config, _, _ = ctx()
    pt2, onnx = ensure_example_files(config, name)
    archive = example_archive(config, name) if fmt == "onnx" else None
    if archive is not None:  # past 2 GB: the model and its data file, as an upload takes them
        return send_file(archive, as_attachment=True, download_name=f"{name}.zip")
    return send_file(onnx if fmt == "onnx" else pt2, as_attachment=True, download_name=f"{name}.{fmt}")


@bp.get("/targets")
def targets() -> Response:
    return jsonify([t.to_json() for t in TARGETS.values()])


@bp.get("/devices")
def devices() -> Response:
    """The device pool: the tracker, the boards registered per key (free, busy, jobs waiting), and
    the emulated boards the pool runs."""
    config, _, _ = ctx()
    return jsonify(pool_status(config))


@bp.post("/jobs")
def create_job() -> tuple[Response, int]:
    return submitted(submit_from_request())


@bp.post("/jobs/<job_id>/bisect")
def bisect_job(job_id: str) -> tuple[Response, int]:
    """The job submitted again with its options and bisect=1 (the first pass whose outputs diverge):
    a new job, answered as POST /api/jobs answers."""
    config, store, queue = ctx()
    return submitted(
        submit_again(config, store, queue, view_or_404(job_id), {"bisect": "1"}, request.remote_addr or "")
    )


@bp.post("/jobs/<job_id>/precision")
def precision_point(job_id: str) -> tuple[Response, int]:
    """The job submitted again as one point of its precision search ({"point": its index in
    quantization.precision_search.points}): a new job, answered as POST /api/jobs answers."""
    config, store, queue = ctx()
    job = view_or_404(job_id)
    body = request.get_json(silent=True)
    point = body.get("point", "") if isinstance(body, dict) else request.form.get("point", "")
    changes = point_changes(job, point)
    return submitted(submit_again(config, store, queue, job, changes, request.remote_addr or ""))


def submitted(job: Submitted) -> tuple[Response, int]:
    """A submission's answer: 202 and the new job's links, or 200 where an identical job answers."""
    root = request.url_root.rstrip("/")
    answer: dict[str, str | bool | None] = {
        "id": job.id,
        "url": f"{root}/r/{job.id}",
        "api_url": f"{root}/api/jobs/{job.id}",
    }
    if job.reused:  # an identical earlier job answers: 200 with "reused" (send rerun=1 for a fresh run)
        return jsonify(answer | {"reused": True}), 200
    # the submitter's alone: DELETE /api/jobs/<id>?token=... (or the link, in a browser)
    assert job.delete_token is not None  # a new job's (Submitted: None only for a reused one)
    answer |= {
        "reused": False,
        "delete_url": delete_url(job.id, job.delete_token),
        "delete_token": job.delete_token,
    }
    return jsonify(answer), 202


@bp.delete("/jobs/<job_id>")
def delete(job_id: str) -> Response:
    """Delete a result with its delete token (`token` in the query or the form)."""
    delete_with_token(job_id, request.values.get("token", ""))
    return jsonify({"id": job_id, "deleted": True})


@bp.post("/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> tuple[Response, int]:
    """Stop a running job's tuning; it keeps what it tuned and goes on to build."""
    view_or_404(job_id)
    ctx()[1].request_cancel(job_id)
    return jsonify(view_or_404(job_id, request.url_root.rstrip("/"))), 202


@bp.get("/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    return job_json(job_id)
