"""A target's way from Relax to fused kernels (before scheduling): the project's own rewrites its kind
names (Target.rewrites), then TVM's legalization for the kind."""

from __future__ import annotations

from webapp.pipeline.passes.rewrites import channels_last, fast_math, fold_with_numpy
from webapp.pipeline.passes.winograd import winograd
from webapp.targets import kind_of

REWRITES = {
    "fast_math": fast_math,
    "channels_last": channels_last,
    "fold_with_numpy": fold_with_numpy,
    "winograd": winograd,
}


def legalize_passes(tvm_target) -> list:
    kind = kind_of(tvm_target)
    return [REWRITES[name] for name in kind.rewrites] + kind.legalize_passes(tvm_target)
