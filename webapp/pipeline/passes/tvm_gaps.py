"""Rewrites around what plain TVM 0.27 fails on, for models people bring (run on the imported model,
before the float pipeline and quantization alike: webapp.pipeline.stages.optimize.canonical).

- Dropout: at inference its input itself. Its tuple output (the result and a mask) stopped
  ConvertLayout: SqueezeNet's int8 build failed, and its float build stayed in NCHW.
- Comparisons of bool tensors (R.equal(a, b) on masks): LLVM code generation takes a bool that is not
  an integer for a float and fails ("Check failed: t.MatchesCode(kDLFloat)"), as on the attention
  masks of a Hugging Face Llama exported with torch.export. Compared as uint8 instead.
- A cumulative sum of a bool tensor (the same masks' sequence numbers) fails the same way; it is
  also typed bool by TVM's PyTorch importer, where PyTorch sums bools into int64 (a bool sum would stop
  counting at 1). Summed in int64, as PyTorch does; what reads it is typed again from there.
"""

from __future__ import annotations

import tvm
from tvm import relax

COMPARISONS = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"}
SCANS = {"cumsum", "cumprod"}


def dtype_of(expr: relax.Expr) -> str | None:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


@relax.expr_functor.mutator
class AroundGaps(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        name = call.op.name.removeprefix("relax.")
        if name == "nn.dropout":
            return relax.Tuple([call.args[0], call.args[0]])
        if name in COMPARISONS and any(dtype_of(a) == "bool" for a in call.args):
            cast = [relax.op.astype(a, "uint8") if dtype_of(a) == "bool" else a for a in call.args]
            return relax.Call(call.op, cast, call.attrs)
        if name in SCANS and dtype_of(call.args[0]) == "bool" and dtype_of(call) == "bool":
            scan = getattr(relax.op, name)
            return scan(
                relax.op.astype(call.args[0], "int64"), call.attrs.axis, "int64", call.attrs.exclusive
            )
        return call


def needs_it(expr: relax.Expr) -> bool:
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return False
    name = expr.op.name.removeprefix("relax.")
    return name == "nn.dropout" or (
        name in COMPARISONS | SCANS and any(dtype_of(a) == "bool" for a in expr.args)
    )


def around_tvm_gaps(mod: tvm.IRModule) -> tvm.IRModule:
    """The module with the rewrites above, where it has something they rewrite (else itself)."""
    found = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: found.append(e) if needs_it(e) else None)
    if not found:
        return mod
    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = AroundGaps().visit_expr(func)
    out = relax.transform.Normalize()(out)
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(out))
