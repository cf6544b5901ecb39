"""The sandbox: no network, nothing writable outside the job folder, limits end a run with their name."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import replace

import pytest

from webapp.machine.sandbox import run_sandboxed


def run_script(config, tmp_path, code: str):
    job_dir = config.jobs_dir / f"sandbox-test-{tmp_path.name}"
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "script.py").write_text(code)
    outcome = run_sandboxed(job_dir, config, [sys.executable, str(job_dir / "script.py")])
    return outcome, job_dir, (job_dir / "log.txt").read_text()


def test_pipeline_cannot_open_a_network_socket(config, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        outcome, _, log = run_script(
            config,
            tmp_path,
            f"""
import socket
for host in ("127.0.0.1", "8.8.8.8"):
    try:
        socket.create_connection((host, {port}), timeout=2)
        print("CONNECTED", host)
    except OSError as e:
        print("BLOCKED", host, e)
""",
        )
    finally:
        listener.close()
    assert outcome.returncode == 0, log
    assert "CONNECTED" not in log and log.count("BLOCKED") == 2


def test_pipeline_cannot_write_outside_its_job_folder(config, tmp_path):
    other_job = config.jobs_dir / "another-job"
    other_job.mkdir(parents=True, exist_ok=True)
    (other_job / "secret.txt").write_text("other user's data")
    targets = [
        config.data_dir / "jobs.db",
        other_job / "secret.txt",
        config.data_dir / "new.txt",
        tmp_path / "outside.txt",
        "/etc/passwd",
        "/usr/local/pwned.txt",
    ]
    outcome, job_dir, log = run_script(
        config,
        tmp_path,
        f"""
import os
for path in {[str(t) for t in targets]!r}:
    try:
        with open(path, "a") as f:
            f.write("x")
        print("WROTE", path)
    except OSError as e:
        print("denied", path, type(e).__name__)
print("other job visible:", os.path.exists({str(other_job / "secret.txt")!r}))
open("inside.txt", "w").write("ok")
""",
    )
    assert outcome.returncode == 0, log
    assert "WROTE" not in log, log
    assert "other job visible: False" in log
    assert (job_dir / "inside.txt").read_text() == "ok"
    assert (other_job / "secret.txt").read_text() == "other user's data"
    assert not (tmp_path / "outside.txt").exists()


def test_memory_limit_ends_the_run_with_its_name(config, tmp_path):
    small = replace(config, memory_limit_mb=512)
    outcome, _, log = run_script(small, tmp_path, "block = bytearray(2 * 1024**3)\nprint('ALLOCATED')")
    assert "ALLOCATED" not in log
    assert outcome.limit == "Memory limit reached (512 MB of address space)."


def test_process_limit_ends_the_run_with_its_name(config, tmp_path):
    small = replace(config, process_limit=8)
    outcome, _, log = run_script(
        small,
        tmp_path,
        """
import os, time
children = []
for _ in range(64):
    pid = os.fork()
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    children.append(pid)
print("FORKED ALL")
""",
    )
    assert "FORKED ALL" not in log
    assert outcome.limit and outcome.limit.startswith("Process limit reached")


def test_wall_clock_limit_kills_the_run(config, tmp_path):
    short = replace(config, wall_limit_s=2)
    outcome, _, _ = run_script(short, tmp_path, "import time\ntime.sleep(60)")
    assert outcome.limit == "Wall-clock limit reached (2 s)."
    assert outcome.seconds < 20


@pytest.mark.parametrize("limit_s", [1])
def test_cpu_limit_ends_the_run_with_its_name(config, tmp_path, limit_s):
    short = replace(config, cpu_limit_s=limit_s)
    outcome, _, _ = run_script(short, tmp_path, "while True:\n    pass")
    assert outcome.limit == f"CPU time limit reached ({limit_s} CPU seconds)."


def test_pipeline_cannot_change_its_inputs_shared_with_other_jobs(config, tmp_path):
    """A job's input folder holds hard links to uploads kept once for every job (data/uploads):
    read-only inside the sandbox, so no job can alter what another job reads."""
    job_dir = config.jobs_dir / f"sandbox-test-{tmp_path.name}"
    (job_dir / "input").mkdir(parents=True)
    (job_dir / "input" / "model.onnx").write_bytes(b"the upload")
    outcome, _, log = run_script(
        config,
        tmp_path,
        """
import os
for attempt in ("write", "chmod", "remove", "create"):
    try:
        if attempt == "write":
            open("input/model.onnx", "ab").write(b"poison")
        elif attempt == "chmod":
            os.chmod("input/model.onnx", 0o666)
        elif attempt == "remove":
            os.unlink("input/model.onnx")
        else:
            open("input/new.onnx", "wb")
        print("DID", attempt)
    except OSError as e:
        print("denied", attempt, type(e).__name__)
print("read:", open("input/model.onnx", "rb").read())
""",
    )
    assert outcome.returncode == 0, log
    assert "DID" not in log and log.count("denied") == 4, log
    assert "read: b'the upload'" in log
    assert (job_dir / "input" / "model.onnx").read_bytes() == b"the upload"


def test_a_sandbox_stops_while_another_holds_the_timing_slot(config, tmp_path):
    """webapp/machine/timing_slot.py: one job times at a time. Job B ticks every 20 ms; job A takes the slot
    for 2 s meanwhile. B's worker stops B's sandbox while A holds it (no tick inside A's hold, the
    pause counted in B's outcome) and continues it after; A's own worker recognises its sandbox's
    process (the slot's holder, seen across the sandbox's pid namespace) and never stops it."""
    import json
    import threading
    import time

    config = replace(config, timing_lock=tmp_path / "timing.lock")
    ticker = """
import time
end = time.time() + 5
with open("ticks.txt", "w") as f:
    while time.time() < end:
        f.write(f"{time.time()}\\n"); f.flush(); time.sleep(0.02)
"""
    holder = """
import time
from webapp.machine import timing_slot
time.sleep(1)
with timing_slot.hold("benchmark"):
    time.sleep(2)
"""
    outcomes = {}

    def run(name, code):
        outcomes[name] = run_script(config, tmp_path / name, code)

    threads = [threading.Thread(target=run, args=args) for args in (("b", ticker), ("a", holder))]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(60)
    (a, a_dir, a_log), (b, b_dir, b_log) = outcomes["a"], outcomes["b"]
    assert a.returncode == 0 and b.returncode == 0, (a_log, b_log)
    (hold,) = [json.loads(line) for line in (a_dir / "timing-slot.jsonl").read_text().splitlines()]
    assert hold["held"] and hold["end"] - hold["start"] >= 2
    ticks = [float(t) for t in (b_dir / "ticks.txt").read_text().split()]
    assert ticks[0] < hold["start"] and ticks[-1] > hold["end"], "B ran before and after A's hold"
    assert not [t for t in ticks if hold["start"] <= t <= hold["end"]], "B ticked while A timed"
    # counted from the poll that saw every process of B stopped
    assert 1.8 <= b.paused_s < 3.5 and a.paused_s == 0, (a.paused_s, b.paused_s)


def test_the_timing_slot_survives_what_a_sandbox_can_do_to_its_files(config, tmp_path):
    """A sandbox of the server's own user can take the lock file's permissions away: the next run
    gives them back. A record it garbles costs only the garbled lines; a paused_s it writes in
    progress.json shows only as a finite number of seconds or nothing."""
    import json

    from webapp.jobs.store import seconds_or_none
    from webapp.machine import timing_slot

    lock = tmp_path / "timing.lock"
    assert timing_slot.prepare(lock) == lock
    lock.chmod(0)
    assert timing_slot.prepare(lock) == lock and lock.stat().st_mode & 0o777 == 0o666
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "link.lock").symlink_to(tmp_path / "elsewhere")
    assert timing_slot.prepare(tmp_path / "link.lock") is None  # not a regular file: no slot, no error
    if os.geteuid() == 0:  # another local user's file in /tmp: not ours to trust (root can make one here)
        theirs = tmp_path / "theirs.lock"
        theirs.write_text("")
        os.chown(theirs, 65534, 65534)
        assert timing_slot.prepare(theirs) is None

    # a job of a worker that could not have the lock file times without the slot, and its record says so
    unusable = replace(config, timing_lock=tmp_path / "link.lock")
    code = "from webapp.machine import timing_slot\nwith timing_slot.hold('benchmark'):\n    pass\n"
    outcome, job_dir, log = run_script(unusable, tmp_path, code)
    assert outcome.returncode == 0, log
    assert timing_slot.summary(job_dir)["unheld"] == 1

    job = tmp_path / "job"
    job.mkdir()
    row = {"phase": "benchmark", "waited_s": 1.5, "start": 1.0, "end": 2.0, "held": True}
    lines = [json.dumps(row), "{not json", json.dumps({"phase": "x"}), json.dumps(row | {"held": False})]
    (job / timing_slot.RECORD).write_text("\n".join(lines) + "\n")
    summary = timing_slot.summary(job)
    assert summary["waited_s"] == 3.0 and len(summary["holds"]) == 2 and summary["unheld"] == 1
    assert [seconds_or_none(v) for v in (2.5, 0, -1, float("nan"), float("inf"), True, "3")] == [
        2.5,
        0.0,
        None,
        None,
        None,
        None,
        None,
    ]
