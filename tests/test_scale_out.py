"""More than one machine: the web alone (`tvm-playground web`, gunicorn) and two workers, each named
as a machine of its own (PLAYGROUND_HOST), sharing one data folder, a real Redis (the queue) and a
real PostgreSQL (the store). They share the jobs; a worker whose machine is lost (its process group
killed: no heartbeat any more) has its job retried by the other, while the web keeps answering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.servers import free_port, postgres_server, redis_server, stop, wait_until
from tests.test_supervision import Prober, get, gone_within, processes_of, submit, wait_finished
from webapp.jobs.store import JobStore


def start(argv: list[str], env: dict, log_path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture()
def cluster(tmp_path):
    with redis_server() as redis_url, postgres_server() as database_url:
        port = free_port()
        env = os.environ | {
            "PORT": str(port),
            "PLAYGROUND_DATA": str(tmp_path / "data"),  # the shared folder (a network mount in real use)
            "REDIS_URL": redis_url,
            "DATABASE_URL": database_url,
            "PLAYGROUND_HEARTBEAT_S": "1",
            "PLAYGROUND_LOST_AFTER_S": "6",
        }
        cli = [sys.executable, "-m", "webapp.cli"]
        procs = {"web": start([*cli, "web"], env, tmp_path / "web.log")}
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(base + "/")[0] == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or procs["web"].poll() is not None:
                    raise AssertionError((tmp_path / "web.log").read_text()) from None
                time.sleep(0.3)
        for machine in ("machine-a", "machine-b"):
            worker_env = env | {"PLAYGROUND_HOST": machine}
            procs[machine] = start([*cli, "worker"], worker_env, tmp_path / f"{machine}.log")
        try:
            yield base, JobStore(tmp_path / "data", database_url), procs
        finally:
            for proc in procs.values():
                stop(proc)


@pytest.mark.slow
def test_two_workers_share_jobs_and_a_lost_ones_job_moves_to_the_other(cluster):
    base, store, procs = cluster
    assert not (store.data_dir / "jobs.db").exists()  # the store is PostgreSQL
    prober = Prober(base + "/")
    prober.start()
    jobs = [
        submit(base, {"example": "cnn-small", "target": "x86-host", "quantize": "int8"}),
        submit(base, {"example": "cnn-small", "target": "x86-host", "quantize": "int8", "skip_first": "1"}),
    ]

    def machines():
        running = [store.get(j) for j in jobs]
        if all(j["status"] == "running" for j in running):
            return {j["worker"].split(":")[0]: j["id"] for j in running}

    # both run at once, one on each machine
    on = wait_until(
        lambda: (m := machines()) and len(m) == 2 and m,
        120,
        f"two jobs running on two machines ({[store.get(j) for j in jobs]})",
    )
    assert set(on) == {"machine-a", "machine-b"}
    lost = on["machine-a"]
    wait_until(lambda: processes_of(store.job_dir(lost)), 60, "sandbox of machine-a's job")
    sandbox = processes_of(store.job_dir(lost))
    os.killpg(procs["machine-a"].pid, signal.SIGKILL)  # machine-a is lost: its worker, mid-job
    procs["machine-a"].wait()
    assert all(gone_within(pid, 2.0) for pid in sandbox), sandbox  # its sandbox died with it
    killed_at = time.monotonic()

    moved = wait_until(lambda: store.get(lost)["attempts"] == 1 and store.get(lost), 60, "retry")
    print(f"\nmachine-a's job queued again {time.monotonic() - killed_at:.1f} s after the kill")
    assert moved["note"] == "retried after the worker stopped"
    for job_id in jobs:
        job = wait_finished(store, job_id, timeout=600)
        assert job["status"] == "done", job["error"]
        assert job["worker"].startswith("machine-b:")  # the retry ran on the machine that is left
    prober.running = False
    prober.join()
    status, page = get(f"{base}/r/{lost}")
    assert status == 200 and b"retried after the worker stopped" in page
    times = sorted(t for _, t in prober.samples)
    errors = sum(s != 200 for s, _ in prober.samples)
    print(f"probes of /: {len(times)}, errors {errors}, max {times[-1] * 1000:.0f} ms")
    assert errors == 0 and times[-1] < 1.0
