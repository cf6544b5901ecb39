"""Names and words as people read them; plain Python, for the pipeline's facts and the web's pages."""

from __future__ import annotations

import re


def natural_key(name: str) -> list:
    """TVM's kernel names in their order: `conv2d` (the first), `conv2d1`, `conv2d2`, `conv2d10`.
    Word by word (split at "_"), digit runs compared as numbers."""
    return [[int(t) if t.isdigit() else t for t in re.split(r"(\d+)", word)] for word in name.split("_")]


ABOUT_AS_FAST = 1.05  # two times within 5% of each other are "about as fast"


def speed_words(ratio: float) -> str:
    """How one time compares with another (ratio: the other's time over this one's, above 1 faster):
    "1.60× faster than", "4.17× slower than", "about as fast as"."""
    if 1 / ABOUT_AS_FAST <= ratio <= ABOUT_AS_FAST:
        return "about as fast as"
    return f"{ratio:.2f}× faster than" if ratio > 1 else f"{1 / ratio:.2f}× slower than"
