"""How far apart the rounds of a timing lie, on a quiet machine and beside other work: the evidence for
the spread above which a timing counts as disturbed (webapp/pipeline/stages/timing.py: SPREAD_LIMIT).

Reads every result.json under the folders given (a `make test` run leaves its jobs' under
/tmp/pytest-of-$USER) and prints, for the benchmark rows timed while the machine was quiet and for those
timed beside other work (the result's conditions), the percentiles of their rounds' spreads
((largest round median - smallest) / median).

    .venv/bin/python benchmarks/spreads.py /tmp/pytest-of-root [more folders]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def spreads(folders: list[Path]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"quiet": [], "beside other work": []}
    for folder in folders:
        for path in folder.rglob("result.json"):
            try:
                results = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            quiet = (results.get("conditions") or {}).get("quiet")
            if quiet is None:
                continue
            for row in results.get("benchmarks") or []:
                if row.get("spread") is not None and row.get("runs", 0) >= 8:
                    out["quiet" if quiet else "beside other work"].append(row["spread"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    for name, values in spreads(args.folders).items():
        if not values:
            print(f"{name}: no rows")
            continue
        p50, p90, p95, top = np.percentile(values, [50, 90, 95, 100])
        print(
            f"{name}: {len(values)} rows, spread p50 {p50:.1%}, p90 {p90:.1%}, p95 {p95:.1%}, max {top:.1%}"
        )


if __name__ == "__main__":
    main()
