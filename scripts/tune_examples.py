"""Tune the built-in examples and ship the best record per kernel with the project.

    .venv/bin/python scripts/tune_examples.py --target x86-host --trials mlp=32,cnn-small=64,resnet50=600

Each example runs through the sandboxed pipeline (as a job with tune_trials) against a work data folder
(default ./data-tuning, which keeps every measured record). The search starts from an empty database, not
from the records shipped today, so a kernel that the default rules changed leaves no stale record behind.
After each example the best record of each kernel measured so far is written to
webapp/tuning_records/<database key>/, which a new data folder starts from
(webapp/jobs/tuning_db.py). Records for `x86-host` are keyed by the vector ISA of the machine that tunes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from webapp.cli import compile_locally
from webapp.config import Config
from webapp.jobs.tuning_db import (
    RECORDS,
    SHIPPED_DIR,
    WORKLOADS,
    database_key,
    locked,
    read_lines,
    shared_dir,
)


def best_records(folder: Path) -> tuple[list[str], list[str]]:
    """The workloads that have records, and the fastest record of each, re-numbered."""
    workloads = read_lines(folder / WORKLOADS)
    best: dict[int, tuple[float, list]] = {}
    for line in read_lines(folder / RECORDS):
        idx, record = json.loads(line)
        run_secs = record[1] or []
        if not run_secs:
            continue
        secs = sum(float(s) for s in run_secs) / len(run_secs)
        if idx not in best or secs < best[idx][0]:
            best[idx] = (secs, record)
    kept = sorted(best)
    lines = [json.dumps([i, best[old][1]], separators=(",", ":")) for i, old in enumerate(kept)]
    return [workloads[i] for i in kept], lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--trials", default="mlp=32,cnn-small=64,transformer-block=128")
    parser.add_argument("--data", type=Path, default=Path("data-tuning"))
    args = parser.parse_args()
    config = Config.from_env(data_dir=args.data.resolve(), bench_budget_s=0.5, shipped_tuning_records=False)
    for item in args.trials.split(","):
        name, trials = item.split("=")
        with tempfile.TemporaryDirectory() as tmp:
            error = compile_locally(
                config, name, {"target": args.target, "tune_trials": int(trials)}, Path(tmp) / name
            )
            if error:
                print(f"{name}: failed at {error['stage']}: {error['message']}", file=sys.stderr)
                continue
            result = json.loads((Path(tmp) / name / "result.json").read_text())
        checks = ", ".join(
            f"{c['variant']} {c['tuned_ms']:.3f} ms with the records against {c['default_ms']:.3f} "
            f"({'kept' if c['kept'] else 'dropped'})"
            for c in result.get("record_check", [])
        )
        print(
            f"{name}: {trials} trials in {result['tuning']['seconds']:.0f} s; the build's whole-model "
            f"check: {checks or 'no record beat its default rule'}",
            flush=True,
        )
        shipped = SHIPPED_DIR / database_key(args.target)
        shipped.mkdir(parents=True, exist_ok=True)
        with locked(shared_dir(config, args.target)):
            workloads, records = best_records(shared_dir(config, args.target))
        (shipped / WORKLOADS).write_text("".join(w + "\n" for w in workloads))
        (shipped / RECORDS).write_text("".join(r + "\n" for r in records))
        print(f"  shipped {len(records)} records to {shipped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
