"""Errors as the user reads them: a stage's failure in a sentence, never a traceback."""

from __future__ import annotations

import os


class StageError(Exception):
    """A failure the user can act on; its message is shown as is (no traceback)."""


def error_message(exc: BaseException) -> str:
    """A short message for an unexpected error: its type and first lines, never a traceback."""
    if isinstance(exc, StageError):
        return str(exc)
    if isinstance(exc, MemoryError) or "bad_alloc" in str(exc) or "Cannot allocate memory" in str(exc):
        limit = os.environ.get("PLAYGROUND_MEMORY_LIMIT_MB")
        return f"Out of memory: the job reached its memory limit ({limit} MB)." if limit else "Out of memory."
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith(("  File", "Traceback"))]
    text = " ".join(lines[:6])
    return f"{type(exc).__name__}: {text[:1500]}" if text else type(exc).__name__
