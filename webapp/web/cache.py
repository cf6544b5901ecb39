"""A finished result never changes: its pages are rendered once and served from that.

Each page of a finished job (the result page, a code view, the JSON, a comparison) is named by an
ETag made from what it is rendered from: this site's own code and templates (SITE_VERSION), the job's
record (status, end, note, what the retention policy removed), its result.json and progress.json (size
and time written), and the request's own choices (the query string, whether it shows the delete link).
A request that has that ETag gets 304 at once; otherwise the page is read from rendered/ in the job's
folder, or rendered and written there. A running job's pages are rendered each time, not cached.

Its files (graphs, downloads) and this site's static files (their URL carries their content's hash)
are cached by browsers for a year: they never change under the same URL.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from flask import Response, current_app, request

from webapp.web import ctx, view_or_404

ROOT = Path(__file__).resolve().parents[2]
FINISHED = ("done", "failed")
PAGE_MAX_AGE = 3600  # a finished page is fresh for an hour, then asked for again (304 while unchanged)
FOREVER = "public, max-age=31536000, immutable"
MAX_RENDERED = 400  # pages kept per job (a view per kernel, per pass...): past that, rendered each time


def tree_hash(*folders: Path, pattern: str = "*") -> str:
    digest = hashlib.sha1()
    for folder in folders:
        for path in sorted(folder.rglob(pattern)):
            if path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# What a rendered page depends on besides the job: the templates, the static files, the web code
SITE_VERSION = tree_hash(ROOT / "templates", ROOT / "static", Path(__file__).parent, pattern="*.*")


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


def job_etag(job_id: str, *choices) -> str | None:
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
    job_id: str, render: Callable[[], str], *choices, mimetype: str = "text/html", private: bool = False
) -> Response:
    """The page `render` makes for a job: for a finished job, with its ETag, from rendered/ once made."""
    etag = job_etag(job_id, request.url_root, request.full_path, *choices)
    if etag is None:
        return Response(render(), mimetype=mimetype)
    if requested(etag):
        response = Response(status=304)
    else:
        response = Response(rendered(job_id, etag, render), mimetype=mimetype)
    response.set_etag(etag)
    # a page with the submitter's delete link is theirs alone: no shared cache keeps it
    response.headers["Cache-Control"] = f"{'private' if private else 'public'}, max-age={PAGE_MAX_AGE}"
    return response


def rendered(job_id: str, etag: str, render: Callable[[], str]) -> str:
    folder = ctx()[1].job_dir(job_id) / "rendered"
    path = folder / f"{etag}.html"
    try:
        return path.read_text()
    except OSError:
        pass
    text = render()
    try:
        folder.mkdir(exist_ok=True)
        if sum(1 for _ in folder.iterdir()) < MAX_RENDERED:
            tmp = folder / f".{etag}.{os.getpid()}"
            tmp.write_text(text)
            tmp.replace(path)  # whole or not at all, whichever process writes it first
    except OSError:
        pass  # a read-only or full disk: served all the same, rendered again next time
    return text


def cache_forever(response: Response) -> Response:
    response.headers["Cache-Control"] = FOREVER
    return response


def job_json(job_id: str) -> Response:
    """A job as /api/jobs/<id> and /r/<id>.json give it (with its links on this server's address)."""
    view = lambda: current_app.json.dumps(view_or_404(job_id, request.url_root.rstrip("/")))  # noqa: E731
    return cached_page(job_id, view, mimetype="application/json")
