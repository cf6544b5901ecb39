"""Blueprints: thin views over webapp.jobs; no TVM here."""

from __future__ import annotations

from flask import abort, current_app

from webapp.jobs.store import job_view


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
