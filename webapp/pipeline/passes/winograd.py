"""Winograd F(2x2, 3x3) for float 3x3 convolutions, a rewrite a CPU kind makes before legalization
(webapp/targets/base.py). Each 2x2 block of outputs takes 16 multiplies per channel pair instead of 36:

    V = B^T d B   the 4x4 input tile d of each 2x2 output block, per input channel   (adds only)
    M = V . U     per each of the 16 positions of the tile: a GEMM over the input channels
    Y = A^T M A   the 2x2 outputs, per output channel, and the epilogue fused          (adds only)

U = G g G^T, the weights g transformed once, here, with numpy. The GEMMs are 16/36 of the direct
convolution's multiply-adds; they run at about the rate of the direct convolution's, so the
convolution takes about half the time (measured here on ResNet's four 3x3 shapes, one conv each:
56x56x64 0.61 ms against 1.07, 14x14x256 0.49 against 1.07; webapp.pipeline.rules.cpu.winograd
schedules the kernel). Outputs differ from the direct convolution's by rounding (about 1e-6 of the
largest output on those shapes).

Taken: conv2d in NHWC / HWIO (channels_last's layout) of float32, 3x3, stride 1, dilation 1, one
group, padding 1 on every side, weights known when the model is compiled, at least MIN_CHANNELS
input channels and MIN_FLOPS. Below those the transforms cost more than they save: measured here,
one conv + ReLU each (direct / Winograd): 16->32 channels on 28x28 50 / 60 us, 16->16 on 12x12 15 /
28 us, 16->32 on 10x10 10 / 14 us; and 32->32 on 14x14 (3.6 MFLOP) 26 / 23 us, 32->32 on 20x20 48 /
39 us, 64->64 on 14x14 78 / 52 us.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax, s_tir, te, tirx

from webapp.pipeline.passes.rewrites import mutate_functions

MIN_CHANNELS, MIN_FLOPS = 32, 1 << 21  # the direct convolution's: 2 per multiply-add
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
# B^T (4x4): row a has two non-zero entries, +1 at column FIRST[a] and SIGN[a] at column SECOND[a]
FIRST, SECOND, SIGN = (0, 1, 2, 1), (2, 2, 1, 3), (-1.0, 1.0, -1.0, -1.0)
NAMES = ("winograd_input", "winograd_matmul", "winograd_output")  # the kernel's blocks (schedules)


def transformed_weights(hwio: np.ndarray) -> np.ndarray:
    """U[a, b, ci, co] = (G g G^T)[a, b] for the 3x3 kernel g of each (ci, co)."""
    return np.einsum("ak,bl,klio->abio", G, G, hwio.astype("float64")).astype("float32")


def lookup(v: tvm.ir.Expr, table: Sequence[int]) -> tvm.ir.Expr:
    """table[v] for an index expression v (folds to a constant once v's loop is unrolled)."""
    out = tirx.const(table[-1], "int32")
    for i in range(len(table) - 2, -1, -1):
        out = tirx.Select(v == i, tirx.const(table[i], "int32"), out)
    return out


def conv2d_te(data: te.Tensor, u: te.Tensor) -> te.Tensor:
    """The convolution of NHWC `data` (padding 1) by transformed weights `u` [4, 4, CI, CO]."""
    n_, h_, w_, ci_ = (int(d) for d in data.shape)
    co_ = int(u.shape[3])
    tiles_h, tiles_w = (h_ + 1) // 2, (w_ + 1) // 2
    tiles = n_ * tiles_h * tiles_w
    zero = tirx.const(0.0, "float32")
    padded = te.compute(
        (n_, 2 * tiles_h + 2, 2 * tiles_w + 2, ci_),
        lambda n, h, w, c: tirx.if_then_else(
            tirx.all(h >= 1, h <= h_, w >= 1, w <= w_), data[n, h - 1, w - 1, c], zero
        ),
        name="winograd_pad",
    )

    def tile(p, r, s, c):
        n, t = p // (tiles_h * tiles_w), p % (tiles_h * tiles_w)
        return padded[n, (t // tiles_w) * 2 + r, (t % tiles_w) * 2 + s, c]

    def sign(v):
        return tirx.Select(v == 1, tirx.const(1.0, "float32"), tirx.const(-1.0, "float32"))

    def first(v):
        return lookup(v, FIRST)

    def second(v):
        return lookup(v, SECOND)

    v_ = te.compute(
        (4, 4, tiles, ci_),
        lambda a, b, p, c: (
            tile(p, first(a), first(b), c)
            + sign(b) * tile(p, first(a), second(b), c)
            + sign(a) * tile(p, second(a), first(b), c)
            + sign(a) * sign(b) * tile(p, second(a), second(b), c)
        ),
        name=NAMES[0],
    )
    k = te.reduce_axis((0, ci_), name="k")
    m_ = te.compute(
        (4, 4, tiles, co_), lambda a, b, p, co: te.sum(v_[a, b, p, k] * u[a, b, k, co], axis=k), name=NAMES[1]
    )

    def coefficient(x, r):  # A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]: row x at column x + r
        return tirx.Select(tirx.any(x == 0, r == 0), tirx.const(1.0, "float32"), tirx.const(-1.0, "float32"))

    def output(n, h, w, co):
        x, y, p = h % 2, w % 2, n * tiles_h * tiles_w + (h // 2) * tiles_w + w // 2
        terms = [
            coefficient(x, r) * coefficient(y, s) * m_[x + r, y + s, p, co]
            for r in range(3)
            for s in range(3)
        ]
        return sum(terms[1:], terms[0])

    return te.compute((n_, h_, w_, co_), output, name=NAMES[2])


def direct_flop(func: tirx.PrimFunc) -> float | None:
    """For a kernel with the Winograd blocks (before scheduling), the floating-point operations of the
    direct convolution it computes, 2 per multiply-add; None for any other kernel."""
    try:
        sch = s_tir.Schedule(func)
        transform, _, output = (sch.get(sch.get_sblock(name)) for name in NAMES)
    except Exception:  # no such block
        return None
    outputs = np.prod([int(d) for d in output.writes[0].source.shape])
    return 2.0 * 9 * int(transform.writes[0].source.shape[3]) * float(outputs)


def takes(call: relax.Call, weight: np.ndarray | None) -> bool:
    """Whether the conv2d `call` is one this rewrite takes (see the module docstring)."""
    attrs = call.attrs
    data_ty = call.args[0].ty
    return (
        weight is not None
        and weight.ndim == 4
        and weight.shape[:2] == (3, 3)
        and weight.dtype == np.float32
        and str(data_ty.dtype) == "float32"
        and str(attrs.data_layout) == "NHWC"
        and str(attrs.kernel_layout) == "HWIO"
        and (attrs.out_layout is None or str(attrs.out_layout) in ("NHWC", ""))
        and (attrs.out_dtype is None or str(attrs.out_dtype) in ("float32", ""))
        and int(attrs.groups) == 1
        and [int(v) for v in attrs.strides] == [1, 1]
        and [int(v) for v in attrs.dilation] == [1, 1]
        and [int(v) for v in attrs.padding] == [1, 1, 1, 1]
        and weight.shape[2] >= MIN_CHANNELS
        and data_ty.shape is not None
        and all(isinstance(d, tirx.IntImm) for d in data_ty.shape)
        and 2 * int(np.prod([int(d) for d in data_ty.shape])) * weight.shape[3] * 9 >= MIN_FLOPS
    )


@relax.expr_functor.mutator
class Winograd(relax.PyExprMutator):
    """conv2d calls this rewrite takes replaced by the Winograd kernel, each binding's var kept."""

    def constant(self, expr: relax.Expr) -> np.ndarray | None:
        while isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is None:
                return None
            expr = bound
        return expr.value.numpy() if isinstance(expr, tvm.ir.Constant) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        weight = self.constant(call.args[1])
        if not takes(call, weight):
            return call
        assert weight is not None  # takes() refuses a weight not known
        u = relax.const(transformed_weights(weight), "float32")
        return self.builder_.call_te(conv2d_te, call.args[0], u, primfunc_name_hint="winograd_conv2d")


@tvm.transform.module_pass(opt_level=0, name="PlaygroundWinograd")
def winograd(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The Winograd rewrite (Winograd) on every Relax function; the direct convolutions if it fails."""
    return mutate_functions(Winograd, mod)
