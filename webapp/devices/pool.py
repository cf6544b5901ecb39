"""The device pool: TVM's RPC tracker, and one emulated board per Raspberry Pi target, kept alive.

`run_pool` is what `tvm-playground pool` (and so `make serve`) runs. It starts the tracker at once,
then, in the background, builds the arm64 root file system if it is missing and starts the boards:
the web and x86 jobs never wait for any of it. Each board is the TVM runtime in that root file
system under qemu-aarch64 with QEMU_CPU set to the target's core, in a bubblewrap jail with no
network, no writes outside its own folder and, as root, the `nobody` user. Its only ways out are
two Unix sockets in its folder, relayed here: one to the tracker, one that clients reach through a
TCP port on loopback. A board that exits (a crash, a kill) is restarted. The pool's state is written
to devices/pool.json, which the web reads for `/api/devices`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from webapp.config import Config
from webapp.devices import tracker as tracker_protocol
from webapp.devices.rootfs import LIBRARY_PATH, RootfsError, ensure_rootfs
from webapp.jobs.sandbox import SandboxUnavailable, check_bubblewrap
from webapp.jsonfile import write_json_atomic
from webapp.targets import TARGETS

BOARD_SCRIPT = Path(__file__).with_name("board.py")
NOBODY = 65534


@dataclass
class Board:
    """An emulated board: its target's key and core, the loopback port clients reach it on."""

    name: str
    key: str
    core: str
    port: int = 0
    state: str = "waiting for the root file system"
    restarts: int = 0
    pid: int | None = None
    started: float = 0.0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    listener: socket.socket | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        keys = ("name", "key", "core", "port", "state", "restarts", "pid")
        return {k: getattr(self, k) for k in keys}


def emulated_boards() -> list[Board]:
    return [
        Board(f"{t.board} (emulated: QEMU {t.core})", t.board, t.core)
        for t in TARGETS.values()
        if t.board and hasattr(t, "core")
    ]


def board_dir(config: Config, board: Board) -> Path:
    return config.devices_dir / "boards" / board.key


# ---------------------------------------------------------------- relays (Unix socket <-> TCP)


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def relay(listener: socket.socket, connect) -> None:
    """Accept on `listener` forever; join each connection to a new one from connect()."""

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
            threading.Thread(target=pump, args=(conn, other), daemon=True).start()
            threading.Thread(target=pump, args=(other, conn), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()


def unix_listener(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o777)  # the jailed board runs as nobody
    sock.listen(16)
    return sock


def unix_connector(path: Path):
    def connect():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return sock

    return connect


# ---------------------------------------------------------------- the jail


def board_command(config: Config, board: Board, rootfs: Path, folder: Path) -> list[str]:
    """bubblewrap around qemu-aarch64 around the board's Python: /usr of the host read-only (qemu,
    setpriv), the root file system read-only, the board's folder its only writable place."""
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
        "LANG": "C.UTF-8",
    }
    args = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for link in ("lib", "lib64", "bin", "sbin"):
        if Path(f"/{link}").is_symlink():
            args += ["--symlink", f"usr/{link}", f"/{link}"]
    args += [
        "--ro-bind", str(rootfs), "/rootfs",
        "--ro-bind", str(BOARD_SCRIPT), "/board.py",
        "--bind", str(folder), "/board",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--unshare-net", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--chdir", "/board", "--clearenv",
    ]  # fmt: skip
    for key, value in env.items():
        args += ["--setenv", key, value]
    if os.geteuid() == 0:
        args += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
    board_args = ["--key", board.key, "--name", board.name, "--port", str(board.port)]
    board_args += ["--listen", "/board/board.sock", "--tracker", "/board/tracker.sock"]
    return args + [qemu, "/rootfs/usr/bin/python3.11", "/board.py", *board_args]


# ---------------------------------------------------------------- the pool


class Pool:
    def __init__(self, config: Config):
        self.config = config
        self.status_path = config.devices_dir / "pool.json"
        self.boards = emulated_boards() if config.emulated_boards else []
        self.state, self.message = "preparing", "starting the tracker"
        self.tracker: subprocess.Popen | None = None
        self.rootfs: Path | None = None  # set by prepare() once built
        self.stopping = False
        self.lock = threading.Lock()

    def write(self) -> None:
        with self.lock:
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
        log = open(self.config.devices_dir / "tracker.log", "ab")
        self.tracker = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", bind, "--port", str(port),
             "--port-end", str(port + 1), "--silent"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.tracker.poll() is None:
            try:
                tracker_protocol.tracker_summary(self.config.tracker)
                self.log(f"tracker on {bind}:{port}")
                return
            except tracker_protocol.TrackerError:
                time.sleep(0.3)
        raise RuntimeError(f"the tracker did not start on {bind}:{port} (see {log.name})")

    def prepare(self) -> None:
        """In the background: the root file system (the main thread then starts the boards: bwrap's
        --die-with-parent follows the thread that started it)."""
        try:
            check_bubblewrap()  # code built from a user's model runs only jailed, on a board too
            self.message = "building the arm64 root file system (first start only, about a minute)"
            self.write()
            started = time.monotonic()
            self.rootfs = ensure_rootfs(self.config.rootfs_dir, log=self.log)
            self.log(f"root file system ready in {time.monotonic() - started:.0f} s")
            self.message = "starting the emulated boards"
            self.write()
        except (RootfsError, OSError, SandboxUnavailable) as exc:
            self.state, self.message = "failed", f"emulated boards unavailable: {exc}"
            self.log(self.message)
            self.write()

    def start_board(self, board: Board) -> None:
        folder = board_dir(self.config, board)
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "tmp").mkdir(parents=True)
        tracker_sock = unix_listener(folder / "tracker.sock")
        host, port = tracker_protocol.parse_address(self.config.tracker)
        relay(tracker_sock, lambda: socket.create_connection((host, port), timeout=10))
        if board.listener is None:  # the client side keeps its port across restarts
            board.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            board.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            board.listener.bind(("127.0.0.1", 0))
            board.listener.listen(16)
            board.port = board.listener.getsockname()[1]
            relay(board.listener, unix_connector(board_dir(self.config, board) / "board.sock"))
        if os.geteuid() == 0:
            for path in [folder, *folder.rglob("*")]:
                os.lchown(path, NOBODY, NOBODY)
        log = open(folder / "board.log", "ab")
        board.proc = subprocess.Popen(
            board_command(self.config, board, self.rootfs, folder),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        board.pid, board.started, board.state = board.proc.pid, time.monotonic(), "starting"
        self.log(f"{board.name}: started (pid {board.pid}, port {board.port})")

    def check(self) -> None:
        """Once a second: restart what died, and say how the pool stands."""
        if self.tracker is not None and self.tracker.poll() is not None and not self.stopping:
            self.log(f"tracker exited ({self.tracker.returncode}); restarting it")
            try:
                self.start_tracker()
            except RuntimeError as exc:
                self.state, self.message = "failed", str(exc)
        try:
            summary = tracker_protocol.tracker_summary(self.config.tracker)
        except tracker_protocol.TrackerError:
            summary = {}
        registered = {int(s["addr"][1]) for s in summary.get("server_info", []) if s.get("addr")}
        for board in self.boards:
            if board.proc is None:
                if self.rootfs is not None:
                    self.start_board(board)
                continue
            if board.proc.poll() is not None:
                board.restarts += 1
                self.log(f"{board.name}: exited ({board.proc.returncode}); restarting")
                if time.monotonic() - board.started < 10:  # crashing at start: do not spin
                    time.sleep(min(30, 2**board.restarts))
                self.start_board(board)
            else:  # running once the tracker lists it (registered, free or busy)
                board.state = "running" if board.port in registered else "starting"
        if self.state != "failed" and self.boards and all(b.proc for b in self.boards):
            waiting = [b.name for b in self.boards if b.state != "running"]
            self.state = "preparing" if waiting else "ready"
            self.message = (
                f"starting {', '.join(waiting)}"
                if waiting
                else f"{len(self.boards)} emulated board(s) running"
            )
        self.write()

    def stop(self, *_) -> None:
        self.stopping = True
        for proc in [b.proc for b in self.boards] + [self.tracker]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [b.proc for b in self.boards] + [self.tracker]:
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        self.state, self.message = "stopped", "the pool was stopped"
        self.write()
        raise SystemExit(0)


def run_pool(config: Config) -> int:
    config.devices_dir.mkdir(parents=True, exist_ok=True)
    pool = Pool(config)
    signal.signal(signal.SIGTERM, pool.stop)
    signal.signal(signal.SIGINT, pool.stop)
    pool.write()
    pool.start_tracker()
    if pool.boards:
        threading.Thread(target=pool.prepare, daemon=True).start()
    else:
        pool.state, pool.message = "ready", "no emulated boards (PLAYGROUND_EMULATED_BOARDS=0)"
    while True:
        time.sleep(1)
        pool.check()


# ---------------------------------------------------------------- a pool as a child process


def read_status(config: Config) -> dict:
    """devices/pool.json, or {} before the pool has written it."""
    try:
        return json.loads((config.devices_dir / "pool.json").read_text())
    except (OSError, ValueError):
        return {}


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
    log = open(config.data_dir / "pool.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "webapp.cli", "pool"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(config)
        if status.get("state") == "ready" and status.get("pid") == proc.pid:
            return proc
        if status.get("state") == "failed" or proc.poll() is not None:
            break
        time.sleep(0.5)
    stop_process(proc)
    raise RuntimeError(f"the device pool did not get ready: {status.get('message')} (see {log.name})")


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group a child of ours leads, SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
