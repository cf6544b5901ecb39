"""The web under load while jobs compile: 50 concurrent clients on loopback reading a result page,
its JSON, the job API and the front page, while two jobs compile on the same machine. Each request
asks for a compressed answer, as browsers do, and none is conditional (no If-None-Match): every one
is answered in full.

Starts its own `tvm-playground serve --no-pool --jobs 2` on a free loopback port with a data folder
of its own, runs one small job to have a result to read, submits two compiling jobs, and once both
are running sends the clients' requests (bounded: --requests per client, and --seconds in all),
after a warm-up in which every web process renders each page once.
Prints p50 / p90 / p99 / max latency, errors, and whether both jobs were compiling throughout.

    .venv/bin/python benchmarks/load.py [--clients 50] [--requests 20] [--seconds 120] [--no-warm-up]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

COMPILING = [  # two jobs that compile for a while on a 2-core machine
    {"example": "cnn-small", "target": "x86-host", "quantize": "int8", "tune_trials": "0"},
    {"example": "transformer-block", "target": "x86-host", "quantize": "int8", "tune_trials": "0"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def submit(base: str, fields: dict) -> str:
    boundary = "playground-load"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in fields.items()
    ]
    body = "".join(parts) + f"--{boundary}--\r\n"
    status, answer = fetch(
        base + "/api/jobs", body.encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    if status not in (200, 202):
        raise SystemExit(f"submit {fields}: {status} {answer[:300]!r}")
    return json.loads(answer)["id"]


def status_of(base: str, job_id: str) -> str:
    return json.loads(fetch(f"{base}/api/jobs/{job_id}")[1])["status"]


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {seconds} s")
        time.sleep(0.3)


BROWSER = {"Accept-Encoding": "gzip, deflate, br, zstd"}  # what Chromium sends: compressed answers


def client(urls: list[str], requests: int, deadline: float, samples: list, offset: int) -> None:
    for i in range(requests):
        if time.monotonic() > deadline:
            return
        url = urls[(offset + i) % len(urls)]
        started = time.monotonic()
        try:
            status = fetch(url, headers=BROWSER)[0]
        except OSError:
            status = 0
        samples.append((url, status, time.monotonic() - started, started))


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--seconds", type=float, default=120, help="the load stops after this at most")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false", help="time each web process's first renders too"
    )
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="playground-load-"))
    port = free_port()
    env = os.environ | {
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "PLAYGROUND_DATA": str(folder / "data"),
        "PLAYGROUND_REUSE_RESULTS": "0",
        "PLAYGROUND_SUBMIT_RATE": "",
    }
    serve = [sys.executable, "-m", "webapp.cli", "serve", "--no-pool", "--no-example-files", "--jobs", "2"]
    serve += ["--web-workers", str(args.web_workers)]
    with open(folder / "serve.log", "w") as log:
        proc = subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base), 60, "answer from the server")
        done = submit(base, {"example": "mlp", "target": "x86-host"})
        wait_for(lambda: status_of(base, done) == "done", 300, "finished mlp job")
        compiling = [submit(base, fields) for fields in COMPILING]
        wait_for(lambda: all(status_of(base, j) == "running" for j in compiling), 120, "two running jobs")
        urls = [f"{base}/r/{done}", f"{base}/r/{done}.json", f"{base}/api/jobs/{done}", f"{base}/"]
        for _ in range(4 * args.web_workers if args.warm_up else 0):  # each web process renders each page
            for url in urls:
                fetch(url)
        samples: list = []
        deadline = time.monotonic() + args.seconds
        clients = [
            threading.Thread(target=client, args=(urls, args.requests, deadline, samples, i))
            for i in range(args.clients)
        ]
        started = time.monotonic()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        seconds = time.monotonic() - started
        still = [status_of(base, j) for j in compiling]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    times = sorted(t * 1000 for _, _, t, _ in samples)
    errors = sum(status != 200 for _, status, _, _ in samples)
    if os.environ.get("LOAD_DEBUG"):
        first = min(s for *_, s in samples)
        for u, _, t, s0 in sorted(samples, key=lambda x: -x[2])[:15]:
            print(f"slow: {t * 1000:.0f} ms at +{s0 - first:.2f}s {u.removeprefix(base)}")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; web: gunicorn {args.web_workers} workers x 4 threads")
    print(
        f"{len(samples)} requests from {args.clients} clients in {seconds:.1f} s "
        f"({len(samples) / seconds:.0f}/s), errors {errors}"
    )
    print(
        f"latency ms: p50 {percentile(times, 0.5):.0f}  p90 {percentile(times, 0.9):.0f}  "
        f"p99 {percentile(times, 0.99):.0f}  max {times[-1]:.0f}  mean {statistics.mean(times):.0f}"
    )
    for url in urls:
        mine = sorted(t * 1000 for u, _, t, _ in samples if u == url)
        p50, p99 = percentile(mine, 0.5), percentile(mine, 0.99)
        print(f"  {url.removeprefix(base):<40} p50 {p50:5.0f}  p99 {p99:5.0f}")
    print(f"the two jobs after the load: {still} (both 'running' = they compiled throughout)")
    return 0 if errors == 0 else 1


def _answers(base: str) -> bool:
    try:
        return fetch(base + "/")[0] == 200
    except OSError:
        return False


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
