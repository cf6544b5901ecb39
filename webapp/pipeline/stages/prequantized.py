"""Models quantized by another tool (ONNX Runtime's quantize_static, ...): their QDQ form, and the
QLinearConv / QLinearMatMul form rewritten to it, become a float model plus the model's own scales,
which the project's quantizer (webapp.pipeline.stages.quantize) then realizes on its integer kernels.

TVM's ONNX importer reads QuantizeLinear / DequantizeLinear as float arithmetic around float
convolutions. Here, before the import: a DequantizeLinear of a constant (a weight, a bias) becomes
that constant in float; a QuantizeLinear -> DequantizeLinear pair becomes the clip to the range its
8 bits can hold (what it does to the values but for rounding: after a convolution with zero point 0,
a ReLU), and the pair's scale and zero point are kept for the tensor. ConvInteger / MatMulInteger
(dynamic quantization: scales computed at run time) run in float, listed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

QDQ = {"QuantizeLinear", "DequantizeLinear"}
QOPERATORS = {"QLinearConv", "QLinearMatMul"}  # and QGemm, QLINEAR_OPS, QLinearConcat (to_qdq)
INTEGER_OPS = {"ConvInteger", "MatMulInteger"}
DYNAMIC_OPS = {"DynamicQuantizeLinear", "DynamicQuantizeLSTM"}
# Ops ONNX Runtime's QOperator form runs on the 8-bit values themselves, between a QuantizeLinear and
# a DequantizeLinear of one scale: they commute with dequantization (dequantize_first).
ON_8_BITS = {"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze"}


@dataclass
class PreQuantized:
    """The model's own quantization, by ONNX tensor name of the float model."""

    form: str  # "QDQ" or "QLinearConv/QLinearMatMul", as the page names it
    acts: dict[str, tuple[float, int, str]] = field(
        default_factory=dict
    )  # tensor -> scale, zero point, dtype
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # float weight -> its scales (per channel)
    inputs: dict[str, list[str]] = field(default_factory=dict)  # node name -> its input tensors
    in_float: list[str] = field(default_factory=list)  # what runs in float: ops and why
    requantized: int = 0  # weights quantized asymmetrically, given symmetric int8 scales here
    dynamic: int = 0  # layers quantized at run time (quantize_dynamic): their activations calibrated here

    def weight(
        self, name: str, q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, value: np.ndarray
    ) -> None:
        """The int8 scales of the float weight `name` (`value`, dequantized from `q`): the model's own
        where it quantized symmetrically to int8; where asymmetrically (uint8, a zero point), symmetric
        int8 scales from its values, for the integer kernels (counted: requantized)."""
        if q.dtype == np.int8 and (zp is None or not np.any(zp)):
            self.weights[name] = np.atleast_1d(scale).astype(np.float64)
        elif q.dtype in (np.int8, np.uint8):
            self.weights[name] = np.atleast_1d(max(np.abs(value).max(), 1e-12) / 127.0)
            self.requantized += 1

    def recurrent(self, name: str, q: np.ndarray, zp: np.ndarray) -> None:
        """A recurrent layer's quantized weights `name`: its matmuls (the input projection, each step's
        recurrent one, per direction) take int8 scales from their values (no scales: []), the model's
        own where it quantized them symmetrically (max |q| = 127), else counted as requantized."""
        self.weights[name] = np.empty(0)
        self.requantized += int(q.dtype != np.int8 or bool(np.any(zp)))

    def to_json(self) -> dict:
        return {
            "form": self.form,
            "tensors": len(self.acts),
            "weights": len(self.weights),
            "in_float": self.in_float,
        }


def is_prequantized(op_types: set[str]) -> bool:
    return bool(op_types & (QDQ | QOPERATORS | INTEGER_OPS | DYNAMIC_OPS | {"QGemm"}))


def dequantized(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PreQuantized]:
    """(float model, PreQuantized) of a pre-quantized ONNX model (modified in place)."""
    graph = model.graph
    ops = {n.op_type for n in graph.node}
    form = (
        "QLinearConv/QLinearMatMul"
        if ops & QOPERATORS
        else "QDQ"
        if ops & QDQ - {"DynamicQuantizeLinear"}
        else ""
    )
    pre = PreQuantized(form or "dynamic (ConvInteger/MatMulInteger)")
    to_qdq(model)
    dynamic_to_float(model, pre)
    pre.in_float += conv_integer_in_float(model)
    for i, node in enumerate(graph.node):  # every node named: the layers are told apart by name
        node.name = node.name or f"{node.op_type}_{i}"
    constant = Constants(graph)
    moved = dequantize_first(graph, constant)
    keep, added = [], []
    quantizers = {n.output[0]: n for n in graph.node if n.op_type == "QuantizeLinear"}
    for node in graph.node:
        if node.op_type == "DequantizeLinear":
            replacement, tensors = dequantize_node(node, constant, quantizers.get(node.input[0]), pre)
            added += tensors
            if replacement is not node:
                keep += [replacement] if replacement is not None else []
                continue
        keep.append(node)
    used = {i for n in keep for i in n.input} | {o.name for o in graph.output}
    keep = [n for n in keep if n.op_type != "QuantizeLinear" or n.output[0] in used]
    dynamic = [n for n in keep if n.op_type in INTEGER_OPS]
    pre.in_float += [
        f"{n.op_type} {n.name}: dynamic quantization (scales computed at run time), TVM's own integer op"
        for n in dynamic
    ]
    for out, dequantized_input in moved.items():  # the op keeps the grid of its input
        if dequantized_input in pre.acts:
            pre.acts[out] = pre.acts[dequantized_input]
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(added)
    pre.inputs = {n.name: list(n.input) for n in graph.node}
    return model, pre


class Constants:
    """The value of a tensor the graph holds as a constant: an initializer, a Constant, or a
    ConstantOfShape of a constant shape (how some exporters write weights); None for the rest."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.producers = {o: n for n in graph.node for o in n.output}

    def __call__(self, name: str):
        from onnx import numpy_helper

        if name in self.inits:
            return self.inits[name]
        node = self.producers.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        if node is not None and node.op_type == "ConstantOfShape":
            shape = self(node.input[0])
            fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
            dims = [int(d) for d in np.ravel(shape)] if shape is not None else None
            if dims is not None and all(d >= 0 for d in dims) and math.prod(dims) <= 1 << 26:
                fill = np.zeros(1, np.float32) if fill is None else fill
                return np.full(dims, fill.ravel()[0], fill.dtype)
        return None


def dequantize_node(
    node: onnx.NodeProto, constant: Constants, source: onnx.NodeProto | None, pre: PreQuantized
) -> tuple[onnx.NodeProto | None, list[onnx.TensorProto]]:
    """A DequantizeLinear's replacement and the constants it adds: a weight or a bias becomes its float
    constant (no node: None), an activation quantized by `source` (its QuantizeLinear) at one scale a
    Clip to its 8-bit grid's range, its scale and zero point kept in `pre`; the node itself where neither."""
    from onnx import helper, numpy_helper

    q, scale = constant(node.input[0]), constant(node.input[1])
    zp = constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if q is None and source is not None and scale is not None:  # a constant quantized as a tensor
        x = constant(source.input[0])
        q = None if x is None else quantize(x, scale, zp, axis)
    if q is not None and scale is not None:  # a weight or a bias: the constant in float
        value = dequantize(q, scale, zp, axis)
        pre.weight(node.output[0], q, scale, zp, value)
        return None, [numpy_helper.from_array(value, node.output[0])]
    if source is None or scale is None or np.size(scale) != 1:
        return node, []
    zp_value = int(zp) if zp is not None else 0
    dtype = str(zp.dtype) if zp is not None else "uint8"
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    bounds = [
        numpy_helper.from_array(np.array((b - zp_value) * float(scale), np.float32), f"{node.output[0]}_{k}")
        for k, b in (("min", lo), ("max", hi))
    ]
    pre.acts[node.output[0]] = (float(scale), zp_value, dtype)
    clip = helper.make_node(
        "Clip", [source.input[0], *(b.name for b in bounds)], [node.output[0]], name=node.name
    )
    return clip, bounds


def dequantize_first(graph: onnx.GraphProto, constant: Constants) -> dict[str, str]:
    """QuantizeLinear -> MaxPool (or a reshape, ON_8_BITS) -> DequantizeLinears of the same scale and
    zero point, as ONNX Runtime's QOperator form writes a max pool between two QLinearConvs, becomes
    QuantizeLinear -> DequantizeLinear -> MaxPool: the same values (a max, a reshape of affine values
    with a positive scale), and the pair is read as everywhere else. Without it the convolution after
    ResNet's max pool, and a classifier after a Flatten, had no scale for their input and ran in float.
    Returns the op's output, and each former DequantizeLinear's (now an Identity of the op's), -> the
    dequantized tensor the op reads, whose scale they keep."""
    from onnx import helper

    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}

    def params(node) -> tuple:
        zp = constant(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
        return constant(node.input[1]), zp

    def same(a: tuple, b: tuple) -> bool:
        return all(x is not None and np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    before, replaced, moved = {}, {}, {}
    for op in graph.node:
        q = producers.get(op.input[0]) if op.op_type in ON_8_BITS and op.input else None
        dqs = readers.get(op.output[0], [])
        if q is None or q.op_type != "QuantizeLinear" or not dqs or op.output[0] in outputs:
            continue
        if np.size(params(q)[0]) != 1 or not all(
            d.op_type == "DequantizeLinear" and d.input[0] == op.output[0] and same(params(q), params(d))
            for d in dqs
        ):
            continue
        name = f"{op.input[0]}_dequantized"
        before[op.name] = helper.make_node("DequantizeLinear", [op.input[0], *q.input[1:]], [name], name=name)
        op.input[0] = name
        op.output[0] = out = f"{op.output[0]}_float"
        moved[out] = name
        for d in dqs:
            replaced[d.name] = helper.make_node("Identity", [out], [d.output[0]], name=d.name)
            moved[d.output[0]] = name
    nodes = []
    for n in graph.node:  # named, each (dequantized)
        nodes += [before[n.name]] if n.name in before else []
        nodes.append(replaced.get(n.name, n))
    del graph.node[:]
    graph.node.extend(nodes)
    return moved


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    """QuantizeLinear of a constant: x / scale rounded to even, plus the zero point, saturated to its
    8 bits (uint8 where no zero point says otherwise)."""
    dtype = np.dtype(zp.dtype) if zp is not None else np.dtype(np.uint8)
    scale = np.asarray(scale, np.float64)
    zp = np.zeros_like(scale) if zp is None else np.asarray(zp, np.float64)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    info = np.iinfo(dtype)
    return np.clip(np.rint(x / scale) + zp, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int) -> np.ndarray:
    q = q.astype(np.float64)
    scale = np.asarray(scale, np.float64)
    zp = np.zeros_like(scale) if zp is None else np.asarray(zp, np.float64)
    if scale.ndim == 1 and scale.size > 1:  # per channel, along `axis`
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((q - zp) * scale).astype(np.float32)


class GraphIndex:
    """An ONNX graph's initializers as arrays, and who writes and who reads each tensor."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.graph = graph
        self.inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.producers = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.nested = {name for n in graph.node for g in subgraphs(n) for name in names_used(g)}

    def only(self, tensor: str, op: str) -> onnx.NodeProto | None:
        """The one node reading `tensor`, if it is an `op` and no branch reads it too."""
        users = self.consumers.get(tensor, [])
        ok = len(users) == 1 and users[0].op_type == op and tensor not in self.nested
        return users[0] if ok else None

    def weights(
        self, pre: PreQuantized, q: str, scale: str, zp: str | None, axis: int, name: str
    ) -> str | None:
        """The float weights of a quantized constant, added as `name`, with their int8 scales."""
        from onnx import numpy_helper

        inits = self.inits
        if q not in inits or scale not in inits or (zp and zp not in inits):
            return None
        zero = inits[zp] if zp else None
        value = dequantize(inits[q], inits[scale], zero, axis)
        pre.weight(name, inits[q], inits[scale], zero, value)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def float_bias(self, tensor: str) -> str:
        """The float bias a Reshape(Cast(Floor(Div(bias, scale)))) quantized at run time, or ""."""
        for op in ("Reshape", "Cast", "Floor", "Div"):
            node = self.producers.get(tensor)
            if node is None or node.op_type != op:
                return ""
            tensor = node.input[0]
        return tensor if tensor in self.inits and self.inits[tensor].ndim == 1 else ""


def dynamic_to_float(model: onnx.ModelProto, pre: PreQuantized) -> None:
    """quantize_dynamic's layers as float layers with the model's weight scales: DynamicQuantizeLinear(x)
    -> MatMulInteger / ConvInteger(x_q, w_q) -> Cast -> Mul(x_scale * w_scale) becomes MatMul / Conv(x,
    w) with w the dequantized weights, and DynamicQuantizeLSTM (ONNX Runtime's contrib operator) an LSTM
    with its weights dequantized, its matmuls int8 layers (PreQuantized.recurrent). The integer kernels
    then take the weights' scales, and the activations' (which the model computes on each run) are
    calibrated like a float model's."""
    graph = model.graph
    index = GraphIndex(graph)
    replaced: dict = {}  # node id -> its float replacement (None: removed)
    for node in graph.node:
        if node.op_type in INTEGER_OPS:
            integer_layer(index, node, pre, replaced)
        elif node.op_type == "DynamicQuantizeLSTM":
            dynamic_lstm(index, node, pre, replaced)
    out = [new for node in graph.node if (new := replaced.get(id(node), node)) is not None]
    del graph.node[:]
    graph.node.extend(out)
    remove_dead(graph)


def integer_layer(index: GraphIndex, node: onnx.NodeProto, pre: PreQuantized, replaced: dict) -> None:
    """A MatMulInteger / ConvInteger of quantize_dynamic's, with its Cast and Mul by the scales, as one
    float MatMul / Conv on the dequantized weights (in `replaced`); left as it is where it is not."""
    from onnx import helper

    dq = index.producers.get(node.input[0])
    add, b = index.only(node.output[0], "Add"), ""  # older quantize_dynamic: the bias added in int32
    if add is not None:
        b = index.float_bias(next(i for i in add.input if i != node.output[0]))
    cast = index.only(add.output[0] if add is not None and b else node.output[0], "Cast")
    mul = cast and index.only(cast.output[0], "Mul")
    scales = mul and index.producers.get(
        # mul is a node only where cast is one
        next(i for i in mul.input if i != cast.output[0])  # type: ignore[union-attr]
    )
    if not (dq and dq.op_type == "DynamicQuantizeLinear" and scales and scales.op_type == "Mul"):
        return
    assert cast is not None and mul is not None  # scales is a node only where both are
    w_scale = next((i for i in scales.input if i != dq.output[1]), "")
    zp = node.input[3] if len(node.input) > 3 else None
    axis = 0 if node.op_type == "ConvInteger" else 1
    w = index.weights(pre, node.input[1], w_scale, zp, axis, f"{node.name or node.output[0]}_w")
    if w is None:
        return
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = "Conv" if node.op_type == "ConvInteger" else "MatMul"
    inputs = [dq.input[0], w] + ([b] if b and op == "Conv" else [])
    replaced[id(node)] = helper.make_node(op, inputs, [mul.output[0]], name=node.name, **attrs)
    replaced[id(cast)] = replaced[id(mul)] = None
    if b:
        replaced[id(add)] = None
    pre.dynamic += 1


def dynamic_lstm(index: GraphIndex, node: onnx.NodeProto, pre: PreQuantized, replaced: dict) -> None:
    """ONNX Runtime's DynamicQuantizeLSTM as an LSTM on its dequantized weights (in `replaced`), whose
    two weights are int8 layers (PreQuantized.recurrent)."""
    from onnx import helper, numpy_helper

    inits = index.inits
    x, wq, rq, *rest = list(node.input) + [""] * (12 - len(node.input))
    name = node.name or node.output[0] or f"DynamicQuantizeLSTM_{len(replaced)}"
    if any(t not in inits for t in (wq, rq, *rest[5:9])):
        return
    w, r = f"{name}_W", f"{name}_R"
    for q, scale, zp, t in ((wq, rest[5], rest[6], w), (rq, rest[7], rest[8], r)):
        d = inits[q].shape[0]  # [directions, input, 4 * hidden], scales per direction or gate
        value = (inits[q].astype(np.float64) - inits[zp].reshape(d, 1, -1)) * inits[scale].reshape(d, 1, -1)
        value = value.astype(np.float32).transpose(0, 2, 1)  # LSTM's [directions, 4 * hidden, input]
        index.graph.initializer.append(numpy_helper.from_array(value, t))
        pre.recurrent(t, inits[q], inits[zp])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = [x, w, r, *rest[:5]]
    while inputs and not inputs[-1]:
        inputs.pop()
    replaced[id(node)] = helper.make_node("LSTM", inputs, list(node.output), name=node.name, **attrs)
    pre.dynamic += 1


def remove_dead(graph: onnx.GraphProto) -> None:
    """Nodes none of whose outputs is used (the quantizers a rewrite left behind), by the graph or by
    any branch within it, however deep."""
    while True:
        used = names_used(graph)
        live = [n for n in graph.node if any(o in used for o in n.output)]
        if len(live) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(live)


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds (an If's branches, a Loop's body)."""
    return [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def names_used(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a graph reads or returns, its branches' (at any depth) included."""
    used = {o.name for o in graph.output}
    for n in graph.node:
        used.update(n.input)
        for g in subgraphs(n):
            used |= names_used(g)
    return used


# ONNX Runtime's QOperator form beyond QLinearConv / QLinearMatMul (its contrib operators): the float op,
# the quantized inputs as (tensor, scale, zero point) positions, and the output's (scale, zero point)
QLINEAR_OPS = {
    "QLinearAdd": ("Add", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QLinearMul": ("Mul", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", [(0, 1, 2)], (3, 4)),
    "QLinearAveragePool": ("AveragePool", [(0, 1, 2)], (3, 4)),
    "QLinearSoftmax": ("Softmax", [(0, 1, 2)], (3, 4)),
    "QLinearSigmoid": ("Sigmoid", [(0, 1, 2)], (3, 4)),
    "QLinearLeakyRelu": ("LeakyRelu", [(0, 1, 2)], (3, 4)),
    "QLinearReduceMean": ("ReduceMean", [(0, 1, 2)], (3, 4)),
}
DROPPED_ATTRIBUTES = {"channels_last", "opset"}  # of the contrib ops, not their float op's


def to_qdq(model: onnx.ModelProto) -> None:
    """QLinearConv / QLinearMatMul / QGemm nodes as DequantizeLinear -> Conv / MatMul / Gemm ->
    QuantizeLinear, and ONNX Runtime's other QLinear* operators (QLINEAR_OPS, QLinearConcat) likewise
    around their float op."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    out = []

    def dq(name: str, x: str, scale: str, zp: str, **axis) -> str:
        out.append(
            helper.make_node(
                "DequantizeLinear", [x, scale, zp] if zp else [x, scale], [name], name=name, **axis
            )
        )
        return name

    def bias(name: str, b: str, xs: str, ws: str) -> str:
        """An int32 bias, whose scale is the input's times the weights'."""
        bias_scale = numpy_helper.to_array(inits[xs]) * numpy_helper.to_array(inits[ws])
        graph.initializer.append(numpy_helper.from_array(bias_scale.astype(np.float32), f"{name}_b_scale"))
        return dq(f"{name}_b", b, f"{name}_b_scale", "", axis=0)

    for node in graph.node:
        op, name = node.op_type, node.name or f"{node.op_type}_{len(out)}"
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = list(node.input) + [""] * 9
        y = (inputs[6], inputs[7]) if op in QOPERATORS else None
        if op in QOPERATORS:
            x = dq(f"{name}_x", *inputs[0:3])
            w = dq(f"{name}_w", *inputs[3:6], axis=0 if op == "QLinearConv" else 1)
            ins = [x, w] + (
                [bias(name, inputs[8], inputs[1], inputs[4])] if op == "QLinearConv" and inputs[8] else []
            )
            float_op = "Conv" if op == "QLinearConv" else "MatMul"
        elif op == "QGemm" and inputs[4] in inits:
            x = dq(f"{name}_x", *inputs[0:3])
            w = dq(f"{name}_w", *inputs[3:6], axis=0 if attrs.get("transB") else 1)
            ins = [x, w] + ([bias(name, inputs[6], inputs[1], inputs[4])] if inputs[6] else [])
            y, float_op = ((inputs[7], inputs[8]) if inputs[7] else None), "Gemm"
        elif op in QLINEAR_OPS and attrs.get("channels_last", 0) == 0:
            float_op, quantized, (s, z) = QLINEAR_OPS[op]
            ins = [dq(f"{name}_{k}", *(inputs[i] for i in t)) for k, t in enumerate(quantized)]
            y = inputs[s], inputs[z]
        elif op == "QLinearConcat":
            triples = [inputs[i : i + 3] for i in range(2, len(node.input), 3)]
            ins = [dq(f"{name}_{k}", *t) for k, t in enumerate(triples)]
            y, float_op = (inputs[0], inputs[1]), "Concat"
        else:
            out.append(node)
            continue
        attrs = {k: v for k, v in attrs.items() if k not in DROPPED_ATTRIBUTES}
        result = f"{name}_y" if y else node.output[0]
        out.append(helper.make_node(float_op, ins, [result], name=name, **attrs))
        if y:
            out.append(helper.make_node("QuantizeLinear", [result, *y], [node.output[0]], name=f"{name}_q"))
    del graph.node[:]
    graph.node.extend(out)


def conv_integer_in_float(model: onnx.ModelProto) -> list[str]:
    """ConvInteger (dynamic quantization, which TVM's importer does not read) as the same arithmetic
    in float: Conv(x - x_zero_point, w - w_zero_point), cast back to the int32 it returns."""
    from onnx import TensorProto, helper

    graph, out, listed = model.graph, [], []
    for i, node in enumerate(graph.node):
        if node.op_type != "ConvInteger":
            out.append(node)
            continue
        name = node.name or f"ConvInteger_{i}"
        centred = []
        for k, tensor in enumerate(node.input[:2]):
            out.append(helper.make_node("Cast", [tensor], [f"{name}_{k}_f"], to=TensorProto.FLOAT))
            value = f"{name}_{k}_f"
            if len(node.input) > k + 2 and node.input[k + 2]:
                zp = node.input[k + 2]
                out.append(helper.make_node("Cast", [zp], [f"{name}_{k}_zp"], to=TensorProto.FLOAT))
                out.append(helper.make_node("Sub", [value, f"{name}_{k}_zp"], [f"{name}_{k}_c"]))
                value = f"{name}_{k}_c"
            centred.append(value)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        out.append(helper.make_node("Conv", centred, [f"{name}_y"], name=name, **attrs))
        out.append(helper.make_node("Cast", [f"{name}_y"], [node.output[0]], to=TensorProto.INT32))
        listed.append(
            f"ConvInteger {name}: dynamic quantization (scales computed at run time), run as a float Conv"
        )
    del graph.node[:]
    graph.node.extend(out)
    return listed
