"""Code views of a job: which IR or generated code text to show, read safely, highlighted by Pygments.

The web shows them (webapp/web/pages.py); the worker renders a finished job's large kernel views once,
after the job (prerender), so that the first look at a kernel's LLVM IR or assembly is as quick as the
next: their highlighted HTML is kept in the job's rendered/ folder, named by a hash of what made it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pygments
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name

from webapp.asm import filter_asm, kept_lines
from webapp.catalog import CODE_VIEWS, code_file
from webapp.jsonfile import kept
from webapp.naming import natural_key
from webapp.targets import device_lexers

# longer texts are cut on the page (highlighted HTML is ~8x larger; the browser lays out ~1 MB of it a
# second): the link under the text downloads the whole; a whole module's text shows its start
MAX_SHOWN_BYTES = 400_000
MAX_MODULE_SHOWN_BYTES = 100_000
RENDERED = "rendered"  # a job folder's pages and views rendered once (webapp/web/cache.py)
MAX_RENDERED = 1200  # files kept per job (a view per kernel, per pass..., in up to 3 encodings)
KEPT_FROM_BYTES = 16_000  # a text highlighted in more than ~15 ms: its HTML is kept in rendered/

# The code views (webapp.catalog.CODE_VIEWS): those with a text per kernel, and a GPU build's device code
KERNEL_VIEWS = tuple(name for name, v in CODE_VIEWS.items() if v.per_kernel)
WHOLE_MODULE = {name: v.whole for name, v in CODE_VIEWS.items() if v.whole}
# the device code's language -> its lexer's name, as each GPU kind of target says (webapp.targets)
DEVICE_LEXERS = device_lexers()


def available_views(results: dict) -> dict[str, str]:
    """View name -> its title, for the views this result has (each view's entry says: catalog.CodeView)."""
    return {name: view.title_for(results) for name, view in CODE_VIEWS.items() if view.shown(name, results)}


def whole_module(results: dict) -> dict[str, str]:
    """View -> the file of the whole module, for the views that have one."""
    device = results.get("device_code") or {}
    files = {"device": device.get("file"), "ptx": device.get("ptx"), "sass": device.get("sass")}
    return WHOLE_MODULE | {view: f"files/{name}" for view, name in files.items() if name}


MODULE = "__module__"  # the kernel choice that means the whole generated module


def changed_passes(passes: list[dict]) -> list[dict]:
    """The passes that changed the Relax IR (only they have a text), numbered 1, 2, ... among
    themselves, each with how many unchanged passes ran since the one before it."""
    out: list[dict]
    out, skipped = [], 0
    for p in passes:
        if p.get("file"):
            out.append({**p, "number": len(out) + 1, "skipped_before": skipped})
            skipped = 0
        else:
            skipped += 1
    return out


def safe_job_file(job_dir: Path, rel: str) -> Path | None:
    """A regular file inside the job folder (the sandbox wrote it: no links out, no escapes)."""
    path = Path(os.path.realpath(job_dir / rel))
    if not path.is_relative_to(os.path.realpath(job_dir)) or not path.is_file():
        return None
    return path


def read_text(path: Path | None, limit: int = MAX_SHOWN_BYTES) -> tuple[str, bool]:
    """(text, truncated): the file's first `limit` bytes."""
    if path is None:
        return "", False
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode(errors="replace"), len(data) > limit


@lru_cache(maxsize=64)
def highlighted(text: str, lexer_name: str, numbered: bool = False, marked: tuple[int, ...] = ()) -> Markup:
    """Pygments' HTML, coloured by the lexer of that name; `numbered` adds line numbers (beside the
    text: a copy takes the code alone), `marked` highlights those lines (1-based)."""
    lexer = get_lexer_by_name(lexer_name)
    # Each line its own box (class "line"), which the browser lays out only when it scrolls into view
    # (style.css: content-visibility): a kernel's LLVM IR of 56,000 tokens took 300 ms to lay out whole.
    # No id per line: htmx matches every id of a swapped-in panel against the page's.
    formatter = HtmlFormatter(
        cssclass="code", linenos="table" if numbered else False, hl_lines=list(marked), linespans="L"
    )
    html = LINE_ID.sub('<span class="line">', highlight(text, lexer, formatter))
    return Markup(PLAIN_TOKEN.sub(r"\1", html))


def kept_highlighted(
    job_dir: Path, text: str, lexer: str, numbered: bool, marked: tuple[int, ...], keep: bool
) -> Markup:
    """highlighted(...), kept in the job's rendered/ folder when the text is long and `keep` (the job
    has ended): made once for all the web's processes, or beforehand by prerender."""
    if not keep or len(text) < KEPT_FROM_BYTES:
        return highlighted(text, lexer, numbered, marked)
    made_by = json.dumps([HIGHLIGHT_VERSION, text, lexer, numbered, marked])
    name = f"code-{hashlib.sha1(made_by.encode()).hexdigest()[:24]}.html"
    make = lambda: highlighted(text, lexer, numbered, marked).encode()  # noqa: E731
    return Markup(rendered_file(job_dir, name, make).decode())


def rendered_file(job_dir: Path, name: str, make: Callable[[], bytes]) -> bytes:
    """The file `name` of the job's rendered/ folder, made by `make` the first time. Only for a job
    that has ended: the sandbox writes in the job folder while the job runs (see clear_rendered)."""
    return kept(job_dir / RENDERED / name, make, MAX_RENDERED)


def clear_rendered(job_dir: Path) -> None:
    """Removes whatever lies at the job's rendered/ (a cache: nothing is lost): the sandboxed pipeline
    could have put pages there (named as the web would name them; a kernel view's name is a hash of
    its text) or a link out of the folder. Moved first into a folder made here under a name of its
    own (a rename needs nothing of what it moves, and cannot meet anything planted), then deleted.
    The worker calls it before it records a job's end (webapp/jobs/worker.py: finish)."""
    path = job_dir / RENDERED
    if not path.is_symlink() and not path.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{RENDERED}-left-", dir=job_dir))
    path.rename(aside / RENDERED)
    shutil.rmtree(aside, ignore_errors=True)


def prerender(job_dir: Path, results: dict) -> int:
    """Renders the long code views of a finished job (its Relax IR, each kernel's code and the whole
    module's, as the code panel first shows them; not the passes') into its rendered/ folder; returns
    how many views it rendered.
    Run by the worker after the job, off the web's processes."""
    views = available_views(results)
    chosen = [(view, "") for view in views if view not in KERNEL_VIEWS and view != "passes"]
    for kernel in [k["name"] for k in results.get("kernels", [])] + [MODULE]:
        chosen += [
            (view, kernel)
            for view in views
            if view in KERNEL_VIEWS and (kernel != MODULE or view in whole_module(results))
        ]
    return sum(
        code_view(job_dir, results, view, kernel, keep=True)["html"] is not None for view, kernel in chosen
    )


LINE_ID = re.compile(r'<span id="L-\d+">')
# whitespace and punctuation tokens, which neither colour scheme colours (Pygments' default style
# leaves punctuation plain, github-dark gives it the text's colour): text, not a span each (LLVM IR
# had 55% of its spans for them)
PLAIN_TOKEN = re.compile(r'<span class="(?:w|p)">([^<]*)</span>')


def code_view(
    job_dir: Path,
    results: dict,
    view: str,
    kernel: str = "",
    pass_index: int | None = None,
    diff: bool = False,
    asm_all: bool = False,
    back: dict | None = None,
    keep: bool = False,
    line: int | None = None,
) -> dict:
    """Everything the code panel needs for one selection. The assembly is filtered (filter_asm)
    unless `asm_all`, numbered, with its hot loop marked (or `line` alone, where given: a line a
    kernel linter's finding points at); `back` ({"graph", "node"}) is the graph node the selection
    came from, for the link back; `keep`: the job has ended, so a long text's highlighted HTML is
    read from (or kept in) its rendered/ folder."""
    views = available_views(results)
    if view not in views:
        view = "relax-imported"
    lexer, template, title = CODE_VIEWS[view].lexer, CODE_VIEWS[view].path, views[view]
    if view == "device":
        lexer = DEVICE_LEXERS.get(results["device_code"]["language"], lexer)
    modules = whole_module(results)
    kernels = sorted((k["name"] for k in results.get("kernels", [])), key=natural_key)
    passes = changed_passes(results.get("passes", []))
    download = None
    rel: str | None  # None: a view without a file
    if view in KERNEL_VIEWS:
        if kernel not in kernels and not (kernel == MODULE and view in modules):
            kernel = kernels[0] if kernels else ""
        rel = modules[view] if kernel == MODULE else code_file(view, kernel) if kernel else ""
        download = modules.get(view, "").removeprefix("files/") or None
    elif view == "passes":
        indexes = [p["index"] for p in passes]
        if pass_index not in indexes:
            pass_index = indexes[0] if indexes else None
        chosen = next((p for p in passes if p["index"] == pass_index), None)
        rel = chosen["file"] if chosen else ""
    else:
        rel = template
    limit = MAX_MODULE_SHOWN_BYTES if kernel == MODULE else MAX_SHOWN_BYTES
    text, truncated = read_text(safe_job_file(job_dir, rel) if rel else None, limit)
    if view == "passes" and diff and pass_index is not None and not (chosen or {}).get("onnx"):
        before = [p for p in passes if p["index"] < pass_index and not p.get("onnx")]
        old, _ = (
            read_text(safe_job_file(job_dir, before[-1]["file"]))
            if before
            else read_text(safe_job_file(job_dir, "views/imported.py"))
        )
        text = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "before", "after"))
        lexer = "diff"
    loop, by_mca = None, False
    row: dict = next((k for k in results.get("kernels") or [] if k["name"] == kernel), {})
    if view in ("asm", "sass") and kernel != MODULE and text:
        text = text if asm_all or view == "sass" else filter_asm(text)
        if view == "asm":
            loop, by_mca = hot_loop_shown(row.get("hot_loop"), text, asm_all)
    numbered = view in KERNEL_VIEWS
    kernel_shown = view in KERNEL_VIEWS and kernel not in ("", MODULE)
    marked = tuple(range(loop[0], loop[1] + 1)) if loop else ()
    line = line if numbered and kernel_shown and line and 0 < line <= text.count("\n") + 1 else None
    marked = (line,) if line else marked
    return {
        "view": view,
        "title": title,
        "kernel": kernel if view in KERNEL_VIEWS else "",  # the title names a kernel only where one is shown
        "kernels": kernels,
        "passes": passes,
        "pass_count": len(results.get("passes", [])),
        "pass_index": pass_index,
        "diff": diff,
        "truncated": truncated,
        "shown_kb": limit // 1000,
        "download": download,
        "html": kept_highlighted(job_dir, text, lexer, numbered, marked, keep) if text else None,
        "hot_loop": loop,
        "hot_loop_by_mca": by_mca,
        "line": line,
        "reproducible": bool(row.get("reproducer")),  # the job wrote its reproducer's texts (repro.py)
        "asm_all": asm_all,
        "back": (back or {}) | {"kernel": kernel} if kernel_shown else None,
        "empty": not text,
        "whole_module_allowed": view in modules,
        "views": views,
        "module": MODULE,
    }


def hot_loop_shown(found: Any, text: str, asm_all: bool) -> tuple[tuple[int, int] | None, bool]:
    """The lines to mark of the hot loop the job found in the filtered assembly (the kernel row's
    "hot_loop", webapp.asm), in `text` as shown (the whole assembly where `asm_all`), and whether
    llvm-mca analysed it: (None, False) where the job found none, or its lines do not fit the text."""
    lines = (found or {}).get("lines") if isinstance(found, dict) else None
    if not (isinstance(lines, list) and len(lines) == 2 and all(isinstance(n, int) for n in lines)):
        return None, False
    if asm_all:  # the filtered text's lines, counted in the whole text
        kept = kept_lines(text)
        if not 1 <= lines[0] <= lines[1] <= len(kept):
            return None, False
        lines = [kept[lines[0] - 1] + 1, kept[lines[1] - 1] + 1]
    if not 1 <= lines[0] <= lines[1] <= text.count("\n") + 1:
        return None, False
    return (lines[0], lines[1]), found.get("by") == "mca"


# what a kept highlighted text depends on besides itself: this file and Pygments
HIGHLIGHT_VERSION = [hashlib.sha1(Path(__file__).read_bytes()).hexdigest(), pygments.__version__]


def pygments_css() -> str:
    """The code's colours: Pygments' default style, and its github-dark style under a dark colour
    scheme (the page follows prefers-color-scheme)."""
    light = HtmlFormatter(cssclass="code", style="default").get_style_defs(".code")
    dark = HtmlFormatter(cssclass="code", style="github-dark").get_style_defs(".code")
    return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
