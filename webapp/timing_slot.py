"""One timing at a time on this machine: the timing slot.

The slot is a POSIX record lock on one file (Config.timing_lock: `timing.lock` in the data folder, or
PLAYGROUND_TIMING_LOCK where several servers share a machine). A sandboxed job takes it (`hold`)
around each of its timing phases: the benchmark and its kernel profiles, the float-fallback checks, each
batch of tuning measurements, a run on an emulated board (whose QEMU shares these cores). Compiling
never takes it, so jobs compile side by side.

While one job holds it the others are stopped: each worker asks every 0.1 s who holds the slot (`holder`:
F_GETLK answers with the holder's process id, as this process sees it, even across the sandbox's pid
namespace, so a job cannot pass for another) and, when it is not a process of its own sandbox, stops
every process of that sandbox (SIGSTOP) until the slot is free (`Pauser`, in webapp/sandbox.py's loop).
A holder waits SETTLE_S after taking the slot, time for the others to stop, before it times.

Each hold is recorded in the job folder (timing-slot.jsonl: phase, seconds waited, when it held the slot)
and summed into result.json by the pipeline (webapp/pipeline/job.py: Results.save).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import struct
import time
from contextlib import contextmanager
from pathlib import Path

ENV = "PLAYGROUND_TIMING_SLOT"  # where the sandbox finds the lock file (bound into it)
RECORD = "timing-slot.jsonl"  # in the job folder: one line per hold
SETTLE_S = 0.25  # after taking the slot: the other sandboxes stop within one 0.1 s poll of their worker
MAX_WAIT_S = 600.0  # then a phase times without the slot, and says so (a holder that never lets go)
MAX_PAUSE_S = 300.0  # a sandbox is stopped this long at most for one holder, then runs on regardless
POLL_S = 0.05

# struct flock on Linux (x86-64 and aarch64): short l_type, l_whence; off_t l_start, l_len; pid_t l_pid
FLOCK = "hhqqi4x"
_holding = False  # whether this process holds the slot now


def prepare(path: Path) -> Path:
    """The lock file, created where missing, writable by the sandbox's user (nobody, as root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)
    except PermissionError:  # another user's file, already shared
        pass
    os.close(fd)
    return path


def holder(path: Path) -> int | None:
    """The process id holding the slot (0 when it is in a pid namespace this process cannot see),
    or None when the slot is free."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        query = struct.pack(FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return None if kind == fcntl.F_UNLCK else pid


def take(fd: int, wait_s: float) -> bool:
    """Takes the slot on fd within wait_s seconds; False when it could not."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN) or time.monotonic() >= deadline:
                return False
        time.sleep(POLL_S)


@contextmanager
def hold(phase: str, job_dir: Path | None = None, wait_s: float = MAX_WAIT_S):
    """`with hold("benchmark"): ...` times with the machine to itself; where no slot is configured
    (a script, a test outside a worker) it only runs the block."""
    global _holding
    path = os.environ.get(ENV)
    if not path or _holding:  # nested in a phase that holds it already (closing its file would free it)
        yield
        return
    fd = os.open(path, os.O_RDWR)
    _holding = True
    try:
        asked = time.monotonic()
        held = take(fd, wait_s)
        waited = time.monotonic() - asked
        if held:
            time.sleep(SETTLE_S)
        start = time.time()
        try:
            yield
        finally:
            end = time.time()
            fcntl.lockf(fd, fcntl.LOCK_UN)
            row = {"phase": phase, "waited_s": round(waited, 3), "start": start, "end": end, "held": held}
            with open(Path(job_dir or ".") / RECORD, "a") as f:
                f.write(json.dumps(row) + "\n")
    finally:
        _holding = False
        os.close(fd)


def summary(job_dir: Path) -> dict | None:
    """What result.json says of the job's holds: {"waited_s": total, "holds": [rows]}, None if none."""
    try:
        lines = (job_dir / RECORD).read_text().splitlines()
    except OSError:
        return None
    rows = [json.loads(line) for line in lines if line.strip()]
    if not rows:
        return None
    return {"waited_s": round(sum(r["waited_s"] for r in rows), 3), "holds": rows}


def descendants(root: int) -> list[int]:
    """The processes below root (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Pauser:
    """Stops the sandbox below `root` (bwrap's process) while another sandbox holds the slot at
    `path`; `poll()` every 0.1 s, `paused_s` the time it spent stopped. `close()` continues it."""

    def __init__(self, path: Path | None, root: int):
        self.path, self.root = path, root
        self.since: float | None = None  # when the current pause began
        self.paused_s = 0.0
        self.endured: int | None = None  # a holder that kept the slot past MAX_PAUSE_S: ignored

    def poll(self) -> None:
        if self.path is None:
            return
        pid = holder(self.path)
        other = (
            pid is not None and pid != self.endured and pid != self.root and pid not in descendants(self.root)
        )
        if other and self.since is not None and time.monotonic() - self.since > MAX_PAUSE_S:
            self.endured, other = pid, False  # a holder that never lets go does not stop the others for ever
        if other:
            if self.since is None:
                self.since = time.monotonic()
            self.signal(signal.SIGSTOP)  # again each poll: a process forked meanwhile stops too
        elif self.since is not None:
            self.close()

    def stopped_s(self) -> float:
        """How long the current pause has lasted (0 when running)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def signal(self, sig: int) -> None:
        for pid in [self.root, *descendants(self.root)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.since is not None:
            self.signal(signal.SIGCONT)
            self.paused_s += time.monotonic() - self.since
            self.since = None
