"""Annotate: find the layers to quantize in a Relax function.

A layer is a conv2d or a matmul whose weight is a constant, with what follows it that quantization
absorbs: a constant per-channel bias add, then a ReLU or a clip (ReLU6). The function is expected
without dataflow blocks (relax.transform.ToNonDataflow), so that any tensor can be made an output
for calibration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax


@dataclass
class Layer:
    index: int
    kind: str  # "conv2d" | "matmul"
    head: relax.Var  # the conv2d / matmul binding
    data: relax.Expr  # its float input (a Var)
    weight: np.ndarray
    attrs: relax.op.op_attrs.Conv2DAttrs | None  # the conv2d attributes (None for matmul)
    bias: np.ndarray | None = None  # per output channel
    activation: tuple | None = None  # ("relu",) or ("clip", lo, hi)
    # the layer's float result: head, or the last absorbed binding (find_layers sets it; the default
    # only follows the fields before it)
    out: relax.Var = None
    absorbed: list[relax.Var] = field(default_factory=list)
    quantized: bool = True
    given_scale: np.ndarray | None = None  # a pre-quantized model's weight scales (per output channel)
    weight_bits: int | None = None  # its weights' bits where not the job's (layer_precision "int4")

    @property
    def name(self) -> str:
        return f"{self.index:02d} {self.kind} {'x'.join(str(d) for d in self.weight.shape)}"

    @property
    def channel_axis(self) -> int:
        """The weight axis of the output channels: OIHW -> 0, [K, N] -> 1."""
        return 0 if self.kind == "conv2d" else 1

    @property
    def nonnegative_out(self) -> bool:
        return self.activation is not None and (self.activation[0] == "relu" or self.activation[1] >= 0)


def bindings(func: relax.Function) -> list[relax.VarBinding]:
    return [b for block in func.body.blocks for b in block.bindings]


def op_name(value: relax.Expr) -> str:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else ""


def users(func: relax.Function) -> dict[relax.Var, list]:
    """Var -> the bindings that read it ("output" for the function's result)."""
    found: dict = {}
    for b in bindings(func):
        for v in relax.analysis.free_vars(b.value):
            found.setdefault(v, []).append(b)
    for v in relax.analysis.free_vars(func.body.body):
        found.setdefault(v, []).append("output")
    return found


def constant(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def per_channel(values: np.ndarray, channels: int, kind: str) -> np.ndarray | None:
    """A bias constant as one value per output channel, or None when it is not one."""
    if values.size != channels:
        return None
    shape = [d for d in values.shape if d != 1] or [1]
    if kind == "conv2d" and values.ndim >= 3 and values.shape[-3] == channels:
        return values.reshape(-1)
    if kind == "matmul" and values.shape[-1] == channels and shape == [channels]:
        return values.reshape(-1)
    return None


def find_layers(func: relax.Function) -> list[Layer]:
    uses = users(func)
    layers: list[Layer] = []
    for b in bindings(func):
        name, value = op_name(b.value), b.value
        if name == "relax.nn.conv2d":
            weight = constant(value.args[1])
            attrs = value.attrs
            if weight is None or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
                continue
            if weight.dtype != np.float32:
                continue
            kind = "conv2d"
        elif name == "relax.matmul":
            weight = constant(value.args[1])
            if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
                continue
            kind, attrs = "matmul", None
        else:
            continue
        layer = Layer(len(layers), kind, b.var, value.args[0], weight, attrs, out=b.var)
        channels = weight.shape[layer.channel_axis]
        # Absorb a bias add, then a ReLU / clip, each the only reader of what it reads.
        nxt = single_user(uses, layer.out)
        if nxt is not None and op_name(nxt.value) == "relax.add":
            a, c = nxt.value.args
            bias = constant(c) if a.same_as(layer.out) else constant(a)
            bias = per_channel(bias, channels, kind) if bias is not None else None
            if bias is not None:
                layer.bias, layer.out = bias, nxt.var
                layer.absorbed.append(nxt.var)
                nxt = single_user(uses, layer.out)
        if nxt is not None and op_name(nxt.value) == "relax.nn.relu":
            layer.activation, layer.out = ("relu",), nxt.var
            layer.absorbed.append(nxt.var)
        elif nxt is not None and op_name(nxt.value) == "relax.clip":
            lo, hi = (float(getattr(a.value, "value", a.value)) for a in nxt.value.args[1:3])
            if lo == 0.0:
                layer.activation, layer.out = ("clip", lo, hi), nxt.var
                layer.absorbed.append(nxt.var)
        layers.append(layer)
    return layers


def single_user(uses: dict, var: relax.Var) -> relax.VarBinding | None:
    readers = uses.get(var, [])
    return readers[0] if len(readers) == 1 and readers[0] != "output" else None


def skip_layers(layers: list[Layer], skip_first: bool, skip_last: bool) -> None:
    if layers and skip_first:
        layers[0].quantized = False
    if layers and skip_last:
        layers[-1].quantized = False


def set_precision(layers: list[Layer], precision: dict | None) -> None:
    """JobOptions.layer_precision on the layers: "float" keeps a layer in float, "int4" gives it 4-bit
    weights (its activations stay 8-bit), "int8" leaves it as quantized."""
    if not precision:
        return
    names = [layer.name for layer in layers]
    unknown = [name for name in precision if name not in names]
    if unknown:
        first = ", ".join(unknown[:3])
        raise ValueError(
            f"layer_precision names {len(unknown)} layer(s) this model does not have ({first}); its layers "
            f"are named as the quantization table lists them: {', '.join(names[:3])}, ..."
        )
    for layer in layers:
        if precision.get(layer.name) == "float":
            layer.quantized = False
        elif precision.get(layer.name) == "int4":
            layer.weight_bits = 4
