"""Real redis-server and PostgreSQL (Debian's packages) for the tests, each in a folder of its own,
listening on a free loopback port only, stopped at the end."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager

from webapp.devices.pool import pump


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str):
    """predicate's first true value, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def redis_server():
    """A redis-server on 127.0.0.1:<free port>, without persistence; yields its URL."""
    folder, port = tempfile.mkdtemp(prefix="playground-redis-"), free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(port, proc, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def postgres_server():
    """A PostgreSQL cluster of its own (initdb, trust authentication on loopback); yields its URL.
    As root it runs as the 'postgres' user the Debian package makes (PostgreSQL refuses root)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql)")
    folder, port = tempfile.mkdtemp(prefix="playground-pg-"), free_port()  # /tmp: postgres may enter it
    as_user = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(folder, "data")
    subprocess.run(
        [*as_user, f"{bins[-1]}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder} -c fsync=off"
    proc = subprocess.Popen(
        [*as_user, f"{bins[-1]}/postgres", "-D", data, *options.split()],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(folder, "log.txt"), "w"),  # noqa: SIM115 - the server's own log
        start_new_session=True,
    )
    try:
        wait_for_port(port, proc, "postgres")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


class CutProxy(threading.Thread):
    """A TCP proxy on 127.0.0.1:<free port> to a server's `url` (postgresql://user@host:port/db), for a
    network cut between one client and the server: `cut()` drops every connection and refuses new ones
    until `restore()`. `url` is the server's URL through the proxy."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        address = url.split("@", 1)[1].split("/", 1)[0]
        self.target = (address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = url.replace(address, f"127.0.0.1:{self.listener.getsockname()[1]}")
        self.open, self.connections, self.lock = True, [], threading.Lock()
        self.start()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                try:
                    if not self.open:
                        raise OSError("cut")
                    server = socket.create_connection(self.target)
                except OSError:
                    client.close()
                    continue
                self.connections += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            self.open = False
            for s in self.connections:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.connections = []

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()
