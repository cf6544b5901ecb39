"""Grouped-query attention without its copies, a rewrite the CPU kinds make first (webapp/targets/base.py).

Hugging Face's models repeat each key-value head for the query heads of its group (`repeat_kv`:
expand_dims, broadcast_to, reshape) and the exporters transpose the keys for Q K^T, so a decode step
copies the whole cache, g times over and transposed with a stride, before two small matmuls: on the
llama example with 2,048 cached tokens that copy was 37% of a step (11.3 of 30.9 ms, profiled). Here the
query heads of a group are taken as rows of one matmul instead, against the group's keys and values as
they are:

    Q K'^T  ->  reshape(Q, [b, kv heads, g * m, d]) . K^T  (the transpose read by the matmul, NT)
    P V'    ->  reshape(P, [b, kv heads, g * m, n]) . V

and reshaped back, a scalar that scaled the repeated keys scaling the (smaller) scores instead. Taken:
a 4-D float32 matmul whose second operand is, through reshapes that keep its last two axes, a swap of
them, and a multiply by a scalar constant, `broadcast_to(expand_dims(K, 2))` of a 4-D K; static shapes.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, te

from webapp.pipeline.passes.rewrites import mutate_functions, static_shape


def op_name(call: Any) -> str:
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else ""


def nt_matmul(a: te.Tensor, b: te.Tensor) -> te.Tensor:
    """C[.., i, j] = sum_k A[.., i, k] * B[.., j, k]: the transposed operand read as it is stored."""
    k = te.reduce_axis((0, a.shape[-1]), name="k")
    shape = [*a.shape[:-1], b.shape[-2]]
    return te.compute(
        shape, lambda *ix: te.sum(a[(*ix[:-1], k)] * b[(*ix[:-2], ix[-1], k)], axis=k), name="NT_matmul"
    )


@relax.expr_functor.mutator
class GroupedAttention(relax.PyExprMutator):
    def producer(self, x: relax.Expr) -> Any:  # the call bound to x, or None
        return self.lookup_binding(x) if isinstance(x, relax.Var) else None

    def repeated(self, b: relax.Expr) -> tuple[relax.Expr, int, bool, relax.Expr | None] | None:
        """(K, g, transposed, scale) when `b` is K's heads repeated g times (and transposed, scaled), or K
        transposed (g = 1: attention with a key-value head a query head)."""
        scale, transposed, expr = None, False, b
        call = self.producer(expr)
        if op_name(call) == "relax.multiply" and isinstance(call.args[1], tvm.ir.Constant):
            if call.args[1].value.numpy().size != 1:
                return None
            scale, expr = call.args[1], call.args[0]
            call = self.producer(expr)
        while op_name(call) in ("relax.reshape", "relax.permute_dims"):
            source, out = static_shape(call.args[0].ty), static_shape(call.ty)
            if source is None or out is None:
                return None
            if op_name(call) == "relax.permute_dims":
                rank = len(source)
                swap = [*range(rank - 2), rank - 1, rank - 2]
                if call.attrs.axes is None or [int(a) for a in call.attrs.axes] != swap:
                    return None
                transposed = not transposed
            elif source[-2:] != out[-2:]:  # a reshape of the heads and batch only
                return None
            expr = call.args[0]
            call = self.producer(expr)
        expand: Any = self.producer(call.args[0]) if op_name(call) == "relax.broadcast_to" else None
        if op_name(expand) != "relax.expand_dims" or [int(a) for a in expand.attrs.axis] != [2]:
            shape = static_shape(expr.ty)  # no repeat: worth a rewrite for the transpose alone
            return (expr, 1, True, scale) if transposed and shape is not None and len(shape) == 4 else None
        k, out = static_shape(expand.args[0].ty), static_shape(call.ty)
        if k is None or out is None or len(k) != 4 or out[:2] != k[:2] or out[3:] != k[2:]:
            return None
        return expand.args[0], out[2], transposed, scale

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.matmul" or str(call.ty.dtype) != "float32":
            return call
        a, out = static_shape(call.args[0].ty), static_shape(call.ty)
        found = self.repeated(call.args[1])
        if found is None or a is None or out is None or len(a) != 4:
            return call
        kv, g, transposed, scale = found
        b, heads, _, _ = static_shape(kv.ty) or [0, 0, 0, 0]
        if a[0] != b or a[1] != heads * g:
            return call
        emit = self.builder_.emit
        rows = emit(relax.op.reshape(call.args[0], [b, heads, g * a[2], a[3]]))
        if transposed:  # K^T: the scores
            product = emit(self.builder_.call_te(nt_matmul, rows, kv, primfunc_name_hint="grouped_scores"))
        else:  # V: the weighted values
            product = emit(relax.op.matmul(rows, kv))
        if scale is not None:
            product = emit(relax.op.multiply(product, scale))
        return relax.op.reshape(product, out)


@tvm.transform.module_pass(opt_level=0, name="PlaygroundGroupedAttention")
def grouped_attention(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """GroupedAttention on every Relax function, the copies it left unused removed; the module as it was
    if it fails."""
    rewritten = mutate_functions(GroupedAttention, mod)
    return mod if rewritten is mod else relax.transform.DeadCodeElimination()(rewritten)
