"""Code views of a job: which IR or generated code text to show, read safely, highlighted by Pygments."""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from pathlib import Path

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, GasLexer, LlvmLexer, PythonLexer, TextLexer

from webapp.naming import natural_key

MAX_SHOWN_BYTES = (
    400_000  # longer texts are cut on the page (highlighted HTML is ~8x larger); download the rest
)

# view name -> (title, lexer, path template relative to the job folder)
VIEWS = {
    "relax-imported": ("Relax IR, imported", PythonLexer, "views/imported.py"),
    "relax-quantized": ("Relax IR, quantized (integer layers)", PythonLexer, "views/quantized.py"),
    "relax-optimized": ("Relax IR, optimized", PythonLexer, "views/optimized.py"),
    "passes": ("IR after each pass", PythonLexer, None),
    "tir": ("TIR of a kernel", PythonLexer, "views/kernels/{kernel}.tir.py"),
    "llvm": ("LLVM IR", LlvmLexer, "views/kernels/{kernel}.ll"),
    "asm": ("Assembly", GasLexer, "views/kernels/{kernel}.s"),
    "bytecode": ("VM bytecode", TextLexer, "views/bytecode.txt"),
}
KERNEL_VIEWS = ("tir", "llvm", "asm")
WHOLE_MODULE = {"llvm": "files/module.ll", "asm": "files/module.s"}
MODULE = "__module__"  # the kernel choice that means the whole generated module


def changed_passes(passes: list[dict]) -> list[dict]:
    """The passes that changed the Relax IR (only they have a text), numbered 1, 2, ... among
    themselves, each with how many unchanged passes ran since the one before it."""
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


def read_text(path: Path | None) -> tuple[str, bool]:
    """(text, truncated)."""
    if path is None:
        return "", False
    with open(path, "rb") as f:
        data = f.read(MAX_SHOWN_BYTES + 1)
    return data[:MAX_SHOWN_BYTES].decode(errors="replace"), len(data) > MAX_SHOWN_BYTES


@lru_cache(maxsize=64)
def highlighted(text: str, lexer_name: str) -> Markup:
    lexer = {c.__name__: c for c in (PythonLexer, LlvmLexer, GasLexer, TextLexer, DiffLexer)}[lexer_name]()
    return Markup(highlight(text, lexer, HtmlFormatter(cssclass="code", linenos=False)))


def code_view(
    job_dir: Path,
    results: dict,
    view: str,
    kernel: str = "",
    pass_index: int | None = None,
    diff: bool = False,
) -> dict:
    """Everything the code panel needs for one selection."""
    if view not in VIEWS:
        view = "relax-imported"
    title, lexer, template = VIEWS[view]
    kernels = sorted((k["name"] for k in results.get("kernels", [])), key=natural_key)
    passes = changed_passes(results.get("passes", []))
    download = None
    if view in KERNEL_VIEWS:
        if kernel not in kernels and not (kernel == MODULE and view in WHOLE_MODULE):
            kernel = kernels[0] if kernels else ""
        rel = WHOLE_MODULE[view] if kernel == MODULE else template.format(kernel=kernel) if kernel else ""
        download = WHOLE_MODULE.get(view, "").removeprefix("files/") or None
    elif view == "passes":
        indexes = [p["index"] for p in passes]
        if pass_index not in indexes:
            pass_index = indexes[0] if indexes else None
        chosen = next((p for p in passes if p["index"] == pass_index), None)
        rel = chosen["file"] if chosen else ""
    else:
        rel = template
    text, truncated = read_text(safe_job_file(job_dir, rel) if rel else None)
    if view == "passes" and diff and pass_index is not None:
        before = [p for p in passes if p["index"] < pass_index]
        old, _ = (
            read_text(safe_job_file(job_dir, before[-1]["file"]))
            if before
            else read_text(safe_job_file(job_dir, "views/imported.py"))
        )
        text = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "before", "after"))
        lexer = DiffLexer
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
        "download": download,
        "html": highlighted(text, lexer.__name__) if text else None,
        "empty": not text,
        "whole_module_allowed": view in WHOLE_MODULE,
        "module": MODULE,
    }


def pygments_css() -> str:
    return HtmlFormatter(cssclass="code", style="default").get_style_defs(".code")
