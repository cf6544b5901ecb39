"""The device pool as the web shows it (`/api/devices`, the form's status line): with no tracker, and
with TVM's own tracker running as a process (no boards register with it here). No TVM in the web."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from tests.servers import free_port
from webapp import create_app
from webapp.devices.pool import stop_processes, tracker_command
from webapp.devices.tracker import TrackerError, tracker_summary


@pytest.fixture(scope="module")
def tracker_address():
    """TVM's RPC tracker on a free port, as the pool starts it; ended with its process group."""
    port = free_port()
    proc = subprocess.Popen(
        tracker_command("127.0.0.1", port), stdin=subprocess.DEVNULL, start_new_session=True
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                tracker_summary(address)
                break
            except TrackerError:
                assert proc.poll() is None and time.monotonic() < deadline, "the tracker did not start"
                time.sleep(0.2)
        yield address
    finally:
        stop_processes(proc)  # the tracker runs its server in a child process: its whole group


def web(config, tmp_path, tracker: str):
    """A client of an app with its own data folder (no pool.json), asking `tracker`."""
    return create_app(replace(config, data_dir=tmp_path, tracker=tracker)).test_client()


def test_devices_api_says_plainly_when_no_tracker_runs(config, tmp_path):
    client = web(config, tmp_path, f"127.0.0.1:{free_port()}")
    started = time.monotonic()
    status = client.get("/api/devices").get_json()
    assert time.monotonic() - started < 5
    assert status["tracker_up"] is False and status["keys"] == {}
    assert "is not answering" in status["message"] and status["state"] == "not started"
    assert status["emulated_boards"] == [] and status["summary"].startswith("tracker not running")
    line = client.get("/").get_data(as_text=True).split('id="pool-status">')[1].split("</p>")[0]
    assert "Device pool: tracker not running at" in line


def test_devices_api_lists_the_pool_of_a_running_tracker(config, tmp_path, tracker_address):
    client = web(config, tmp_path, tracker_address)
    status = client.get("/api/devices").get_json()
    assert status["tracker"] == tracker_address and status["tracker_up"] is True
    assert status["keys"] == {} and status["message"] is None
    assert status["summary"] == "no boards registered"
    line = client.get("/").get_data(as_text=True).split('id="pool-status">')[1].split("</p>")[0]
    assert "Device pool: no boards registered" in line


def test_devices_api_reports_the_pools_own_state(config, tmp_path, tracker_address):
    (tmp_path / "devices").mkdir()
    pool = {
        "tracker": tracker_address,
        "state": "preparing",
        "message": "building the arm64 root file system (first start only, about a minute)",
        "emulated": True,
        "boards": [{"name": "rpi5 (emulated: QEMU cortex-a76)", "key": "rpi5", "state": "waiting"}],
    }
    (tmp_path / "devices" / "pool.json").write_text(json.dumps(pool))
    client = web(config, tmp_path, tracker_address)
    status = client.get("/api/devices").get_json()
    assert status["state"] == "preparing" and status["pool_message"] == pool["message"]
    assert status["emulated_boards"] == pool["boards"]
    assert "preparing (building the arm64 root file system" in client.get("/").get_data(as_text=True)


def test_devices_api_counts_a_board_registered_with_the_tracker(config, tmp_path, tracker_address):
    """TVM's stock RPC server on this machine, registered under the rpi5 key as a real board would be."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port),
         "--port-end", str(port + 1), "--tracker", tracker_address, "--key", "rpi5", "--silent"],
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        client = web(config, tmp_path, tracker_address)
        deadline = time.monotonic() + 60
        # it reports its info, then offers itself (free): wait for the second
        while not (status := client.get("/api/devices").get_json())["keys"].get("rpi5", {}).get("free"):
            assert server.poll() is None and time.monotonic() < deadline, "the server did not register"
            time.sleep(0.3)
        assert status["keys"] == {"rpi5": {"boards": 1, "free": 1, "busy": 0, "waiting": 0}}
        assert "Device pool: rpi5: 1 board (1 free)" in client.get("/").get_data(as_text=True)
    finally:
        stop_processes(server)
