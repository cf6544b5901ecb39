"""Code views of a job: which IR or generated code text to show, read safely, highlighted by Pygments."""

from __future__ import annotations

import difflib
import os
import re
from functools import lru_cache
from pathlib import Path

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name

from webapp.catalog import CODE_VIEWS, code_file
from webapp.naming import natural_key
from webapp.targets import KINDS

MAX_SHOWN_BYTES = (
    400_000  # longer texts are cut on the page (highlighted HTML is ~8x larger); download the rest
)

# The code views (webapp.catalog.CODE_VIEWS): those with a text per kernel, and a GPU build's device code
KERNEL_VIEWS = tuple(name for name, v in CODE_VIEWS.items() if v.per_kernel)
DEVICE_VIEWS = tuple(name for name, v in CODE_VIEWS.items() if v.device)
WHOLE_MODULE = {name: v.whole for name, v in CODE_VIEWS.items() if v.whole}
# the device code's language -> its lexer's name, as each GPU kind of target says (webapp.targets)
DEVICE_LEXERS = {kind.language: kind.lexer for kind in KINDS if kind.gpu}


def available_views(results: dict) -> dict[str, str]:
    """View name -> its title, for the views this result has: the quantized IR with quantization,
    the device code views of a GPU build (the LLVM IR and assembly are then its host side)."""
    device = results.get("device_code") or {}
    out = {}
    for name, code_view in CODE_VIEWS.items():
        title = code_view.title
        if name == "relax-quantized" and not results.get("quantization"):
            continue
        if name == "passes" and not results.get("passes"):  # a job that failed before optimize's end
            continue
        if (code_view.per_kernel or name in ("relax-optimized", "bytecode")) and not results.get("kernels"):
            continue  # written by the inspect stage, which a failed job did not reach
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


LINE_ID = re.compile(r'<span id="L-\d+">')
# whitespace and punctuation tokens, which neither colour scheme colours (Pygments' default style
# leaves punctuation plain, github-dark gives it the text's colour): text, not a span each (LLVM IR
# had 55% of its spans for them)
PLAIN_TOKEN = re.compile(r'<span class="(?:w|p)">([^<]*)</span>')


# ---------------------------------------------------------------- assembly as Compiler Explorer shows it

ASM_LABEL = re.compile(r"^([.\w$]+):")
ASM_DIRECTIVE = re.compile(r"^\s*\.[a-zA-Z_]\w*\b")
ASM_LOCAL_LABEL = re.compile(r"\.L[\w$.]+")
ASM_VECTOR = re.compile(r"\b(?:[xyz]mm\d+|v\d+\.\d*[bhsd]|q\d+)\b")


def filter_asm(text: str) -> str:
    """The assembly without assembler directives (.cfi_*, .p2align, .type, ...) and without the local
    labels nothing jumps to (.Ltmp*, .Lfunc_end*): what Compiler Explorer shows by default."""
    lines = text.splitlines()
    code = [line for line in lines if not ASM_LABEL.match(line) and not ASM_DIRECTIVE.match(line)]
    used = {label for line in code for label in ASM_LOCAL_LABEL.findall(line)}
    out = []
    for line in lines:
        label = ASM_LABEL.match(line)
        if label:
            if label.group(1).startswith(".L") and label.group(1) not in used:
                continue
        elif ASM_DIRECTIVE.match(line):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def hot_loop(text: str) -> tuple[int, int] | None:
    """The lines (1-based, inclusive) of the kernel's hot loop: of its innermost loops (a label and
    the last jump back up to it, with no other loop inside), the one with the most vector
    instructions; None when the code has no loop."""
    lines = text.splitlines()
    loops = []
    for i, line in enumerate(lines):
        label = ASM_LABEL.match(line)
        if label and label.group(1).startswith(".L"):
            jump = re.compile(rf"^\s+\S+\s+{re.escape(label.group(1))}\s*(#.*)?$")
            back = [j for j in range(i + 1, len(lines)) if jump.match(lines[j])]
            if back:
                loops.append((i, back[-1]))
    inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    vector = {
        (a, b): sum(1 for line in lines[a : b + 1] if ASM_VECTOR.search(line.split("#")[0])) for a, b in inner
    }
    best = max(inner, key=lambda span: vector[span], default=None)
    return (best[0] + 1, best[1] + 1) if best and vector[best] else None


def code_view(
    job_dir: Path,
    results: dict,
    view: str,
    kernel: str = "",
    pass_index: int | None = None,
    diff: bool = False,
    asm_all: bool = False,
    back: dict | None = None,
) -> dict:
    """Everything the code panel needs for one selection. The assembly is filtered (filter_asm)
    unless `asm_all`, numbered, with its hot loop marked; `back` ({"graph", "node"}) is the graph
    node the selection came from, for the link back."""
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
    text, truncated = read_text(safe_job_file(job_dir, rel) if rel else None)
    if view == "passes" and diff and pass_index is not None:
        before = [p for p in passes if p["index"] < pass_index]
        old, _ = (
            read_text(safe_job_file(job_dir, before[-1]["file"]))
            if before
            else read_text(safe_job_file(job_dir, "views/imported.py"))
        )
        text = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "before", "after"))
        lexer = "diff"
    loop = None
    if view in ("asm", "sass") and kernel != MODULE and text:
        text = text if asm_all or view == "sass" else filter_asm(text)
        loop = hot_loop(text) if view == "asm" else None
    numbered = view in KERNEL_VIEWS
    kernel_shown = view in KERNEL_VIEWS and kernel not in ("", MODULE)
    marked = tuple(range(loop[0], loop[1] + 1)) if loop else ()
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
        "html": highlighted(text, lexer, numbered, marked) if text else None,
        "hot_loop": loop,
        "asm_all": asm_all,
        "back": (back or {}) | {"kernel": kernel} if kernel_shown else None,
        "empty": not text,
        "whole_module_allowed": view in modules,
        "views": views,
        "module": MODULE,
    }


def pygments_css() -> str:
    """The code's colours: Pygments' default style, and its github-dark style under a dark colour
    scheme (the page follows prefers-color-scheme)."""
    light = HtmlFormatter(cssclass="code", style="default").get_style_defs(".code")
    dark = HtmlFormatter(cssclass="code", style="github-dark").get_style_defs(".code")
    return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
