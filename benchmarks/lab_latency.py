"""The kernel lab's edit-to-code and edit-to-time (#55): a 1024x1024 matmul's schedule edited again and
again (its split factors changed, so that every edit is a new build), each edit sent as the page sends
it (POST /api/lab) to an app with a worker of its own, its JSON polled every 50 ms: the seconds until the
assembly is there (result.hot_loop), and until the time is (result.time). The whole way: the queue, the
sandbox's start, Python's and TVM's imports, the build, the reference run and the timing. Run from the
repository root, with no job running:

    PYTHONPATH=. .venv/bin/python benchmarks/lab_latency.py [--edits 5] [--target x86-host]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from record import host_cpu, script_parser

from webapp import create_app
from webapp.config import Config
from webapp.jobs.lab import starters
from webapp.jobs.queue import JobQueue

FACTORS = [(8, 16), (4, 16), (8, 8), (16, 16), (2, 32), (4, 8), (16, 8), (2, 16)]


def edit(client, code: str, target: str, parent: str | None) -> tuple[float, float | None, str]:
    """Seconds from the edit sent to its assembly shown, and to its time shown (None: none came), and the
    build's id. `parent`: the build edited, as the page sends it (stopped where it still runs)."""
    sent = time.perf_counter()
    asked = {"code": code, "target": target} | ({"parent": parent} if parent else {})
    lab_id = client.post("/api/lab", json=asked).get_json()["id"]
    code_s = None
    while True:
        view = client.get(f"/api/lab/{lab_id}").get_json()
        result = view.get("result") or {}
        if code_s is None and result.get("hot_loop"):
            code_s = time.perf_counter() - sent
        if result.get("time") or view["status"] in ("done", "failed"):
            if view["status"] == "failed":
                raise RuntimeError(view.get("error"))
            done = time.perf_counter() - sent
            return code_s or done, done if result.get("time") else None, lab_id
        time.sleep(0.05)


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--target", default="x86-host")
    args = parser.parse_args()
    matmul = starters()["matmul"]
    with tempfile.TemporaryDirectory() as scratch:
        config = Config(data_dir=Path(scratch), submit_rate="", max_queued_per_client=0, max_queued=0)
        consumer = JobQueue(config).consumer(workers=1)
        consumer.start()
        client = create_app(config).test_client()
        rows: list[tuple[float, float | None]] = []
        parent = None
        try:
            for i in range(args.edits):
                rows_i, columns = FACTORS[i % len(FACTORS)]
                code = matmul.replace("sch.split(i, [None, 8])", f"sch.split(i, [None, {rows_i}])")
                code = code.replace("sch.split(j, [None, 16])", f"sch.split(j, [None, {columns}])")
                code_s, time_s, parent = edit(client, code, args.target, parent)
                rows.append((code_s, time_s))
                print(f"edit {i + 1} (split {rows_i} x {columns}): code {code_s:.2f} s, time {time_s:.2f} s")
        finally:
            consumer.stop(graceful=True)
    code_s = statistics.median(r[0] for r in rows)
    timed = [r[1] for r in rows if r[1] is not None]
    print(f"{host_cpu()}, {args.target}, {args.edits} edits: assembly after {code_s:.2f} s (median), "
          + (f"time after {statistics.median(timed):.2f} s" if timed else "no time"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
