"""One timing at a time on this machine: the timing slot.

The slot is a POSIX record lock on one file of the machine (Config.timing_lock_path:
/tmp/tvm-playground-timing.lock, or PLAYGROUND_TIMING_LOCK). A sandboxed job takes it (`hold`)
around each of its timing phases: the benchmark and its kernel profiles, the float-fallback checks, each
batch of tuning measurements, a run on an emulated board (whose QEMU shares these cores). Compiling
never takes it, so jobs compile side by side.

While one job holds it the others are stopped: each worker asks every 0.1 s who holds the slot (`holder`:
F_GETLK answers with the holder's process id, as this process sees it, even across the sandbox's pid
namespace, so a job cannot pass for another) and, when it is not a process of its own sandbox, stops
every process of that sandbox (SIGSTOP) until the slot is free (`Pauser`, in webapp/machine/sandbox.py's
loop).
SIGSTOP is no jail: processes of a hostile sandbox can continue each other; then its stopped time is
not counted as such (its wall-clock limit keeps running), and the timing it disturbed says so in its
conditions. (A cgroup freezer would hold it; not used, since no cgroup can be created everywhere this
runs.)
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
import stat
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENV = "PLAYGROUND_TIMING_SLOT"  # where the sandbox finds the lock file (bound into it)
RECORD = "timing-slot.jsonl"  # in the job folder: one line per hold
UNAVAILABLE = "unavailable"  # ENV's value where the worker could not have the lock file
SETTLE_S = 0.25  # after taking the slot: the other sandboxes stop within one 0.1 s poll of their worker
MAX_WAIT_S = 600.0  # then a phase times without the slot, and says so (a holder that never lets go)
MAX_PAUSE_S = 300.0  # a sandbox is stopped this long at most, in all, for one holder; then runs on
POLL_S = 0.05

# struct flock on Linux (x86-64 and aarch64): short l_type, l_whence; off_t l_start, l_len; pid_t l_pid
FLOCK = "hhqqi4x"
_holding = False  # whether this process holds the slot now
waited_s = 0.0  # how long this process has waited for the slot, in all (a stage's budget leaves it out)
waiting_since: float | None = None  # time.monotonic() when the wait going on now began


def prepare(path: Path) -> Path | None:
    """The lock file, created where missing and writable by the sandbox's user (nobody, as root); None,
    with a warning, where it cannot be had (then jobs time without the slot)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:  # there already (or another worker made it just now)
            pass
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_uid not in (0, os.geteuid()):  # another user's file in /tmp: theirs to hold or break
            raise OSError(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_uid == os.geteuid():
            os.chmod(path, 0o666)  # past the umask, and again: a sandbox of this user could have changed it
        os.close(os.open(path, os.O_RDWR | os.O_NOFOLLOW))
        return path
    except OSError as exc:
        print(f"timing slot: {exc}; jobs time without it", file=sys.stderr, flush=True)
        return None


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
def hold(phase: str, job_dir: Path | None = None, wait_s: float = MAX_WAIT_S) -> Iterator[None]:
    """`with hold("benchmark"): ...` times with the machine to itself; where no slot is configured
    (a script, a test outside a worker) it only runs the block."""
    global _holding, waited_s, waiting_since
    path = os.environ.get(ENV)
    if not path or _holding:  # nested in a phase that holds it already (closing its file would free it)
        yield
        return
    try:
        if path == UNAVAILABLE:
            raise OSError("the worker could not have the lock file")
        fd = os.open(path, os.O_RDWR)
    except OSError:  # no lock file, or it was taken away: time without the slot, and say so
        record(
            {"phase": phase, "waited_s": 0.0, "start": time.time(), "end": time.time(), "held": False},
            job_dir,
        )
        yield
        return
    _holding = True
    try:
        asked = waiting_since = time.monotonic()
        try:
            held = take(fd, wait_s)
        finally:
            waiting_since = None
        waited = time.monotonic() - asked
        waited_s += waited
        if held:
            time.sleep(SETTLE_S)
        start = time.time()
        try:
            yield
        finally:
            end = time.time()
            fcntl.lockf(fd, fcntl.LOCK_UN)
            record(
                {"phase": phase, "waited_s": round(waited, 3), "start": start, "end": end, "held": held},
                job_dir,
            )
    finally:
        _holding = False
        os.close(fd)


def record(row: dict, job_dir: Path | None) -> None:
    with open(Path(job_dir or ".") / RECORD, "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(job_dir: Path) -> dict | None:
    """What result.json says of the job's holds: {"waited_s": total, "holds": [rows], "unheld": how many
    phases timed without the slot}; None if none. A line that is not a hold is left out."""
    try:
        lines = (job_dir / RECORD).read_text(errors="replace").splitlines()
    except OSError:
        return None
    rows = []
    for line in lines:
        try:
            got = json.loads(line)
            row: dict[str, Any] = {key: float(got[key]) for key in ("waited_s", "start", "end")}
            row |= {"phase": str(got["phase"]), "held": bool(got["held"])}
        except (ValueError, TypeError, KeyError):
            continue
        rows.append(row)
    if not rows:
        return None
    unheld = sum(1 for r in rows if not r["held"])
    return {"waited_s": round(sum(r["waited_s"] for r in rows), 3), "holds": rows, "unheld": unheld}


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
    `path`; `poll()` every 0.1 s. `paused_s`: the time it was seen stopped (every process of it in
    state T at a poll; a sandbox whose processes continue each other is not counted as stopped). A
    holder, known by its pid namespace, stops it MAX_PAUSE_S in all at most. `close()` continues it."""

    held_by: int | None
    members: list[int]

    def __init__(self, path: Path | None, root: int):
        self.path, self.root = path, root
        self.pausing = False  # stopping the sandbox now
        self.stopped = False  # every process of it was seen stopped at the last poll
        self.last = time.monotonic()
        self.paused_s = 0.0
        self.spent: dict[str, float] = {}  # seconds stopped for each holder
        self.key, self.held_by, self.members = "", None, []  # the holder, its pid; the processes stopped

    def poll(self) -> None:
        now, since = time.monotonic(), self.last
        self.last = now
        if self.path is None:
            return
        if self.pausing and self.stopped:
            self.paused_s += now - since
            self.spent[self.key] = self.spent.get(self.key, 0.0) + now - since
        try:
            pid = holder(self.path)
            if (  # still stopped for the same holder: nothing to scan (a stopped process cannot fork)
                self.pausing
                and self.stopped
                and pid == self.held_by
                and self.spent.get(self.key, 0.0) < MAX_PAUSE_S
                and all(state(p) in STOPPED for p in self.members)
                and all(c in self.members for p in self.members for c in children(p))  # none forked since
            ):
                return
            below = descendants(self.root) if pid is not None else []
        except OSError:
            pid, below = None, []
        other = pid is not None and pid != self.root and pid not in below
        if other:
            assert pid is not None  # `other` says so
            self.key = namespace(pid)
            other = self.spent.get(self.key, 0.0) < MAX_PAUSE_S  # a holder that never lets go
        if other:
            self.pausing, self.held_by, self.members = True, pid, [self.root, *below]
            self.stopped = self.signal(signal.SIGSTOP, below)  # each poll: a process forked meanwhile too
        elif self.pausing:
            self.close()

    def signal(self, sig: int, below: list[int] | None = None) -> bool:
        """Sends sig to the sandbox's processes; whether each was stopped (state T) before it."""
        stopped = True
        for pid in [self.root, *(descendants(self.root) if below is None else below)]:
            stopped = stopped and state(pid) in STOPPED
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return stopped

    def close(self, running: bool = True) -> None:
        """Continues the sandbox if it was stopped (running: its root not reaped yet, or it ran on)."""
        if self.pausing and running:
            self.signal(signal.SIGCONT)
        self.pausing = self.stopped = False


def namespace(pid: int) -> str:
    """Who holds the slot: its pid namespace (one per sandbox), or the pid where it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return f"pid {pid}"


STOPPED = (
    "T",
    "Z",
    "X",
    None,
)  # stopped, or gone: a child that exited stays a zombie while its parent is stopped


def children(pid: int) -> list[int]:
    """A process's children, from /proc (each of its threads' list)."""
    out = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            try:
                with open(f"{task.path}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def state(pid: int) -> str | None:
    """A process's state letter (R, S, T, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
