"""Memory handed back between a job's heavy steps. A model's weights pass through the process several times
(the ONNX file's arrays, TVM's constants, each build's), each tensor of a few MB, which glibc serves from
its heap and, once freed, keeps: in resident memory until trimmed, and in address space, which the sandbox
limits, for good. A 2 GB model's generate stage held 14.5 GB of address space with 3.5 GB resident, and
its next import failed at the 16 GB limit. So the pipeline process maps every allocation of 1 MiB or more
on its own (freed, it leaves the address space), except while runtimes are timed: PyTorch then allocates
and frees tensors of a few MB a call, which glibc's own threshold, once warmed up, serves from the heap."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)
MAPPED_BYTES = 1 << 20  # allocations this large and more are mapped on their own
TIMED_BYTES = 32 << 20  # while timed: glibc's largest dynamic threshold, where a warmed-up program sits
mapped = False  # whether this process maps large allocations (map_large_allocations)


def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (mallopt, malloc_trim); None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def mallopt(threshold: int) -> bool:
    libc = glibc()
    return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, threshold))


def map_large_allocations() -> None:
    """Every allocation of MAPPED_BYTES and more mapped on its own from now on (the pipeline's process)."""
    global mapped
    mapped = mallopt(MAPPED_BYTES)


@contextmanager
def heap_while_timed() -> Iterator[None]:
    """Allocations under TIMED_BYTES from the heap while the block times runtimes, in a process that maps
    large allocations (elsewhere nothing changes)."""
    if not mapped:
        yield
        return
    mallopt(TIMED_BYTES)
    try:
        yield
    finally:
        mallopt(MAPPED_BYTES)


def let_go() -> None:
    """What was let go collected, and the heap's free memory handed back (glibc keeps it resident: 1.9 GB
    after the stages of a 538 MB model)."""
    gc.collect()
    libc = glibc()
    if libc:
        libc.malloc_trim(0)
