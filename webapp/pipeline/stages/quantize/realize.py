"""Realize: the float function rewritten with integer layers.

Each quantized layer becomes

    uint8 input (padded with its zero point) -> conv2d / matmul with int8 weights, int32 accumulation
    -> + int32 bias (which also cancels the input's zero point)
    -> requantize to the next layer's uint8 (a rounding shift when every scale is a power of two, a
       float32 multiply rounded half up otherwise, or on Arm a fixed-point multiply in int64), the
       ReLU / ReLU6 being the clip of that step

when every reader of its result is another quantized layer, so consecutive layers stay in 8 bits.
At 8 bits, a float op's result that a quantized layer reads (a residual add's sum) is stored in 8
bits only, and so is a layer's result that several ops read, some of them float ops: the float ops
dequantize on entry, in their own kernels, so the residual streams between kernels are bytes, not
float32s, as in ONNX Runtime's QDQ models. Otherwise (a result that one float op reads, the model's
output, and at fewer bits any result a float op reads) the accumulator is scaled back to float32;
a quantized reader of a float tensor quantizes it on entry (in the kernel that computes it, where
fusion allows). Measured (in-process A/B against float32 residual streams, 30 rounds): ResNet-50 int8
11.50 against 12.42 ms, MobileNetV2 1.689 against 1.723; a ResNet-50 layer-1 expand convolution, which
reads the block's input as its residual, 0.228 against 0.298 ms a call.

On Arm (Target.requantizes_fixed_point) an 8-bit result that is an affine function of int32 values
(Affine: a layer's accumulator, a dequantized 8-bit tensor, a residual add of the two) is requantized
from those integers in fixed point (fixed_point_multiply), the float values between them left unused:
no float vector instruction in a residual block's epilogue, where under QEMU each one is a call into
soft-float code (docs/quantization.md, On other targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from webapp.pipeline.stages.quantize.annotate import Layer, bindings, op_name, users
from webapp.pipeline.stages.quantize.scales import (
    ActQuant,
    fit_pairs,
    fixed_point_terms,
    is_power_of_two,
    pair_sums,
    power2_up,
    quantize_weights,
    weight_scales,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


@dataclass
class LayerQuant:
    """How one layer was quantized, for the page, result.json and the tests."""

    layer: Layer
    input: ActQuant
    weight_scale: np.ndarray  # per output channel (or one value)
    weight_q: np.ndarray  # int8 storage of the b-bit weights
    bias_q: np.ndarray  # int32, zero-point correction included
    multiplier: np.ndarray  # input scale x weight scale / output scale (requantize) or x 1 (float)
    output: ActQuant | None  # the uint8 result's quantization; None when the result is float32
    requantize: str  # "shift" | "float32 multiply" | "fixed point" | "float" (the result stays float32)


@dataclass
class Affine:
    """A float tensor as sum(int32 tensor x multiplier) + offset: the multipliers and the offset
    (float64) per output channel or one value."""

    terms: list  # (int32 relax value, multiplier)
    offset: np.ndarray | float = 0.0

    def __add__(self, other: Affine) -> Affine:
        return Affine([*self.terms, *other.terms], self.offset + other.offset)


# A convolution of this many groups or fewer (ShuffleNet's 1x1 convolutions of 3, 4 or 8 groups; not
# a depthwise one, nor ResNeXt's 32) runs as one dense convolution with zeros between its groups
# (block_diagonal): `groups` times the multiplies, on the dot-product kernels, which are faster than
# that many times the windowed rule a grouped int8 convolution otherwise gets.
DENSE_GROUPS = 8


def const(values: ArrayLike, dtype: str) -> relax.Expr:
    return relax.const(np.ascontiguousarray(np.asarray(values).astype(dtype)), dtype)


def scalar(value: float | np.ndarray, dtype: str, like: relax.Expr) -> relax.Expr:
    """A constant shaped [1, 1, ...] like `like`: layout conversion (ConvertLayout) follows binary ops
    whose operands have the same rank, not a 0-d one."""
    ndim = len(like.ty.shape.values) if like.ty.shape is not None else 0
    return const(np.full([1] * ndim, value), dtype)


def substitute(expr: relax.Expr, env: dict) -> relax.Expr:
    """`expr` with its variables replaced through env (Call, Tuple, TupleGetItem, leaves)."""
    if isinstance(expr, relax.Var):
        return env.get(expr, expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute(a, env) for a in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(f, env) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, env), expr.index)
    return expr


class Realizer:
    def __init__(
        self,
        func,
        layers: list[Layer],
        acts: dict,
        options,
        expose=False,
        pair_limit=None,
        means=None,
        saturating=False,
        fixed_point=False,
    ):
        self.func, self.bits = func, options.bits
        self.means = means or {}  # a layer's float input Var -> its mean per input channel (calibration)
        # the most a pair of 8-bit weights may add up to, where the target's int8 kernels sum pairs of
        # products in 16 bits (Target.int8_pair_limit; None: any)
        self.pair_limit = pair_limit if options.bits == 8 else None
        # whether the target's float -> int conversion saturates (Target.converts_saturating): then a
        # rounded value converts first and is clipped in int32 (to_bits)
        self.saturating = saturating
        # whether an 8-bit result is requantized by an integer (fixed-point) multiply of the int32
        # values it is an affine function of (Target.requantizes_fixed_point), instead of in float
        self.fixed_point = fixed_point
        # original Var -> its float value as an affine function of int32 tensors (Affine), where it is
        # one: a layer's float result, a dequantized 8-bit tensor, their sums (a residual add)
        self.affine: dict = {}
        self.weight_mode, self.per_channel = options.weight_scale, options.per_channel
        # also return every quantized layer's result, then its input, in float32 as the integer model has them
        self.expose = expose
        self.layers = {layer.head: layer for layer in layers if layer.quantized}
        self.absorbed = {v for layer in self.layers.values() for v in layer.absorbed}
        self.acts = acts  # float tensor Var -> ActQuant, for every input of a quantized layer
        self.uses = users(func)
        self.bb = relax.BlockBuilder()
        self.floats: dict = {}  # original Var -> its float32 value in the new function
        self.quants: dict = {}  # original Var -> its 8-bit value (uint8, or int8 on Arm)
        self.report: list[LayerQuant] = []
        # each var this emits -> the vars of the float model it computes (a layer: its head and what
        # it absorbed; a quantization: the var quantized; a float op: its own), as the layer map reads
        self.origin: dict[str, list[str]] = {}
        self.current: list[str] | None = None  # what the vars emitted now compute

    def emit(self, expr: relax.Expr, name: str = "q") -> relax.Var:
        """`expr` bound to a var named after `name`, its nested calls first (each a var of its own): a
        name the block builder chose itself ("lv", "lv1", ...) could be a var name of the float model,
        which the layer map (webapp.pipeline.stages.optimize.Fusion) reads as that var."""
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            args = [self.emit(a, f"{name}_in") if isinstance(a, relax.Call) else a for a in expr.args]
            expr = relax.Call(expr.op, args, expr.attrs, expr.ty_args)
        var = self.bb.emit(expr, name_hint=name)
        if self.current is not None:
            self.origin[var.name] = list(self.current)
        return var

    def float_value(self, var: relax.Var) -> relax.Var:
        if var not in self.floats:  # only a requantized layer result: dequantize it
            p = self.acts[var]
            q = self.emit(R.astype(self.quants[var], "int32"))
            shifted = self.emit(R.subtract(q, scalar(p.zero_point, "int32", q))) if p.zero_point else q
            self.floats[var] = self.emit(
                R.multiply(R.astype(shifted, "float32"), scalar(p.scale, "float32", q))
            )
            self.affine[var] = Affine([(q, np.float64(p.scale))], -p.zero_point * np.float64(p.scale))
        return self.floats[var]

    def quant_value(self, var: relax.Var) -> relax.Var:
        """`var` in 8 bits. The quantizing ops belong to what computed `var` (they fuse into its kernel),
        not to the layer that reads it; a model input's to its first reader."""
        if var in self.quants:
            return self.quants[var]
        reader = self.current  # a model input is quantized for the layer reading it (its head alone)
        self.current = (reader or [])[:1] if var in self.func.params else [var.name]
        try:
            return self.quantize(var)
        finally:
            self.current = reader

    def quantize(self, var: relax.Var) -> relax.Var:
        if var not in self.quants and self.fixed_point and var in self.affine:
            p = self.acts[var]
            q = self.fixed_point_multiply(self.affine[var], p, p.qmin, p.qmax, "quantized")
            if q is not None:
                self.quants[var] = q
        if var not in self.quants:
            p, x = self.acts[var], self.float_value(var)
            # floor(x * (1 / scale) + zero point + 1/2): round half up, which vectorizes (for
            # R.round's half away from zero LLVM calls roundf value by value)
            shifted = R.add(
                R.multiply(x, scalar(1.0 / p.scale, "float32", x)), scalar(p.zero_point + 0.5, "float32", x)
            )
            q = self.emit(R.floor(shifted), "quantize")
            self.quants[var] = self.to_bits(q, p.qmin, p.qmax, p.dtype, "quantized")
        return self.quants[var]

    def run(self) -> relax.Function:
        bb, func = self.bb, self.func
        with bb.function("main", list(func.params), attrs=dict(func.attrs or {})):
            with bb.dataflow():
                for p in func.params:
                    self.floats[p] = p
                for b in bindings(func):
                    if b.var in self.layers:
                        self.current = [b.var.name]
                        self.layer(self.layers[b.var])
                    elif b.var not in self.absorbed:
                        self.current = [b.var.name]
                        if self.relu_in_the_clip(b):  # its input is quantized in its place
                            self.floats[b.var] = self.float_value(b.value.args[0])
                            if b.value.args[0] in self.affine:
                                self.affine[b.var] = self.affine[b.value.args[0]]
                        else:
                            value = substitute(b.value, {v: self.float_value(v) for v in free_vars(b.value)})
                            self.floats[b.var] = self.emit(value, b.var.name)
                            self.note_affine(b)
                        if self.stored_in_8_bits(b.var):  # e.g. a residual add feeding the next layer
                            self.quant_value(b.var)
                            del self.floats[b.var]  # its float readers dequantize the 8 bits
                    self.current = None
                body = func.body.body
                if self.expose:
                    exposed = [r.layer.out for r in self.report] + [r.layer.data for r in self.report]
                    body = relax.Tuple([body, *exposed])
                out = bb.emit_output(substitute(body, {v: self.float_value(v) for v in free_vars(body)}))
            bb.emit_func_output(out)
        # the float values that a fixed-point requantization made unread
        return relax.analysis.remove_all_unused(bb.get()["main"])

    def note_affine(self, binding: relax.VarBinding) -> None:
        """A float add of two affine values (a residual block's sum) is affine too."""
        args = binding.value.args if isinstance(binding.value, relax.Call) else []
        if op_name(binding.value) == "relax.add" and all(a in self.affine for a in args):
            self.affine[binding.var] = self.affine[args[0]] + self.affine[args[1]]

    def stored_in_8_bits(self, var: relax.Var) -> bool:
        """At 8 bits, a tensor with a calibrated quantization that is not the model's output is stored
        as 8 bits even where float ops read it (residual adds, pooling): they dequantize it on entry,
        in their own kernel. Between kernels a model then moves bytes, not float32s, as ONNX Runtime's
        QDQ models do. Narrower quantizations keep such tensors in float32 (a residual stream of 4 or 2
        bits would lose too much)."""
        return (
            self.bits == 8
            and var in self.acts
            and not self.reaches_output(var)
            and str(getattr(var.ty, "dtype", "")) == "float32"
        )

    def relu_in_the_clip(self, binding: relax.VarBinding) -> bool:
        """A ReLU whose result is stored in 8 bits that are never below their zero point (a residual
        block's ReLU(h + y)): its input is quantized in its place, the clip at the zero point being the
        ReLU, bit for bit (floor(x / scale + zero point + 1/2) is at most the zero point where x <= 0).
        That is a float max less per value; under QEMU (the emulated boards) a float max is one of the
        dearest vector instructions, about 60 ns against 1 ns for an integer max (docs/quantization.md)."""
        if op_name(binding.value) != "relax.nn.relu" or not self.stored_in_8_bits(binding.var):
            return False
        p = self.acts[binding.var]
        return p.qmin >= p.zero_point

    def reaches_output(self, var: relax.Var) -> bool:
        """The function returns `var`, directly or through bindings that only rename or group it."""
        return any(
            r == "output"
            if isinstance(r, str)
            else isinstance(r.value, relax.Var | relax.Tuple) and self.reaches_output(r.var)
            for r in self.uses.get(var, [])
        )

    def readers_quantized(self, var: relax.Var) -> tuple[bool, bool]:
        """(some reader is a quantized layer, some reader needs float32)."""
        readers = self.uses.get(var, [])
        quant = [
            r != "output" and r.var in self.layers and self.layers[r.var].data.same_as(var) for r in readers
        ]
        return any(quant), not all(quant)

    def layer(self, layer: Layer) -> None:
        p_in = self.acts[layer.data]
        xq = self.quant_value(layer.data)
        w = layer.weight
        axis = layer.channel_axis
        w_scale = self.weight_scale(layer)
        wq = quantize_weights(w, w_scale, layer.weight_bits or self.bits)
        if self.pair_limit is not None:
            wq = fit_pairs(wq, w / w_scale, self.pair_limit, pair_axis(layer))
        channels = w.shape[axis]
        reduce = tuple(i for i in range(w.ndim) if i != axis)
        w_sum = wq.astype(np.int64).sum(axis=reduce)
        flat_scale = np.broadcast_to(w_scale.reshape(-1), (channels,)).astype(np.float64)
        acc_scale = p_in.scale * flat_scale
        bias = layer.bias if layer.bias is not None else np.zeros(channels)
        bias = bias.reshape(-1) + self.rounding_bias(layer, w - wq * w_scale)
        bias_q = np.round(bias / acc_scale).astype(np.int64) - p_in.zero_point * w_sum
        shape = (1, channels, 1, 1) if layer.kind == "conv2d" else (channels,)

        if layer.kind == "conv2d":
            acc, wq = self.integer_conv2d(layer, xq, wq, p_in)  # wq: block-diagonal where it was grouped
        else:
            acc = self.emit(R.matmul(xq, const(wq, "int8"), out_dtype="int32"), "acc")
        # the accumulator and bias as an affine value, the bias in its offset: a fixed-point
        # requantization widens the accumulator itself (see passes/legalize.py) and adds the bias's
        # share to its rounding constant, one add less
        products = Affine([(acc, acc_scale.reshape(shape))], (bias_q * acc_scale).reshape(shape))
        if np.any(bias_q):
            acc = self.emit(R.add(acc, const(bias_q.reshape(shape), "int32")), "acc")

        # from here on the layer computes what it absorbed too (its bias add, its ReLU)
        self.current = [*(self.current or []), *(v.name for v in layer.absorbed)]
        to_quant, to_float = self.readers_quantized(layer.out)
        # Requantized straight from the accumulator when only quantized layers read the result;
        # otherwise the kernel writes float32 and the readers that want 8 bits quantize that.
        # At 8 bits also when several ops read it, one of them a float op (stored_in_8_bits): a result
        # that one float op reads alone is left to it in float32, as that op is fused into this
        # layer's kernel in most models (ResNet's residual add), where 8 bits would only cost time.
        shared = len(self.uses.get(layer.out, [])) > 1
        p_out: ActQuant | None  # None: the result stays float32
        if to_quant and not to_float or shared and self.stored_in_8_bits(layer.out):
            p_out, multiplier, how = self.requantized_output(layer, acc, products, acc_scale, shape)
        else:
            p_out, multiplier, how = None, acc_scale, "float"
            self.float_output(layer, acc, products, acc_scale, shape)
        self.report.append(
            LayerQuant(layer, p_in, flat_scale, wq, bias_q, np.asarray(multiplier), p_out, how)
        )

    def integer_conv2d(
        self, layer: Layer, xq: relax.Var, wq: np.ndarray, p_in: ActQuant
    ) -> tuple[relax.Var, np.ndarray]:
        """The layer's convolution in integers into int32: its input padded with its zero point, its
        input channels to a multiple of 4 (the dot-product instructions take 4 a time). (Its output, its
        weights as convolved: a grouped convolution of few groups made one block-diagonal.)"""
        a = layer.attrs
        assert a is not None  # a conv2d's
        pad = [int(v) for v in a.padding]  # top, left, bottom, right
        groups = int(a.groups)
        if 1 < groups <= DENSE_GROUPS and wq.shape[1] > 1:
            wq, groups = block_diagonal(wq, groups), 1
        # Input channels padded to a multiple of 4 (zero weights) when they are not one, for the
        # dot-product instructions (4 channels an instruction): an RGB image's 3, say.
        extra = -wq.shape[1] % 4 if groups == 1 else 0
        weight = np.pad(wq, ((0, 0), (0, extra), (0, 0), (0, 0)))
        # The convolution pads with 0, the zero point of non-negative inputs; the rest is padded
        # here, with the input's zero point.
        inner = pad if p_in.zero_point == 0 else [0, 0, 0, 0]
        outer = [pad[0], pad[2], pad[1], pad[3]] if p_in.zero_point else [0, 0, 0, 0]
        if any(outer) or extra:
            xq = self.emit(
                R.nn.pad(xq, [0, 0, 0, extra, *outer], "constant", float(p_in.zero_point)), "padded"
            )
        conv = R.nn.conv2d(
            xq,
            const(weight, "int8"),
            strides=[int(s) for s in a.strides],
            padding=inner,
            dilation=[int(d) for d in a.dilation],
            groups=groups,
            out_dtype="int32",
        )
        return self.emit(conv, "acc"), wq

    def requantized_output(
        self, layer: Layer, acc: relax.Var, products: Affine, acc_scale: np.ndarray, shape: tuple
    ) -> tuple[ActQuant, np.ndarray, str]:
        """The layer's result requantized to 8 bits from its accumulator (with its ReLU's clip): its
        quantization parameters, the multiplier, and how (fixed point, or in float)."""
        p_out = self.acts[layer.out]
        multiplier = acc_scale / p_out.scale
        lo, hi = p_out.qmin, p_out.qmax
        if layer.activation is not None:  # ReLU / ReLU6: clipped at the zero point / at hi
            lo = max(lo, p_out.zero_point)
            if layer.activation[0] == "clip":
                hi = min(hi, p_out.zero_point + int(np.floor(layer.activation[2] / p_out.scale)))
        q = None
        if self.fixed_point and not is_power_of_two(multiplier):
            q = self.fixed_point_multiply(products, p_out, lo, hi, "requantized")
        if q is not None:
            self.quants[layer.out], how = q, "fixed point"
        else:
            y, how = self.requantize(acc, multiplier.reshape(shape), p_out.zero_point)
            self.quants[layer.out] = self.to_bits(y, lo, hi, p_out.dtype, "requantized")
        return p_out, multiplier, how

    def float_output(
        self, layer: Layer, acc: relax.Var, products: Affine, acc_scale: np.ndarray, shape: tuple
    ) -> None:
        """The layer's result in float32, for the float ops that read it: the accumulator scaled, then its
        ReLU or clip."""
        y = self.emit(R.multiply(R.astype(acc, "float32"), const(acc_scale.reshape(shape), "float32")))
        if layer.activation is not None and layer.activation[0] == "relu":
            y = self.emit(R.nn.relu(y))
        elif layer.activation is not None:
            y = self.clip(y, layer.activation[1], layer.activation[2], "float32")
        self.floats[layer.out] = y
        if layer.activation is None:
            self.affine[layer.out] = products

    def rounding_bias(self, layer: Layer, error: np.ndarray) -> np.ndarray:
        """What the weights' rounding adds to each output channel on average, given back through the bias
        (bias correction, Nagel et al. 2019): the weights' error by the input's mean per channel from
        the calibration runs."""
        mean = self.means.get(layer.data)
        if mean is None or layer.given_scale is not None:
            return np.zeros(error.shape[layer.channel_axis])
        if layer.kind == "matmul":
            return np.einsum("kn,k->n", error, mean) if error.ndim == 2 else np.zeros(error.shape[1])
        assert layer.attrs is not None  # a conv2d's (a matmul returned above)
        groups = int(layer.attrs.groups)
        per_group = mean.reshape(groups, -1)[np.arange(error.shape[0]) // (error.shape[0] // groups)]
        return np.einsum("oihw,oi->o", error, per_group)

    def to_bits(self, y: relax.Var, lo: int, hi: int, dtype: str, name: str) -> relax.Var:
        """A rounded value (float32 integers, or int32 from a rounding shift) clipped to [lo, hi] and
        stored in `dtype`. Where the target's float -> int conversion saturates (Arm: a float beyond the
        int32 range becomes its bound, as the clip would make it), the float converts first and the clip
        is integer max and min: float ones cost a compare and a select each on NEON (the bounds are
        buffers, NaN-aware), and under QEMU each float vector op is a call while integer ones run inline
        (MobileNetV2's 1x1 convolutions over 16-32 channels spend as many instructions requantizing as
        multiplying). Elsewhere (x86's conversion gives INT_MIN beyond the range) the clip is in float."""
        if self.saturating and str(y.ty.dtype) == "float32":
            y = self.emit(R.astype(y, "int32"), f"{name}_int")
        return self.emit(R.astype(self.clip(y, lo, hi, str(y.ty.dtype)), dtype), name)

    def clip(self, x: relax.Var, lo: float, hi: float, dtype: str) -> relax.Var:
        """max then min with constants: unlike R.clip, these keep the layout ConvertLayout chose."""
        return self.emit(R.minimum(R.maximum(x, scalar(lo, dtype, x)), scalar(hi, dtype, x)))

    def weight_scale(self, layer: Layer) -> np.ndarray:
        w, axis = layer.weight, layer.channel_axis
        if layer.given_scale is not None:
            shape = [1] * w.ndim
            shape[axis] = -1
            scale = np.broadcast_to(layer.given_scale, (w.shape[axis],)).reshape(shape)
        else:
            scale = weight_scales(w, layer.weight_bits or self.bits, self.weight_mode, self.per_channel, axis)
        if self.pair_limit is None:
            return scale
        # A target that sums pairs of products in int16 (x86 vpmaddubsw): a channel whose largest pair
        # of one sign would pass the limit takes the coarser step that brings it to the limit, between
        # 8 bits and 7 (ONNX Runtime gives every weight 7 bits on such CPUs, its reduce_range; figures in
        # docs/quantization.md).
        sums = pair_sums(w / scale, pair_axis(layer))
        reduce = tuple(i for i in range(sums.ndim) if i != axis or scale.size == 1)
        coarser = scale * np.maximum(sums.max(axis=reduce, keepdims=True) / self.pair_limit, 1.0)
        return power2_up(coarser) if self.weight_mode == "power2" else coarser

    def fixed_point_multiply(
        self, value: Affine, out: ActQuant, lo: int, hi: int, name: str
    ) -> relax.Var | None:
        """`value` in `out`'s 8 bits, floor(value / scale + zero point + 1/2) clipped to [lo, hi], in
        integers (None where the form cannot hold the multipliers): each term's int32 tensor widened
        to int64 times its multiplier in fixed point (scales.fixed_point_terms), summed with the
        rounding constant, shifted right. Integer vector instructions only, where the float form is a
        conversion, a multiply-add and a rounding conversion per term; under QEMU (the emulated
        boards) each float vector instruction is a call into its soft-float code, integer ones run
        inline."""
        factor = 1.0 / out.scale
        form = fixed_point_terms(
            [m * factor for _, m in value.terms], value.offset * factor + out.zero_point + 0.5
        )
        if form is None:
            return None
        multipliers, rounding, shift = form
        total = None
        for (t, _), m in zip(value.terms, multipliers, strict=True):
            fixed = const(m, "int64") if np.ndim(m) else scalar(m, "int64", t)  # (ConvertLayout: see scalar)
            product = R.multiply(R.astype(t, "int64"), fixed)
            total = product if total is None else R.add(total, product)
        rounding = const(rounding, "int64") if np.ndim(rounding) else scalar(rounding, "int64", t)
        y = self.emit(R.right_shift(R.add(total, rounding), scalar(shift, "int64", t)))
        if shift >= 32:  # |the sum| < 2**63: shifted it fits in int32, clipped there (fewer lanes)
            y = self.clip(self.emit(R.astype(y, "int32")), lo, hi, "int32")
        else:
            y = self.clip(y, lo, hi, "int64")
        return self.emit(R.astype(y, out.dtype), name)

    def requantize(self, acc: relax.Var, multiplier: np.ndarray, zero_point: int) -> tuple[relax.Var, str]:
        """int32 accumulator x multiplier + zero point, rounded half up (before the clip to 8 bits):
        a rounding shift when the multipliers are powers of two, else a float32 multiply, as
        ONNX Runtime's kernels requantize (scales.requantize_reference). The float32 form costs a
        third of the 31-bit fixed-point multiply's instructions (int64 lanes) that it replaced, which
        dominated 1x1 convolutions over few channels: measured here, MobileNetV2 int8 2.14 -> 1.89 ms."""
        if not is_power_of_two(multiplier):
            y = R.multiply(R.astype(acc, "float32"), const(multiplier, "float32"))
            return self.emit(R.floor(R.add(y, scalar(zero_point + 0.5, "float32", acc)))), "float32 multiply"
        k = np.round(-np.log2(multiplier)).astype(np.int64)
        if np.all(k >= 1):
            rounding = const(np.left_shift(1, k - 1), "int32")
            y = self.emit(R.right_shift(R.add(acc, rounding), const(k, "int32")), "shifted")
        else:
            wide = self.emit(R.astype(acc, "int64"))
            left, right = np.maximum(-k, 0), np.maximum(k, 0)
            wide = self.emit(R.left_shift(wide, const(left, "int64")))
            rounding = np.where(right > 0, np.left_shift(1, np.maximum(right - 1, 0)), 0)
            y = self.emit(R.right_shift(R.add(wide, const(rounding, "int64")), const(right, "int64")))
        if zero_point:
            y = self.emit(R.add(y, scalar(zero_point, str(y.ty.dtype), y)))
        return y, "shift"


def block_diagonal(weight: np.ndarray, groups: int) -> np.ndarray:
    """A grouped convolution's OIHW weights as one dense convolution's: each group's block on the
    diagonal, zeros elsewhere (each output channel reads its own group's input channels only)."""
    out, per_group = weight.shape[0] // groups, weight.shape[1]
    dense = np.zeros((weight.shape[0], per_group * groups, *weight.shape[2:]), weight.dtype)
    for g in range(groups):
        dense[g * out : (g + 1) * out, g * per_group : (g + 1) * per_group] = weight[g * out : (g + 1) * out]
    return dense


def pair_axis(layer: Layer) -> int:
    """The weight axis that the int8 kernels reduce 4 at a time, in pairs: the input channels of a
    conv2d (OIHW), the rows of a matmul's [K, N]."""
    return 1 if layer.kind == "conv2d" else layer.weight.ndim - 2


def free_vars(expr: relax.Expr) -> list[relax.Var]:
    return list(relax.analysis.free_vars(expr))
