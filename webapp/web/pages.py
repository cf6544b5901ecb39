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
        "job.html",
        job=job,
        code=requested_code_view(job),
        views=VIEWS,
        chart=bench_chart(job),
        quant=quantization_view(job["results"]),
        sweep=sweep_view(job["results"]),
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


def quantization_view(results: dict) -> dict | None:
    """What the Quantization section says beyond the raw tables: the speedup over TVM fp32 (or why
    there is none), the accuracy change, and the layer whose error grows the most."""
    q = results.get("quantization")
    if not q:
        return None
    variant = q["variant"]
    times = {
        (b["variant"], b["tuned"]): b["median_ms"]
        for b in results.get("benchmarks", [])
        if b["runtime"] == "tvm"
    }
    fp32_ms, quant_ms = times.get(("fp32", False)), times.get((variant, False))
    speedup = fp32_ms / quant_ms if fp32_ms and quant_ms else None
    instructions = results.get("instructions") or {}
    dots = instructions.get("vpdpbusd", 0) + instructions.get("sdot", 0)
    why = None
    if speedup is not None and speedup < 1.1:
        if not dots:
            why = (
                "the generated code has no integer dot-product instruction (vpdpbusd / sdot): this target "
                "lacks AVX-512 VNNI or Arm dot product, so 8-bit products are widened and multiplied one "
                "by one, no faster than float FMAs"
            )
        else:
            why = (
                "the integer kernels are fast, but this model is small: converting activations to 8 bits "
                "and back around the layers that stay in float costs about as much as the arithmetic "
                "saved (the kernel table under Code shows which kernels are integer)"
            )
    accuracy = {a["variant"]: a["top1"] for a in results.get("accuracy", []) if not a["tuned"]}
    errors = q.get("layer_errors") or []
    # The errors accumulate layer after layer: the layer that hurts most is where the SQNR falls the
    # most from the layer before it (the first layer is compared with nothing).
    worst, previous = None, None
    for row in errors:
        sqnr = row.get("sqnr_db")
        if sqnr is None:
            continue
        if previous is not None and (worst is None or previous - sqnr > worst[1]):
            worst = (row["layer"], previous - sqnr)
        previous = sqnr
    return {
        "variant": variant,
        "fp32_ms": fp32_ms,
        "quant_ms": quant_ms,
        "speedup": speedup,
        "why_no_speedup": why,
        "fp32_top1": accuracy.get("fp32"),
        "quant_top1": accuracy.get(variant),
        "worst_layer": worst[0] if worst else None,
        "worst_drop_db": worst[1] if worst else None,
    }


def sweep_view(results: dict) -> dict | None:
    """The bits sweep: one row per build (fp32 first, then each quantized variant, failed ones with
    their stage and message) and the points of the two charts against bits."""
    sweep = results.get("sweep")
    if not sweep:
        return None
    tvm_rows = [b for b in results.get("benchmarks", []) if b["runtime"] == "tvm" and not b["tuned"]]
    ms = {b["variant"]: b["median_ms"] for b in tvm_rows}
    fid = {f["variant"]: f for f in results.get("fidelity", []) if f["reference"] == "tvm fp32"}
    acc = {a["variant"]: a["top1"] for a in results.get("accuracy", []) if not a["tuned"]}
    rows = [{"variant": "fp32", "bits": 32, "calibration": "", "status": "done", "mode": "float32"}]
    rows += sweep["variants"]
    rows += [{**f, "bits": None, "calibration": "", "status": "failed", "mode": ""} for f in sweep["failed"]]
    for row in rows:
        row["ms"] = ms.get(row["variant"])
        row["speedup"] = ms["fp32"] / row["ms"] if row["ms"] and ms.get("fp32") else None
        row.update({k: fid.get(row["variant"], {}).get(k) for k in ("sqnr_db", "cosine", "top1_agree")})
        row["top1"] = acc.get(row["variant"])
    # The charts: one point per bit-width (the job's calibration), fp32 drawn at "32".
    by_bits = [r for r in rows if r["status"] == "done" and r["variant"] in ("fp32", f"int{r['bits']}")]
    quality_key = "top1" if acc else "sqnr_db"
    points = [r for r in by_bits if r["ms"]]
    return {
        "rows": rows,
        "quality": "top-1 accuracy %" if acc else "SQNR vs fp32, dB",
        "points": [
            {
                "label": "fp32" if r["bits"] == 32 else f"{r['bits']}",
                "quality": (100 * r[quality_key] if acc else r[quality_key])
                if r[quality_key] is not None
                else None,
                "ms": r["ms"],
            }
            for r in points
        ],
    }
