"""The int8 tensor intrinsic of x86 CPUs without a dot product (AVX2, as `x86-avx2`; AVX-512BW without
VNNI, as `x86-avx512`), as ONNX Runtime's MLAS computes int8 there: `vpmaddubsw` multiplies uint8
activations by int8 weights and sums each pair of products into int16, `vpmaddwd` by ones sums pairs
of those into int32, and an add accumulates. The weights lane-major, as for the dot-product
instructions (rules/int8_dot.py).

vpmaddubsw saturates a pair's sum at 32,767: 2 x 255 x 127 would pass it, so the quantizer keeps each
pair of weights (input channels 0 and 1, 2 and 3...) within 128 in magnitude where they have one sign
on such a target (Target.int8_pair_limit; 255 x 128 = 32,640; stages/quantize/scales.pair_sums)."""

from __future__ import annotations

from webapp.pipeline.rules.int8_dot import lane_major
from webapp.pipeline.rules.int8_dot import weight_tile as weight_tile  # lane-major, as the dot products


def register(name: str, lanes: int, a_dtype: str, intrinsic: tuple) -> str:
    """`intrinsic`: ("vpmaddubsw", LLVM's vpmaddubsw, LLVM's vpmaddwd) for the vector width."""
    from tvm.script import tirx as T

    _, pairs, quads = intrinsic

    def products(acc, a, b):
        halves = T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(pairs), a, b, dtype=f"int16x{2 * lanes}")
        ones = T.broadcast(T.int16(1), 2 * lanes)
        return acc + T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(quads), halves, ones, dtype=f"int32x{lanes}"
        )

    return lane_major(name, lanes, a_dtype, products)
