"""docs/benchmarks.md's results tables, written from the runs recorded in benchmarks/results/*.json.

Each benchmark script with --record appends its run there (benchmarks/record.py). This script renders
each file into the doc's block between `<!-- results:NAME -->` and `<!-- /results:NAME -->` (NAME:
cpu_models, quantized, decode, pi, job_time, contention, repeat), so the doc's figures are the recorded
ones and no copy goes stale.

A table is from the latest runs: those at the newest run's commit, CPU and thread count (and target,
for the scripts that take one). Its figures are medians across those runs of each run's figure, its
ratio columns each run's ratio and their median. Older runs are summed up, one line per commit, below it.

    .venv/bin/python benchmarks/tables.py           # rewrite the blocks
    .venv/bin/python benchmarks/tables.py --check   # exit 1, naming each stale block, if any differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"

# The command that records a run of each script (run from the repository's root).
COMMANDS = {
    "cpu_models": "PYTHONPATH=. .venv/bin/python benchmarks/cpu_models.py --record",
    "quantized": "PYTHONPATH=. .venv/bin/python benchmarks/quantized.py --record",
    "decode": "PYTHONPATH=. .venv/bin/python benchmarks/decode.py --record",
    "llm": "PYTHONPATH=. .venv/bin/python benchmarks/llm.py --record",
    "pi": ".venv/bin/python benchmarks/pi.py --record",
    "job_time": "PYTHONPATH=. .venv/bin/python benchmarks/job_time.py --runs 3 --record",
    "contention": "PYTHONPATH=. .venv/bin/python benchmarks/contention.py --record",
    "repeat": "PYTHONPATH=. .venv/bin/python benchmarks/repeat.py --record",
}


# ---------------------------------------------------------------- numbers and cells


def spread(values) -> float:
    """How far apart values lie: (largest - smallest) / their median."""
    return (max(values) - min(values)) / median(values)


def med(values) -> float | None:
    """The median of the values that are there (None where none is)."""
    present = [v for v in values if v is not None]
    return median(present) if present else None


def ms(x: float | None) -> str:
    """Milliseconds to about three significant digits."""
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def seconds(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def each(values) -> str:
    """Each run's ratio, in run order ("—" for a run without it)."""
    return ", ".join("—" if v is None else v if isinstance(v, str) else f"{v:.2f}" for v in values)


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def listed(values) -> str:
    """Distinct values in first-seen order, joined."""
    return ", ".join(dict.fromkeys(str(v) for v in values))


# ---------------------------------------------------------------- runs


def load_runs(results: Path, name: str) -> list[dict]:
    path = results / f"{name}.json"
    if not path.exists():
        return []
    runs = json.loads(path.read_text())
    if not isinstance(runs, list):
        raise SystemExit(f"{path}: not a list of runs")
    return runs


def groups(runs: list[dict], extra: tuple[str, ...] = ()) -> list[list[dict]]:
    """The runs by where they ran (commit, CPU, threads, and `extra` keys), the newest group first: a
    group's place is that of its newest run."""
    by: dict[tuple, list[dict]] = {}
    last: dict[tuple, int] = {}
    for i, run in enumerate(runs):
        key = tuple(run.get(k) for k in ("commit", "cpu", "threads", *extra))
        by.setdefault(key, []).append(run)
        last[key] = i
    return [by[key] for key in sorted(by, key=lambda k: -last[k])]


def where(runs: list[dict], extra: str = "") -> str:
    dates = listed(sorted(r.get("date", "?") for r in runs))
    threads = listed(r.get("threads") for r in runs)
    return (
        f"{plural(len(runs), 'run')} ({dates}) at {listed(r.get('commit') for r in runs)} on "
        f"{listed(r.get('cpu') for r in runs)}, {threads} {'thread' if threads == '1' else 'threads'}{extra}"
    )


def machine(runs: list[dict]) -> str:
    """CPU and threads (and the target, where it is not x86-host) of a group of runs."""
    targets = listed(r["target"] for r in runs if r.get("target", "x86-host") != "x86-host")
    cpu = f"{listed(r.get('cpu') for r in runs)}, {listed(r.get('threads') for r in runs)}"
    return cpu + (f", {targets}" if targets else "")


def names(items, key: str | None = "model") -> list:
    """The distinct models (or items, with key None) in first-seen order."""
    return list(dict.fromkeys(r if key is None else r[key] for r in items))


def row_of(run: dict, **match) -> dict | None:
    """The run's row for this model (and board), None if the run has none."""
    return next(
        (r for r in run.get("rows", []) if all(r.get(k) == v for k, v in match.items())),
        None,
    )


def history(earlier: list[list[dict]], columns: list, label: Callable, cell: Callable, what: str) -> str:
    """One line per earlier group: its commit, dates, runs, machine, and a figure per column."""
    if not earlier:
        return ""
    header = ["commit", "dates", "runs", "CPU, threads", *(label(c) for c in columns)]
    rows = [
        [
            listed(r.get("commit") for r in g),
            listed(sorted(r.get("date", "?") for r in g)),
            len(g),
            machine(g),
            *(cell(g, c) for c in columns),
        ]
        for g in earlier
    ]
    return f"\n\nEarlier commits ({what}, median of each commit's runs):\n\n" + table(header, rows)


def medians(n: int) -> str:
    return "medians across the runs of each run's median" if n > 1 else "the run's medians"


def peaks(runs: list[dict]) -> str:
    values = [r["sgemm_peak_gflops"] for r in runs if r.get("sgemm_peak_gflops")]
    return f"; sgemm reference {', '.join(f'{v:.0f}' for v in values)} GFLOP/s" if values else ""


# ---------------------------------------------------------------- cpu_models.py


def per_model(latest: list[dict]):
    """Each model of the latest runs: its name, its row in each run (None where it failed), the rows
    it has, and figure(key), that figure's median over them."""
    for model in names(r for run in latest for r in run.get("rows", [])):
        mine = [row_of(run, model=model) for run in latest]
        present = [r for r in mine if r]
        yield model, mine, present, lambda key, present=present: med(r.get(key) for r in present)


def render_cpu_models(runs: list[dict]) -> str:
    latest, *earlier = groups(runs, ("target",))
    n = len(latest)
    rows = []
    for model, mine, present, figure in per_model(latest):
        kept = [r["tvm_records_ms"] for r in present if r.get("tvm_records_ms") is not None]
        if kept:
            records = ms(med(kept)) + ("" if len(kept) == len(present) else f" ({len(kept)} of {n} runs)")
        elif any(r.get("kernels_with_records") for r in present):
            records = "(not kept)"
        else:
            records = "(no records)"
        over_default = [
            None
            if r is None
            else div(r.get("tvm_records_ms"), r.get("tvm_default_ms"))
            or ("(not kept)" if r.get("kernels_with_records") else "(no records)")
            for r in mine
        ]
        over_ort = [r and div(r.get("tvm_default_ms"), r.get("onnxruntime_ms")) for r in mine]
        pct = figure("tvm_default_peak_pct")
        rows.append(
            [
                model,
                ms(figure("pytorch_ms")),
                ms(figure("onnxruntime_ms")),
                ms(figure("tvm_default_ms")),
                records,
                each(over_default),
                times(med(v for v in over_default if not isinstance(v, str))),
                each(over_ort),
                times(med(over_ort)),
                "—" if pct is None else f"{pct:.0f}%",
            ]
        )
    header = [
        "model",
        "PyTorch",
        "ONNX Runtime",
        "TVM default rules",
        "TVM + shipped records",
        f"records / default, {plural(n, 'run')}",
        "median",
        f"default / ORT, {plural(n, 'run')}",
        "median",
        "default, % of sgemm",
    ]
    target = listed(r.get("target", "x86-host") for r in latest)
    earlier_ratio = ratio_history(earlier, "tvm_default_ms", "onnxruntime_ms", "default / ORT")
    return ratio_table(latest, f", target {target}", header, rows) + earlier_ratio


def ratio_table(latest: list[dict], extra: str, header: list, rows: list) -> str:
    """Where the runs are from, the sgemm reference, and the table of their medians and ratios."""
    return (
        f"{where(latest, extra)}{peaks(latest)}. {medians(len(latest)).capitalize()}, in ms; ratios per "
        "run, then their median.\n\n" + table(header, rows)
    )


def ratio_history(earlier: list[list[dict]], num: str, den: str, what: str) -> str:
    """A line per earlier commit: each model's median of num / den over its runs."""
    models = names(r for g in earlier for run in g for r in run.get("rows", []))

    def ratio(g, model):
        found = [row_of(run, model=model) for run in g]
        return times(med(r and div(r.get(num), r.get(den)) for r in found))

    return history(earlier, models, str, ratio, what)


# ---------------------------------------------------------------- quantized.py


def render_quantized(runs: list[dict]) -> str:
    """Per CPU, a table of each target's newest runs (x86-host, x86-avx2...), then a line per earlier
    commit and target."""
    every = groups(runs, ("target",))
    newest_of: dict = {}
    for g in every:
        newest_of.setdefault((g[0].get("cpu"), g[0].get("target") or "x86-host"), g)
    newest = list(newest_of.values())
    newest.sort(key=lambda g: (g[0].get("cpu") or "", g[0].get("target") or "x86-host"))
    earlier = [g for g in every if g not in newest]
    tables = "\n\n".join(quantized_table(latest) for latest in newest)
    return tables + ratio_history(earlier, "tvm_int8_ms", "ort_int8_ms", "TVM/ORT int8")


def quantized_table(latest: list[dict]) -> str:
    n = len(latest)
    rows = []
    for model, mine, _, figure in per_model(latest):
        fp32 = [r and div(r.get("tvm_fp32_ms"), r.get("ort_fp32_ms")) for r in mine]
        int8 = [r and div(r.get("tvm_int8_ms"), r.get("ort_int8_ms")) for r in mine]
        dynamic = [r and div(r.get("tvm_int8_ms"), r.get("ort_dynamic_ms")) for r in mine]
        gain = [r and div(r.get("tvm_fp32_ms"), r.get("tvm_int8_ms")) for r in mine]
        sqnr = (figure("tvm_int8_sqnr_db"), figure("ort_int8_sqnr_db"))
        rows.append(
            [
                model,
                ms(figure("tvm_fp32_ms")),
                ms(figure("tvm_int8_ms")),
                times(med(gain)),
                ms(figure("ort_fp32_ms")),
                ms(figure("ort_int8_ms")),
                ms(figure("ort_dynamic_ms")),
                each(fp32),
                times(med(fp32)),
                each(int8),
                times(med(int8)),
                times(med(dynamic)),
                " / ".join("—" if s is None else f"{s:.1f}" for s in sqnr) + " dB",
            ]
        )
    header = [
        "model",
        "TVM fp32",
        "TVM int8",
        "TVM int8 gain",
        "ORT fp32",
        "ORT int8",
        "ORT dynamic int8",
        f"TVM/ORT fp32, {plural(n, 'run')}",
        "median",
        f"TVM/ORT int8, {plural(n, 'run')}",
        "median",
        "TVM int8 / ORT dynamic",
        "int8 SQNR TVM / ORT",
    ]
    target = listed(r.get("target", "x86-host") for r in latest)
    return ratio_table(latest, f", target {target}", header, rows)


# ---------------------------------------------------------------- decode.py


def render_decode(runs: list[dict]) -> str:
    latest, *earlier = groups(runs, ("past",))
    n = len(latest)
    rows = []
    for model, mine, _, figure in per_model(latest):
        ort = [r and div(r.get("tvm_ms"), r.get("onnxruntime_ms")) for r in mine]
        rows.append(
            [
                model,
                *(
                    f"{ms(figure(f'{k}_ms'))} ({figure(f'{k}_tokens_per_s'):.0f})"
                    if figure(f"{k}_ms") is not None
                    else "—"
                    for k in ("tvm", "onnxruntime", "pytorch")
                ),
                each(ort),
                times(med(ort)),
                times(med(r and div(r.get("tvm_ms"), r.get("pytorch_ms")) for r in mine)),
            ]
        )
    header = [
        "model",
        "TVM ms (tokens/s)",
        "ORT ms (tokens/s)",
        "PyTorch ms (tokens/s)",
        f"TVM/ORT, {plural(n, 'run')}",
        "median",
        "TVM/PyTorch",
    ]
    past = listed(r.get("past") for r in latest)
    earlier_ratio = ratio_history(earlier, "tvm_ms", "onnxruntime_ms", "TVM/ORT")
    return (
        f"{where(latest)}; one new token after {past} cached. {medians(n).capitalize()}, in ms; ratios "
        "per run, then their median.\n\n" + table(header, rows) + earlier_ratio
    )


# ---------------------------------------------------------------- pi.py


def render_pi(runs: list[dict]) -> str:
    latest, *earlier = groups(runs)
    n = len(latest)
    pairs = names(
        ((r["board"], r["model"]) for run in latest for r in run.get("rows", [])),
        key=None,
    )
    pairs.sort(key=lambda p: p[0])  # by board, each board's models in the order they ran
    rows = []
    for board, model in pairs:
        present = [r for run in latest if (r := row_of(run, model=model, board=board))]
        ok = [r for r in present if "error" not in r]
        if not ok:
            error = present[-1].get("error", "")
            rows.append([board, model, f"failed: {error.split(':')[0]}", *["—"] * 6])
            continue

        def figure(key: str, ok=ok):
            return med(r.get(key) for r in ok)

        count = figure("int8_instructions")
        rows.append(
            [
                board,
                model,
                ms(figure("tvm_fp32_ms")),
                ms(figure("tvm_int8_ms")),
                ms(figure("ort_fp32_ms")),
                ms(figure("ort_int8_ms")),
                times(med(div(r.get("tvm_fp32_ms"), r.get("tvm_int8_ms")) for r in ok)),
                times(med(div(r.get("ort_fp32_ms"), r.get("ort_int8_ms")) for r in ok)),
                "—" if count is None else f"{count:.0f} {ok[-1].get('int8_mnemonic')}",
            ]
        )
    header = [
        "board",
        "model",
        "TVM fp32",
        "TVM int8",
        "ORT fp32",
        "ORT int8",
        "TVM fp32 / int8",
        "ORT fp32 / int8",
        "int8 multiplies in TVM int8",
    ]
    last = latest[-1]
    emulation = f"; emulated: {last.get('qemu', 'QEMU')}, ONNX Runtime {last.get('onnxruntime') or '?'}"
    text = (
        f"{where(latest, emulation)}. **Emulated** figures, {medians(n)}, in ms; fp32 / int8: fp32 time "
        f"over int8 time of the same runtime.\n\n" + table(header, rows)
    )
    earlier_pairs = names(
        ((r["board"], r["model"]) for g in earlier for run in g for r in run.get("rows", [])), None
    )

    def int8_ratio(g, pair):
        found = [row_of(run, board=pair[0], model=pair[1]) for run in g]
        return times(med(r and div(r.get("tvm_int8_ms"), r.get("ort_int8_ms")) for r in found))

    return text + history(earlier, earlier_pairs, " ".join, int8_ratio, "TVM/ORT int8")


# ---------------------------------------------------------------- job_time.py


def model_name(model: str) -> str:
    """A built-in example's name, or a model file's name without its folder."""
    return Path(model).name


def render_job_time(runs: list[dict]) -> str:
    latest, *earlier = groups(runs, ("target",))
    jobs = [j for run in latest for j in run.get("jobs", [])]
    stages = list(dict.fromkeys(s for j in jobs if not j.get("error") for s in j.get("stages", {})))
    rows = []
    for model in names(jobs):
        mine = [j for j in jobs if j["model"] == model]
        ok = [j for j in mine if not j.get("error")]
        count = str(len(ok)) + (f" ({len(mine) - len(ok)} failed)" if len(ok) < len(mine) else "")
        rows.append(
            [
                model_name(model),
                count,
                seconds(med(j["wall_s"] for j in ok)),
                *(seconds(med(j["stages"].get(s) for j in ok)) for s in stages),
            ]
        )
    target = listed(r.get("target", "x86-host") for r in latest)
    text = f"{where(latest, f', target {target}')}. Medians of each model's jobs, in seconds.\n\n" + table(
        ["model", "jobs", "in all", *stages], rows
    )
    models = names(j for g in earlier for run in g for j in run.get("jobs", []))

    def whole(g, model):
        ok = [j for run in g for j in run.get("jobs", []) if j["model"] == model and not j.get("error")]
        if not ok:
            return "—"
        build = med(j["stages"].get("build") for j in ok)
        wall = seconds(med(j["wall_s"] for j in ok))
        return f"{wall} s" + ("" if build is None else f" (build {seconds(build)})")

    return text + history(earlier, models, model_name, whole, "whole job, seconds")


# ---------------------------------------------------------------- contention.py


def render_contention(runs: list[dict]) -> str:
    latest, *earlier = groups(runs)
    rows = [r for run in latest for r in run.get("rows", [])]
    keys = ("tvm fp32", "ort fp32", "tvm int8", "ort int8")
    out = []
    for model in names(rows):
        for scenario in names((r for r in rows if r["model"] == model), "scenario"):
            mine = [r for r in rows if r["model"] == model and r["scenario"] == scenario]
            out.append(
                [
                    model,
                    scenario,
                    listed(r["threads"] for r in mine),
                    f"{med(r['others_cores'] for r in mine):.2f}",
                    *(ms(med(r["ms"][k] for r in mine)) for k in keys),
                    times(med(r["ms"]["tvm fp32"] / r["ms"]["ort fp32"] for r in mine)),
                    times(med(r["ms"]["tvm int8"] / r["ms"]["ort int8"] for r in mine)),
                ]
            )
    count = len(rows) // max(1, len({(r["model"], r["scenario"]) for r in rows}))
    header = ["model", "scenario", "threads", "others' cores", *(f"{k} ms" for k in keys)]
    text = f"{where(latest)}, each scenario {plural(count, 'time')}; medians.\n\n" + table(
        header + ["TVM/ORT fp32", "TVM/ORT int8"], out
    )
    return text + ("" if not earlier else f"\n\n({plural(len(earlier), 'earlier commit')} not shown.)")


# ---------------------------------------------------------------- repeat.py


def render_repeat(runs: list[dict]) -> str:
    """The newest group of runs on each CPU at each thread count."""
    shown = {}
    for group in groups(runs):
        shown.setdefault((group[0].get("cpu"), group[0].get("threads")), group)
    header = [
        "model",
        "quantize",
        "runtime",
        "each job's median ms",
        "spread across jobs",
        "the same, all rounds' median",
        "in-job spread",
        "÷ ONNX Runtime fp32, per job (spread)",
    ]
    parts = []
    for group in shown.values():
        rows = []
        for run in group:
            ort = {
                r["model"]: r["medians_ms"] for r in run.get("rows", []) if r["runtime"] == "onnxruntime fp32"
            }
            for r in run.get("rows", []):
                ratios = [m / o for m, o in zip(r["medians_ms"], ort.get(r["model"], []), strict=False)]
                rows.append(
                    [
                        r["model"],
                        r["quantize"],
                        r["runtime"],
                        " / ".join(ms(m) for m in r["medians_ms"]),
                        f"{100 * r['spread']:.1f}%",
                        f"{100 * r['spread_all_rounds']:.1f}%" if "spread_all_rounds" in r else "–",
                        f"{100 * r['round_spread']:.1f}%",
                        "–"
                        if r["runtime"] == "onnxruntime fp32" or not ratios
                        else " / ".join(f"{x:.2f}" for x in ratios) + f" ({100 * spread(ratios):.1f}%)",
                    ]
                )
        parts.append(f"{where(group)}.\n\n" + table(header, rows))
    return "\n\n".join(parts)


def render_llm(runs: list[dict]) -> str:
    """Each model from the newest group of runs that measured it (a block per group: machines differ)."""
    blocks, shown = [], set()
    for group in groups(runs, ("preset",)):
        models = {ln["model"] for run in group for ln in run["rows"]} - shown
        if models:
            blocks.append(llm_block(group, models))
            shown |= models
    return "\n\n".join(blocks)


def llm_block(latest: list[dict], models: set[str]) -> str:
    """Per model and point: each runtime's median ms (tokens/s), TVM's ratios and share of the bound; then
    the weight-only builds' decode tokens/s and speed against TVM fp32. Medians across the group's runs."""
    lines = [ln for run in latest for ln in run["rows"] if ln["model"] in models]
    points = list(dict.fromkeys((ln["model"], ln["phase"], ln["length"]) for ln in lines))

    def fig(point: tuple, key: str) -> float | None:
        return med(ln.get(key) for ln in lines if (ln["model"], ln["phase"], ln["length"]) == point)

    rows = []
    for point in points:
        cells = []
        for k in ("tvm", "onnxruntime", "genai", "pytorch"):
            value, rate = fig(point, f"{k}_ms"), fig(point, f"{k}_tokens_per_s")
            cells.append("—" if value is None or rate is None else f"{ms(value)} ({rate:,.0f})")
        share = fig(point, "tvm_bound_share")
        ratios = [times(fig(point, f"tvm_vs_{k}")) for k in ("onnxruntime", "genai", "pytorch")]
        rows.append([*map(str, point), *cells, *ratios, "—" if share is None else f"{100 * share:.0f}%"])
    header = ["model", "phase", "tokens (prompt or cache)", "TVM ms (tokens/s)", "ORT ms (tokens/s)",
              "ORT GenAI ms (tokens/s)", "PyTorch ms (tokens/s)", "TVM vs ORT", "TVM vs ORT GenAI",
              "TVM vs PyTorch", "TVM share of the bound"]  # fmt: skip
    variants = sorted(
        {k[4:-13] for ln in lines for k in ln if k.startswith("tvm_int") and k.endswith("_tokens_per_s")}
    )
    decode = [p for p in points if p[1] == "decode"]

    def rate(p: tuple, v: str) -> str:
        return f"{fig(p, f'tvm_{v}_tokens_per_s') or 0:,.1f} ({times(fig(p, f'tvm_{v}_vs_fp32'))})"

    def genai_int4(p: tuple) -> str:
        value = fig(p, "genai_int4-g32_tokens_per_s")
        against = times(fig(p, "tvm_int4-g32_vs_genai"))
        return "—" if value is None else f"{value:,.1f} (TVM int4-g32 {against})"

    quantized = [[p[0], str(p[2]), *(rate(p, v) for v in variants), genai_int4(p)] for p in decode]
    bandwidth = listed(f"{ln['bandwidth']['read_gb_s']}" for ln in lines if ln["phase"] == "decode")
    return (
        f"{where(latest)}, {listed(r.get('preset') for r in latest)}; read bandwidth {bandwidth} GB/s. "
        "Medians across the runs; TVM is fp32 here, ratios are speeds (above 1: TVM faster).\n\n"
        + table(header, rows)
        + "\n\nWeight-only TVM builds at the decode points, tokens/s (against TVM fp32):\n\n"
        + table(["model", "tokens in the cache", *variants, "ORT GenAI int4 (TVM int4-g32 vs it)"], quantized)
    )


RENDER = {
    "cpu_models": render_cpu_models,
    "quantized": render_quantized,
    "decode": render_decode,
    "llm": render_llm,
    "pi": render_pi,
    "job_time": render_job_time,
    "contention": render_contention,
    "repeat": render_repeat,
}


# ---------------------------------------------------------------- the doc


def render(name: str, runs: list[dict]) -> str:
    """The markdown of one block: the table of the runs, or the command that records one."""
    if not runs:
        return f"No run recorded yet: `{COMMANDS[name]}`"
    return f"From `benchmarks/results/{name}.json`: " + RENDER[name](runs)


def blocks(results: Path = RESULTS) -> dict[str, str]:
    return {name: render(name, load_runs(results, name)) for name in RENDER}


def marker(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- results:{name} -->)(.*?)(<!-- /results:{name} -->)",
        re.DOTALL,
    )


def rewrite(text: str, bodies: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """(the doc with each block's body replaced, the names of the blocks that changed, the names whose
    markers the doc lacks)."""
    stale, missing = [], []
    for name, body in bodies.items():
        inner = f"\n\n{body}\n\n"
        found = marker(name).search(text)
        if found is None:
            missing.append(name)
            continue
        if found.group(2) != inner:
            stale.append(name)
            text = text[: found.start(2)] + inner + text[found.end(2) :]
    return text, stale, missing


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help="the markdown file with the blocks")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of <script>.json files")
    args = parser.parse_args(argv)
    doc = shown(args.doc)
    text = args.doc.read_text()
    new, stale, missing = rewrite(text, blocks(args.results))
    for name in missing:
        print(f"{doc}: no block <!-- results:{name} --> ... <!-- /results:{name} -->")
    if args.check:
        for name in stale:
            print(
                f"{doc}: block results:{name} is stale (differs from {shown(args.results)}/{name}.json); "
                "run .venv/bin/python benchmarks/tables.py"
            )
        if not stale and not missing:
            print(f"{doc}: the {len(RENDER)} results blocks agree with {shown(args.results)}")
        return 1 if stale or missing else 0
    if new != text:
        args.doc.write_text(new)
        print(f"{doc}: rewrote {', '.join(f'results:{n}' for n in stale)}")
    else:
        print(f"{doc}: the results blocks were up to date")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
