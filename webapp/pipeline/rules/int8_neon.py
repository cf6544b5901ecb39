"""The int8 tensor intrinsic of Arm cores without a dot product (Cortex-A72, the Raspberry Pi 4), as
MLAS's and XNNPACK's NEON kernels compute int8 there: `smull` multiplies input channels 0-1 of a
vector's 4 output channels (8 int8 x int8 products into int16), `smlal` adds channels 2-3's products
into the same int16s (2 products each: 2 x 128 x 127 = 32,512 fits, as weights stop at +-127), and
`sadalp` adds adjacent int16s into the int32 accumulator: three instructions for 16 multiply-adds,
where `sdot` takes one and float `fmla` four. For this the weights are packed pair-major
(weight_tile)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvm.ir import Expr


def weight_tile(o: Expr, i: Expr, lanes: int, vectors: bool = True) -> tuple:
    """Where output channel o (within its register tile: several vectors, or one when not `vectors`)
    and input channel i (within its 4) of a weight lie in the repacked weights: ([vector,] i // 2,
    lane, i % 2), input channels 0-1 of every lane of a vector, then 2-3, so that one smull and one
    smlal multiply a whole vector's lanes and add into the same int16s."""
    return ((o // lanes,) if vectors else ()) + (i // 2, o % lanes, i % 2)


def register(name: str, lanes: int, a_dtype: str, intrinsic: tuple) -> str:
    """`intrinsic`: ("smull", LLVM's smull, LLVM's saddlp); LLVM makes smlal of the add of a second
    smull, and sadalp of saddlp's add to the accumulator."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    _, widen, long_pairs = intrinsic

    @T.prim_func(s_tir=True)
    def desc(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((2, lanes, 2), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:2, 0:lanes, 0:2])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vk // 2, vi, vk % 2], "int32")

    def products(A, B, half: int):
        """Input channels 2 half, 2 half + 1 of the 4 lanes: A's two bytes as one int16, broadcast to
        every lane, by B's 8 bytes of them."""
        a = T.broadcast(T.reinterpret(A.vload([2 * half], f"{a_dtype}x2"), dtype="int16"), lanes)
        b = B.vload([half, 0, 0], f"int8x{2 * lanes}")
        return T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(widen), T.reinterpret(a, dtype=f"int8x{2 * lanes}"), b, dtype="int16x8"
        )

    @T.prim_func(s_tir=True)
    def impl(
        A: T.Buffer((4,), a_dtype, offset_factor=1),
        B: T.Buffer((2, lanes, 2), "int8", offset_factor=1),
        C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:2, 0:lanes, 0:2])
            T.writes(C[0:lanes])
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(long_pairs),
                products(A, B, 0) + products(A, B, 1),
                dtype=f"int32x{lanes}",
            )

    TensorIntrin.register(name, desc, impl, override=True)
    return name
