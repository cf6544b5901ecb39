"""Names as people read them in order; plain Python, for the pipeline's facts and the web's tables."""

from __future__ import annotations

import re


def natural_key(name: str) -> list:
    """TVM's kernel names in their order: `conv2d` (the first), `conv2d1`, `conv2d2`, `conv2d10`.
    Word by word (split at "_"), digit runs compared as numbers."""
    return [[int(t) if t.isdigit() else t for t in re.split(r"(\d+)", word)] for word in name.split("_")]
