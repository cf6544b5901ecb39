"""Memory handed back between a job's heavy steps: the stages before the generate stage, and each of its
points, leave a model's weights several times over in glibc's heap."""

from __future__ import annotations

import ctypes
import gc


def let_go() -> None:
    """What was let go collected, and the memory handed back: glibc keeps what is freed in its heap (1.9
    GB after the stages of a 538 MB model), in the address space the sandbox limits."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator does as it does
        pass
