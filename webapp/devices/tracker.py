"""The TVM RPC tracker's wire protocol, in plain Python (no TVM): the web asks it for the pool's
status, the remote stage asks it for a free board. Messages are a little-endian int32 length and a
JSON list, after a magic number each way (tvm/rpc/base.py, tvm/rpc/tracker.py)."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

TRACKER_MAGIC = 0x2F271
SUCCESS, PING, PUT, REQUEST, UPDATE_INFO, SUMMARY, GET_PENDING_MATCHKEYS = 0, 1, 3, 4, 5, 6, 7


class TrackerError(RuntimeError):
    """The tracker cannot be reached, or gave no board in time: the message says which, plainly."""


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return data


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


class Tracker:
    def __init__(self, address: str, timeout: float = 5.0):
        self.address = address
        try:
            self.sock = socket.create_connection(parse_address(address), timeout=timeout)
            self.sock.sendall(struct.pack("<i", TRACKER_MAGIC))
            if struct.unpack("<i", recv_exactly(self.sock, 4))[0] != TRACKER_MAGIC:
                raise TrackerError(f"{address} answered, but it is not a TVM RPC tracker.")
        except OSError as exc:
            raise TrackerError(
                f"The device pool's tracker at {address} is not answering ({exc.strerror or exc}): "
                "it runs with `make serve` (or `tvm-playground pool`)."
            ) from None

    def call(self, *message: object, timeout: float | None = 5.0) -> Any:
        self.sock.settimeout(timeout)
        data = json.dumps(list(message)).encode()
        self.sock.sendall(struct.pack("<i", len(data)) + data)
        size = struct.unpack("<i", recv_exactly(self.sock, 4))[0]
        # The tracker writes the length and the message apart, and holds the message back until the
        # length's ACK (Nagle), which Linux delays 40 ms by default: ACK at once (this took 44 ms a
        # call, every front page paid it)
        if hasattr(socket, "TCP_QUICKACK"):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return json.loads(recv_exactly(self.sock, size))

    def request(self, key: str, wait_s: float) -> tuple[str, int, str]:
        """The address and match key of the first free board of `key`, waiting up to wait_s for one."""
        try:
            code, value = self.call(REQUEST, key, "", 1, timeout=wait_s)
        except TimeoutError:
            raise TrackerError(
                f"No '{key}' board became free within {wait_s:.0f} s (the pool: "
                f"{describe(pool_of(self.summary_or_empty())) or 'no boards registered'})."
            ) from None
        except (OSError, ValueError) as exc:
            raise TrackerError(f"The tracker at {self.address} stopped answering: {exc}") from None
        if code != SUCCESS:
            raise TrackerError(f"The tracker refused the request for a '{key}' board ({value}).")
        host, port, matchkey = value
        return host, int(port), matchkey

    def summary_or_empty(self) -> dict:
        try:
            return tracker_summary(self.address)
        except TrackerError:
            return {}

    def close(self) -> None:
        self.sock.close()


def pool_of(summary: dict) -> dict[str, dict]:
    """{key: {"boards": registered, "free": n, "busy": n, "waiting": requests}} from a summary."""
    registered: dict[str, int] = {}
    for server in summary.get("server_info", []):
        key = str(server.get("key", "")).removeprefix("server:")
        registered[key] = registered.get(key, 0) + 1
    pool = {}
    for key in sorted(set(registered) | set(summary.get("queue_info", {}))):
        queue = summary.get("queue_info", {}).get(key, {})
        boards, free = registered.get(key, 0), int(queue.get("free", 0))
        pool[key] = {
            "boards": boards,
            "free": free,
            "busy": max(boards - free, 0),
            "waiting": queue.get("pending", 0),
        }
    return pool


def describe(pool: dict[str, dict]) -> str:
    return ", ".join(f"{k}: {v['boards']} board(s), {v['free']} free" for k, v in pool.items())


def tracker_summary(address: str, timeout: float = 2.0) -> dict:
    """The tracker's summary; TrackerError with a plain message when it does not answer in time."""
    tracker = Tracker(address, timeout=timeout)
    try:
        code, status = tracker.call(SUMMARY, timeout=timeout)
    except (OSError, ValueError) as exc:
        raise TrackerError(
            f"The device pool's tracker at {address} did not answer its status: {exc}"
        ) from None
    finally:
        tracker.close()
    return status if code == SUCCESS else {}
