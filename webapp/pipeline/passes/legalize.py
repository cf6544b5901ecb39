"""A target's way from Relax to fused kernels (before scheduling): the project's own rewrites its kind
names (Target.rewrites), then TVM's legalization for the kind, with MultiplyByInt32Constants before its
FuseOps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax, te

from webapp.pipeline.passes.attention import padded_keys, padded_rows
from webapp.pipeline.passes.convolutions import as_conv2d, channels, upsampling
from webapp.pipeline.passes.grouped_attention import grouped_attention
from webapp.pipeline.passes.rewrites import channels_last, fast_math, fold_with_numpy, mutate_functions
from webapp.pipeline.passes.running import RunningPass
from webapp.pipeline.passes.winograd import winograd
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages.optimize import FusionTrace

REWRITES = {
    "grouped_attention": grouped_attention,
    "padded_keys": padded_keys,
    "padded_rows": padded_rows,
    "fast_math": fast_math,
    "conv1d_as_conv2d": as_conv2d,
    "channels_last": channels_last,
    "upsampling": upsampling,
    "padded_channels": channels,
    "fold_with_numpy": fold_with_numpy,
    "winograd": winograd,
}


def legalize_passes(target: Target) -> list:
    tvm_passes = target.legalize_passes()
    fuse_ops = [i for i, p in enumerate(tvm_passes) if p.info.name == "FuseOps"]
    if fuse_ops:  # just before it, the new kernels annotated as LegalizeOps' are
        at = fuse_ops[0]
        narrow = [multiply_by_int32_constants, tvm.relax.transform.AnnotateTIROpPattern()]
        tvm_passes = tvm_passes[:at] + narrow + tvm_passes[at:]
    return [REWRITES[name] for name in target.rewrites] + tvm_passes


@relax.expr_functor.mutator
class _Narrow(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (call.op.same_as(tvm.ir.Op.get("relax.call_tir")) and len(call.args[1].fields) == 2):
            return call
        x, c = call.args[1].fields
        if not (
            isinstance(c, tvm.ir.Constant)
            and str(c.value.dtype) == "int64"
            and isinstance(call.args[0], relax.GlobalVar)
            and call.args[0].name_hint.startswith("multiply")
        ):
            return call
        values, shape = c.value.numpy(), [int(d) for d in x.ty.shape.values]
        within = values.ndim <= len(shape) and all(
            n in (1, shape[len(shape) - values.ndim + k]) for k, n in enumerate(values.shape)
        )
        if not within or values.size == 0 or values.min() < -(2**31) or values.max() >= 2**31:
            return call
        return self.builder_.call_te(widening_multiply, x, relax.const(values.astype(np.int32)))


def widening_multiply(x: te.Tensor, c: te.Tensor) -> te.Tensor:
    """x (int64) x c (int32, broadcast as numpy does), c widened as it is read."""
    offset = len(x.shape) - len(c.shape)

    def value(*i):
        j = [0 if int(c.shape[k]) == 1 else i[offset + k] for k in range(len(c.shape))]
        return x(*i) * c(*j).astype("int64")

    return te.compute(x.shape, value, name="T_multiply")


@tvm.transform.module_pass(opt_level=0, name="MultiplyByInt32Constants")
def multiply_by_int32_constants(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """An int64 multiply by a constant whose values fit in 32 bits (a fixed-point requantization's
    multipliers, webapp.pipeline.stages.quantize) reads the constant as int32 and widens it: in its
    fused kernel both operands are then 32-bit values widened, which LLVM multiplies with one
    widening instruction (AArch64 smull / smull2) where a 64-bit multiply has no vector instruction
    on NEON (each lane a scalar mul). Runs on the legalized module, after FoldConstant (which would
    fold the widening of a constant back), before FuseOps. A module it cannot take (a dynamic shape,
    say) stays as it was."""
    return mutate_functions(_Narrow, mod)


def fuse(mod: tvm.IRModule, target: Target, trace: FusionTrace | None = None) -> tvm.IRModule:
    """Legalized and fused (the kernels before scheduling), as the optimize stage's FuseTIR module,
    without its per-pass views; `trace` (an optimize.FusionTrace) sees its fusion."""
    instruments = [RunningPass(), *([trace] if trace else [])]
    with target.tvm, tvm.transform.PassContext(opt_level=3, instruments=instruments):
        return tvm.transform.Sequential(legalize_passes(target))(mod)
