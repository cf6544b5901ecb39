"""A finished result never changes: its pages are rendered once and served from that.

Each page of a finished job (the result page, a code view, the JSON, a comparison) is named by an
ETag made from what it is rendered from: this site's own code and templates (SITE_VERSION), the job's
record (status, end, note, what the retention policy removed), its result.json and progress.json (size
and time written), and the request's own choices (the query string, whether it shows the delete link).
A request that has that ETag gets 304 at once; otherwise the page is read from rendered/ in the job's
folder (compressed there too, as brotli or gzip, the first the request accepts), or rendered and
written there. A running job's pages are rendered each time, not cached.

Its files (graphs, downloads) and this site's static files (their URL carries their content's hash)
are cached by browsers for a year: they never change under the same URL.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import brotli
from flask import Response, current_app, request

from webapp.codeviews import rendered_file
from webapp.web import ctx, view_or_404

ROOT = Path(__file__).resolve().parents[2]
FINISHED = ("done", "failed")
PAGE_MAX_AGE = 3600  # a finished page is fresh for an hour, then asked for again (304 while unchanged)
FOREVER = "public, max-age=31536000, immutable"


def tree_hash(*places: Path, pattern: str = "*") -> str:
    """A hash of these files and of the files in these folders whose names match `pattern`."""
    digest = hashlib.sha1()
    for place in places:
        for path in [place] if place.is_file() else sorted(place.rglob(pattern)):
            if path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# What a rendered page depends on besides the job: the templates, the static files, the web code and
# the code views'
SITE_VERSION = tree_hash(
    ROOT / "templates",
    ROOT / "static",
    Path(__file__).parent,
    ROOT / "webapp" / "codeviews.py",
    pattern="*.*",
)


@lru_cache(maxsize=256)
def file_version(path: str, mtime_ns: int) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]


def static_version(filename: str) -> str | None:
    """The content hash a static file's URL carries (?v=...), so that it can be cached for a year."""
    path = ROOT / "static" / filename
    try:
        return file_version(str(path), path.stat().st_mtime_ns)
    except OSError:
        return None


def job_etag(job_id: str, *choices: object) -> str | None:
    """The ETag of a finished job's page rendered for `choices`; None while the job runs (or is gone)."""
    _, store, _ = ctx()
    job = store.get(job_id)
    if job is None or job["status"] not in FINISHED:
        return None
    stamp = [SITE_VERSION, job_id, job["status"], job["finished"], job["note"], job["expired"], job["error"]]
    folder = store.job_dir(job_id)
    for name in ("result.json", "progress.json"):
        try:
            st = (folder / name).stat()
            stamp.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append(None)
    stamp += choices
    return hashlib.sha1(json.dumps(stamp, default=str).encode()).hexdigest()[:24]


def requested(etag: str) -> bool:
    """Whether the request already has this page (its ETag as sent, or as the compression marked it:
    "<etag>:br")."""
    return any(tag.split(":")[0] == etag for tag in request.if_none_match.as_set())


def cached_page(
    job_id: str,
    render: Callable[[], str],
    *choices: object,
    mimetype: str = "text/html",
    private: bool = False,
) -> Response:
    """The page `render` makes for a job: for a finished job, with its ETag, from rendered/ once made."""
    etag = job_etag(job_id, request.url_root, request.full_path, *choices)
    if etag is None:
        return Response(render(), mimetype=mimetype)
    encoding = next((e for e in PACKED if request.accept_encodings[e]), None)
    if requested(etag):
        response = Response(status=304)
    elif encoding:  # compressed once too, as the browser takes it (Flask-Compress leaves it as it is)
        response = Response(packed(job_id, etag, render, encoding), mimetype=mimetype)
        response.headers["Content-Encoding"] = encoding
        etag = f"{etag}:{encoding}"  # a strong ETag per encoding, as Flask-Compress marks its own
    else:
        response = Response(rendered(job_id, etag, render), mimetype=mimetype)
    response.set_etag(etag)
    # a page with the submitter's delete link is theirs alone: no shared cache keeps it
    response.headers["Cache-Control"] = f"{'private' if private else 'public'}, max-age={PAGE_MAX_AGE}"
    return response


# the encodings a finished page is also kept in (the first the request accepts is served), and how
PACKED = {
    "br": lambda data: brotli.compress(data, quality=6),
    "gzip": lambda data: gzip.compress(data, compresslevel=6),
}


def rendered(job_id: str, etag: str, render: Callable[[], str]) -> str:
    return kept(job_id, f"{etag}.html", lambda: render().encode()).decode()


def packed(job_id: str, etag: str, render: Callable[[], str], encoding: str) -> bytes:
    return kept(
        job_id, f"{etag}.html.{encoding}", lambda: PACKED[encoding](rendered(job_id, etag, render).encode())
    )


def kept(job_id: str, name: str, make: Callable[[], bytes]) -> bytes:
    """The file `name` of the job's rendered/ folder, made by `make` the first time."""
    return rendered_file(ctx()[1].job_dir(job_id), name, make)


def cache_forever(response: Response) -> Response:
    response.headers["Cache-Control"] = FOREVER
    return response


def job_json(job_id: str) -> Response:
    """A job as /api/jobs/<id> and /r/<id>.json give it (with its links on this server's address)."""
    view = lambda: current_app.json.dumps(view_or_404(job_id, request.url_root.rstrip("/")))  # noqa: E731
    return cached_page(job_id, view, mimetype="application/json")
