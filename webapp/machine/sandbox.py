"""The jail for untrusted work, configured in this one place.

A pipeline run is a child process under bubblewrap: no network, the whole system read-only, home
folders and every other job hidden, only its own job folder writable, and as root it drops to the
`nobody` user. Resource limits (address space, CPU seconds, processes, file size) are rlimits set
before exec; the wall-clock limit is enforced here. `run_sandboxed` reports which limit ended a run.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from webapp.config import Config
from webapp.jsonfile import read_plain
from webapp.machine import timing_slot

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SANDBOX_UID = 65534  # nobody, when the worker runs as root
# The kernel lab's user code (webapp/jobs/lab.py), as users of its own, one per build running: RLIMIT_NPROC
# counts a user's processes across sandboxes, and a fork bomb typed in the lab would otherwise leave running
# jobs, or the lab's other builds, no threads
LAB_UIDS = range(65500, 65516)


@dataclass
class Outcome:
    returncode: int
    limit: str | None  # a message naming the limit that ended the run, if one did
    seconds: float
    paused_s: float = 0.0  # stopped while other jobs timed (webapp/machine/timing_slot.py)


class SandboxUnavailable(RuntimeError):
    pass


def check_bubblewrap() -> None:
    """Raises SandboxUnavailable with the reason when bubblewrap cannot run here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    cmd = [
        "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--unshare-net",
        "--unshare-pid",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap cannot create a sandbox here: {r.stderr.strip()}")


def user_process_count(uid: int | None = None) -> int:
    """The processes and threads of a user (this process's by default), as RLIMIT_NPROC counts them."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                status = (p / "status").read_text()
                threads = int(status.split("Threads:")[1].split()[0])
                if int(status.split("Uid:")[1].split()[0]) == uid:
                    count += threads
            except (OSError, IndexError, ValueError):
                pass
    return count


def gpu_device_nodes() -> list[str]:
    """NVIDIA's device nodes (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, ...) where there are."""
    return sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())


def set_limits(config: Config, nproc: int) -> Callable[[], None]:
    # The CUDA driver reserves far more address space than it uses: with a GPU the memory limit
    # cannot be one on address space (the other limits still hold).
    limit_address_space = not gpu_device_nodes()

    def preexec():
        mb = 1 << 20
        if limit_address_space:
            resource.setrlimit(resource.RLIMIT_AS, (config.memory_limit_mb * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (config.cpu_limit_s, config.cpu_limit_s + 5))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_FSIZE, (config.output_limit_mb * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.nice(config.nice)
        os.setsid()

    return preexec


def readable_paths() -> list[Path]:
    """What the sandboxed Python needs to see when it lives under a hidden home folder."""
    paths = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(os.path.realpath(sys.executable)).parents[1],
        PROJECT_ROOT,
    }
    return sorted(paths)


def bwrap_command(
    job_dir: Path,
    data_dir: Path,
    as_root: bool,
    env: dict[str, str],
    command: list[str],
    network: bool = False,
    timing_lock: Path | None = None,
    uid: int = SANDBOX_UID,
) -> list[str]:
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for node in gpu_device_nodes():  # a job for a CUDA target runs and times its code on the GPU
        args += ["--dev-bind", node, node]
    hidden = [Path(p) for p in ("/tmp", "/root", "/home") if Path(p).is_dir()] + [data_dir]

    def mount_point(path: Path) -> list[str]:
        # bwrap creates missing parents of a mount point as 0700 root: make them traversable.
        out = []
        for parent in reversed(path.parents):
            if any(parent != h and parent.is_relative_to(h) for h in hidden):
                out += ["--perms", "0755", "--dir", str(parent)]
        return out

    for path in hidden[:-1]:
        args += ["--tmpfs", str(path)]
    for path in readable_paths():
        if any(path.is_relative_to(h) for h in hidden[:-1]):
            args += mount_point(path) + ["--ro-bind", str(path), str(path)]
    # after the binds above: the data folder may lie inside one of them
    args += mount_point(data_dir) + ["--tmpfs", str(data_dir)]
    args += mount_point(job_dir) + ["--bind", str(job_dir), str(job_dir)]
    if (job_dir / "input").is_dir():  # the inputs, uploads kept once and shared by jobs: read-only
        args += ["--ro-bind", str(job_dir / "input"), str(job_dir / "input")]
    if timing_lock is not None:  # the machine's timing slot: a lock file, its contents meaningless
        args += mount_point(timing_lock) + ["--bind", str(timing_lock), str(timing_lock)]
    # No user namespace as root: the process must stay a real uid for RLIMIT_NPROC to count.
    args += [
        "--unshare-ipc",
        "--unshare-pid",
        *([] if network else ["--unshare-net"]),
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--chdir",
        str(job_dir),
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    if as_root:
        # setuid to nobody clears the capabilities; the bounding set and no_new_privs keep them gone
        args += [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return args + command


# Settings of the server that its jobs follow: x86-host standing in for a named preset (webapp/targets/x86.py)
PASSED_THROUGH = ("PLAYGROUND_HOST_PRESET",)


def sandbox_env(config: Config, job_dir: Path) -> dict[str, str]:
    threads = str(config.bench_threads)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(job_dir),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(PROJECT_ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",  # `python -m` must not import from the job folder it runs in
        "TVM_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MALLOC_ARENA_MAX": "2",  # each thread's arena reserves 64 MB of address space otherwise
        "PLAYGROUND_MEMORY_LIMIT_MB": str(config.memory_limit_mb),
    } | {k: os.environ[k] for k in PASSED_THROUGH if os.environ.get(k)}


# What an allocation refused by the address-space limit looks like, in a log or an error's text; a C
# extension's import that fails to allocate may also end in CPython's "SystemError: error return
# without exception set" (import torch under 600 MB, one run in several).
MEMORY_WORDS = (
    "MemoryError",
    "bad_alloc",
    "Cannot allocate memory",
    "out of memory",
    "Out of memory",
    "error return without exception set",
    "cannot allocate memory",  # glibc's thread-local data, then abort
    "failed to map segment",  # a shared library dlopen could not map
)


def describe_exit(returncode: int, config: Config, log_tail: str) -> str | None:
    """The limit that ended a run, judged from how it ended and what it printed last."""
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig == signal.SIGXCPU:
        return f"CPU time limit reached ({config.cpu_limit_s} CPU seconds)."
    if sig == signal.SIGXFSZ:
        return f"Output size limit reached (no file may exceed {config.output_limit_mb} MB)."
    if any(w in log_tail for w in MEMORY_WORDS):
        return f"Memory limit reached ({config.memory_limit_mb} MB of address space)."
    if "Resource temporarily unavailable" in log_tail or "can't start new thread" in log_tail:
        return f"Process limit reached ({config.process_limit} processes and threads)."
    if sig:
        return f"The pipeline process was killed by signal {signal.Signals(sig).name}."
    return None


def run_sandboxed(
    job_dir: Path,
    config: Config,
    command: list[str] | None = None,
    network: bool = False,
    stop: Callable[[], str | None] | None = None,
    pausable: bool = True,
    uid: int = SANDBOX_UID,
    slot: bool = True,
) -> Outcome:
    """Run the pipeline (or `command`) on job_dir under the sandbox and limits. `network`: the
    host's network namespace stays (the remote stage, which reaches the device pool's tracker and
    boards and never reads the user's model), and with it every loopback service and abstract Unix
    socket of the host; the file system, users and limits are as jailed as the pipeline's. `stop`, asked
    every 0.1 s: a reason to kill the sandbox at once (the outcome's limit then), or None. While
    another job holds the machine's timing slot the sandbox is stopped (timing_slot.Pauser), unless
    not `pausable`: that time is the outcome's paused_s, and does not count towards the wall-clock
    limit. Without `slot` the sandbox cannot take the slot itself (the lab's user code, which could hold it
    and stop every job): it times without it."""
    command = command or [sys.executable, "-m", "webapp.pipeline", str(job_dir)]
    as_root = os.geteuid() == 0
    if as_root:
        # The sandbox user owns the job folder, the only place it can write, but not its inputs.
        for path in [job_dir, *job_dir.rglob("*")]:
            if not path.is_relative_to(job_dir / "input"):
                os.lchown(path, uid, uid)
        nproc = config.process_limit
    else:
        nproc = user_process_count() + config.process_limit
    env = sandbox_env(config, job_dir)
    lock = timing_slot.prepare(config.timing_lock_path)  # None: time without it (and say so)
    env[timing_slot.ENV] = str(lock) if lock is not None and slot else timing_slot.UNAVAILABLE
    if config.unsandboxed:
        full, env = command, {**os.environ, **env}
    else:
        bound = lock if slot else None
        full = bwrap_command(job_dir, config.data_dir, as_root, env, command, network, bound, uid)
    why = stop() if stop is not None else None
    if why:  # the job was lost before its sandbox started: it does not start
        return Outcome(-1, why, 0.0)
    log_path = job_dir / "log.txt"
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            full,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=set_limits(config, nproc),
            cwd=job_dir,
        )
        ended = None  # the limit that ended it, if one did
        pauser = timing_slot.Pauser(lock if pausable else None, proc.pid)
        try:
            while True:
                try:
                    returncode = proc.wait(timeout=0.1)
                    pauser.close(running=False)  # it ended (reaped): nothing of it left to continue
                    break
                except subprocess.TimeoutExpired:
                    pauser.poll()
                    ended = stop() if stop is not None else None
                    if not ended and time.monotonic() - started - pauser.paused_s >= config.wall_limit_s:
                        ended = f"Wall-clock limit reached ({config.wall_limit_s} s)."
                    if ended:
                        break
        finally:
            if proc.returncode is None:  # a limit, or an exception here: the sandbox goes, stopped or not
                os.killpg(proc.pid, signal.SIGKILL)
                pauser.close()
                returncode = proc.wait()
    seconds, paused = time.monotonic() - started, round(pauser.paused_s, 3)
    if ended:
        return Outcome(returncode, ended, seconds, paused)
    tail = tail_text(log_path)
    limit = describe_exit(returncode, config, tail) if returncode else None
    return Outcome(returncode, limit, seconds, paused)


def tail_text(path: Path, size: int = 8192) -> str:
    """The log's last `size` bytes (the sandbox may have put a link or a FIFO in its place: then none)."""
    return (read_plain(path, size, tail=True) or b"").decode(errors="replace")
