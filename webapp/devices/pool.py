"""The device pool: TVM's RPC tracker, and one emulated board per Arm board target (the Pis, graviton3),
kept alive.

`run_pool` is what `tvm-playground pool` (and so `make serve`) runs. It starts the tracker at once,
then, in the background, builds the arm64 root file system if it is missing and starts the boards:
the web and x86 jobs never wait for any of it. Each board is the TVM runtime in that root file
system under qemu-aarch64 with QEMU_CPU set to the target's core, in a bubblewrap jail: no network,
the system read-only, one folder of its own writable, rlimits, and (as root) a user of its own.
Its only ways out are two Unix sockets the pool made, in a folder the board cannot write: one it
listens on, which the pool joins to a TCP port on loopback for clients, and one to the tracker,
through which the pool passes only the board's own registration (so code run on a board cannot
register boards of its own). A board that exits (killed, crashed) is restarted; a session that
crashes (SIGILL) ends only that session. The pool's state is written to devices/pool.json, which
the web reads for `/api/devices`.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from webapp import targets
from webapp.config import Config
from webapp.devices import tracker as tracker_protocol
from webapp.devices.rootfs import LIBRARY_PATH, RootfsError, ensure_rootfs
from webapp.devices.status import read_status
from webapp.jsonfile import write_json_atomic
from webapp.machine.sandbox import SandboxUnavailable, check_bubblewrap

BOARD_SCRIPT = Path(__file__).with_name("board.py")
BOARD_UID = 65500  # + the board's index: not the job sandbox's `nobody`, not each other's


@dataclass
class Board:
    """An emulated board: its target's key and core, the loopback port clients reach it on."""

    name: str
    key: str
    core: str
    uid: int = BOARD_UID
    port: int = 0
    state: str = "waiting for the root file system"
    restarts: int = 0
    pid: int | None = None
    started: float = 0.0
    restart_at: float = 0.0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    listener: socket.socket | None = field(default=None, repr=False)  # board.sock, made by the pool

    def to_json(self) -> dict:
        keys = ("name", "key", "core", "port", "state", "restarts", "pid")
        return {k: getattr(self, k) for k in keys}


def emulated_boards() -> list[Board]:
    presets = targets.emulated_boards()  # each names its board: timed_on_board is a str
    return [
        Board(
            f"{t.timed_on_board} (emulated: QEMU {t.core})",
            cast(str, t.timed_on_board),
            t.core,
            BOARD_UID + i,
        )
        for i, t in enumerate(presets)
    ]


# ---------------------------------------------------------------- relays


def close_both(a: socket.socket, b: socket.socket) -> None:
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        close_both(src, dst)


def board_registration_only(board: Board) -> Callable[[socket.socket, socket.socket], None]:
    """A pump from a board to the tracker that lets through only the board's own registration (its
    key, its port, loopback) and its keep-alive questions; anything else ends the connection."""
    P = tracker_protocol

    def allowed(message) -> bool:
        match message:
            case [P.UPDATE_INFO, {"key": key, "addr": ["127.0.0.1", port]}]:
                return key == f"server:{board.key}" and port == board.port
            case [P.PUT, key, [port, str(matchkey)], "127.0.0.1"]:
                return key == board.key and port == board.port and matchkey.startswith(f"{board.key}:")
            case [P.GET_PENDING_MATCHKEYS] | [P.PING]:
                return True
        return False

    def filtered(src: socket.socket, dst: socket.socket) -> None:
        try:
            dst.sendall(tracker_protocol.recv_exactly(src, 4))  # the magic number
            while True:
                header = tracker_protocol.recv_exactly(src, 4)
                size = struct.unpack("<i", header)[0]
                if not 0 < size <= 1 << 16:
                    return
                body = tracker_protocol.recv_exactly(src, size)
                if not allowed(json.loads(body)):
                    print(f"pool: {board.name}: refused a tracker message: {body[:200]!r}", flush=True)
                    return
                dst.sendall(header + body)
        except (OSError, ValueError):
            pass
        finally:
            close_both(src, dst)

    return filtered


def relay(
    listener: socket.socket,
    connect: Callable[[], socket.socket],
    upstream: Callable[[socket.socket, socket.socket], None] = pump,
) -> None:
    """Accept on `listener` until it is closed; join each connection to a new one from connect()."""

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                other = connect()
                other.settimeout(None)  # a quiet connection (a long session) is not a dead one
            except OSError:
                conn.close()
                continue
            threading.Thread(target=upstream, args=(conn, other), daemon=True).start()
            threading.Thread(target=pump, args=(other, conn), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()


def unix_listener(path: Path, mode: int = 0o666) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    sock.listen(16)
    return sock


def unix_connector(path: Path) -> Callable[[], socket.socket]:
    def connect():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return sock

    return connect


# ---------------------------------------------------------------- the jail


def board_command(
    config: Config,
    board: Board,
    rootfs: Path,
    folder: Path,
    sockets: Path,
    script_args: list[str] | None = None,
) -> list[str]:
    """bubblewrap around qemu-aarch64 around the board's Python: /usr of the host read-only (qemu,
    setpriv), the root file system and the pool's sockets read-only, its own folder writable."""
    qemu = shutil.which("qemu-aarch64-static") or "/usr/bin/qemu-aarch64-static"
    env = {
        "QEMU_LD_PREFIX": "/rootfs",
        "QEMU_CPU": board.core,
        "TVM_USE_RUNTIME_LIB": "1",  # runtime-only import: seconds instead of 14 s under emulation
        "TVM_NUM_THREADS": str(config.bench_threads),
        "LD_LIBRARY_PATH": LIBRARY_PATH,
        "HOME": "/board",
        "TMPDIR": "/board/tmp",
        "PATH": "/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONSAFEPATH": "1",
        "LANG": "C.UTF-8",
    }
    args = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for link in ("lib", "lib64", "bin", "sbin"):
        if Path(f"/{link}").is_symlink():
            args += ["--symlink", f"usr/{link}", f"/{link}"]
    args += [
        "--ro-bind", str(rootfs), "/rootfs",
        "--ro-bind", str(BOARD_SCRIPT), "/board.py",
        "--ro-bind", str(sockets), "/sockets",
        "--bind", str(folder), "/board",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--unshare-net", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--chdir", "/board", "--clearenv",
    ]  # fmt: skip
    for key, value in env.items():
        args += ["--setenv", key, value]
    if os.geteuid() == 0:
        args += ["setpriv", f"--reuid={board.uid}", f"--regid={board.uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
    if script_args is None:
        assert board.listener is not None  # the pool's start_board made it
        script_args = ["--key", board.key, "--name", board.name, "--port", str(board.port)]
        script_args += ["--listen-fd", str(board.listener.fileno()), "--tracker", "/sockets/tracker.sock"]
        script_args = ["/board.py", *script_args]
    return args + [qemu, "/rootfs/usr/bin/python3.11", *script_args]


def tracker_command(host: str, port: int) -> list[str]:
    """TVM's own tracker on exactly host:port."""
    return [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", host, "--port", str(port),
            "--port-end", str(port + 1), "--silent"]  # fmt: skip


def board_limits() -> Callable[[], None]:
    """Before exec: a session of its own, and rlimits on what the board may use."""

    def preexec():
        os.setsid()
        gb = 1 << 30
        resource.setrlimit(resource.RLIMIT_NPROC, (256, 256))  # counted per board user
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * gb, 2 * gb))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return preexec


def die_with_us() -> None:
    """Before exec: the child gets SIGTERM when the pool's main thread goes, however it goes."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


# ---------------------------------------------------------------- the pool


class Pool:
    def __init__(self, config: Config):
        self.config = config
        self.status_path = config.devices_dir / "pool.json"
        self.boards = emulated_boards() if config.emulated_boards else []
        self.state, self.message = "preparing", "starting the tracker"
        self.tracker: subprocess.Popen | None = None
        self.tracker_up, self.tracker_restart_at, self.tracker_exits = False, 0.0, 0
        self.rootfs: Path | None = None  # set by prepare() once built
        self.failure: str | None = None  # why there are no emulated boards, if there are none
        self.sockets = Path(tempfile.mkdtemp(prefix="tvm-pool-"))  # short paths: sockets have 108 bytes
        self.stopping = False

    def write(self) -> None:
        write_json_atomic(
            self.status_path,
            {
                "tracker": self.config.tracker,
                "state": self.state,
                "message": self.message,
                "emulated": self.config.emulated_boards,
                "boards": [b.to_json() for b in self.boards],
                "pid": os.getpid(),
                "updated": time.time(),
            },
        )

    def log(self, text: str) -> None:
        print(f"pool: {text}", flush=True)

    def start_tracker(self) -> None:
        host, port = tracker_protocol.parse_address(self.config.tracker)
        bind = self.config.tracker_bind or host
        with open(self.config.devices_dir / "tracker.log", "ab") as log:
            self.tracker = subprocess.Popen(
                tracker_command(bind, port),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_us,
            )  # fmt: skip
        self.tracker_restart_at = time.monotonic() + 5  # if it dies, not again before this
        self.log(f"tracker starting on {bind}:{port} (pid {self.tracker.pid})")

    def prepare(self) -> None:
        """In the background: the root file system (the main thread then starts the boards: bwrap's
        --die-with-parent follows the thread that started it)."""
        try:
            check_bubblewrap()  # code built from a user's model runs only jailed, on a board too
            self.message = "building the arm64 root file system (the first start only)"
            started = time.monotonic()
            self.rootfs = ensure_rootfs(self.config.rootfs_dir, log=self.log)
            self.log(f"root file system ready in {time.monotonic() - started:.0f} s")
        except (RootfsError, OSError, SandboxUnavailable) as exc:
            self.failure = f"emulated boards unavailable: {exc}"
            self.log(self.failure)

    def start_board(self, board: Board) -> None:
        sockets = self.sockets / board.key
        if board.listener is None:  # made once: the port and the sockets outlive a board's restarts
            sockets.mkdir(mode=0o755)
            tracker_sock = unix_listener(sockets / "tracker.sock")
            host, port = tracker_protocol.parse_address(self.config.tracker)
            connect = lambda: socket.create_connection((host, port), timeout=10)  # noqa: E731
            relay(tracker_sock, connect, upstream=board_registration_only(board))
            board.listener = unix_listener(sockets / "board.sock", 0o600)  # the board inherits it
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind(("127.0.0.1", 0))
            tcp.listen(16)
            board.port = tcp.getsockname()[1]
            relay(tcp, unix_connector(sockets / "board.sock"))
        folder = self.config.devices_dir / "boards" / board.key  # its only writable place, new each start
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "tmp").mkdir(parents=True)
        if os.geteuid() == 0:
            for path in (folder, folder / "tmp"):
                os.chown(path, board.uid, board.uid)
        assert self.rootfs is not None  # a board starts once the root file system is built (check)
        command = board_command(self.config, board, self.rootfs, folder, sockets)
        with open(self.config.devices_dir / "boards" / f"{board.key}.log", "ab") as log:
            board.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=(board.listener.fileno(),), preexec_fn=board_limits(),
            )  # fmt: skip
        board.pid, board.started, board.state = board.proc.pid, time.monotonic(), "starting"
        self.log(f"{board.name}: started (pid {board.pid}, port {board.port})")

    def check(self) -> None:
        """Once a second: restart what died (not too often), and say how the pool stands."""
        now = time.monotonic()
        assert self.tracker is not None  # started before the first check (run_pool)
        if self.tracker.poll() is not None and now >= self.tracker_restart_at:
            self.tracker_exits += 1
            self.log(f"tracker exited ({self.tracker.returncode}); restarting it")
            self.start_tracker()
        try:
            summary = tracker_protocol.tracker_summary(self.config.tracker)
            self.tracker_up = self.tracker.poll() is None  # ours, not another pool's on that port
        except tracker_protocol.TrackerError:
            summary, self.tracker_up = {}, False
        if self.tracker_up:
            self.tracker_exits = 0
        registered = {int(s["addr"][1]) for s in summary.get("server_info", []) if s.get("addr")}
        for board in self.boards:
            if board.proc is None:
                if self.rootfs is not None:
                    self.start_board(board)
            elif board.proc.poll() is not None:
                if board.state != "restarting":
                    board.restarts += 1
                    quick = now - board.started < 10  # crashing at start: back off, do not spin
                    board.restart_at = now + (min(60, 2**board.restarts) if quick else 0)
                    board.state = "restarting"
                    self.log(f"{board.name}: exited ({board.proc.returncode}); restarting")
                if now >= board.restart_at:
                    self.start_board(board)
            else:  # running once the tracker lists it (registered, free or busy)
                board.state = "running" if board.port in registered else "starting"
        self.state, self.message = self.standing()
        self.write()

    def standing(self) -> tuple[str, str]:
        if not self.tracker_up and self.tracker_exits >= 3:
            return "failed", (
                f"the tracker exits as soon as it starts: is {self.config.tracker} taken by another "
                "program (another pool)? Set PLAYGROUND_TRACKER (see devices/tracker.log)"
            )
        if not self.tracker_up:
            return "preparing", f"the tracker is not answering at {self.config.tracker} (starting it)"
        if self.failure:
            return "failed", self.failure
        if not self.boards:
            return "ready", "no emulated boards (PLAYGROUND_EMULATED_BOARDS=0)"
        if self.rootfs is None:
            return "preparing", "building the arm64 root file system (the first start only)"
        waiting = [f"{b.name} ({b.state})" for b in self.boards if b.state != "running"]
        if waiting:
            return "preparing", "starting " + ", ".join(waiting)
        return "ready", f"{len(self.boards)} emulated board(s) running"

    def shutdown(self) -> None:
        stop_processes(*[p for p in [b.proc for b in self.boards] + [self.tracker] if p], timeout=10)
        shutil.rmtree(self.sockets, ignore_errors=True)
        self.state, self.message = "stopped", "the pool was stopped"
        self.write()


def run_pool(config: Config) -> int:
    config.devices_dir.mkdir(parents=True, exist_ok=True)
    (config.devices_dir / "boards").mkdir(exist_ok=True)
    pool = Pool(config)

    def stop(*_):  # only a flag: the main loop stops the pool
        pool.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        pool.write()
        pool.start_tracker()
        if pool.boards:
            threading.Thread(target=pool.prepare, daemon=True).start()
        while not pool.stopping:
            time.sleep(1)
            pool.check()
    finally:
        pool.shutdown()
    return 0


# ---------------------------------------------------------------- a pool as a child process


def start_pool(config: Config, timeout: float = 300) -> subprocess.Popen:
    """`tvm-playground pool` for this config in a process group of its own (benchmarks and tests),
    returned once its boards are ready; RuntimeError, with the pool's message, if they never are."""
    env = os.environ | {
        "PLAYGROUND_DATA": str(config.data_dir),
        "PLAYGROUND_TRACKER": config.tracker,
        "PLAYGROUND_BENCH_THREADS": str(config.bench_threads),
    }
    env |= {"PLAYGROUND_ROOTFS": str(config.rootfs)} if config.rootfs else {}
    config.data_dir.mkdir(parents=True, exist_ok=True)
    log = config.data_dir / "pool.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webapp.cli", "pool"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(config)
        if status.get("state") == "ready" and status.get("pid") == proc.pid:
            return proc
        if status.get("pid") == proc.pid and status.get("state") == "failed" or proc.poll() is not None:
            break
        time.sleep(0.5)
    stop_processes(proc)
    raise RuntimeError(f"the device pool did not get ready: {status.get('message')} (see {log})")


def stop_processes(*procs: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the process groups children of ours lead, then SIGKILL to any that lingers."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
