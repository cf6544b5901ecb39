"""Files that a reader may open at any moment (the page polls JSON files while the job writes; the web
keeps pages it rendered): written whole or not at all."""

from __future__ import annotations

import json
import os
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
