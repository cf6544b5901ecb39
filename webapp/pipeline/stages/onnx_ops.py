"""ONNX operators TVM 0.27's importer lacks, converted to plain Relax ops (added to its converter map
while a model is imported: `more_operators`). The recurrent layers (LSTM, GRU) are unrolled over
their time steps, which are known once the input shapes are: the input's projection for all steps is
one matmul, each step one matmul by the recurrent weights and its gates' elementwise arithmetic.
Silero VAD's LSTM and the CRNN text recognizers (ddddocr) were refused at import. Sum, Max, Min
and Mean of several inputs are chains of binary ops (Pairwise)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from webapp.pipeline.errors import StageError

ACTIVATIONS = {"sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh, "relu": relax.op.nn.relu}


def static_shape(expr: relax.Expr, what: str) -> list[int]:
    shape = expr.ty.shape.values if isinstance(expr.ty, relax.TensorType) and expr.ty.shape else None
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        raise StageError(f"{what} needs a fixed shape (give the model's input shapes); it has {shape}.")
    return [int(d) for d in shape]


def activations(attr: dict, count: int, directions: int, op: str) -> list[list]:
    """The activation functions of each direction (ONNX lists them direction after direction)."""
    names = [a.decode() if isinstance(a, bytes) else a for a in attr.get("activations", [])]
    names = names or (["Sigmoid", "Tanh", "Tanh"] if count == 3 else ["Sigmoid", "Tanh"]) * directions
    unknown = sorted({n for n in names if n.lower() not in ACTIVATIONS})
    if unknown:
        raise StageError(
            f"{op} with the activation {', '.join(unknown)}: only Sigmoid, Tanh and Relu are supported."
        )
    funcs = [ACTIVATIONS[n.lower()] for n in names]
    return [funcs[d * count : (d + 1) * count] for d in range(directions)]


def of_direction(v: relax.Expr, d: int) -> relax.Expr:
    """A per-direction tensor's (weights, biases, states, peepholes: [directions, ...]) part for `d`."""
    return relax.op.squeeze(relax.op.strided_slice(v, [0], [d], [d + 1]), [0])


def chunks(v: relax.Expr, axis: int, count: int, size: int) -> list[relax.Expr]:
    """`count` consecutive slices of `size` along `axis` (a layer's gates, stacked in its weights)."""
    return [relax.op.strided_slice(v, [axis], [k * size], [(k + 1) * size]) for k in range(count)]


def constant_lengths(lengths: relax.Expr | None, seq: int, op: str) -> None:
    """sequence_lens: accepted where every sequence is the whole input (the unrolled steps)."""
    if lengths is None:
        return
    if isinstance(lengths, tvm.ir.Constant) and (lengths.value.numpy() == seq).all():
        return
    raise StageError(f"{op} with sequence_lens shorter than the input ({seq} steps) is not supported.")


class Recurrent(OnnxOpConverter):
    """What LSTM and GRU share: their inputs in time-major form, the directions, the outputs."""

    gates = 0  # LSTM 4, GRU 3
    functions = 0  # activation functions per direction

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        x, w, r, b, lengths = inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]
        layout = attr.get("layout", 0)  # 1: the input, output and states batch first
        initial = cls.initial_states(inputs)
        if layout:
            x = relax.op.permute_dims(x, [1, 0, 2])
            initial = [relax.op.permute_dims(v, [1, 0, 2]) if v is not None else None for v in initial]
        x = bb.normalize(x)
        seq, batch, _ = static_shape(x, cls.__name__)
        directions, gates, _ = static_shape(w, f"{cls.__name__}'s weights")
        hidden = gates // cls.gates
        constant_lengths(lengths, seq, cls.__name__)
        direction = attr.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        funcs = activations(attr, cls.functions, directions, cls.__name__)
        clip = attr.get("clip")
        dtype = str(x.ty.dtype)
        zeros = relax.const(np.zeros((batch, hidden), dtype=dtype))
        ys, hs, extra = [], [], []
        for d in range(directions):
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            # every step's input projection at once, one matmul of seq x batch rows (not seq matmuls
            # of batch rows each, which read the weights seq times): [seq, batch, gates * hidden]
            rows = relax.op.reshape(x, [seq * batch, x.ty.shape[2]])
            xw = relax.op.matmul(rows, relax.op.permute_dims(of_direction(w, d), [1, 0]))
            xw = bb.normalize(relax.op.reshape(xw, [seq, batch, gates]))
            r_t = bb.normalize(relax.op.permute_dims(of_direction(r, d), [1, 0]))
            bias = chunks(of_direction(b, d), 0, 2, gates) if b is not None else None  # input's, recurrent's
            state = [of_direction(v, d) if v is not None else zeros for v in initial]
            steps = range(seq - 1, -1, -1) if reverse else range(seq)
            outs = [None] * seq
            for t in steps:
                x_t = relax.op.squeeze(relax.op.strided_slice(xw, [0], [t], [t + 1]), [0])
                state = cls.step(bb, x_t, state, r_t, bias, funcs[d], clip, hidden, inputs, attr, d)
                outs[t] = state[0]
            ys.append(relax.op.stack(outs, axis=0))  # [seq, batch, hidden]
            hs.append(state[0])
            extra.append(state[1:])
        y = relax.op.stack(ys, axis=1)  # [seq, directions, batch, hidden]
        y_h = relax.op.stack(hs, axis=0)  # [directions, batch, hidden]
        rest = [relax.op.stack([e[i] for e in extra], axis=0) for i in range(len(extra[0]))]
        if layout:
            y = relax.op.permute_dims(y, [2, 0, 1, 3])
            y_h = relax.op.permute_dims(y_h, [1, 0, 2])
            rest = [relax.op.permute_dims(v, [1, 0, 2]) for v in rest]
        return relax.Tuple([y, y_h, *rest])

    @staticmethod
    def clipped(v: relax.Expr, clip: float | None) -> relax.Expr:
        return relax.op.clip(v, -float(clip), float(clip)) if clip is not None else v


class LSTM(Recurrent):
    gates, functions = 4, 3

    @staticmethod
    def initial_states(inputs: list[relax.Expr | None]) -> list[relax.Expr | None]:
        return [inputs[5], inputs[6]]  # initial_h, initial_c

    @classmethod
    def step(
        cls,
        bb: relax.BlockBuilder,
        x_t: relax.Expr,
        state: list[relax.Expr],
        r_t: relax.Expr,
        bias: list[relax.Expr] | None,
        funcs: list[Callable[..., relax.Expr]],
        clip: float | None,
        hidden: int,
        inputs: list[relax.Expr | None],
        attr: dict,
        d: int,
    ) -> list[relax.Expr]:
        f, g, h = funcs
        h_prev, c_prev = state
        z = relax.op.add(x_t, relax.op.matmul(h_prev, r_t))
        if bias is not None:
            z = relax.op.add(z, relax.op.add(bias[0], bias[1]))
        z = bb.normalize(z)
        i, o, fg, c = chunks(z, 1, 4, hidden)
        peep = inputs[7]
        if peep is not None:
            pi, po, pf = chunks(of_direction(peep, d), 0, 3, hidden)
            i = relax.op.add(i, relax.op.multiply(pi, c_prev))
            fg = relax.op.add(fg, relax.op.multiply(pf, c_prev))
        i, fg = f(cls.clipped(i, clip)), f(cls.clipped(fg, clip))
        if attr.get("input_forget", 0):
            fg = relax.op.subtract(relax.const(1.0, str(z.ty.dtype)), i)
        c_new = relax.op.add(relax.op.multiply(fg, c_prev), relax.op.multiply(i, g(cls.clipped(c, clip))))
        c_new = bb.normalize(c_new)
        if peep is not None:
            o = relax.op.add(o, relax.op.multiply(po, c_new))
        h_new = bb.normalize(relax.op.multiply(f(cls.clipped(o, clip)), h(c_new)))
        return [h_new, c_new]


class GRU(Recurrent):
    gates, functions = 3, 2

    @staticmethod
    def initial_states(inputs: list[relax.Expr | None]) -> list[relax.Expr | None]:
        return [inputs[5]]  # initial_h

    @classmethod
    def step(
        cls,
        bb: relax.BlockBuilder,
        x_t: relax.Expr,
        state: list[relax.Expr],
        r_t: relax.Expr,
        bias: list[relax.Expr] | None,
        funcs: list[Callable[..., relax.Expr]],
        clip: float | None,
        hidden: int,
        inputs: list[relax.Expr | None],
        attr: dict,
        d: int,
    ) -> list[relax.Expr]:
        f, g = funcs
        (h_prev,) = state
        if bias is not None:
            x_t = relax.op.add(x_t, bias[0])
        x_t = bb.normalize(x_t)
        xz, xr, xh = chunks(x_t, 1, 3, hidden)
        hr = relax.op.matmul(h_prev, r_t)
        if bias is not None:
            hr = relax.op.add(hr, bias[1])
        hr = bb.normalize(hr)
        rz, rr, rh = chunks(hr, 1, 3, hidden)
        z = f(cls.clipped(relax.op.add(xz, rz), clip))
        reset = f(cls.clipped(relax.op.add(xr, rr), clip))
        if attr.get("linear_before_reset", 0):
            candidate = relax.op.add(xh, relax.op.multiply(reset, rh))
        else:  # (r * h_prev) @ Rh^T + Rbh
            r_h = chunks(r_t, 1, 3, hidden)[2]
            candidate = relax.op.add(xh, relax.op.matmul(relax.op.multiply(reset, h_prev), r_h))
            if bias is not None:
                candidate = relax.op.add(candidate, chunks(bias[1], 0, 3, hidden)[2])
        candidate = g(cls.clipped(candidate, clip))
        one = relax.const(1.0, str(x_t.ty.dtype))
        keep = relax.op.multiply(z, h_prev)
        h_new = relax.op.add(relax.op.multiply(relax.op.subtract(one, z), candidate), keep)
        return [bb.normalize(h_new)]


class Pairwise(OnnxOpConverter):
    """Sum, Max, Min and Mean of several tensors as a chain of binary ops, which fuse as elementwise
    arithmetic into the ops around them. TVM's converters stack the inputs and reduce the stack when
    their shapes are known: a kernel of its own that copies every input (ShuffleNet's residual Sum).
    ONNX broadcasts these ops' inputs as the binary ops do, so the chain is the same function."""

    binary = None

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        out = inputs[0]
        for x in inputs[1:]:
            out = bb.normalize(cls.binary(out, x))
        return out


class Sum(Pairwise):
    binary = relax.op.add


class Max(Pairwise):
    binary = relax.op.maximum


class Min(Pairwise):
    binary = relax.op.minimum


class Mean(Sum):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        total = super()._impl_v1(bb, inputs, attr, params)
        return relax.op.divide(total, relax.const(float(len(inputs)), str(total.ty.dtype)))


MORE = {"LSTM": LSTM, "GRU": GRU, "Sum": Sum, "Max": Max, "Min": Min, "Mean": Mean}


@contextmanager
def more_operators() -> Iterator[None]:
    """TVM's ONNX converter map with the operators above added, while a model is imported."""
    from tvm.relax.frontend.onnx import onnx_frontend

    tvm_map = onnx_frontend._get_convert_map
    onnx_frontend._get_convert_map = lambda: {**tvm_map(), **MORE}
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = tvm_map


def supported_operators() -> set[str]:
    """The ONNX operators an import takes: TVM's converters, those above, and what TVM's importer
    converts itself (If, Constant)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return set(_get_convert_map()) | set(MORE) | {"If", "Constant"}


def check_onnx_ops_supported(op_types: list[str]) -> None:
    """A StageError naming the model's operators that no converter (TVM's or those above) takes."""
    supported = supported_operators()
    missing = [op for op in op_types if op not in supported]
    if missing:
        raise StageError(
            f"TVM's ONNX importer does not support the operator{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} (used by this model)."
        )
