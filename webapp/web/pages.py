"""HTML pages and htmx fragments. Each renders data built elsewhere (job_view, code_view)."""

from __future__ import annotations

import math
from collections import Counter

from flask import Blueprint, Response, abort, redirect, render_template, request, send_file, url_for

from webapp.catalog import EXAMPLES, TARGETS
from webapp.jobs.submit import SubmitError
from webapp.web import ctx, submit_from_request, view_or_404
from webapp.web.code import VIEWS, code_view, pygments_css, safe_job_file

bp = Blueprint("pages", __name__)

# Artifacts come from the sandbox: never let a browser run them as part of this site.
FILE_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}


@bp.app_context_processor
def common():
    config, _, _ = ctx()
    return {"unsandboxed": config.unsandboxed, "schedule_counts": schedule_counts}


def schedule_counts(kernels: list[dict]) -> list[tuple[str, int]]:
    """How many kernels each kind of schedule covers: tuned, default rule, naive."""
    counts = Counter(k["schedule"].split(":")[0] for k in kernels)
    return sorted(counts.items(), key=lambda kv: -kv[1])


def render_index(error: str | None = None, status: int = 200, form=None):
    html = render_template(
        "index.html",
        examples=EXAMPLES.values(),
        targets=TARGETS.values(),
        error=error,
        form=form or {},
        max_upload_mb=ctx()[0].max_upload_mb,
    )
    return html, status


@bp.get("/")
def index():
    return render_index()


@bp.post("/jobs")
def submit():
    try:
        job_id = submit_from_request()
    except SubmitError as e:
        return render_index(str(e), 400, request.form)
    return redirect(url_for("pages.result", job_id=job_id), code=303)


@bp.errorhandler(413)
def too_large(e):
    config, _, _ = ctx()
    return render_index(f"The file is larger than this server's limit of {config.max_upload_mb} MB.", 413)


@bp.get("/r/<job_id>.json")
def result_json(job_id: str):
    from flask import jsonify

    return jsonify(view_or_404(job_id, request.url_root.rstrip("/")))


def requested_code_view(job: dict) -> dict:
    """The code panel for the selection in the query string (?view=&kernel=&pass=&diff=1)."""
    _, store, _ = ctx()
    args = request.args
    return code_view(
        store.job_dir(job["id"]),
        job["results"],
        args.get("view", "relax-imported"),
        args.get("kernel", ""),
        args.get("pass", type=int),
        args.get("diff") == "1",
    )


@bp.get("/r/<job_id>")
def result(job_id: str):
    job = view_or_404(job_id)
    return render_template(
        "job.html", job=job, code=requested_code_view(job), views=VIEWS, chart=bench_chart(job)
    )


@bp.get("/r/<job_id>/stages")
def stages(job_id: str):
    job = view_or_404(job_id)
    resp = Response(render_template("_stages.html", job=job))
    if job["status"] in ("done", "failed") and request.args.get("live") == "1":
        resp.headers["HX-Refresh"] = "true"  # the job page becomes the result page
    return resp


@bp.post("/r/<job_id>/cancel")
def cancel(job_id: str):
    """Ask a running job to stop tuning: the pipeline sees the flag, keeps its records and builds."""
    view_or_404(job_id)
    ctx()[1].request_cancel(job_id)
    return redirect(url_for("pages.result", job_id=job_id), code=303)


@bp.get("/r/<job_id>/code")
def code(job_id: str):
    job = view_or_404(job_id)
    return render_template("_code.html", job=job, code=requested_code_view(job), views=VIEWS)


@bp.get("/r/<job_id>/files/<name>")
def files(job_id: str, name: str):
    view_or_404(job_id)
    _, store, _ = ctx()
    if name == "result.json":
        return result_json(job_id)
    path = safe_job_file(store.job_dir(job_id), f"files/{name}")
    if path is None:
        abort(404)
    inline = name.endswith(".svg")
    resp = send_file(
        path,
        mimetype="image/svg+xml" if inline else None,
        as_attachment=not inline,
        download_name=name,
        max_age=0,
    )
    resp.headers.update(FILE_HEADERS)
    return resp


@bp.get("/pygments.css")
def pygments_stylesheet():
    return Response(pygments_css(), mimetype="text/css")


def format_ms(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def bench_chart(job: dict) -> list[dict]:
    """Bars for the benchmark chart, on a log scale (runtimes can differ by 100x)."""
    rows = [r for r in job["results"].get("benchmarks", []) if r.get("median_ms")]
    if not rows:
        return []
    lo = min(r["median_ms"] for r in rows) / 2
    hi = max(r["p90_ms"] for r in rows)
    span = math.log10(hi / lo) or 1.0
    bars = []
    for r in rows:
        bars.append(
            {
                **r,
                "label": f"{r['runtime']} {r['variant']}"
                + (" tuned" if r["tuned"] else " default rules" if r["runtime"] == "tvm" else ""),
                "value": format_ms(r["median_ms"]),
                "width": 100 * math.log10(r["median_ms"] / lo) / span,
                "p90": 100 * math.log10(r["p90_ms"] / lo) / span,
            }
        )
    return bars
