"""Rewrites a CPU kind's pipeline makes before legalization (the kind names them, Target.rewrites;
webapp.pipeline.passes.legalize runs them). Each leaves a model it cannot take as it was: never a job's
failure.

Fast math: `erf`, `exp`, `tanh` and softmax become TVM's fast approximations (topi.fast_erf, ...:
clamped polynomials that vectorize, where LLVM calls libm once per element; GELU's erf was half the
transformer block's time), GELU, sigmoid and SiLU first written with them (Expansions), and
`power(x, 2 or 3)` as products. Every job's fidelity figures include the approximation.

Channels last: float conv2d goes from NCHW / OIHW to NHWC / HWIO, with TVM's ConvertLayout: the ops
between two convolutions (bias, batch norm, ReLU, residual adds, pooling) follow the layout, so the
data is transposed once at the edges of each region of convolutions, not at every one. In NHWC the
input channels are innermost: a convolution is a GEMM over the channel axis
(webapp.pipeline.rules.cpu.conv2d_nhwc; a 1x1 convolution is exactly one), and a depthwise
convolution or a pooling vectorizes over channels (rules/reductions.py, windowed).

ConvertLayout makes new vars for the bindings it rewrites, and inserts transposes; `align` maps the
new vars back to the ones they stand for, so the fusion map (webapp.pipeline.stages.optimize.FusionTrace)
still names every kernel's source layers.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax

LAYOUT_PASS = "PlaygroundChannelsLast"
# conv2d_transpose stays in NCHW: TVM 0.27 legalizes it in no other layout (left as a Relax op, the
# VM cannot run it), so ConvertLayout must not carry the NHWC of its neighbours into it.
DESIRED = {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}
LOOKAHEAD = 8  # bindings ConvertLayout may insert before the one it rewrites (transposes of its args)


@tvm.transform.module_pass(opt_level=0, name="PlaygroundFastMath")
def fast_math(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Activations written out in the functions FastMathTransform replaces (Expansions), then TVM's
    FastMathTransform, on a model it can take (it fails on a call of an extern function)."""
    expanded = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            expanded[gv] = Expansions().visit_expr(func)
    try:
        return relax.transform.FastMathTransform()(expanded)
    except Exception:  # noqa: BLE001 - the exact functions instead
        traceback.print_exc()
        return expanded


@relax.expr_functor.mutator
class Expansions(relax.PyExprMutator):
    """On float tensors: GELU (erf and tanh forms), sigmoid and SiLU written with erf, tanh and exp,
    which FastMathTransform then replaces (legalized whole, they call libm's erff / expf once per
    element: ViT's GELU took a fifth of its feed-forward matmul's time, Llama's SiLU as much);
    power(x, 2) and power(x, 3) as products (GPT-2's tanh GELU cubes its input: 3.6 ms of its 48
    here, calling powf per element)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not call.args:
            return call
        x, dtype = call.args[0], str(getattr(call.args[0].ty, "dtype", ""))
        if not dtype.startswith("float"):
            return call
        op, name = relax.op, call.op.name

        def c(value: float):
            return relax.const(value, dtype)

        if name == "relax.power" and isinstance(call.args[1], tvm.ir.Constant):
            value = call.args[1].value.numpy()
            exponent = float(value.reshape(-1)[0]) if value.size == 1 else None
            if exponent in (2.0, 3.0):
                square = op.multiply(x, x)
                return square if exponent == 2.0 else op.multiply(square, x)
        if name == "relax.nn.gelu":
            return op.multiply(x, op.add(c(0.5), op.multiply(op.erf(op.multiply(x, c(0.5**0.5))), c(0.5))))
        if name == "relax.nn.gelu_tanh":
            cube = op.multiply(op.multiply(x, x), x)
            inner = op.multiply(op.add(x, op.multiply(cube, c(0.044715))), c((2 / np.pi) ** 0.5))
            return op.multiply(x, op.add(c(0.5), op.multiply(op.tanh(inner), c(0.5))))
        if name in ("relax.sigmoid", "relax.nn.silu"):
            sigmoid = op.divide(c(1.0), op.add(c(1.0), op.exp(op.negative(x))))
            return sigmoid if name == "relax.sigmoid" else op.multiply(x, sigmoid)
        return call


def static_shape(ty: tvm.ir.Type) -> list[int] | None:
    shape = getattr(ty, "shape", None)
    try:
        return [int(d) for d in shape] if shape is not None else None
    except TypeError:  # a symbolic dimension
        return None


# Ops on constants computed here with numpy (weights transposed for a layout, a batch norm's scale
# and shift): FoldConstant would build and compile a TIR function for each one, ~15 ms apiece (1,426
# of them on DenseNet-121, a third of its optimize stage). Arithmetic is folded for floats only
# (numpy and TVM round +, -, *, /, sqrt alike; integer division differs).
ARITHMETIC: dict[str, Callable[..., Any]] = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.divide": lambda a, b: a / b,
    "relax.sqrt": np.sqrt,
    "relax.negative": np.negative,
}
SHAPING = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to", "relax.permute_dims"}


def numpy_value(call: relax.Call, values: list, ty: tvm.ir.Type) -> np.ndarray | None:
    """The value of an op on constants (numpy arrays), or None when it is not computed here."""
    name, shape, dtype = call.op.name, static_shape(ty), str(getattr(ty, "dtype", ""))
    if shape is None or any(v.dtype != np.dtype(dtype) for v in values if dtype):
        return None
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.ascontiguousarray(np.transpose(values[0], None if axes is None else [int(a) for a in axes]))
    if name == "relax.broadcast_to":
        return np.ascontiguousarray(np.broadcast_to(values[0], shape))
    if name in SHAPING:
        return values[0].reshape(shape)
    if name in ARITHMETIC and dtype.startswith("float"):
        out = np.asarray(ARITHMETIC[name](*values), dtype=dtype)
        return out if list(out.shape) == shape else None
    return None


def constant_value(arg: tvm.ir.Constant) -> np.ndarray:
    """A constant's value: a tensor's, or an immediate's (a clip's bounds, a binary op's scalar operand:
    FloatImm and IntImm are tvm.ir.Constant too, with a number for a value; read as tensors they made
    NumpyFold fail on every int8 model, and FoldConstant built ~2,600 small functions instead)."""
    if isinstance(arg, tvm.ir.GenericConst):
        return arg.value.numpy()
    return np.array(arg.value, dtype=str(arg.ty))


@relax.expr_functor.mutator
class NumpyFold(relax.PyExprMutator):
    """Bindings of shape ops and float arithmetic on constants bound to their values, each var kept."""

    def __init__(self, mod=None) -> None:
        super().__init__(mod)
        self.values: dict = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        call = binding.value
        if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
            tensors = [
                a for a in call.args if type(a).__name__ not in ("ShapeExpr", "PrimValue", "StringImm")
            ]
            known = [
                constant_value(a) if isinstance(a, tvm.ir.Constant) else self.values.get(a) for a in tensors
            ]
            if tensors and all(v is not None for v in known):
                value = numpy_value(call, known, binding.var.ty)
                if value is not None:
                    self.values[binding.var] = value
                    constant = relax.const(value, str(value.dtype))  # relax.const alone narrows int64
                    self.builder_.emit_normalized(relax.VarBinding(binding.var, constant))
                    return
        super().visit_var_binding_(binding)


def mutate_functions(
    mutator: Callable[[tvm.IRModule], relax.PyExprMutator], mod: tvm.IRModule
) -> tvm.IRModule:
    """Every Relax function of `mod` rewritten by `mutator(mod)` (a PyExprMutator class); `mod` as it
    was if that fails (the rewrite is an optimization, never a job's failure)."""
    try:
        rewriter = mutator(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()
    except Exception:  # noqa: BLE001 - the model goes on as it was
        traceback.print_exc()
        return mod


@tvm.transform.module_pass(opt_level=0, name="PlaygroundNumpyFold")
def fold_with_numpy(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Ops on constants computed with numpy (NumpyFold), before FoldConstant does the rest (all of them,
    if NumpyFold fails)."""
    return mutate_functions(NumpyFold, mod)


def float_nchw_convs(mod: tvm.IRModule) -> list:
    """main's float32 conv2d calls in NCHW (what the conversion is for)."""
    conv2d, found = tvm.ir.Op.get("relax.nn.conv2d"), []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(conv2d):
            if expr.attrs.data_layout == "NCHW" and str(expr.args[0].ty.dtype) == "float32":
                found.append(expr)

    if "main" in [gv.name_hint for gv in mod.get_global_vars()]:
        relax.analysis.post_order_visit(mod["main"], visit)
    return found


def grouped(conv: relax.Call) -> bool:
    """A grouped convolution other than a depthwise one (several input channels a group)."""
    weight = conv.args[1].ty.shape
    return int(conv.attrs.groups) > 1 and (
        weight is None or not isinstance(weight[1], tvm.tirx.IntImm) or int(weight[1]) > 1
    )


@relax.expr_functor.mutator
class LayoutGaps(relax.PyExprMutator):
    """What TVM 0.27's ConvertLayout cannot carry a layout through, written with ops it can, so that a
    region of convolutions stays in NHWC without a transpose at each of them:
    - stack(xs, axis) as concat([expand_dims(x, axis) ...], axis): its layout inference indexes the
      layout at -1 and fails, and an LSTM's outputs are stacked (ddddocr's recognizer, Silero VAD:
      their convolutions stayed in NCHW);
    - clip(x, lo, hi) as minimum(maximum(x, lo), hi), and the ONNX importer's Clip (a call_tir of
      topi.maximum / topi.minimum with a scalar bound) as maximum / minimum: a clip has no layout
      inference, and a call_tir none either. The hard-swish activations of PP-OCR's MobileNetV3 were
      transposed to NCHW and back around each clip, which kept them out of their convolution's kernel
      (a kernel each of their own, 0.15 of the direction classifier's 0.60 ms)."""

    def __init__(self, mod: tvm.IRModule | None = None) -> None:
        super().__init__(mod)
        self.mod = mod

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.stack":
            return self.concat(call)
        if call.op.name == "relax.clip":
            x, (lo, hi) = call.args[0], (immediate(a) for a in call.args[1:])
            dtype = str(x.ty.dtype)
            return relax.op.minimum(relax.op.maximum(x, relax.const(lo, dtype)), relax.const(hi, dtype))
        if call.op.name == "relax.call_tir" and self.mod is not None:
            bound = scalar_bound(self.mod, call)
            if bound is not None:
                return bound
        return call

    def concat(self, call: relax.Call) -> relax.Expr:
        items = call.args[0]
        if not isinstance(items, relax.Tuple) or call.attrs.axis is None:
            return call
        ndim = len(items.fields[0].ty.shape.values) if items.fields[0].ty.shape is not None else None
        axis = int(call.attrs.axis)
        if ndim is None or not -ndim - 1 <= axis <= ndim:
            return call
        axis %= ndim + 1
        expanded = [self.builder_.emit(relax.op.expand_dims(x, [axis])) for x in items.fields]
        return relax.op.concat(expanded, axis=axis)


def immediate(arg: relax.Expr) -> float:
    """A clip's bound: an IntImm / FloatImm, or a PrimValue of one."""
    value = arg.value
    return float(value if isinstance(value, int | float) else value.value)


def scalar_bound(mod: tvm.IRModule, call: relax.Call) -> relax.Expr | None:
    """A call_tir of topi.maximum or topi.minimum (one block, T_maximum or T_minimum) on a tensor and a
    0-d bound, as the ONNX importer writes Clip, as the Relax op; else None."""
    from tvm import s_tir, tirx

    gv, args = call.args[0], call.args[1]
    if not isinstance(gv, relax.GlobalVar) or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
        return None
    func, names = mod[gv], []
    if isinstance(func, tirx.PrimFunc):
        sch = s_tir.Schedule(func)
        names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    x, bound = args.fields
    op = {"T_maximum": relax.op.maximum, "T_minimum": relax.op.minimum}.get(
        names[0] if len(names) == 1 else ""
    )
    same = x.ty.dtype == call.ty.dtype and str(x.ty.shape) == str(call.ty.shape)
    if op is None or not same or getattr(bound.ty, "ndim", None) != 0:
        return None
    return op(x, bound)


def convert_layout(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's ConvertLayout to DESIRED (conv2d_transpose stays NCHW), what it cannot carry a layout through
    rewritten first (LayoutGaps). Raises what ConvertLayout raises."""
    return relax.transform.ConvertLayout(DESIRED)(mutate_functions(LayoutGaps, mod))


@tvm.transform.module_pass(opt_level=0, name=LAYOUT_PASS)
def channels_last(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Float convolutions in NHWC / HWIO, their neighbours following. A model the conversion cannot
    take stays as it was: the NCHW rules schedule it (never a job's failure). So does a model with a
    grouped convolution (ShuffleNet's): the NCHW rule tiles a group's output channels in registers,
    NHWC has only the windowed rule for it (the light ShuffleNet: 8.4 ms in NCHW, 56 ms in NHWC, one
    run here on a loaded machine)."""
    convs = float_nchw_convs(mod)
    if not convs or any(grouped(c) for c in convs):
        return mod
    try:
        return convert_layout(mod)
    except Exception:  # noqa: BLE001 - the model builds in NCHW instead
        traceback.print_exc()
        return mod


def main_bindings(mod: tvm.IRModule, name: str = "main") -> list:
    body = mod[name].body
    return [b for block in body.blocks for b in block.bindings] if isinstance(body, relax.SeqExpr) else []


def same_kind(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether two binding values are the same operation (an op, a function, or a tuple / field)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, relax.Call):
        if isinstance(a.op, tvm.ir.Op) or isinstance(b.op, tvm.ir.Op):
            return isinstance(a.op, tvm.ir.Op) and a.op.same_as(b.op)
        return getattr(a.op, "name_hint", None) == getattr(b.op, "name_hint", None)
    return True


def computed(mod: tvm.IRModule) -> set:
    """The vars of main that depend on its inputs (the others are weights computed from constants)."""
    out = set(mod["main"].params)
    for b in main_bindings(mod):
        if any(v in out for v in relax.analysis.free_vars(b.value)):
            out.add(b.var)
    return out


def align(before: tvm.IRModule, after: tvm.IRModule) -> dict:
    """Each var of `after`'s main (ConvertLayout's output) -> the var of `before`'s main it stands
    for. ConvertLayout rewrites the bindings in order, each after the transposes it inserts for its
    arguments: each binding of `before` that depends on the inputs is found among the next few of
    `after`, the same operation reading what its arguments stand for (or, failing that, the first
    of the same operation). Weights computed from constants (a bias reshaped, now transposed) are
    not layers, and are left out on both sides."""
    later_computed, before_computed = computed(after), computed(before)
    later = [b for b in main_bindings(after) if b.var in later_computed]
    defs = {b.var: b.value for b in later}
    origin: dict = dict(zip(after["main"].params, before["main"].params, strict=False))

    def source(v):  # through the transposes ConvertLayout inserted (vars of no binding of before)
        while v not in origin and isinstance(defs.get(v), relax.Call) and defs[v].args:
            v = defs[v].args[0]
        return origin.get(v, v)

    def reads_the_same(a, b) -> bool:
        args_a = [source(x) for x in a.args if isinstance(x, relax.Var) and x in later_computed]
        args_b = [x for x in b.args if isinstance(x, relax.Var) and x in before_computed]
        return len(args_a) == len(args_b) and all(x.same_as(y) for x, y in zip(args_a, args_b, strict=True))

    at = 0
    for binding in main_bindings(before):
        if binding.var not in before_computed:
            continue
        window = [c for c in later[at : at + LOOKAHEAD] if same_kind(c.value, binding.value)]
        exact = [
            c for c in window if not isinstance(c.value, relax.Call) or reads_the_same(c.value, binding.value)
        ]
        match = (exact or window or [None])[0]
        if match is not None:
            origin[match.var] = binding.var
            at = later.index(match) + 1
    return origin
