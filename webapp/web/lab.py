"""The kernel lab (webapp/jobs/lab.py): POST /api/lab, a run's JSON at /api/lab/<id>."""

from __future__ import annotations

from flask import Blueprint, Response, abort, jsonify, request, url_for

from webapp.jobs.lab import create_lab, lab_view, queued_before
from webapp.options import SubmitError
from webapp.web import ctx

bp = Blueprint("lab", __name__)


@bp.errorhandler(SubmitError)
def refused(e: SubmitError) -> tuple[Response, int]:
    return jsonify({"error": str(e)}), 400


def view_or_404(lab_id: str) -> dict:
    config, store, _ = ctx()
    view = lab_view(config, lab_id)
    if view is None:
        abort(404)
    if view["status"] == "queued":  # where it stands: lab runs and jobs queued before it, and jobs running
        place = store.queue_place("", view.get("created", 0))
        ahead = queued_before(config, view.get("created", 0))
        view["queue"] = {"place": ahead + place["place"], "jobs_running": place["running"]}
    return view


def submitted() -> str:
    config, _, queue = ctx()
    asked = request.get_json(silent=True) if request.is_json else dict(request.form)
    if not isinstance(asked, dict):
        raise SubmitError('Send JSON: {"code": ..., "target": ...}.')
    lab_id = create_lab(config, asked.get("code"), asked.get("target") or "x86-host", asked.get("parent"))
    queue.enqueue_lab(lab_id)
    return lab_id


@bp.post("/api/lab")
def api_create() -> tuple[Response, int]:
    lab_id = submitted()
    return jsonify({"id": lab_id, "api_url": url_for("lab.api_get", lab_id=lab_id, _external=True)}), 202


@bp.get("/api/lab/<lab_id>")
def api_get(lab_id: str) -> Response:
    return jsonify(view_or_404(lab_id))
