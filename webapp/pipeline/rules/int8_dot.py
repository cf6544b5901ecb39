"""The int8 tensor intrinsics of one dot-product instruction: AVX-512 VNNI's `vpdpbusd` (zmm, and ymm
for 8 channels), AVX-VNNI's `{vex} vpdpbusd` (ymm, Alder Lake and later), Arm's `sdot` (Cortex-A76,
the Pi 5). Each lane of the accumulator adds the 4 products of 4 activation bytes (broadcast to every
lane) and that lane's 4 weight bytes; the weights lane-major, a lane's 4 bytes together. The int8
rules (rules/int8.py) tensorize with them; rules/int8_pairs.py and rules/int8_neon.py hold the forms
of CPUs without such an instruction."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvm.ir import Expr


def lane_major(name: str, lanes: int, a_dtype: str, products: Callable[[Expr, Expr, Expr], Expr]) -> str:
    """Registers `name`: `lanes` int32 += 4 activations x 4 int8 weights each, the weights [lanes, 4],
    accumulating in registers ("local"); `products(acc, a, b)` the instructions, given the
    accumulator, the 4 activation bytes broadcast to every lane and the weights' bytes. TVM's own x86
    intrinsic (`dot_16x4_vnni`) passes int32 vectors, which LLVM 22 rejects (it wants bytes), and
    accumulates in global memory."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    def broadcast(A):  # the 4 activation bytes as one int32, in every lane
        return T.reinterpret(
            T.broadcast(T.reinterpret(A.vload([0], f"{a_dtype}x4"), dtype="int32"), lanes),
            dtype=f"{a_dtype}x{4 * lanes}",
        )

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((lanes, 4), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            # One expression: a value given a name here becomes a local buffer, which TVM allocates
            # from its workspace pool (a runtime call) at every use
            C[T.ramp(T.int32(0), 1, lanes)] = products(
                C.vload([0], dtype=f"int32x{lanes}"), broadcast(A), B.vload([0, 0], dtype=f"int8x{4 * lanes}")
            )

    TensorIntrin.register(name, desc, impl, override=True)
    return name


def register(name: str, lanes: int, a_dtype: str, intrinsic: str) -> str:
    """The intrinsic of one dot-product instruction (`intrinsic`, LLVM's name: vpdpbusd, sdot)."""
    from tvm.script import tirx as T

    def products(acc, a, b):
        return T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(intrinsic), acc, a, b, dtype=f"int32x{lanes}"
        )

    return lane_major(name, lanes, a_dtype, products)


def weight_tile(o: Expr, i: Expr, lanes: int, vectors: bool = True) -> tuple:
    """Where output channel o (within its register tile) and input channel i (within its 4) of a weight
    lie in the repacked weights: a lane's 4 bytes together."""
    return (o, i)
