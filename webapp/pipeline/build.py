"""Build stage: compile the optimized module and export it as a shared library."""

from __future__ import annotations

from pathlib import Path

import tvm


def build(lowered: tvm.IRModule, target: tvm.target.Target, out: Path | None):
    """Returns the VM executable; writes the loadable library to `out` (a .so) unless it is None."""
    executable = tvm.compile(lowered, target=target, relax_pipeline=None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        executable.export_library(str(out))
    return executable
