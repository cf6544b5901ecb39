"""Errors as the user reads them: a stage's failure in a sentence, never a traceback."""

from __future__ import annotations

import mmap
import os

from webapp.machine.sandbox import MEMORY_WORDS


class StageError(Exception):
    """A failure the user can act on; its message is shown as is (no traceback). `resubmit`: the
    options that would get past it (e.g. {"input_shapes": ...}), which the result page offers."""

    def __init__(self, message: str, resubmit: dict | None = None):
        super().__init__(message)
        self.resubmit = resubmit


def error_message(exc: BaseException) -> str:
    """A short message for an unexpected error: its type and first lines, never a traceback."""
    if isinstance(exc, StageError):
        return str(exc)
    if isinstance(exc, MemoryError) or any(w in str(exc) for w in MEMORY_WORDS) or near_limit():
        limit = os.environ.get("PLAYGROUND_MEMORY_LIMIT_MB")
        return f"Out of memory: the job reached its memory limit ({limit} MB)." if limit else "Out of memory."
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith(("  File", "Traceback"))]
    text = " ".join(lines[:6])
    return f"{type(exc).__name__}: {text[:1500]}" if text else type(exc).__name__


def near_limit(headroom_mb: int = 512) -> bool:
    """Whether this process is within `headroom_mb` of its address-space limit. A library that cannot
    map itself under the limit fails in many ways (MemoryError, ImportError "failed to map segment",
    even an AttributeError from a half-registered TVM), so a failure is judged by the room left."""
    try:
        mmap.mmap(-1, headroom_mb << 20).close()
    except (OSError, ValueError):
        return True
    return False
