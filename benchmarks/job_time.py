"""Time to result: each stage's seconds for a list of models, run as a job runs them (the sandboxed
pipeline, webapp.cli.compile_locally, the same call as `tvm-playground compile`), and the whole
job's wall time. Models are built-in example names or model files.

    .venv/bin/python benchmarks/job_time.py [--models resnet50,model.onnx] [--runs 1] [--json out.json]
        [--record] [--bisect] [--quantize int8]

--bisect asks each job for the bisection of its passes (webapp/pipeline/stages/bisect.py) and prints, per
build, how many of its points it ran and in how long.

--record appends the run (its jobs) to benchmarks/results/job_time.json (benchmarks/tables.py renders it
into docs/benchmarks.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from record import keep, script_parser

from webapp.cli import compile_locally
from webapp.config import Config


def time_job(config: Config, model: str, options: dict, out: Path) -> dict:
    started = time.monotonic()
    error = compile_locally(config, model, options, out)
    wall = time.monotonic() - started
    stages = json.loads((out / "progress.json").read_text())["stages"]
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else {}
    bisection = [
        {k: b[k] for k in ("variant", "points", "seconds")} | {"runs": len(b["runs"]), "first": b["first"]}
        for b in result.get("bisection", [])
    ]
    return {
        "model": model,
        "wall_s": wall,
        "error": error,
        "stages": {s["name"]: s["seconds"] for s in stages if s["seconds"] is not None},
        "bisection": bisection,
    }


def main() -> int:
    parser = script_parser(__doc__, "job_time")
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--runs", type=int, default=1, help="jobs per model; medians are printed")
    parser.add_argument("--keep", type=Path, help="keep the job folders here (a new or empty folder)")
    parser.add_argument("--bisect", action="store_true", help="each job bisects its passes")
    parser.add_argument("--quantize", default="none")
    args = parser.parse_args()
    options = {"target": args.target, "quantize": args.quantize, "bisect": args.bisect}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(data_dir=Path(tmp) / "data")
        jobs = args.keep or Path(tmp)
        for model in args.models.split(","):
            mine = [
                time_job(config, model, options, jobs / f"{Path(model).stem}-{i}") for i in range(args.runs)
            ]
            runs += mine
            failed = next((r["error"] for r in mine if r["error"]), None)
            if failed:
                print(f"{model}: failed at {failed['stage']}: {failed['message']}", file=sys.stderr)
                continue
            names = list(mine[0]["stages"])
            stages = ", ".join(f"{n} {median(r['stages'].get(n, 0) for r in mine):.1f}" for n in names)
            print(
                f"{model:<20} {median(r['wall_s'] for r in mine):6.1f} s in all "
                f"(median of {len(mine)}); stages, s: {stages}",
                flush=True,
            )
            for b in (b for r in mine for b in r["bisection"]):
                first = b["first"]["name"] if b["first"] else "none"
                ran = f"{b['runs']} of {b['points']} points in {b['seconds']} s"
                print(f"  bisection {b['variant']}: {ran}; first off: {first}")
    keep(args, "job_time", config.bench_threads, runs, key="jobs", target=args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
