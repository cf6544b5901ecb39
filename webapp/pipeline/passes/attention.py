"""Attention over a number of keys that is no multiple of a vector (ViT's 197 tokens, Whisper's 1,500
frames), a rewrite a CPU kind makes first (webapp/targets/base.py): the scores are padded with -inf to a
multiple of KEYS and the values with zero rows, so that softmax runs on full vectors of 16
(rules/reductions.py, rows: a row of 197 had vectors of 1, one of 1,500 vectors of 4) and the
probabilities times the values need no slice:

    P = softmax([S, -inf ...])        the padded keys' probabilities are exp(-inf) = 0
    P V = P[:, :n] V = P [V; 0 ...]   the padded values are never weighted

Any other softmax over a last axis of no multiple of KEYS (a text recognizer's 18,710 characters: vectors
of 2, 2.1 ms) is padded the same way and its output sliced back (`padded_rows`, after this one).

Taken: matmul(P, V) where P is softmax(S) over its last axis, float32, directly or through elementwise
ops that map NaN to 0 (torch.export writes `where(isnan(p), 0, p)` after the softmax), with static
shapes. A fully masked row (all -inf) stays NaN, as it was.
"""

from __future__ import annotations

import tvm
from tvm import relax

from webapp.pipeline.passes.rewrites import mutate_functions, static_shape

KEYS = 16  # the widest float32 vector the CPU kinds have (AVX-512); a multiple of 4 and 8
ELEMENTWISE = {"relax.isnan", "relax.where"}  # what torch.export writes between softmax and matmul


def extra_keys(keys: int) -> int:
    """The -inf columns that take a row of `keys` to a multiple of KEYS; 0 where it is left as it is (a
    multiple already, or shorter than 2 x KEYS)."""
    return 0 if keys % KEYS == 0 or keys < 2 * KEYS else -(-keys // KEYS) * KEYS - keys


def padded_softmax(builder: relax.BlockBuilder, scores: relax.Expr, ndim: int, extra: int) -> relax.Expr:
    """softmax over the last axis of `scores` (of `ndim` axes) padded by `extra` columns of -inf."""
    width = [0] * (2 * ndim)
    width[-1] = extra
    padded = builder.emit(relax.op.nn.pad(scores, width, pad_value=float("-inf")))
    return builder.emit(relax.op.nn.softmax(padded, axis=-1))


@relax.expr_functor.mutator
class PaddedKeys(relax.PyExprMutator):
    """matmul(softmax(S), V) with S and V padded (the module docstring)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
            return call
        probabilities, values = call.args
        shape = static_shape(probabilities.ty)
        if not shape or str(probabilities.ty.dtype) != "float32" or getattr(values.ty, "shape", None) is None:
            return call
        keys, extra = shape[-1], extra_keys(shape[-1])
        if extra == 0:
            return call
        padded = self.padded(probabilities, keys, extra, {})
        if padded is None:
            return call
        ndim = len(values.ty.shape.values)
        zeros = [0] * (2 * ndim)
        zeros[2 * (ndim - 2) + 1] = extra  # after the keys' axis (the values' rows)
        rows = self.builder_.emit(relax.op.nn.pad(values, zeros))
        return relax.op.matmul(padded, rows, out_dtype=call.attrs.out_dtype)

    def padded(self, expr: relax.Expr, keys: int, extra: int, done: dict) -> relax.Expr | None:
        """`expr` (the probabilities, or an elementwise op of them) computed on scores padded by `extra`
        keys; None where it is not one this rewrite takes."""
        if not isinstance(expr, relax.Var):
            return expr if isinstance(expr, tvm.ir.Constant) and not expr.ty.shape.values else None
        if expr in done:
            return done[expr]
        bound = self.lookup_binding(expr)
        if not (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)):
            return None
        if bound.op.name == "relax.nn.softmax":
            scores = bound.args[0]
            scores_shape = static_shape(scores.ty)
            last = (-1, len(scores_shape or []) - 1)
            if not scores_shape or scores_shape[-1] != keys or int(bound.attrs.axis) not in last:
                return None
            done[expr] = padded_softmax(self.builder_, scores, len(scores_shape), extra)
            return done[expr]
        if bound.op.name not in ELEMENTWISE:
            return None
        args = [self.padded(arg, keys, extra, done) for arg in bound.args]
        if any(arg is None for arg in args):
            return None
        done[expr] = self.builder_.emit(relax.Call(bound.op, args, bound.attrs))
        return done[expr]


@tvm.transform.module_pass(opt_level=0, name="PlaygroundPaddedKeys")
def padded_keys(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The attention rewrite (PaddedKeys) on every Relax function, the softmax it replaced removed; the
    module as it was if it fails."""
    rewritten = mutate_functions(PaddedKeys, mod)
    return mod if rewritten is mod else relax.transform.DeadCodeElimination()(rewritten)


@relax.expr_functor.mutator
class PaddedRows(relax.PyExprMutator):
    """softmax(x) over a last axis of no multiple of KEYS as softmax([x, -inf ...])[..., :n]."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.softmax"):
            return call
        x = call.args[0]
        shape = static_shape(x.ty)
        if not shape or str(x.ty.dtype) != "float32" or int(call.attrs.axis) not in (-1, len(shape) - 1):
            return call
        extra = extra_keys(shape[-1])
        if extra == 0:
            return call
        rows = padded_softmax(self.builder_, x, len(shape), extra)
        return relax.op.strided_slice(rows, axes=[len(shape) - 1], begin=[0], end=[shape[-1]])


@tvm.transform.module_pass(opt_level=0, name="PlaygroundPaddedRows")
def padded_rows(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The softmax rows' rewrite (PaddedRows) on every Relax function; the module as it was if it fails."""
    return mutate_functions(PaddedRows, mod)
