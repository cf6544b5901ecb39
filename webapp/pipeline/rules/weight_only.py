"""Weight-only quantization as LLM runtimes do it (llama.cpp's Q8_0 / Q4_0, ONNX Runtime GenAI's int4):
each weight matrix of a matmul stored as int8 or int4 in groups of `group` values along the reduced axis,
one float scale a group, symmetric (int8 in [-127, 127], int4 in [-8, 7]); the activations stay float
and the dequantization is fused into the matrix-vector kernel, which reads the narrow weights (a
decode step is bound by the bytes it reads).

Every `R.matmul(x, W)` of the imported module whose W is a float32 constant [K, N] (ONNX's MatMul with
its weight as exporters write nn.Linear) and N a multiple of LANES becomes a call of one kernel,
`weight_only_kernel`: the weight packed as (N / LANES, K / per byte, LANES) panels and the scales as
(N / LANES, groups, LANES), parallel over panels, LANES columns a vector, as many vectors a tile as the
target's registers hold (`tile_vectors`), the reduction running down K a group at a time. The other
matmuls (attention's, over the cache) stay float.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax, s_tir, te

from webapp.pipeline.passes.rewrites import static_shape
from webapp.pipeline.rules.schedules import SCHEDULE_ATTR

if TYPE_CHECKING:
    from webapp.targets import Target

LANES = 16  # columns a vector of the panels (an AVX-512 register of float32; two AVX2, four NEON)


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


def tile_vectors(target: Target, n: int) -> int:
    """How many LANES-column vectors a kernel's tile takes on `target`: as many (4, 2 or 1) as keep its
    two sets of float accumulators (the tile's sums and its group's, weight_only_kernel) in half of the
    vector registers, the other half left for the weights as they are widened (AVX-512's 32 registers of
    16 lanes: 4; AVX2's 16 of 8 and NEON's 32 of 4: 2); and that divide the N columns."""
    lanes, registers = target.vector_shape()
    return next(v for v in (4, 2, 1) if 2 * v * LANES <= lanes * registers // 2 and n % (LANES * v) == 0)


def weight_only_kernel(m: int, k: int, n: int, scheme: Scheme, vectors: int) -> tvm.tirx.PrimFunc:
    """C[m, n] = sum_g scale[g, n] * sum_{k in group g} A[m, k] * q[k, n], scheduled: parallel over panels
    of LANES * `vectors` columns, the rows and the groups inside; each group's sums of products in
    registers, scaled once a group into the tile's sums, also in registers (a scale a group, not a
    multiply a weight). A last partial group (SmolLM2's 576 in groups of 128) reads its bytes clamped to
    the last and takes A as 0 past K."""
    per, size = 8 // scheme.bits, scheme.group
    groups = -(-k // size)
    a = te.placeholder((m, k), "float32", name="A")
    q = te.placeholder((n // LANES, k // per, LANES), "int8" if scheme.bits == 8 else "uint8", name="Q")
    s = te.placeholder((n // LANES, groups, LANES), "float32", name="S")
    r, rg = te.reduce_axis((0, size), name="k"), te.reduce_axis((0, groups), name="g")

    def weight(j: Any, kk: Any, clamped: bool) -> Any:
        byte = te.min(kk // per, k // per - 1) if clamped else kk // per
        v = q[j // LANES, byte, j % LANES]
        if scheme.bits == 8:
            return v.astype("float32")
        shift = (4 * (kk % 2)).astype("uint8")  # the nibble of kk itself, clamped or not
        return ((v >> shift) & tvm.tirx.const(15, "uint8")).astype("float32") - tvm.tirx.const(8.0, "float32")

    def product(i: Any, g: Any, j: Any) -> Any:
        kk = g * size + r
        if k % size == 0:
            return a[i, kk] * weight(j, kk, False)
        inside = tvm.tirx.Select(kk < k, a[i, te.min(kk, k - 1)], tvm.tirx.const(0.0, "float32"))
        return inside * weight(j, kk, True)

    p = te.compute((m, groups, n), lambda i, g, j: te.sum(product(i, g, j), axis=r), name="P")
    c = te.compute((m, n), lambda i, j: te.sum(p[i, rg, j] * s[j // LANES, rg, j % LANES], axis=rg), name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, q, s, c]))
    block, sums = sch.get_sblock("C"), sch.get_sblock("P")
    i, j, g = sch.get_loops(block)
    outer, vec, lane = sch.split(j, [None, vectors, LANES])
    sch.reorder(outer, i, g, vec, lane)
    sch.parallel(outer)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, i)
    sch.compute_at(sums, g)  # a group's sums, in registers
    sch.set_scope(sums, 0, "local")
    columns, kk = sch.get_loops(sums)[-2:]
    svec, slane = sch.split(columns, [vectors, LANES])
    ko, ki = sch.split(kk, [None, per])  # int4: both nibbles of a byte in one step, each its own shift
    sch.reorder(ko, ki, svec, slane)
    sch.unroll(ki)
    sch.unroll(svec)
    sch.vectorize(slane)
    sch.vectorize(sch.get_loops(sch.decompose_reduction(sums, ko))[-1])
    sch.unroll(vec)
    sch.vectorize(lane)
    sch.vectorize(sch.get_loops(sch.decompose_reduction(block, g))[-1])
    sch.vectorize(sch.get_loops(acc)[-1])
    label = f"weight-only {scheme.name}: dequantized in the matrix-vector kernel, scaled a group"
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

    def __init__(self, mod: tvm.IRModule, scheme: Scheme | None, target: Target):
        super().__init__(mod)
        self.scheme, self.target, self.packed = scheme, target, Packed()
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
            kernel = weight_only_kernel(m, k, n, self.scheme, tile_vectors(self.target, n))
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


def quantize_weights(mod: tvm.IRModule, scheme: Scheme | None, target: Target) -> tuple[tvm.IRModule, Packed]:
    """The module with its weight matmuls on `scheme` (None: as it is) in kernels tiled for `target`, and
    what their weights take."""
    mutator = WeightOnly(mod, scheme, target)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return (mutator.builder_.get() if scheme else mod), mutator.packed
