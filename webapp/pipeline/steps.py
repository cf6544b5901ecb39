"""What runs now inside a stage (the TVM pass, the step), so that a stage past its time budget, or a
job out of memory, names it. The TVM passes of the optimize, quantize and build stages name
themselves through RunningPass (webapp.pipeline.passes.running), longer steps through `step`;
Progress writes the step into progress.json, where the worker reads it when the process died of a
limit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

now = ""  # the step running now in this process ("" when none is named)


def set_step(name: str) -> None:
    global now
    now = name


@contextmanager
def step(name: str) -> Iterator[None]:
    """`with step("tvm.compile"): ...`: the step named while the block runs."""
    outer = now
    set_step(name)
    try:
        yield
    finally:
        set_step(outer)
