"""Built-in examples through the whole pipeline (sandboxed, as a job runs), one run, one table:
TVM vs PyTorch eager vs ONNX Runtime, medians from the same harness and thread count.

    .venv/bin/python benchmarks/cpu_models.py [--models mlp,cnn-small] [--json out.json]

TVM here is the default pipeline, untuned.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from webapp.catalog import EXAMPLES
from webapp.cli import compile_locally
from webapp.config import Config


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(EXAMPLES))
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--budget", type=float, default=5.0, help="timing seconds per runtime and model")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    config = Config.from_env(bench_budget_s=args.budget)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            started = time.monotonic()
            out = Path(tmp) / name
            error = compile_locally(config, name, args.target, out)
            if error:
                print(f"{name}: failed at {error['stage']}: {error['message']}", file=sys.stderr)
                continue
            result = json.loads((out / "result.json").read_text())
            times = {b["runtime"]: b for b in result["benchmarks"]}
            rows.append(
                {
                    "model": name,
                    "seconds_total": round(time.monotonic() - started, 1),
                    "threads": result["threads"],
                    **{f"{k}_median_ms": v["median_ms"] for k, v in times.items()},
                }
            )
            print_row(rows[-1])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def print_row(row: dict) -> None:
    tvm, pt, ort = (row.get(f"{k}_median_ms") for k in ("tvm", "pytorch", "onnxruntime"))
    print(
        f"{row['model']:<18} threads {row['threads']}  TVM {tvm:9.3f} ms  PyTorch {pt:8.3f} ms  "
        f"ORT {ort:8.3f} ms  TVM/PyTorch {tvm / pt:6.1f}x  TVM/ORT {tvm / ort:6.1f}x  "
        f"(job {row['seconds_total']} s)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
