"""Scales: how a float tensor maps onto b-bit integers, and how an int32 accumulator is brought back
to the next layer's integers (a float32 multiply, or a shift when every scale is a power of two).

Pure numpy; the tests check these against their definitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

# a float scale or an array of them (per channel): power2_up gives back the same kind
Scale = TypeVar("Scale", float, np.ndarray)


def power2_up(scale: Scale) -> Scale:
    """The smallest power of two >= scale (rounding down would saturate the largest values)."""
    return 2.0 ** np.ceil(np.log2(np.maximum(scale, np.finfo(np.float32).tiny)))


@dataclass(frozen=True)
class ActQuant:
    """An activation tensor stored as 8-bit integers: real = scale * (q - zero_point), q in
    [qmin, qmax]. As uint8 (x86, whose dot product is uint8 x int8): tensors that are never negative
    (after a ReLU) use zero point 0 and all 2^bits levels, others are symmetric around zero point 128
    (int8 shifted by 128). As int8 (Arm, whose dot product is int8 x int8): zero point 0, and a
    non-negative tensor uses the 2^(bits-1) non-negative levels only."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str = "uint8"

    @staticmethod
    def make(threshold: float, nonnegative: bool, bits: int, power2: bool, dtype: str = "uint8") -> ActQuant:
        threshold = max(float(threshold), 1e-8)
        half = 2 ** (bits - 1)
        if dtype == "int8":
            qmax = max(half - 1, 1) if not nonnegative else min(2**bits - 1, 127)
            zero_point, qmin = 0, 0 if nonnegative else -half
        elif nonnegative:
            zero_point, qmin, qmax = 0, 0, 2**bits - 1
        else:
            zero_point, qmin, qmax = 128, 128 - half, 128 + max(half - 1, 1)
        scale = threshold / (qmax - zero_point)
        return ActQuant(float(power2_up(scale)) if power2 else scale, zero_point, qmin, qmax, dtype)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """As the quantized model does it: float32 multiply by 1/scale, round half up."""
        q = np.floor(fma32(x, np.float32(1.0 / self.scale), np.float32(self.zero_point + 0.5)))
        return np.clip(q, self.qmin, self.qmax).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return (q.astype(np.float32) - self.zero_point) * np.float32(self.scale)

    def to_json(self) -> dict:
        return {
            "scale": self.scale,
            "zero_point": self.zero_point,
            "qmin": self.qmin,
            "qmax": self.qmax,
            "dtype": self.dtype,
        }


def weight_scales(w: np.ndarray, bits: int, mode: str, per_channel: bool, axis: int) -> np.ndarray:
    """Scale per output channel (per_channel) or one for the tensor, shaped to broadcast along `axis`.
    max: the largest magnitude maps to the largest level; power2: that scale rounded up to a power of
    two. At 1 bit the weights are signs and the scale is the mean magnitude (binary networks)."""
    reduce = tuple(i for i in range(w.ndim) if i != axis) if per_channel else None
    magnitude = np.abs(w.astype(np.float64))
    if bits == 1:
        scale = magnitude.mean(axis=reduce, keepdims=True)
    else:
        scale = magnitude.max(axis=reduce, keepdims=True) / (2 ** (bits - 1) - 1)
    scale = np.maximum(scale, 1e-12)
    return power2_up(scale) if mode == "power2" else scale


def quantize_weights(w: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    if bits == 1:
        return np.where(w >= 0, 1, -1).astype(np.int8)
    limit = 2 ** (bits - 1) - 1
    return np.clip(np.round(w / scale), -limit, limit).astype(np.int8)


def paired_last(x: np.ndarray, axis: int) -> np.ndarray:
    """`x` with `axis` moved last and padded with a zero to an even length: pairs at [..., 0::2] and
    [..., 1::2]."""
    x = np.moveaxis(x, axis, -1)
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, x.shape[-1] % 2)])


def pair_sums(w: np.ndarray, axis: int) -> np.ndarray:
    """The magnitude of each pair's same-signed sum along `axis` (0 and 1, 2 and 3, ...: the pairs of
    weights an x86 vpmaddubsw multiplies by two uint8 activations and sums into int16): the most the pair
    can add up to with activations of one sign. `axis` halved (rounded up)."""
    w = paired_last(np.asarray(w, np.float64), axis)
    up = np.maximum(w[..., 0::2], 0) + np.maximum(w[..., 1::2], 0)
    down = np.minimum(w[..., 0::2], 0) + np.minimum(w[..., 1::2], 0)
    return np.moveaxis(np.maximum(up, -down), -1, axis)


def fit_pairs(wq: np.ndarray, exact: np.ndarray, limit: int, axis: int) -> np.ndarray:
    """8-bit weights whose pairs along `axis` (pair_sums) add up to at most `limit` in magnitude. The
    scale already keeps the unrounded pairs within it (Realizer.weight_scale); rounding both up can
    pass it by one level, and such a pair moves to the nearest pair on the limit: the excess split
    between the two, each rounded, their sum exact."""
    odd = wq.shape[axis] % 2
    w, f = paired_last(wq.astype(np.int64), axis), paired_last(exact.astype(np.float64), axis)
    w0, w1 = w[..., 0::2], w[..., 1::2]
    total = w0 + w1
    over = np.abs(total) > limit
    t = np.sign(total) * limit
    first = np.clip(np.round((f[..., 0::2] - f[..., 1::2] + t) / 2), -127, 127)
    w[..., 0::2] = np.where(over, first, w0)
    w[..., 1::2] = np.where(over, np.clip(t - first, -127, 127), w1)
    return np.moveaxis(w[..., : w.shape[-1] - odd], -1, axis).astype(np.int8)


def fma32(a: ArrayLike, b: ArrayLike, c: ArrayLike) -> np.ndarray:
    """float32 a * b + c rounded once, as a fused multiply-add: TVM's LLVM code generation fuses a
    float multiply with the add after it (the quantize and requantize steps compile to `vfmadd`).
    The float32 product is exact in float64, and so is the sum at the magnitudes 8-bit values take."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    return (a * b + c).astype(np.float32)


def is_power_of_two(x: ArrayLike) -> bool:
    x = np.asarray(x, dtype=np.float64)
    mantissa, _ = np.frexp(x)
    return bool(np.all((x > 0) & (mantissa == 0.5)))


def requantize_reference(
    acc: np.ndarray, multiplier: np.ndarray, out: ActQuant, lo: int, hi: int
) -> np.ndarray:
    """The arithmetic the quantized kernels do after their int32 accumulation (numpy). A power-of-two
    multiplier is a rounding shift; any other a float32 multiply, rounded half up (floor of + 1/2)."""
    if not is_power_of_two(multiplier):
        y = fma32(acc.astype(np.float32), np.asarray(multiplier).astype(np.float32), out.zero_point + 0.5)
        return np.clip(np.floor(y), lo, hi).astype(out.dtype)
    acc = acc.astype(np.int64)
    k = -np.log2(multiplier).astype(np.int64)
    left = np.maximum(-k, 0)
    right = np.maximum(k, 0)
    y = ((acc << left) + np.where(right > 0, 1 << np.maximum(right - 1, 0), 0)) >> right
    return np.clip(y + out.zero_point, lo, hi).astype(out.dtype)


def fixed_point_terms(multipliers: list, offset: ArrayLike) -> tuple[list, np.ndarray, int] | None:
    """sum(t x m) + offset, t int32 (at most two terms), as (sum(t x M) + C) >> shift in int64 (an
    arithmetic shift: the floor): M = round(m x 2**shift), C = round(offset x 2**shift), one shift for
    all, so that the largest M lies in [2**29, 2**30] (the shift at most 52) and each product is
    below 2**61; C (per channel or one value: the rounding's 1/2, the zero point, a bias) below 2**61
    too: the sum stays in int64 at any int32 t. A multiplier 2**-k below the largest keeps 30 - k bits.
    None where a multiplier is 2**28 or more or C passes its bound (no layer's: the multipliers are
    input scale x weight scale / output scale, the offsets a few hundred)."""
    largest = max(float(np.max(np.abs(m))) for m in multipliers)
    if len(multipliers) > 2 or not 0 < largest < 2**28:
        return None
    shift = int(min(29 - np.floor(np.log2(largest)), 52))
    fixed = [np.round(np.asarray(m, np.float64) * 2.0**shift).astype(np.int64) for m in multipliers]
    rounding = np.round(np.asarray(offset, np.float64) * 2.0**shift)
    if np.max(np.abs(rounding)) >= 2**61:
        return None
    return fixed, rounding.astype(np.int64), shift


def fixed_point_reference(
    terms: list, multipliers: list, offset: float, lo: int, hi: int, dtype: str
) -> np.ndarray:
    """The arithmetic of a fixed-point requantization (Realizer.fixed_point_multiply) in numpy."""
    # the caller's requantization is of this form (fixed_point_terms is None for one that is not)
    fixed, rounding, shift = cast("tuple[list, np.ndarray, int]", fixed_point_terms(multipliers, offset))
    total = sum(np.asarray(t).astype(np.int64) * m for t, m in zip(terms, fixed, strict=True))
    return np.clip((total + rounding) >> shift, lo, hi).astype(dtype)  # (as int32 when shift >= 32: equal)


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """b-bit integers stored 8/b to a byte (two's complement fields, first value in the low bits);
    at 1 bit the values are signs: -1 -> 0, +1 -> 1."""
    flat = q.reshape(-1).astype(np.int16)
    fields = (flat > 0).astype(np.uint8) if bits == 1 else (flat & (2**bits - 1)).astype(np.uint8)
    per_byte = 8 // bits
    fields = np.concatenate([fields, np.zeros((-len(fields)) % per_byte, np.uint8)]).reshape(-1, per_byte)
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(fields << shifts, axis=1).astype(np.uint8)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    per_byte = 8 // bits
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    fields = ((packed[:, None] >> shifts) & (2**bits - 1)).reshape(-1)[:count].astype(np.int16)
    if bits == 1:
        return np.where(fields > 0, 1, -1).astype(np.int8)
    return np.where(fields >= 2 ** (bits - 1), fields - 2**bits, fields).astype(np.int8)
