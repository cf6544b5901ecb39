"""A target's way from Relax to fused kernels (before scheduling): the project's own rewrites its kind
names (Target.rewrites), then TVM's legalization for the kind."""

from __future__ import annotations

import tvm

from webapp.pipeline.passes.rewrites import channels_last, fast_math, fold_with_numpy
from webapp.pipeline.passes.winograd import winograd
from webapp.targets import Target

REWRITES = {
    "fast_math": fast_math,
    "channels_last": channels_last,
    "fold_with_numpy": fold_with_numpy,
    "winograd": winograd,
}


def legalize_passes(target: Target) -> list:
    return [REWRITES[name] for name in target.rewrites] + target.legalize_passes()


def fuse(mod: tvm.IRModule, target: Target, trace=None) -> tvm.IRModule:
    """Legalized and fused (the kernels before scheduling), as the optimize stage's FuseTIR module,
    without its per-pass views; `trace` (an optimize.FusionTrace) sees its fusion."""
    with target.tvm, tvm.transform.PassContext(opt_level=3, instruments=[trace] if trace else []):
        return tvm.transform.Sequential(legalize_passes(target))(mod)
