"""Where and when a benchmark ran, and the run appended to benchmarks/results/<script>.json.

Each results file is a list of runs, oldest first; a run is one invocation of a benchmark script:

    {"date": "2026-11-25", "commit": "4a75041", "cpu": "AMD EPYC ...", "threads": 2, ...the script's data}

benchmarks/tables.py renders docs/benchmarks.md's tables from these files. Light on purpose (no
webapp, TVM or torch import): the scripts call it after measuring.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def host_cpu() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def commit() -> str:
    """The checkout's short commit hash ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def record_run(script: str, threads: int, data: dict, results: Path = RESULTS) -> Path:
    """Append one run of `script` (cpu_models, quantized, pi, job_time) to results/<script>.json."""
    run = {
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "cpu": host_cpu(),
        "threads": threads,
        **data,
    }
    path = results / f"{script}.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append(run)
    results.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(runs, indent=1) + "\n")
    tmp.replace(path)
    return path


def script_parser(doc: str | None, record: str | None = None) -> argparse.ArgumentParser:
    """A benchmark script's arguments: its docstring as the help, --json, and --record where the script
    keeps its runs in results/<record>.json."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    if record:
        parser.add_argument(
            "--record", action="store_true", help=f"append this run to benchmarks/results/{record}.json"
        )
    return parser


def keep(
    args: argparse.Namespace, record: str | None, threads: int, rows: list, key: str = "rows", **about
) -> None:
    """What --json and --record ask of a finished run: its rows (under `key`, beside `about`: the
    options that made them) written to the --json file, and appended to results/<record>.json."""
    data = {**about, key: rows}
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    if not getattr(args, "record", False):
        return
    if not rows:
        print("nothing was measured: nothing recorded", file=sys.stderr)
        return
    print(f"recorded in {record_run(record or '', threads, data)}")
