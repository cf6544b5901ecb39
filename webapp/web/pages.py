"""HTML pages and htmx fragments. Each renders data built elsewhere: job_view (the job and its
result.json, whose derived facts webapp.pipeline.reports.facts wrote), code_view, the catalog, and the
device pool's status (webapp.devices.status, also /api/devices)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from flask import (
    Blueprint,
    Response,
    abort,
    jsonify,
    redirect,
    render_template,
    request,
    send_file,
    url_for,
)
from markupsafe import Markup
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.wrappers import Response as BaseResponse

from webapp.catalog import (
    CALIBRATION_MODES,
    CHOICE_TEXT,
    CODE_VIEWS,
    EXAMPLES,
    GRAPHS,
    QUANTIZE_MODES,
    TARGETS,
    WEIGHT_GRANULARITY,
    WEIGHT_SCALE_MODES,
)
from webapp.codeviews import code_view, highlighted, pygments_css, safe_job_file
from webapp.devices.status import recent_pool_status
from webapp.exports.repro import archive_name, reproducer_zip
from webapp.jobs.submit import SubmitError, Submitted, point_changes, resubmit_job, submit_again
from webapp.naming import natural_key
from webapp.options import MAX_TUNE_TRIALS, JobOptions
from webapp.web import ctx, delete_url, delete_with_token, retry_headers, submit_from_request, view_or_404
from webapp.web.cache import FINISHED, cache_forever, cached_page, job_json
from webapp.web.chart import bench_chart, generation_charts, pareto_chart
from webapp.web.compare import code_diff, compare, job_title

bp = Blueprint("pages", __name__)

# Artifacts come from the sandbox: never let a browser run them as part of this site.
FILE_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}

# The result page's sections, in order: each is one partial (templates/_<name>.html) that renders its
# section, or nothing while the job has not measured what it shows. A running job's page polls
# /r/<id>/live, which sends back the sections whose HTML changed. The head (headline and contents)
# comes first, then what was measured, then how it was made; each section's label in the contents.
SECTION_LABELS = {
    "benchmark": "Benchmark",
    "generation": "Generation",
    "device": "Board",
    "fidelity": "Fidelity",
    "bisection": "Passes bisected",
    "quantization": "Quantization",
    "sweep": "Bits sweep",
    "tuning": "Tuning",
    "summary": "Model",
    "graph": "Graph",
    "code": "Code and kernels",
    "downloads": "Downloads",
}
PARTS = ("head", *SECTION_LABELS)
PART_TEMPLATES = {"code": "_code_section.html"}  # _code.html is the code panel inside it


def choices(name: str, values: Iterable[str]) -> list[tuple[str, str]]:
    return [(v, CHOICE_TEXT.get(name, {}).get(v, v)) for v in values]


@bp.app_template_filter("natural_sort")
def natural_sort(items: Iterable[Any], attribute: str | None = None) -> list:
    return sorted(items, key=lambda x: natural_key(str(x[attribute] if attribute else x)))


@bp.app_template_filter("datetime")
def format_datetime(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


@bp.app_template_filter("blocks")
def blocks_text(blocks: list[str]) -> str:
    """A kernel's blocks, each run of numbered ones as a range: ["embed", "encoder.layer.0",
    "encoder.layer.1", "encoder.layer.2"] -> "embed, encoder.layer.0–2"."""
    runs: list[list] = []  # [stem, first, last] or [name]
    for block in blocks:
        stem, _, number = block.rpartition(".")
        last = runs[-1] if runs else None
        if number.isdigit() and last and len(last) == 3 and last[0] == stem and int(number) == last[2] + 1:
            last[2] = int(number)
        elif number.isdigit():
            runs.append([stem, int(number), int(number)])
        else:
            runs.append([block])
    return ", ".join(
        r[0] if len(r) == 1 else f"{r[0]}.{r[1]}" if r[1] == r[2] else f"{r[0]}.{r[1]}–{r[2]}" for r in runs
    )


@bp.app_template_test("match")
def matches(value: str, pattern: str) -> bool:
    return re.match(pattern, value) is not None


@bp.app_context_processor
def common() -> dict[str, Any]:
    config, _, _ = ctx()
    # the code views a graph node's kernel links to (the graph viewer's script reads them)
    links = [[name, v.graph_link] for name, v in CODE_VIEWS.items() if v.graph_link]
    return {"unsandboxed": config.unsandboxed, "kernel_links": links}


# ---------------------------------------------------------------- errors


def wants_json() -> bool:
    return request.path.startswith("/api/") or request.path.endswith(".json")


ERROR_TEXT = {
    404: "There is nothing at this address. A result is reachable only through its exact link.",
    405: "This address does not answer that kind of request.",
    403: "This is not the delete link of this result.",
    409: "The job is running: cancel its tuning or wait until it has finished, then delete it.",
    410: "This result was deleted by the person who submitted it.",
    413: "The upload is larger than this server accepts.",
    500: "Something went wrong on the server while answering this request.",
}


@bp.app_errorhandler(HTTPException)
def http_error(e: HTTPException) -> tuple[str | Response, int]:
    """Every error as a styled page, or as JSON for a .json URL and the API."""
    status = e.code or 500
    message: str | None
    if status == 413 and not wants_json():
        config, _, _ = ctx()
        message = f"The file is larger than this server's limit of {config.max_upload_mb} MB."
    elif status == 429:  # flask-limiter's rate limit on submissions (it adds Retry-After)
        message = f"Too many submissions from your address (at most {e.description}). Try again later."
        if request.endpoint == "pages.submit":
            return render_index(message, 429, request.form)
    elif e.description != type(e).description:  # abort(status, "what this page says of it")
        message = e.description
    else:
        message = ERROR_TEXT.get(status, e.description or e.name)
    if wants_json():
        return jsonify({"error": message if status != 404 else "Not found."}), status
    return render_template("error.html", status=status, title=e.name, message=message), status


@bp.app_errorhandler(InternalServerError)
def server_error(e: InternalServerError) -> tuple[str | Response, int]:
    if wants_json():
        return jsonify({"error": ERROR_TEXT[500]}), 500
    return render_template("error.html", status=500, title="Server error", message=ERROR_TEXT[500]), 500


# ---------------------------------------------------------------- the form


def target_groups() -> list[tuple[str, list]]:
    """The presets grouped by where their code runs: this server first, then the pool's boards, then
    the GPUs (with a CUDA GPU here, its presets come first)."""
    groups: dict[str, list] = {}
    for t in sorted(TARGETS.values(), key=lambda t: t.form_group[0]):
        groups.setdefault(t.form_group[1], []).append(t)
    return list(groups.items())


def render_index(
    error: str | None = None, status: int = 200, form: Mapping[str, str] | None = None
) -> tuple[str, int]:
    html = render_template(
        "index.html",
        examples=EXAMPLES.values(),
        target_groups=target_groups(),
        pool=recent_pool_status(ctx()[0]),
        quantize_modes=choices("quantize", QUANTIZE_MODES),
        calibration_modes=choices("calibration", CALIBRATION_MODES),
        weight_scales=choices("weight_scale", WEIGHT_SCALE_MODES),
        granularities=choices("weight_granularity", WEIGHT_GRANULARITY),
        defaults=JobOptions(),
        max_tune_trials=MAX_TUNE_TRIALS,
        error=error,
        form=form or {},
        max_upload_mb=ctx()[0].max_upload_mb,
    )
    return html, status


@bp.get("/")
def index() -> tuple[str, int]:
    return render_index()


@bp.post("/jobs")
def submit() -> tuple[str, int, dict] | BaseResponse:
    try:
        job = submit_from_request()
    except SubmitError as e:
        return *render_index(str(e), e.status, request.form), retry_headers(e)
    return to_result(job)


def to_result(job: Submitted) -> BaseResponse:
    """The answer to a submission from a browser: its result page, and the cookies that make the
    result this browser's own (the compare picker's list, the delete link's token)."""
    response = redirect(
        url_for("pages.result", job_id=job.id, **cast(dict[str, Any], {"reused": 1} if job.reused else {})),
        code=303,
    )
    # this browser's own results, newest first: the compare picker lists them first
    mine = [job.id, *own_results(but=job.id)]
    response.set_cookie(MINE, ".".join(mine[:MINE_KEPT]), max_age=365 * 86400, httponly=True, samesite="Lax")
    if job.delete_token:  # the submitter's browser keeps the delete link's token for the result page
        response.set_cookie(
            f"delete-{job.id}",
            job.delete_token,
            max_age=365 * 86400,
            path=f"/r/{job.id}",
            httponly=True,
            samesite="Lax",
        )
    return response


MINE, MINE_KEPT = "mine", 20  # the cookie of a browser's own results (job ids: their links, no secret)


def own_results(but: str) -> list[str]:
    """The ids of this browser's own results (its MINE cookie), newest first, but one."""
    return [i for i in request.cookies.get(MINE, "").split(".") if i and i != but]


@bp.get("/compare/picker")
def compare_picker() -> str:
    """The result page's "compare with" choices, fetched by the page (they change as jobs end; the page
    itself is cached): this browser's own finished results first, then recent ones of the built-in
    examples (an upload is listed only to the browser that submitted it)."""
    store = ctx()[1]
    this = request.args.get("a", "")
    own = own_results(but=this)
    jobs = [j for j in map(store.get, own) if j and j["status"] == "done"]
    examples = [j for j in store.recent_examples(PICKER_RECENT) if j["id"] != this and j["id"] not in own]
    return render_template("_picker.html", own=jobs, examples=examples, title=job_title)


PICKER_RECENT = 15


@bp.errorhandler(413)
def too_large(e: HTTPException) -> tuple[str, int]:
    config, _, _ = ctx()
    return render_index(f"The file is larger than this server's limit of {config.max_upload_mb} MB.", 413)


# ---------------------------------------------------------------- the result page


@bp.get("/r/<job_id>.json")
def result_json(job_id: str) -> Response:
    return job_json(job_id)


def requested_code_view(job: dict) -> dict:
    """The code panel for the selection in the query string (?view=&kernel=&pass=&diff=1&line=)."""
    _, store, _ = ctx()
    args = request.args
    return code_view(
        store.job_dir(job["id"]),
        job["results"],
        args.get("view", "relax-imported"),
        args.get("kernel", ""),
        args.get("pass", type=int),
        args.get("diff") == "1",
        args.get("asm_all") == "1",
        {"graph": args.get("graph", "fused"), "node": args.get("node", "")},
        keep=job["status"] in FINISHED,
        line=args.get("line", type=int),
    )


def downloadable(job: dict) -> set[str]:
    """The files under /r/<id>/files/ that exist: the pipeline lists them in result.json."""
    return set(job["results"].get("files") or ()) - set((job["expired"] or {}).get("files") or ())


FOLDED_FROM = 40  # a fused graph of more nodes opens folded by block, where the job drew that graph


def shown_graph(graphs: dict) -> str:
    """The graph the page opens on: the model folded by block when the fused graph is large (a
    transformer's layers) and folding makes it at least 3 times smaller, else the fused graph (a small
    CNN's, which reads whole; a chain of one-kernel blocks, which folding would not shorten)."""
    fused, folded = graphs.get("fused", {}).get("nodes", 0), graphs.get("layers", {}).get("nodes")
    if folded and fused > FOLDED_FROM and 3 * folded <= fused:
        return "layers"
    return "fused" if "fused" in graphs else "imported"


def render_parts(job: dict) -> list[tuple[str, str, str]]:
    """(name, html, version) of each section; the version changes exactly when the html does."""
    page = {
        "job": job,
        "job_title": job_title(job),
        "r": job["results"],
        "code": requested_code_view(job),
        "chart": bench_chart(job["results"]),
        "generation_charts": generation_charts(job["results"].get("generation") or {}),
        "precision_chart": pareto_chart(job["results"].get("quantization", {}).get("precision_search", {})),
        "files": downloadable(job),
        "graph_tabs": [(k, t) for k, t in GRAPHS.items() if k in (job["results"].get("graphs") or {})],
        "graph_shown": shown_graph(job["results"].get("graphs") or {}),
    }
    htmls = {name: render_template(PART_TEMPLATES.get(name, f"_{name}.html"), **page) for name in PARTS[1:]}
    # the head last: its contents list the sections that have something to show
    sections = [(name, SECTION_LABELS[name]) for name, html in htmls.items() if html.strip()]
    htmls = {"head": render_template("_head.html", **page, sections=sections)} | htmls
    return [
        (name, Markup(html), hashlib.sha1(html.encode()).hexdigest()[:16]) for name, html in htmls.items()
    ]


def is_live(job: dict) -> bool:
    return job["status"] in ("queued", "running")


@bp.get("/r/<job_id>")
def result(job_id: str) -> Response:
    reused = request.args.get("reused") == "1"  # the form's submission was answered by this job
    token = request.cookies.get(f"delete-{job_id}", "")  # set for the browser that submitted it
    deletable = delete_url(job_id, token) if ctx()[1].may_delete(job_id, token) else None

    def render() -> str:
        job = view_or_404(job_id)
        return render_template(
            "job.html",
            job=job,
            title=job_title(job),
            parts=render_parts(job),
            live=is_live(job),
            reused=reused,
            delete_url=deletable,
        )

    return cached_page(job_id, render, deletable, private=bool(deletable))


@bp.get("/r/<job_id>/delete")
def confirm_delete(job_id: str) -> str:
    """The delete link: a page that asks first (a GET deletes nothing)."""
    job = view_or_404(job_id)
    return render_template("delete.html", job=job, token=request.args.get("token", ""))


@bp.post("/r/<job_id>/delete")
def delete(job_id: str) -> BaseResponse:
    delete_with_token(job_id, request.form.get("token", ""))
    # to an address no browser has cached (the result's own page may be, for an hour): it says 410 Gone
    response = redirect(url_for("pages.result", job_id=job_id, deleted=1), code=303)
    response.delete_cookie(f"delete-{job_id}", path=f"/r/{job_id}")
    return response


@bp.get("/r/<job_id>/live")
def live(job_id: str) -> Response:
    """The stages, and every section whose HTML differs from the version the page has (the page
    sends its versions, and its code selection so that the code section renders as it shows it).
    htmx swaps the sections in by id; the answer 286 tells it to stop polling: the job has ended."""
    job = view_or_404(job_id)
    html = [render_template("_stages.html", job=job)]
    for name, part, version in render_parts(job):
        if request.args.get(f"v-{name}") != version:
            html.append(render_template("_part.html", name=name, html=part, version=version, oob=True))
    return Response("".join(html), status=200 if is_live(job) else 286)


@bp.get("/r/<job_id>/stages")
def stages(job_id: str) -> str:
    return render_template("_stages.html", job=view_or_404(job_id))


@bp.post("/r/<job_id>/resubmit")
def resubmit(job_id: str) -> BaseResponse:
    """A failed upload submitted again with the input shapes its failure asked for (jobs/submit.py)."""
    config, store, queue = ctx()
    job = view_or_404(job_id)
    try:
        submitted = resubmit_job(
            config, store, queue, job, request.form.get("input_shapes", ""), request.remote_addr or ""
        )
    except SubmitError as e:
        abort(e.status, str(e))
    return to_result(submitted)


@bp.post("/r/<job_id>/bisect")
def bisect(job_id: str) -> BaseResponse:
    """The job submitted again with the bisection of its passes (the bisection section's button)."""
    config, store, queue = ctx()
    try:
        submitted = submit_again(
            config, store, queue, view_or_404(job_id), {"bisect": "1"}, request.remote_addr or ""
        )
    except SubmitError as e:
        abort(e.status, str(e))
    return to_result(submitted)


@bp.post("/r/<job_id>/precision")
def precision(job_id: str) -> BaseResponse:
    """The job submitted again as one point of its precision search (the points table's button)."""
    config, store, queue = ctx()
    job = view_or_404(job_id)
    try:
        changes = point_changes(job, request.form.get("point", ""))
        submitted = submit_again(config, store, queue, job, changes, request.remote_addr or "")
    except SubmitError as e:
        abort(e.status, str(e))
    return to_result(submitted)


@bp.post("/r/<job_id>/cancel")
def cancel(job_id: str) -> BaseResponse:
    """Ask a running job to stop tuning: the pipeline sees the flag, keeps its records and builds."""
    view_or_404(job_id)
    ctx()[1].request_cancel(job_id)
    return redirect(url_for("pages.result", job_id=job_id), code=303)


CODE_ARGS = ("view", "kernel", "pass", "diff", "asm_all", "graph", "node", "line")  # a code selection


@bp.get("/r/<job_id>/code")
def code(job_id: str) -> Response:
    def render() -> str:
        job = view_or_404(job_id)
        return render_template("_code.html", job=job, code=requested_code_view(job))

    response = cached_page(job_id, render)
    if request.headers.get("HX-Request"):  # the page's picker: its address says the selection (history)
        chosen: dict[str, Any] = {
            k: v for k, v in request.args.items() if k in CODE_ARGS and v and (k, v) != ("graph", "fused")
        }
        response.headers["HX-Push-Url"] = url_for("pages.result", job_id=job_id, **chosen) + "#code"
    return response


# ---------------------------------------------------------------- two results side by side

RESULT_ID = re.compile(r"(?:/r/|/compare/[^/]+/|^)([A-Za-z0-9_-]{8,64})(?:\.json)?/?(?:[?#].*)?$")


@bp.get("/compare")
def compare_form() -> BaseResponse:
    """The result page's "compare with..." field: another result's link (or id), or one picked from the
    recent ones -> /compare/<a>/<b>."""
    match = RESULT_ID.search((request.args.get("b") or request.args.get("pick") or "").strip())
    if match is None:
        abort(
            400, "Paste the link of another result (…/r/<id>) or its id, or pick one of the recent results."
        )
    return redirect(url_for("pages.compare_page", a=request.args.get("a", ""), b=match.group(1)))


def requested_comparison(a: str, b: str) -> tuple[dict, dict]:
    store = ctx()[1]
    for side, job_id in (("A", a), ("B", b)):
        if store.get(job_id) is None:
            abort(
                404,
                f"There is no result {job_id!r} on this server (the compare page's {side}): check its link.",
            )
    job_a, job_b = view_or_404(a), view_or_404(b)
    args = request.args
    # by default A's slowest kernel (the kernels are listed slowest first) and B's kernel of the same
    # source layers (else of the same name, else B's slowest)
    comparison = compare(job_a, job_b, store.job_dir(a), store.job_dir(b))
    names = [[k["name"] for k in job["results"].get("kernels", [])] for job in (job_a, job_b)]
    kernel_a = args.get("kernel_a") or args.get("kernel") or next(iter(names[0]), "")
    row = next((r for r in comparison["kernels"] if kernel_a in [k["name"] for k in r["a"]]), None)
    same_layers = row["b"][0]["name"] if row and row["b"] else None
    kernel_b = (
        args.get("kernel_b")
        or args.get("kernel")
        or same_layers
        or (kernel_a if kernel_a in names[1] else next(iter(names[1]), ""))
    )
    diff = code_diff(
        store.job_dir(a),
        store.job_dir(b),
        job_a,
        job_b,
        args.get("view", "asm"),
        kernel_a,
        kernel_b,
    )
    return comparison, diff


@bp.get("/compare/<a>/<b>.json")
def compare_json(a: str, b: str) -> Response:
    comparison, diff = requested_comparison(a, b)
    return jsonify(comparison | {"diff": {k: diff[k] for k in ("view", "kernel_a", "kernel_b", "text")}})


@bp.get("/compare/<a>/<b>")
def compare_page(a: str, b: str) -> str:
    comparison, diff = requested_comparison(a, b)
    html = highlighted(diff["text"], "diff") if diff["text"] else None
    return render_template("compare.html", c=comparison, diff=diff, diff_html=html)


@bp.get("/r/<job_id>/graph-<key>.json")
def graph_json(job_id: str, key: str) -> Response:
    """A graph of the job as JSON (nodes, edges; the layers, kernels and times linked to them)."""
    job = view_or_404(job_id)
    path = safe_job_file(ctx()[1].job_dir(job_id), f"views/graph-{key}.json") if key in GRAPHS else None
    if path is None:
        abort(404)
    resp = send_file(path, mimetype="application/json", max_age=0)
    return cache_forever(resp) if job["status"] in FINISHED else resp


@bp.get("/r/<job_id>/files/<name>")
def files(job_id: str, name: str) -> Response:
    job = view_or_404(job_id)
    _, store, _ = ctx()
    if name == "result.json":
        return result_json(job_id)
    # the pipeline's log (its output and tracebacks) is beside files/, shown as text
    path = safe_job_file(store.job_dir(job_id), "log.txt" if name == "log.txt" else f"files/{name}")
    if path is None:
        abort(404)
    shown = {"log.txt": "text/plain"} | ({name: "image/svg+xml"} if name.endswith(".svg") else {})
    resp = send_file(
        path,
        mimetype=shown.get(name),
        as_attachment=name not in shown,
        download_name=name,
        max_age=0,
    )
    resp.headers.update(FILE_HEADERS)
    return cache_forever(resp) if job["status"] in FINISHED else resp


@bp.get("/r/<job_id>/repro/<path:kernel>.zip")
def reproducer(job_id: str, kernel: str) -> Response:
    """A kernel's reproducer (webapp/exports/repro.py), packed from the job's texts when asked."""
    job = view_or_404(job_id)
    data = job["status"] in FINISHED and reproducer_zip(ctx()[1].job_dir(job_id), job["results"], kernel)
    if not data:
        abort(404)
    attachment = {"Content-Disposition": f'attachment; filename="{archive_name(kernel)}.zip"'}
    return cache_forever(Response(data, mimetype="application/zip", headers=FILE_HEADERS | attachment))


@bp.get("/pygments.css")
def pygments_stylesheet() -> Response:
    """Pygments' colours; its URL carries the site's version (?v=), so browsers keep it a year."""
    return cache_forever(Response(pygments_css(), mimetype="text/css"))


@bp.get("/favicon.ico")
def favicon() -> BaseResponse:
    """What browsers ask for on their own: the page's icon (an SVG, which they all read)."""
    return redirect(url_for("static", filename="favicon.svg"), code=301)
