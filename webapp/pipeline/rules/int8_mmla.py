"""The int8 tensor intrinsic of Arm's matrix multiply-accumulate, `smmla` (the i8mm extension: Neoverse
V1 and N2, AWS Graviton3 and 4, Cortex-A710 and X2 and later): one instruction multiplies a 2 x 8
matrix of int8 (two rows of 8 bytes) by the transpose of another (two columns of 8) and adds the
2 x 2 int32 products to the accumulator, 32 multiply-adds where `sdot` does 16. The rows are two
output pixels (or two matrix rows) over 8 input channels, the columns two output channels; the
accumulator holds a 2 x 2 tile, so the rules (rules/int8.py, `conv2d_nhwc_mmla`, `matmul_mmla`) keep
their sums in (pixels / 2, channels / 2, 2, 2) and pack the weights (channels / 2, inputs / 8, 2, 8)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tvm.ir import Expr

ROWS, COLS, DEPTH = 2, 2, 8  # an instruction: 2 rows x 2 columns, 8 products each


def weight_tile(o: Expr, i: Expr, pairs: int) -> tuple:
    """Where output channel o (within its register tile of `pairs` pairs) and input channel i (within
    its 8) of a weight lie in the repacked weights: a pair of channels' 8 bytes each, together."""
    return ((o // COLS,) if pairs > 1 else ()) + (o % COLS, i)


def register(name: str, lanes: int, a_dtype: str, intrinsic: tuple) -> str:
    """The intrinsic (`lanes`: 2, the columns): C[2 rows, 2 columns] (int32, in registers) +=
    A[2 rows, 8] x B[2 columns, 8]^T, A's rows anywhere (two 8-byte loads: two output pixels of a
    convolution read input pixels one apart), B's 16 bytes together."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    intrinsic = intrinsic[1]  # ("smmla", LLVM's name)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (ROWS, DEPTH), a_dtype, offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (COLS, DEPTH), "int8", offset_factor=1)
        C = T.match_buffer(c, (ROWS, COLS), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:ROWS, 0:COLS], A[0:ROWS, 0:DEPTH], B[0:COLS, 0:DEPTH])
            T.writes(C[0:ROWS, 0:COLS])
            for i, j, k in T.grid(ROWS, COLS, DEPTH):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(B[vj, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (ROWS, DEPTH), a_dtype, offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (COLS, DEPTH), "int8", offset_factor=1)
        C = T.match_buffer(c, (ROWS, COLS), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:ROWS, 0:COLS], A[0:ROWS, 0:DEPTH], B[0:COLS, 0:DEPTH])
            T.writes(C[0:ROWS, 0:COLS])
            rows = T.Shuffle(
                [A.vload([0, 0], f"{a_dtype}x{DEPTH}"), A.vload([1, 0], f"{a_dtype}x{DEPTH}")],
                list(range(ROWS * DEPTH)),
            )
            C.vstore(
                [0, 0],
                T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(intrinsic),
                    C.vload([0, 0], dtype=f"int32x{ROWS * COLS}"),
                    rows,
                    B.vload([0, 0], dtype=f"int8x{COLS * DEPTH}"),
                    dtype=f"int32x{ROWS * COLS}",
                ),
            )

    TensorIntrin.register(name, desc, impl, override=True)
    return name
