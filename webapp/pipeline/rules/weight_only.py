"""Weight-only quantization as LLM runtimes do it (llama.cpp's Q8_0 / Q4_0, ONNX Runtime GenAI's int4):
each weight matrix of a matmul stored as int8 or int4 in groups of `group` values along the reduced axis,
one float scale a group, symmetric (int8 in [-127, 127], int4 in [-8, 7]); the activations stay float
and the dequantization is fused into the matrix-vector kernel, which reads the narrow weights (a
decode step is bound by the bytes it reads).

Every `R.matmul(x, W)` of the imported module whose W is a float32 constant [K, N] (ONNX's MatMul with
its weight as exporters write nn.Linear) and N a multiple of LANES becomes a call of one kernel,
`weight_only_kernel`: the weight packed as (N / LANES, K / per byte, LANES) panels and the scales as
(N / LANES, groups, LANES), parallel over panels, LANES columns a vector, `VECTORS` vectors a tile,
the reduction running down K. The other matmuls (attention's, over the cache) stay float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, s_tir, te

from webapp.pipeline.passes.rewrites import static_shape
from webapp.pipeline.rules.schedules import SCHEDULE_ATTR

LANES = 16  # columns a vector (an AVX-512 register of float32; two NEON or AVX2 registers)
VECTORS = 4  # vectors of columns a tile


@dataclass(frozen=True)
class Scheme:
    bits: int  # 8 or 4
    group: int  # values of the reduced axis sharing one scale

    @property
    def name(self) -> str:
        return f"int{self.bits}-g{self.group}"

    @property
    def qmax(self) -> int:
        return 127 if self.bits == 8 else 7


SCHEMES = {s.name: s for s in (Scheme(8, 128), Scheme(4, 32), Scheme(4, 128))}


def quantize_weight(w: np.ndarray, scheme: Scheme) -> tuple[np.ndarray, np.ndarray]:
    """A [K, N] float weight as (packed values, scales) in the kernel's panels; the last group of K may be
    partial (SmolLM2's 576 in groups of 128)."""
    k, n = w.shape
    groups = -(-k // scheme.group)
    padded = np.zeros((groups * scheme.group, n), np.float32)
    padded[:k] = w
    g = padded.reshape(groups, scheme.group, n)
    scales = np.abs(g).max(axis=1) / scheme.qmax  # [groups, N]
    scales[scales == 0] = 1.0
    low = -scheme.qmax - (scheme.bits == 4)  # int4's [-8, 7]
    q = np.clip(np.round(g / scales[:, None]), low, scheme.qmax).astype(np.int8).reshape(-1, n)[:k]
    if scheme.bits == 4:  # two values a byte, the even k in the low nibble
        u = (q + 8).astype(np.uint8)
        q = u[0::2] | (u[1::2] << 4)
    panels = q.reshape(q.shape[0], n // LANES, LANES).transpose(1, 0, 2)
    scale_panels = scales.reshape(groups, n // LANES, LANES).transpose(1, 0, 2)
    return np.ascontiguousarray(panels), np.ascontiguousarray(scale_panels.astype(np.float32))


def dequantized(packed: np.ndarray, scales: np.ndarray, k: int, scheme: Scheme) -> np.ndarray:
    """The [K, N] float weight the kernel computes with (for the tests)."""
    q = packed.transpose(1, 0, 2).reshape(packed.shape[1], -1)
    if scheme.bits == 4:
        q = np.stack([(q & 15).astype(np.int8) - 8, (q >> 4).astype(np.int8) - 8], axis=1).reshape(
            -1, q.shape[1]
        )
    s = scales.transpose(1, 0, 2).reshape(scales.shape[1], -1)
    return q[:k].astype(np.float32) * np.repeat(s, scheme.group, axis=0)[:k]


def weight_only_kernel(m: int, k: int, n: int, scheme: Scheme) -> tvm.tirx.PrimFunc:
    """C[m, n] = sum_k A[m, k] * q[k, n] * scale[k // group, n], scheduled: parallel over panels of
    LANES * VECTORS columns, the rows and the reduction inside, the tile's accumulators in registers."""
    per = 8 // scheme.bits
    a = te.placeholder((m, k), "float32", name="A")
    q = te.placeholder((n // LANES, k // per, LANES), "int8" if scheme.bits == 8 else "uint8", name="Q")
    s = te.placeholder((n // LANES, -(-k // scheme.group), LANES), "float32", name="S")
    r = te.reduce_axis((0, k), name="k")

    def weight(j, kk):
        v = q[j // LANES, kk // per, j % LANES]
        if scheme.bits == 4:
            shift = (4 * (kk % 2)).astype("uint8")
            v = ((v >> shift) & tvm.tirx.const(15, "uint8")).astype("float32") - tvm.tirx.const(
                8.0, "float32"
            )
        return v.astype("float32") * s[j // LANES, kk // scheme.group, j % LANES]

    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * weight(j, r), axis=r), name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, q, s, c]))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    vectors = VECTORS if n % (LANES * VECTORS) == 0 else 1
    outer, vec, lane = sch.split(j, [None, vectors, LANES])
    ko, ki = sch.split(kk, [None, per])  # int4: both nibbles of a byte in one step, each its own shift
    sch.reorder(outer, i, ko, ki, vec, lane)
    sch.unroll(ki)
    kk = ko
    sch.parallel(outer)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, i)
    sch.unroll(vec)
    sch.vectorize(lane)
    init = sch.decompose_reduction(block, kk)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(acc)[-1])
    label = f"weight-only {scheme.name}: dequantized in the matrix-vector kernel"
    kernel = sch.mod["main"].without_attr("global_symbol")
    return kernel.with_attr("tirx.is_scheduled", True).with_attr(SCHEDULE_ATTR, label)


@dataclass
class Packed:
    """What the weights of a module's matmuls take: `streamed`, the bytes a call reads (packed where
    quantized, float elsewhere); `replaced`, the float bytes quantized; `packed`, what replaced them."""

    streamed: int = 0
    replaced: int = 0
    packed: int = 0


@relax.expr_functor.mutator
class WeightOnly(relax.PyExprMutator):
    """Each weight matmul as a weight-only kernel of `scheme` (None: none, the weights only counted)."""

    def __init__(self, mod: tvm.IRModule, scheme: Scheme | None):
        super().__init__(mod)
        self.scheme, self.packed = scheme, Packed()
        self.kernels: dict[tuple[int, int, int], tvm.ir.GlobalVar] = {}
        self.done: dict[relax.Call, relax.Expr] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if call not in self.done:  # the walk meets the last binding's call twice: rewritten once
            self.done[call] = self.rewrite(super().visit_call_(call))
        return self.done[call]

    def rewrite(self, call: relax.Call) -> relax.Expr:
        if call.op != tvm.ir.Op.get("relax.matmul") or not isinstance(call.args[1], tvm.ir.Constant):
            return call
        weight, x = call.args[1].value.numpy(), call.args[0]
        shape = static_shape(x.ty)
        takes = weight.ndim == 2 and weight.dtype == np.float32 and weight.shape[1] % LANES == 0
        if (
            self.scheme is None
            or not takes
            or shape is None
            or weight.shape[0] % 2
            or shape[-1] != weight.shape[0]
        ):
            self.packed.streamed += weight.nbytes
            return call
        k, n = weight.shape
        m = int(np.prod(shape[:-1]))
        values, scales = quantize_weight(weight, self.scheme)
        self.packed.streamed += values.nbytes + scales.nbytes
        self.packed.packed += values.nbytes + scales.nbytes
        self.packed.replaced += weight.nbytes
        if (m, k, n) not in self.kernels:
            kernel = weight_only_kernel(m, k, n, self.scheme)
            name = f"weight_only_{self.scheme.bits}b_{m}x{k}x{n}"
            self.kernels[m, k, n] = self.builder_.add_func(kernel, name)
        rows = self.builder_.emit(relax.op.reshape(x, [m, k]))
        out = self.builder_.emit(
            relax.call_tir(
                self.kernels[m, k, n],
                [rows, relax.const(values), relax.const(scales)],
                relax.TensorType([m, n], "float32"),
            )
        )
        return relax.op.reshape(out, [*shape[:-1], n])


def quantize_weights(mod: tvm.IRModule, scheme: Scheme | None) -> tuple[tvm.IRModule, Packed]:
    """The module with its weight matmuls on `scheme` (None: as it is), and what their weights take."""
    mutator = WeightOnly(mod, scheme)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return (mutator.builder_.get() if scheme else mod), mutator.packed
