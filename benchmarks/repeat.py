"""The same job, run three times on a quiet machine: how far apart its benchmark's medians lie.

Each model runs as a job would (webapp.cli.compile_locally: the sandboxed pipeline, its benchmark at the
server's default budget) `--runs` times over, each run a new job folder. Per runtime it prints each run's
median (its fastest round's, as the result states it), the spread across the runs ((largest - smallest) /
their median), the same spread of each run's median over all four of its rounds (what a row stated before
it took its fastest round), and the largest of the runs' own spread (how far apart one job's four timing
rounds lie: `spread` in its result).

    PYTHONPATH=. .venv/bin/python benchmarks/repeat.py [--models resnet50:none,mobilenet-v2:int8,bert:none]
        [--runs 3] [--record]

--record appends the run to benchmarks/results/repeat.json (benchmarks/tables.py renders it into
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from statistics import median

from record import keep, script_parser
from tables import spread

from webapp.cli import compile_locally
from webapp.config import Config


def main() -> int:
    parser = script_parser(__doc__, "repeat")
    parser.add_argument("--models", default="resnet50:none,mobilenet-v2:int8,bert:none")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(data_dir=Path(tmp) / "data")
        for spec in args.models.split(","):
            model, quantize = spec.split(":")
            runs: dict[str, list[dict]] = {}
            for i in range(args.runs):
                out = Path(tmp) / f"{model}-{quantize}-{i}"
                error = compile_locally(config, model, {"target": "x86-host", "quantize": quantize}, out)
                if error:
                    raise RuntimeError(f"{model}: failed at {error['stage']}: {error['message']}")
                result = json.loads((out / "result.json").read_text())
                for b in result["benchmarks"]:
                    name = f"{b['runtime']} {b['variant']}"
                    runs.setdefault(name, []).append(b)
            for name, timed in runs.items():
                medians = [b["median_ms"] for b in timed]
                of_rounds = [median(b["rounds_ms"]) for b in timed]
                row = {
                    "model": model,
                    "quantize": quantize,
                    "runtime": name,
                    "medians_ms": medians,
                    "spread": spread(medians),
                    "spread_all_rounds": spread(of_rounds),
                    "round_spread": max(b.get("spread") or 0 for b in timed),
                }
                rows.append(row)
                print(
                    f"{model:18} {name:18} "
                    + " ".join(f"{m:9.3f}" for m in medians)
                    + f"  spread {100 * row['spread']:5.1f}%"
                    + f"  over all rounds {100 * row['spread_all_rounds']:5.1f}%"
                    + f"  rounds' {100 * row['round_spread']:5.1f}%",
                    flush=True,
                )
    keep(args, "repeat", config.bench_threads, rows, runs=args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
