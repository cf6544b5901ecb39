"""Code views of a job: which IR or generated code text to show, read safely, highlighted by Pygments."""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from pathlib import Path

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import (
    CLexer,
    CppLexer,
    CudaLexer,
    DiffLexer,
    GasLexer,
    LlvmLexer,
    PtxLexer,
    PythonLexer,
    TextLexer,
    WgslLexer,
)

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
    # a GPU build's device code (results["device_code"] says which of these it has)
    "device": ("Device code", CudaLexer, "views/kernels/{kernel}.device"),
    "ptx": ("PTX", PtxLexer, "views/kernels/{kernel}.ptx"),
    "sass": ("SASS", GasLexer, "views/kernels/{kernel}.sass"),
    "bytecode": ("VM bytecode", TextLexer, "views/bytecode.txt"),
}
KERNEL_VIEWS = ("tir", "llvm", "asm", "device", "ptx", "sass")
DEVICE_VIEWS = ("device", "ptx", "sass")
WHOLE_MODULE = {"llvm": "files/module.ll", "asm": "files/module.s"}
# the device code's language -> its lexer (the device view's default is CUDA C)
DEVICE_LEXERS = {"OpenCL C": CLexer, "Metal Shading Language": CppLexer, "WGSL": WgslLexer}
LEXERS = {*(lexer for _, lexer, _ in VIEWS.values()), *DEVICE_LEXERS.values(), DiffLexer}


def available_views(results: dict) -> dict[str, str]:
    """View name -> its title, for the views this result has: the quantized IR with quantization,
    the device code views of a GPU build (the LLVM IR and assembly are then its host side)."""
    device = results.get("device_code") or {}
    out = {}
    for name, (title, _, _) in VIEWS.items():
        if name == "relax-quantized" and not results.get("quantization"):
            continue
        if name in DEVICE_VIEWS and name not in device.get("views", ()):
            continue
        if name == "device" and device:
            title = f"Device code ({device['language']})"
        elif name == "ptx" and device:
            title = f"PTX ({device['sm']})"
        elif name == "sass" and device:
            title = f"SASS ({device['sm']}, from ptxas)"
        elif name in ("llvm", "asm") and device:
            title = f"{title}, host side (kernel launches)"
        out[name] = title
    return out


def whole_module(results: dict) -> dict[str, str]:
    """View -> the file of the whole module, for the views that have one."""
    device = results.get("device_code") or {}
    files = {"device": device.get("file"), "ptx": device.get("ptx"), "sass": device.get("sass")}
    return WHOLE_MODULE | {view: f"files/{name}" for view, name in files.items() if name}


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
    lexer = {c.__name__: c for c in LEXERS}[lexer_name]()
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
    views = available_views(results)
    if view not in views:
        view = "relax-imported"
    _, lexer, template = VIEWS[view]
    title = views[view]
    if view == "device":
        lexer = DEVICE_LEXERS.get(results["device_code"]["language"], lexer)
    modules = whole_module(results)
    kernels = sorted((k["name"] for k in results.get("kernels", [])), key=natural_key)
    passes = changed_passes(results.get("passes", []))
    download = None
    if view in KERNEL_VIEWS:
        if kernel not in kernels and not (kernel == MODULE and view in modules):
            kernel = kernels[0] if kernels else ""
        rel = modules[view] if kernel == MODULE else template.format(kernel=kernel) if kernel else ""
        download = modules.get(view, "").removeprefix("files/") or None
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
        "whole_module_allowed": view in modules,
        "views": views,
        "module": MODULE,
    }


def pygments_css() -> str:
    return HtmlFormatter(cssclass="code", style="default").get_style_defs(".code")
