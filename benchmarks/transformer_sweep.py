"""Transformer uploads as users make them (benchmarks/hf_models.py), each through the playground as one
job (sandboxed, as a job runs: import, build, inspect, benchmark), on x86-host or another preset.

Prints one row a case: TVM, ONNX Runtime and PyTorch fp32 medians from the job's own benchmark (one
timing loop), TVM / ONNX Runtime, the matmul kernels' rate as a share of this machine's sgemm (their
flops over their measured time), the slowest kernel with its share of a run and its rule, the time from
upload to result, and the first failure. Then the median and the worst TVM / ONNX Runtime.

    .venv/bin/python benchmarks/transformer_sweep.py [--cases bert:128:dynamo,gpt2:1024:pt2]
        [--preset x86-avx2] [--json out.json] [--record] [--jobs DIR]

Without --cases: every architecture at its default case, then the extra cases (other exporters,
sequence lengths from 16 to 1,024). Exports are cached in PLAYGROUND_SWEEP_CACHE
(~/.cache/tvm-playground-sweep). --jobs keeps each case's job folder (its result.json, views, log) there.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from corpus import fmt, median  # the corpus table's cells and its benchmark rows
from hf_models import ARCHS, export
from record import host_cpu, keep, script_parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webapp.cli import compile_locally  # noqa: E402
from webapp.config import Config  # noqa: E402

CACHE = Path(os.environ.get("PLAYGROUND_SWEEP_CACHE", Path.home() / ".cache" / "tvm-playground-sweep"))
# every architecture once (its users' exporter, a typical length), then other exporters and lengths
DEFAULT = [f"{name}:128:dynamo" for name in ARCHS]
EXTRA = [
    "bert:16:dynamo", "bert:512:dynamo", "bert:128:torchscript", "bert:128:pt2",
    "gpt2:1024:dynamo", "gpt2:64:torchscript", "llama:256:pt2", "llama:1024:dynamo",
    "distilbert:384:torchscript", "roberta:256:torchscript", "t5:512:dynamo", "vit:0:torchscript",
]  # fmt: skip


def model_file(case: str) -> Path:
    name, seq, how = case.split(":")
    path = CACHE / f"{name}-{seq}-{how}.{'pt2' if how == 'pt2' else 'onnx'}"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".partial-{path.name}")
        export(ARCHS[name], int(seq), how, partial)
        partial.rename(path)
    return path


def matmul_share_of_sgemm(result: dict) -> float | None:
    """The matmul kernels' flops over their measured time, as a share of the machine's sgemm rate."""
    kernels = [
        k for k in result.get("kernels", []) if "matmul" in k["name"] and k.get("ms") and k.get("flop")
    ]
    sgemm = result.get("sgemm") or {}
    if not kernels or not sgemm.get("gflops"):
        return None
    flop = sum(k["flop"] * k.get("calls", 1) for k in kernels)
    return flop / (sum(k["ms"] for k in kernels) * 1e-3) / 1e9 / sgemm["gflops"]


def slowest(result: dict) -> dict | None:
    kernels = [k for k in result.get("kernels", []) if k.get("share")]
    k = max(kernels, key=lambda k: k["share"], default=None)
    return {"name": k["name"][:60], "share": k["share"], "rule": k["schedule"]} if k else None


def run_case(config: Config, case: str, preset: str, tmp: Path) -> dict:
    row: dict = {"case": case, "arch": case.split(":")[0], "family": ARCHS[case.split(":")[0]].family}
    try:
        path = model_file(case)
    except Exception as e:  # an exporter's failure is this case's result
        return row | {"error": {"stage": "export", "message": f"{type(e).__name__}: {str(e)[:300]}"}}
    out = tmp / case.replace(":", "-")
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    error = compile_locally(config, str(path), {"target": preset}, out)
    row["seconds"] = time.perf_counter() - started
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else {}
    tvm, ort = median(result, "tvm", "fp32"), median(result, "onnxruntime", "fp32")
    torch = median(result, "pytorch", "fp32")
    return row | {
        "error": error,
        "tvm_ms": tvm,
        "ort_ms": ort,
        "pytorch_ms": torch,
        "tvm_over_ort": tvm / ort if tvm and ort else None,
        "matmul_of_sgemm": matmul_share_of_sgemm(result),
        "slowest": slowest(result),
    }


def table(rows: list[dict]) -> str:
    columns = ["case", "family", "TVM ms", "ORT ms", "PyTorch ms", "TVM/ORT", "matmuls % of sgemm"]
    columns += ["slowest kernel", "rule", "s", "failure"]
    head = "| " + " | ".join(columns) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        k, error = r.get("slowest") or {}, r.get("error")
        failure = f"{error['stage']}: {error['message'][:120]}" if error else ""
        of_sgemm = r.get("matmul_of_sgemm")
        lines.append(
            f"| {r['case']} | {r['family']} | {fmt(r.get('tvm_ms'))} | {fmt(r.get('ort_ms'))} | "
            f"{fmt(r.get('pytorch_ms'))} | {fmt(r.get('tvm_over_ort'))}x | "
            f"{fmt(100 * of_sgemm if of_sgemm else None, '.0f')} | "
            f"{k.get('name', '-')} ({fmt(100 * k['share'] if k else None, '.0f')}%) | {k.get('rule', '-')} | "
            f"{fmt(r.get('seconds'), '.0f')} | {failure} |"
        )
    ratios = [r["tvm_over_ort"] for r in rows if r.get("tvm_over_ort")]
    if ratios:
        lines.append(
            f"\nTVM / ONNX Runtime: median {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x "
            f"over {len(ratios)} cases"
        )
    return "\n".join(lines)


def main() -> int:
    parser = script_parser(__doc__, "transformer_sweep")
    parser.add_argument("--cases", default=",".join(DEFAULT + EXTRA))
    parser.add_argument("--preset", default="x86-host")
    parser.add_argument("--jobs", help="a folder to keep the job folders in")
    args = parser.parse_args()
    config = Config.from_env()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            print(case, file=sys.stderr, flush=True)
            rows.append(run_case(config, case, args.preset, Path(args.jobs or tmp)))
            print(table(rows[-1:]).splitlines()[2], file=sys.stderr, flush=True)
    print(f"measured on {host_cpu()}, {config.bench_threads} threads, preset {args.preset}")
    print(table(rows))
    keep(args, "transformer_sweep", config.bench_threads, rows, preset=args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
