"""Two results side by side: /compare/<a>/<b> and its JSON. Everything here is read from the two
result JSONs (and, for the code diff, the two jobs' code views): nothing is measured again."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import fields
from pathlib import Path

from webapp.asm import filter_asm
from webapp.catalog import CODE_VIEWS, OPTION_LABELS, code_file, option_text
from webapp.codeviews import KERNEL_VIEWS, available_views, read_text, safe_job_file
from webapp.jobs.storage import file_digest
from webapp.jobs.store import read_untrusted_json
from webapp.naming import speed_words
from webapp.options import JobOptions

OPTION_DEFAULTS = {f.name: f.default for f in fields(JobOptions)}
OPTION_ORDER = ("target", "quantize", "calibration", "weight_scale", "weight_granularity", "tune_trials")


def headline(results: dict) -> dict | None:
    """The job's own TVM time: its quantized build's in a quantized job, else its fastest fp32 build's."""
    summary = results.get("quantization_summary") or {}
    if summary.get("quant_ms"):
        return {"label": f"TVM {summary['variant']}", "ms": summary["quant_ms"]}
    rows = [b for b in results.get("benchmarks", []) if b["runtime"] == "tvm" and b.get("median_ms")]
    rows = [b for b in rows if b["variant"] == "fp32"] or rows
    if not rows:
        return None
    best = min(rows, key=lambda b: b["median_ms"])
    return {"label": f"TVM {best['variant']}{' tuned' if best['tuned'] else ''}", "ms": best["median_ms"]}


def model_name(options: dict) -> str:
    return options.get("example") or options.get("filename") or "model"


def job_title(job: dict) -> str:
    """What a result is called (its tab title, its heading, the compare page's): the model, then the
    options that tell two jobs of it apart, as the form says them."""
    options = job["options"]
    model = model_name(options)
    quantize = options.get("quantize") or "none"
    variant = "fp32" if quantize == "none" else quantize
    tuned = f", {options['tune_trials']} tuning trials" if options.get("tune_trials") else ""
    return f"{model} {variant} on {options.get('target', '?')}{tuned}"


def side(job: dict) -> dict:
    r = job["results"]
    return {
        "id": job["id"],
        "status": job["status"],
        "model": model_name(job["options"]),
        "title": job_title(job),
        "target": (r.get("target") or {}).get("preset") or job["options"].get("target"),
        "device": ((r.get("benchmarks") or [{}])[0]).get("device"),
        "headline": headline(r),
        "graph": (r.get("graphs") or {}).get("fused", {}).get("svg"),  # its fused graph's picture
    }


def same_file(a: Path, b: Path) -> bool:
    """Whether two jobs' input files hold the same bytes: one upload is kept once, hard-linked into
    each job that uses it (jobs/storage.py), so the same inode says so without reading them."""
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return True
    return sa.st_size == sb.st_size and file_digest(a) == file_digest(b)


def model_differences(job_a: dict, job_b: dict, dir_a: Path, dir_b: Path) -> list[str]:
    """What differs between the models of two results (empty: the same model, the same inputs): the
    example or the uploaded file's bytes, then the inputs' shapes and types. A speed ratio of two
    different models compares the models, not the compiler."""
    out = []
    oa, ob = job_a["options"], job_b["options"]
    if oa.get("example") or ob.get("example"):
        if oa.get("example") != ob.get("example"):
            out.append(f"the model: {model_name(oa)} against {model_name(ob)}")
    elif not same_file(
        dir_a / "input" / oa.get("model_file", ""), dir_b / "input" / ob.get("model_file", "")
    ):
        same_name = oa.get("filename") == ob.get("filename")
        names = f"both named {model_name(oa)}" if same_name else f"{model_name(oa)} against {model_name(ob)}"
        out.append(f"the model file's contents ({names})")
    inputs = [
        [f"{t.get('name')} {'x'.join(map(str, t.get('shape') or []))} {t.get('dtype')}" for t in inp]
        for inp in (
            (job_a["results"].get("model") or {}).get("inputs") or [],
            (job_b["results"].get("model") or {}).get("inputs") or [],
        )
    ]
    if all(inputs) and inputs[0] != inputs[1]:
        out.append(f"the inputs: {', '.join(inputs[0])} against {', '.join(inputs[1])}")
    return out


def paired(a: list[dict], b: list[dict], key: Callable[[dict], Hashable]) -> list[tuple]:
    """(key, row of a or None, row of b or None) for every key of either, in a's order then b's."""
    index_a, index_b = {key(x): x for x in a}, {key(x): x for x in b}
    keys = list(index_a) + [k for k in index_b if k not in index_a]
    return [(k, index_a.get(k), index_b.get(k)) for k in keys]


KERNEL_FIELDS = ("name", "schedule", "calls", "ms", "share", "flop")


def joined(items: list[tuple[str, dict]], keys: Callable[[dict], Iterable[Hashable]]) -> list[list[int]]:
    """Items of A and of B ((side, item) pairs) in groups joined by shared keys (keys(item) -> a list),
    each group's members in order; groups in A's order, then B's groups that meet nothing of A."""
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict = {}  # a key -> the first item seen with it
    for i, (_, item) in enumerate(items):
        for key in keys(item):
            if key in owner:
                parent[root(i)] = root(owner[key])
            else:
                owner[key] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda m: (items[m[0]][0] != "a", m[0]))


def matched_kernels(a: list[dict], b: list[dict]) -> list[dict]:
    """The two builds' kernels lined up by the source layers they compute, so that an fp32 and an int8
    build of one model (whose kernels are named differently: fused_conv2d_add_relu against
    fused_conv2d_add_cast_multiply_...) meet layer by layer. A row is a group of kernels of A and of B
    joined by shared layers (a layer fused differently in the two builds joins the kernels of both),
    with their ms added up; a kernel that computes no layer of the model (a layout change the
    compiler added) is matched by name. Rows in A's order, then B's rows that meet nothing of A."""
    kernels = [("a", k) for k in a] + [("b", k) for k in b]
    rows = []
    for members in joined(kernels, source_keys):
        row: dict = {"layers": []}
        for i in members:
            for layer in kernels[i][1].get("layers") or []:
                if layer not in row["layers"]:
                    row["layers"].append(layer)
        for tag in ("a", "b"):
            mine = [kernels[i][1] for i in members if kernels[i][0] == tag]
            row[tag] = [{f: k.get(f) for f in KERNEL_FIELDS} for k in mine]
            timed = [k["ms"] for k in mine if k.get("ms") is not None]
            row[f"{tag}_ms"] = sum(timed) if mine and len(timed) == len(mine) else None
        row["ratio"] = row["a_ms"] / row["b_ms"] if row["a_ms"] and row["b_ms"] else None
        rows.append(row)
    return rows


def source_keys(item: dict) -> list[tuple]:
    """What matches a kernel (or a kernel call) across two builds: its source layers, else its name."""
    return [("layer", layer) for layer in item.get("layers") or []] or [
        ("name", item.get("name") or item.get("label") or "")
    ]


# A matched kernel call "changed" in time when one build's takes this many times the other's (timings
# of one kernel call repeat within a few per cent on a quiet machine; this is well above that).
TIME_CHANGE = 1.25
DIFF_STATES = ("same", "changed", "removed", "added")


def graph_diff(
    graph_a: dict | None, graph_b: dict | None, kernels_a: list[dict], kernels_b: list[dict]
) -> dict:
    """The two fused graphs' kernel calls matched by the source layers they compute (a call of no
    layer by its kernel's name), each marked: "removed" (A's, nothing of B computes its layers),
    "added" (B's, likewise), "changed" (its rule, the ops fused into its kernels, or its time by
    TIME_CHANGE or more, differs from its match's), or "same". Per side {node id: {state, why,
    match}} and the count of each state."""
    if not graph_a or not graph_b:
        return {}
    rules = [{k["name"]: k.get("schedule") for k in ks} for ks in (kernels_a, kernels_b)]
    calls = [("a", n) for n in graph_a["nodes"] if n["kind"] in ("kernel", "op")]
    calls += [("b", n) for n in graph_b["nodes"] if n["kind"] in ("kernel", "op")]
    out: dict = {"a": {}, "b": {}, "time_change": TIME_CHANGE}
    out["counts"] = {"a": dict.fromkeys(DIFF_STATES, 0), "b": dict.fromkeys(DIFF_STATES, 0)}
    for members in joined(calls, source_keys):
        sides = [[calls[i][1] for i in members if calls[i][0] == tag] for tag in ("a", "b")]
        why, state = [], "same"
        if not sides[1]:
            state = "removed"
            why = ["B computes none of its layers" if sides[0][0].get("layers") else "no call of it in B"]
        elif not sides[0]:
            state = "added"
            why = ["A computes none of its layers" if sides[1][0].get("layers") else "no call of it in A"]
        else:
            used = [
                sorted({rule.get(n["label"]) or n["kind"] for n in side})
                for rule, side in zip(rules, sides, strict=True)
            ]
            if used[0] != used[1]:
                why.append(f"rule: {', '.join(used[0])} → {', '.join(used[1])}")
            fused = [sorted(re.sub(r"\d+(?=_|$)", "", n["label"]) for n in side) for side in sides]
            if fused[0] != fused[1]:  # the ops fused into its kernels (their names, numbering left out)
                why.append(f"kernels: {', '.join(fused[0])} → {', '.join(fused[1])}")
            # each side's ms a call, None where a call is untimed: two numbers past `ms[0] and ms[1]`
            ms: list = [
                sum(n["ms"] for n in side) if all(n.get("ms") for n in side) else None for side in sides
            ]
            if ms[0] and ms[1] and max(ms) / min(ms) >= TIME_CHANGE:
                faster = f"{ms[0] / ms[1]:.2f}× faster" if ms[1] < ms[0] else f"{ms[1] / ms[0]:.2f}× slower"
                why.append(f"time: {ms[0]:.4f} → {ms[1]:.4f} ms a call (B {faster})")
            state = "changed" if why else "same"
        for tag, side, other in (("a", sides[0], sides[1]), ("b", sides[1], sides[0])):
            match = list(dict.fromkeys(m["label"] for m in other))
            for n in side:
                out[tag][n["id"]] = {"state": state, "why": why, "match": match}
            out["counts"][tag][state] += len(side)
    return out


def drawn_diff(dir_a: Path, dir_b: Path, kernels_a: list[dict], kernels_b: list[dict]) -> dict:
    """graph_diff of the two jobs' fused graphs (views/graph-fused.json, as their sandboxes wrote
    them: one missing or malformed gives no diff, never a failed page)."""
    paths = [safe_job_file(d, "views/graph-fused.json") for d in (dir_a, dir_b)]
    graphs = [read_untrusted_json(p) if p else None for p in paths]
    try:
        return graph_diff(graphs[0], graphs[1], kernels_a, kernels_b)
    except Exception:  # any shape a sandbox could give it
        return {}


def compare(job_a: dict, job_b: dict, dir_a: Path, dir_b: Path) -> dict:
    """The comparison of two results, as /compare/<a>/<b>.json gives it."""
    ra, rb = job_a["results"], job_b["results"]
    a, b = side(job_a), side(job_b)
    speedup = a["headline"]["ms"] / b["headline"]["ms"] if a["headline"] and b["headline"] else None
    names = [n for n in OPTION_ORDER if n in job_a["options"] or n in job_b["options"]]
    names += sorted((set(job_a["options"]) | set(job_b["options"])) - set(names))
    # an option a job was not given is its default (a job from the API may leave any out)
    given = [{n: job["options"].get(n, OPTION_DEFAULTS.get(n)) for n in names} for job in (job_a, job_b)]
    options = [
        {"option": n, "label": OPTION_LABELS.get(n, n.replace("_", " ")), "a": given[0][n], "b": given[1][n]}
        | {"same": given[0][n] == given[1][n], "a_text": option_text(n, given[0][n])}
        | {"b_text": option_text(n, given[1][n])}
        for n in names
    ]
    bench_key = lambda x: (x["runtime"], x["variant"], x["tuned"])  # noqa: E731
    benchmarks = [
        {"runtime": k[0], "variant": k[1], "tuned": k[2]}
        | {"a_ms": x and x.get("median_ms"), "b_ms": y and y.get("median_ms")}
        for k, x, y in paired(ra.get("benchmarks", []), rb.get("benchmarks", []), bench_key)
    ]
    fidelity_key = lambda x: (x["reference"], x["variant"], x.get("tuned", False))  # noqa: E731
    fidelity = [
        {"reference": k[0], "variant": k[1], "tuned": k[2], "a": x, "b": y}
        for k, x, y in paired(ra.get("fidelity", []), rb.get("fidelity", []), fidelity_key)
    ]
    kernels = matched_kernels(ra.get("kernels", []), rb.get("kernels", []))
    counted = list(ra.get("instructions") or {}) + [n for n in rb.get("instructions") or {}]
    instructions = [
        {"name": n, "a": (ra.get("instructions") or {}).get(n), "b": (rb.get("instructions") or {}).get(n)}
        for n in dict.fromkeys(counted)
    ]
    return {
        "a": a,
        "b": b,
        "speedup": speedup,  # a's time / b's: above 1, b is faster
        "speed_words": speed_words(speedup) if speedup is not None else None,
        "differences": model_differences(job_a, job_b, dir_a, dir_b),  # of the models: [] if the same
        "options": options,
        "benchmarks": benchmarks,
        "fidelity": fidelity,
        "kernels": kernels,
        "instructions": instructions,
        "graph_diff": drawn_diff(dir_a, dir_b, ra.get("kernels", []), rb.get("kernels", [])),
    }


def code_diff(
    dir_a: Path, dir_b: Path, job_a: dict, job_b: dict, view: str, kernel_a: str, kernel_b: str
) -> dict:
    """A unified diff of one code view between the two jobs (a kernel view: a kernel of each, by
    default the same name)."""
    views = available_views(job_a["results"]) | available_views(job_b["results"])
    view = view if view in views and view != "passes" else "relax-optimized"
    template = CODE_VIEWS[view].path
    texts = []
    for job_dir, kernel in ((dir_a, kernel_a), (dir_b, kernel_b)):
        rel = code_file(view, kernel) if view in KERNEL_VIEWS else template
        text, _ = read_text(
            safe_job_file(job_dir, rel) if rel and (kernel or view not in KERNEL_VIEWS) else None
        )
        texts.append(filter_asm(text) if view == "asm" and text else text)  # as the code panel shows it
    diff = "".join(
        difflib.unified_diff(
            texts[0].splitlines(True),
            texts[1].splitlines(True),
            f"{job_a['id']}: {kernel_a if view in KERNEL_VIEWS else view}",
            f"{job_b['id']}: {kernel_b if view in KERNEL_VIEWS else view}",
        )
    )
    return {
        "view": view,
        "per_kernel": view in KERNEL_VIEWS,
        "views": {k: v for k, v in views.items() if k != "passes"},
        "kernels": [[k["name"] for k in job["results"].get("kernels", [])] for job in (job_a, job_b)],
        "text": diff,
        "kernel_a": kernel_a,
        "kernel_b": kernel_b,
        "missing": [not t for t in texts],
    }
