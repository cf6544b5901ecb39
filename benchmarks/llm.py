"""Language models as llama-bench measures them: time to the first token for prompts of 16, 128 and 512
tokens, and decode tokens/s with 128, 512 and 2,048 tokens in the cache; TVM against ONNX Runtime (the
same .onnx), ONNX Runtime GenAI (its builder's models of the checkpoint, float and int4) and PyTorch eager
with its cache, in one run, and each runtime's share of the memory-bandwidth bound (the bytes a decode step
reads at the read bandwidth measured in the same run).

Each example runs as a job does (the whole pipeline, sandboxed, through its generate stage:
webapp/pipeline/stages/generation.py), so these are the figures its result page states.

    PYTHONPATH=. .venv/bin/python benchmarks/llm.py [--models llama,smollm2-135m] [--budget 2] [--record]
        [--runs DIR]

--record appends the run to benchmarks/results/llm.json; --runs DIR keeps each model's run in DIR and takes
one found there instead of measuring it again.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from record import keep, script_parser

from webapp.cli import compile_locally
from webapp.config import Config

KEYS = {"tvm": "tvm", "onnxruntime": "onnxruntime", "onnxruntime-genai": "genai", "pytorch": "pytorch"}


def measure(config: Config, name: str, preset: str, tmp: Path) -> dict:
    out = tmp / f"{name}-{preset}"
    error = compile_locally(config, name, {"target": preset}, out)
    if error:
        raise RuntimeError(f"{name}: failed at {error['stage']}: {error['message']}")
    results = json.loads((out / "result.json").read_text())
    seconds = {s["name"]: s.get("seconds") for s in json.loads((out / "progress.json").read_text())["stages"]}
    return {"model": name, "preset": preset, "generate_s": seconds.get("generate")} | results["generation"]


def table(run: dict) -> list[dict]:
    """One line a point: each runtime's ms and tokens/s, TVM's ratios and share of the bound."""
    lines = []
    for point in run["points"]:
        if "error" in point:
            print(f"{point['phase']} {point['tokens']}/{point['past']}: not measured: {point['error']}")
            continue
        here = [
            r
            for r in run["rows"]
            if (r["phase"], r["tokens"], r["past"]) == (point["phase"], point["tokens"], point["past"])
        ]
        at = {KEYS[r["runtime"]]: r for r in here if r["variant"] == "fp32"}
        quantized = {r["variant"]: r for r in here if r["variant"] != "fp32" and r["runtime"] == "tvm"}
        genai = {
            r["variant"]: r for r in here if r["variant"] != "fp32" and r["runtime"] == "onnxruntime-genai"
        }
        tvm = at["tvm"]
        line = {
            "model": run["model"],
            "phase": point["phase"],
            "length": point["tokens"] if point["phase"] == "prefill" else point["past"],
            **{f"{k}_ms": r["median_ms"] for k, r in at.items()},
            **{f"{k}_tokens_per_s": r["tokens_per_s"] for k, r in at.items()},
            "tvm_vs_onnxruntime": tvm["speedup_vs_onnxruntime"],
            "tvm_vs_genai": tvm.get("speedup_vs_onnxruntime_genai"),
            **{f"genai_{v}_tokens_per_s": r["tokens_per_s"] for v, r in genai.items()},
            **{f"genai_{v}_bound_share": r.get("bound_share") for v, r in genai.items()},
            **{f"tvm_{v}_vs_genai": r.get("speedup_vs_onnxruntime_genai") for v, r in quantized.items()},
            "tvm_vs_pytorch": at["pytorch"]["median_ms"] / tvm["median_ms"] if "pytorch" in at else None,
            "tvm_bound_share": tvm.get("bound_share"),
            "onnxruntime_bound_share": at["onnxruntime"].get("bound_share"),
            **{f"tvm_{v}_tokens_per_s": r["tokens_per_s"] for v, r in quantized.items()},
            **{f"tvm_{v}_vs_fp32": r["speedup_vs_tvm_fp32"] for v, r in quantized.items()},
            **{f"tvm_{v}_bound_share": r["bound_share"] for v, r in quantized.items()},
            **{f"tvm_{v}_logits_sqnr_db": point["variants"][v]["logits_sqnr_db"] for v in quantized},
            **{
                f"tvm_{v}_model_bytes": point["variants"][v]["model_bytes"] for v in point.get("variants", {})
            },
            "greedy": point.get("greedy") and point["greedy"]["agreement"],
            "logits_sqnr_db": point["logits_sqnr_db"],
            "disturbed": point["disturbed"],
        }
        lines.append(line)
    return lines


def show(run: dict, lines: list[dict]) -> None:
    bw = run["bandwidth"]
    print(
        f"\n{run['model']} on {run['device']}, {run['threads']} threads: weights "
        f"{run['weight_bytes'] / 1e6:,.1f} MB; bandwidth {bw['read_gb_s']} GB/s read, "
        f"{bw['triad_gb_s']} GB/s triad (over {bw['bytes'] / 1e6:,.0f} MB); "
        f"generate stage {run['generate_s']} s"
    )
    if run["genai"].get("why_not"):
        print(f"ONNX Runtime GenAI not run: {run['genai']['why_not']}")
    print(
        f"{'phase':<8} {'length':>6} {'TVM ms':>9} {'ORT ms':>9} {'GenAI ms':>9} {'PyTorch ms':>10} "
        f"{'TVM tok/s':>10} {'vs ORT':>7} {'vs GenAI':>8} {'vs PyT':>7} {'TVM bound':>9} {'ORT bound':>9}"
    )
    for ln in lines:
        share = lambda v: f"{100 * v:8.0f}%" if v is not None else f"{'':>9}"  # noqa: E731
        cell = lambda v, w: f"{v:{w}.2f}" if v is not None else f"{'':>{w}}"  # noqa: E731
        ratio = lambda v, w: f"{v:{w - 1}.2f}x" if v else f"{'':>{w}}"  # noqa: E731
        print(
            f"{ln['phase']:<8} {ln['length']:>6} {ln['tvm_ms']:9.2f} {ln['onnxruntime_ms']:9.2f} "
            f"{cell(ln.get('genai_ms'), 9)} {cell(ln.get('pytorch_ms'), 10)} "
            f"{ln['tvm_tokens_per_s']:10.1f} {ln['tvm_vs_onnxruntime']:6.2f}x {ratio(ln['tvm_vs_genai'], 8)} "
            f"{ratio(ln['tvm_vs_pytorch'], 7)} "
            f"{share(ln['tvm_bound_share'])} {share(ln['onnxruntime_bound_share'])}"
            + (f"  (disturbed: {ln['disturbed']})" if ln["disturbed"] else ""),
            flush=True,
        )


def show_quantized(run: dict, lines: list[dict]) -> None:
    """The weight-only builds at the decode points: tokens/s, against TVM fp32, share of the bound."""
    variants = [v for v in run["variants"] if v != "fp32"]
    decode = [ln for ln in lines if ln["phase"] == "decode"]
    if not variants or not decode:
        return
    print(
        f"{'build':<10} {'MB':>7} "
        + " ".join(f"{'tok/s@' + str(ln['length']):>11} {'vs fp32':>7} {'bound':>5}" for ln in decode)
        + f" {'SQNR dB':>7} {'greedy':>14}"
    )
    for v in variants:
        cells = " ".join(
            f"{ln[f'tvm_{v}_tokens_per_s']:11.1f} {ln[f'tvm_{v}_vs_fp32']:6.2f}x "
            f"{100 * ln[f'tvm_{v}_bound_share']:4.0f}%"
            for ln in decode
        )
        agree = next((ln["greedy"][v] for ln in decode if ln["greedy"]), None)
        said = f"{100 * agree['same_share']:.0f}% same" if agree else ""
        print(
            f"{v:<10} {decode[0][f'tvm_{v}_model_bytes'] / 1e6:7.1f} {cells} "
            f"{decode[0][f'tvm_{v}_logits_sqnr_db']:7.1f} {said:>14}"
        )
    for v in (v for v in run["genai"].get("variants", {}) if v != "fp32"):
        cells = " ".join(
            f"{ln[f'genai_{v}_tokens_per_s']:11.1f} {'':>7} {100 * ln[f'genai_{v}_bound_share']:4.0f}%"
            for ln in decode
        )
        against = ", ".join(f"{ln[f'tvm_{v}_vs_genai']:.2f}x" for ln in decode if ln.get(f"tvm_{v}_vs_genai"))
        print(f"{'GenAI ' + v:<10} {'':>7} {cells}   (TVM {v} against it: {against})")
    agree = next((ln["greedy"]["fp32"] for ln in decode if ln["greedy"]), None)
    if agree:
        print(
            f"greedy, TVM fp32 against ONNX Runtime: {100 * agree['same_share']:.0f}% of the tokens the same"
        )


def main() -> int:
    parser = script_parser(__doc__, "llm")
    parser.add_argument("--models", default="llama,smollm2-135m")
    parser.add_argument("--preset", default="x86-host")
    parser.add_argument("--budget", type=float, default=2.0, help="timing seconds per runtime and point")
    parser.add_argument("--runs", help="a folder keeping each model's run: one there is not measured again")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(bench_budget_s=args.budget, data_dir=Path(tmp) / "data")
        for name in args.models.split(","):
            kept = Path(args.runs) / f"llm-{name}-{args.preset}.json" if args.runs else None
            if kept and kept.exists():  # a run measured before, printed and recorded again
                run = json.loads(kept.read_text())
            else:
                run = measure(config, name, args.preset, Path(tmp))
            if kept:
                kept.write_text(json.dumps(run))
            lines = table(run)
            show(run, lines)
            show_quantized(run, lines)
            rows += [ln | {"bandwidth": run["bandwidth"], "device": run["device"]} for ln in lines]
    keep(args, "llm", config.bench_threads, rows, budget_s=args.budget, preset=args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
