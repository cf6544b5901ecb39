"""The kernel lab (webapp/jobs/lab.py): its page /lab (a starter) and /lab/<id> (a build, its short link),
POST /api/lab, a build's JSON at /api/lab/<id>."""

from __future__ import annotations

from flask import Blueprint, Response, abort, jsonify, render_template, request, url_for

from webapp.jobs.lab import create_lab, kernel_code, lab_targets, lab_view, queued_before, starters
from webapp.options import SubmitError
from webapp.web import ctx
from webapp.web import view_or_404 as job_or_404

bp = Blueprint("lab", __name__)


@bp.app_template_global("lab_takes")
def lab_takes(job: dict) -> bool:
    """Whether a job's kernels open in the lab: a finished build for one of the lab's targets."""
    target = ((job.get("results") or {}).get("target") or {}).get("preset")
    return job.get("status") == "done" and target in lab_targets()


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
    # JSON alone: a form post could come from another site's page, on its visitors' behalf
    asked = request.get_json(silent=True) if request.is_json else None
    if not isinstance(asked, dict):
        raise SubmitError('Send JSON: {"code": ..., "target": ...}.')
    target, client = asked.get("target") or "x86-host", request.remote_addr or ""
    lab_id = create_lab(config, asked.get("code"), target, asked.get("parent"), client)
    queue.enqueue_lab(lab_id)
    return lab_id


@bp.post("/api/lab")
def api_create() -> tuple[Response, int]:
    lab_id = submitted()
    return jsonify({"id": lab_id, "api_url": url_for("lab.api_get", lab_id=lab_id, _external=True)}), 202


@bp.get("/api/lab/<lab_id>")
def api_get(lab_id: str) -> Response:
    return jsonify(view_or_404(lab_id))


def lab_page(code: str, target: str, run: dict | None = None, starter: str = "") -> str:
    """The lab's page: the editor holding `code`, the target chosen, and a build's view where it has one."""
    data = {"starters": starters(), "starter": starter, "code": code, "run": run}
    names = {"starters": list(starters()), "starter": starter, "targets": lab_targets(), "target": target}
    return render_template("lab.html", data=data, **names)


@bp.get("/lab")
def new() -> str:
    """A starter (?starter=, matmul by default) for a target (?target=, this server's CPU by default)."""
    code = starters()
    starter = request.args.get("starter", "matmul")
    target = request.args.get("target", "x86-host")
    if starter not in code or target not in lab_targets():
        abort(404)
    return lab_page(code[starter], target, starter=starter)


@bp.get("/lab/<lab_id>")
def page(lab_id: str) -> str:
    view = view_or_404(lab_id)
    return lab_page(view["code"], view["target"], view)


@bp.get("/lab/kernel/<job_id>/<path:kernel>")
def from_kernel(job_id: str, kernel: str) -> str:
    """A kernel of a finished CPU job, before scheduling, for the job's target (its code view links here)."""
    job = job_or_404(job_id)
    found = job["status"] == "done" and kernel_code(ctx()[1].job_dir(job_id), job["results"], kernel)
    if not found:
        abort(404)
    return lab_page(*found)
