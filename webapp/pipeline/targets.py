"""Turn a target preset (webapp.catalog.TARGETS) into a TVM target."""

from __future__ import annotations

import os

import tvm

from webapp.catalog import TARGETS


def make_target(preset_name: str) -> tvm.target.Target:
    spec = dict(TARGETS[preset_name].tvm_target)
    if spec.get("mcpu") == "host":
        spec["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
    if spec["kind"] == "llvm":
        spec.setdefault("num-cores", int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1))
    return tvm.target.Target(spec)


def host_target() -> tvm.target.Target:
    """This machine's CPU: where calibration and other measurements run, whatever the job's target."""
    return make_target("x86-host")


def target_json(target: tvm.target.Target) -> dict:
    """The target as the plain JSON dict the result page shows."""
    out = {"kind": target.kind.name}
    for key, value in dict(target.attrs).items():
        out[key] = [str(v) for v in value] if isinstance(value, (list, tuple, tvm.ir.Array)) else value
    return out
