"""JSON files that a reader may open at any moment (the page polls them while the job writes)."""

from __future__ import annotations

import json
from pathlib import Path


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
