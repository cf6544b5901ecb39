"""Built-in examples through the whole pipeline (sandboxed, as a job runs), measured in one run:
PyTorch eager, ONNX Runtime, TVM default (untuned: the default schedule rules) and TVM with the
shipped/shared tuning records (default rules for kernels without one), all with
the same harness (webapp/pipeline/stages/bench.py) and thread count. Prints medians, each one's ratio to
PyTorch and to ONNX Runtime, and GFLOP/s as a share of this machine's sgemm peak measured in the same run.

    .venv/bin/python benchmarks/cpu_models.py [--models mlp,cnn-small] [--json out.json] [--record]

--record appends the run to benchmarks/results/cpu_models.json (benchmarks/tables.py renders it into
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from record import keep, script_parser

from webapp.catalog import EXAMPLES
from webapp.cli import compile_locally
from webapp.config import Config


def sgemm_peak_gflops(threads: int, n: int = 2048, repeats: int = 10) -> float:
    """The best fp32 matrix-multiply rate of numpy (OpenBLAS) and torch.mm (the linter's reference,
    bench.sgemm_gflops) at the given thread count.

    A measured reference, not the hardware's peak: a library that beats this sgemm shows above 100%.
    """
    import numpy as np  # imported here: after OPENBLAS_NUM_THREADS is set, below

    from webapp.pipeline.stages.bench import best_seconds, sgemm_gflops

    a, b = (np.random.default_rng(i).standard_normal((n, n), dtype=np.float32) for i in (0, 1))
    numpy_gflops = 2 * n**3 / best_seconds(lambda: np.matmul(a, b), repeats) / 1e9
    return max(sgemm_gflops(threads, n, repeats), numpy_gflops)


# numpy's OpenBLAS reads its thread count once, at import: the same count as every runtime here.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, str(Config.from_env().bench_threads))


def main() -> int:
    parser = script_parser(__doc__, "cpu_models")
    parser.add_argument("--models", default=",".join(EXAMPLES))
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--budget", type=float, default=5.0, help="timing seconds per runtime and model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # A fresh data folder: TVM "with records" means the records shipped with the project.
        config = Config.from_env(bench_budget_s=args.budget, data_dir=Path(tmp) / "data")
        peak = sgemm_peak_gflops(config.bench_threads)
        print(
            f"sgemm reference: {peak:.1f} GFLOP/s with {config.bench_threads} threads (best of numpy and "
            "torch.mm, 2048x2048 fp32); '% peak' below is relative to it"
        )
        rows = []
        for name in args.models.split(","):
            out = Path(tmp) / name
            error = compile_locally(config, name, {"target": args.target}, out)
            if error:
                print(f"{name}: failed at {error['stage']}: {error['message']}", file=sys.stderr)
                continue
            result = json.loads((out / "result.json").read_text())
            rows.append(row_of(name, result, peak))
            print_row(rows[-1])
    about = {"target": args.target, "budget_s": args.budget, "sgemm_peak_gflops": peak}
    keep(args, "cpu_models", config.bench_threads, rows, **about)
    return 0


def row_of(name: str, result: dict, peak: float) -> dict:
    times = {(b["runtime"], b["tuned"]): b["median_ms"] for b in result["benchmarks"]}
    gflop = result.get("model_flop", 0) / 1e9
    row = {
        "model": name,
        "threads": result["threads"],
        "gflop": gflop,
        "pytorch_ms": times.get(("pytorch", False)),
        "onnxruntime_ms": times.get(("onnxruntime", False)),
        "tvm_default_ms": times.get(("tvm", False)),
        "tvm_records_ms": times.get(("tvm", True)),
        "kernels_with_records": (result.get("tuning") or {}).get("pretuned", 0),
        "kernels": len(result.get("kernels", [])),
    }
    for key in ("tvm_default", "tvm_records", "pytorch", "onnxruntime"):
        ms = row[f"{key}_ms"]
        row[f"{key}_peak_pct"] = None if not ms or not gflop else 100 * gflop / (ms / 1e3) / peak
    # Where the tuned time goes: the kernels with the largest share of the summed best times.
    tasks = [t for t in (result.get("tuning") or {}).get("tasks", []) if t["latency_us"]]
    total_us = sum(t["latency_us"] * t["weight"] for t in tasks) or 1.0
    row["top_kernels"] = [
        {
            "name": t["name"],
            "share_pct": 100 * t["latency_us"] * t["weight"] / total_us,
            "gflops": t["gflops"],
            "peak_pct": 100 * (t["gflops"] or 0) / peak,
        }
        for t in sorted(tasks, key=lambda t: -t["latency_us"] * t["weight"])[:3]
    ]
    return row


def print_row(row: dict) -> None:
    def cell(key: str) -> str:
        ms = row[f"{key}_ms"]
        if ms is None:
            return f"{key}: n/a"
        ratios = "".join(
            f", {ms / row[f'{ref}_ms']:.2f}x {short}"
            for ref, short in (("pytorch", "PT"), ("onnxruntime", "ORT"))
            if row[f"{ref}_ms"]
        )
        pct = row[f"{key}_peak_pct"]
        return f"{key} {ms:.3f} ms ({pct:.1f}% peak{ratios})" if pct is not None else f"{key} {ms:.3f} ms"

    work = f"{row['gflop']:.2f} GFLOP" if row["gflop"] >= 0.1 else f"{row['gflop'] * 1e3:.2f} MFLOP"
    print(
        f"{row['model']:<18} {work}, records for {row['kernels_with_records']}/{row['kernels']} kernels",
        flush=True,
    )
    for key in ("pytorch", "onnxruntime", "tvm_default", "tvm_records"):
        print(f"    {cell(key)}", flush=True)
    for k in row["top_kernels"]:
        print(
            f"      {k['share_pct']:4.1f}% of tuned time: {k['name']} at {k['gflops']:.1f} GFLOP/s "
            f"({k['peak_pct']:.1f}% of peak)",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
