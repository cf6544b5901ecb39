"""What runs now inside a stage (the TVM pass, the step), so that a stage past its time budget, or a
job out of memory, names it. The TVM passes of the optimize, quantize and build stages name
themselves through RunningPass (webapp.pipeline.passes.running); Progress writes the step into
progress.json, where the worker reads it when the process died of a limit."""

from __future__ import annotations

now = ""  # the step running now in this process ("" before any)


def set_step(name: str) -> None:
    global now
    now = name
