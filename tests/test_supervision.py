"""Crashes cost one job at most, never the server: `tvm-playground serve` (real gunicorn, a real worker
process, the real sandbox) keeps answering while its worker is killed with SIGKILL mid-job, starts the
worker again, and the job is retried once; a job whose worker is killed twice fails with a message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.servers import free_port, stop
from webapp.jobs.store import JobStore, read_untrusted_json


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def submit(base: str, fields: dict) -> str:
    boundary = "playground-test"
    body = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in fields.items()
    )
    body += f"--{boundary}--\r\n"
    request = urllib.request.Request(
        base + "/api/jobs",
        data=body.encode(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())["id"]


def start_serve(folder, port: int) -> subprocess.Popen:
    """`tvm-playground serve --no-pool --no-example-files` on the data folder folder/data, in a process
    group of its own, once it answers."""
    env = os.environ | {"PORT": str(port), "PLAYGROUND_DATA": str(folder / "data")}
    with open(folder / "serve.log", "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webapp.cli", "serve", "--no-pool", "--no-example-files"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            if get(f"http://127.0.0.1:{port}/")[0] == 200:
                return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError((folder / "serve.log").read_text()) from None
            time.sleep(0.3)


@pytest.fixture()
def server(tmp_path):
    port = free_port()
    proc = start_serve(tmp_path, port)
    yield f"http://127.0.0.1:{port}", JobStore(tmp_path / "data"), tmp_path / "serve.log"
    stop(proc)


class Prober(threading.Thread):
    """GET / every 0.1 s; records each answer's status and seconds (an error as status 0)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.samples, self.running = url, [], True

    def run(self):
        while self.running:
            started = time.monotonic()
            try:
                status = get(self.url, timeout=5)[0]
            except OSError:
                status = 0
            self.samples.append((status, time.monotonic() - started))
            time.sleep(0.1)


def processes_of(job_dir) -> list[int]:
    """The processes whose command line names the job folder: its sandbox (bwrap and the pipeline)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if str(job_dir).encode() in f.read():
                    out.append(int(entry))
        except (OSError, ValueError):
            continue
    return out


def kill_worker_once_running(store: JobStore, job_id: str, stage: str) -> tuple[int, list[int]]:
    """SIGKILL to the worker process running the job, once the job has reached `stage` in its
    sandbox; returns the worker's pid and the sandbox's processes."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        job = store.get(job_id)
        progress = read_untrusted_json(store.job_dir(job_id) / "progress.json") or {}
        reached = any(s["name"] == stage and s["status"] == "running" for s in progress.get("stages", []))
        sandbox = processes_of(store.job_dir(job_id))
        if job["status"] == "running" and job["worker"] and reached and sandbox:
            pid = int(job["worker"].rsplit(":", 1)[1])
            os.kill(pid, signal.SIGKILL)
            return pid, sandbox
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {stage}: {store.get(job_id)}")


# How long a sandbox may take to die with its worker. 2 s was once not enough in make test (test_scale_out:
# two sandbox processes still there; the test passed alone), likely because they exit at the jobs' low
# priority (nice 10) while the other test process and another job keep both cores busy. A sandbox that
# outlived its worker would never end, so a longer wait still tells the two apart.
SANDBOX_DIES_S = 10.0


def gone_within(pid: int, seconds: float) -> bool:
    """Whether the process has ended (exited, or a zombie its parent has not reaped yet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                if "zombie" in f.read():
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def wait_finished(store: JobStore, job_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = store.get(job_id)
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not finish: {store.get(job_id)}")


@pytest.mark.slow
def test_worker_killed_mid_job_the_web_keeps_answering_and_the_job_is_retried(server):
    base, store, log = server
    prober = Prober(base + "/")
    prober.start()
    job_id = submit(base, {"example": "cnn-small", "target": "x86-host", "quantize": "int8"})
    killed, sandbox = kill_worker_once_running(store, job_id, "quantize")
    assert gone_within(killed, 2.0)
    # the sandboxed pipeline did not outlive its worker (bwrap --die-with-parent)
    assert all(gone_within(pid, SANDBOX_DIES_S) for pid in sandbox), sandbox
    job = wait_finished(store, job_id)
    prober.running = False
    prober.join()
    assert job["status"] == "done", job["error"]
    assert job["attempts"] == 1 and job["note"] == "retried after the worker stopped"
    assert int(job["worker"].rsplit(":", 1)[1]) != killed  # a new worker process ran it
    status, page = get(f"{base}/r/{job_id}")
    assert status == 200 and b"retried after the worker stopped" in page
    assert "serve: the worker exited (-9); starting it again" in log.read_text()
    # the web answered throughout: every probe, each within a second
    times = sorted(t for _, t in prober.samples)
    print(
        f"\nprobes of / while the worker was killed and the job retried: {len(times)}, "
        f"errors {sum(s != 200 for s, _ in prober.samples)}, median {times[len(times) // 2] * 1000:.0f} ms, "
        f"max {times[-1] * 1000:.0f} ms"
    )
    assert len(prober.samples) > 20
    assert all(s == 200 for s, _ in prober.samples), [s for s in prober.samples if s[0] != 200]
    assert max(t for _, t in prober.samples) < 1.0, max(t for _, t in prober.samples)


@pytest.mark.slow
def test_a_job_whose_worker_is_killed_twice_fails_with_a_plain_message(server):
    base, store, _ = server
    job_id = submit(base, {"example": "cnn-small", "target": "x86-host", "quantize": "int8"})
    first, _ = kill_worker_once_running(store, job_id, "quantize")
    deadline = time.monotonic() + 120
    while store.get(job_id)["attempts"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    second, _ = kill_worker_once_running(store, job_id, "quantize")
    assert second != first
    job = wait_finished(store, job_id)
    assert job["status"] == "failed" and "twice" in job["error"]["message"]
    assert get(f"{base}/")[0] == 200


@pytest.mark.slow
def test_a_restart_of_everything_loses_no_finished_result_and_no_queued_job(tmp_path):
    port = free_port()
    base, store = f"http://127.0.0.1:{port}", JobStore(tmp_path / "data")
    proc = start_serve(tmp_path, port)
    finished = submit(base, {"example": "mlp", "target": "x86-host"})
    assert wait_finished(store, finished)["status"] == "done"
    running = submit(base, {"example": "cnn-small", "target": "x86-host", "quantize": "int8"})
    queued = submit(base, {"example": "transformer-block", "target": "x86-host"})
    deadline = time.monotonic() + 120
    while store.get(running)["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    stop(proc)  # everything: the web, the worker and (dying with it) the job's sandbox
    assert [store.get(j)["status"] for j in (running, queued)] == ["running", "queued"]  # not failed
    proc = start_serve(tmp_path, port)
    try:
        for job_id in (running, queued):
            job = wait_finished(store, job_id)
            assert job["status"] == "done", job["error"]
        assert store.get(running)["note"] == "retried after the worker stopped"
        assert store.get(queued)["note"] is None  # it simply waited
        status, page = get(f"{base}/r/{finished}")
        assert status == 200 and b"retried" not in page
    finally:
        stop(proc)
