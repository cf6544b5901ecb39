"""Files that a reader may open at any moment (the page polls JSON files while the job writes; the web
keeps pages it rendered): written whole or not at all."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def kept(path: Path, make: Callable[[], bytes], max_files: int) -> bytes:
    """The file at `path`, made by `make` and written there the first time, while its folder holds
    fewer than `max_files` files (whichever process writes it first; a read-only or full disk: made
    again each time)."""
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = make()
    try:
        path.parent.mkdir(exist_ok=True)
        if sum(1 for _ in path.parent.iterdir()) < max_files:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data)}")
            tmp.write_bytes(data)
            tmp.replace(path)
    except OSError:
        pass
    return data


def open_plain(path: Path) -> int | None:
    """A file another user may have written (a sandbox, in its folder), opened for reading only where it is
    a regular file: not through a link (O_NOFOLLOW), never waited on (O_NONBLOCK: a FIFO put in its place
    is refused, not read); its descriptor, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_plain(path: Path, max_bytes: int, tail: bool = False) -> bytes | None:
    """The bytes of such a file (open_plain), None where it is none or longer than max_bytes; with `tail`
    its last max_bytes whatever its length. Checked on the descriptor read, so a file swapped for a link
    after a check is never followed."""
    fd = open_plain(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes and not tail:
            return None
        if tail:
            os.lseek(fd, max(0, size - max_bytes), os.SEEK_SET)
        chunks, left = [], max_bytes + (0 if tail else 1)  # one more: a file grown since fstat is too long
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)
