"""Calibrate: run the float model on calibration inputs, record each quantized tensor's range and
distribution, and pick the clipping threshold it is quantized with.

Modes: max (the largest magnitude seen), percentile (the 99.99th percentile of magnitudes), kl
(the threshold whose quantized distribution is closest to the float one in KL divergence: entropy
calibration as in TensorRT and Relay), global (one threshold for every tensor, given by the user:
Relay's global_scale; nothing is run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    from webapp.pipeline.stages.importers import TensorSpec

PERCENTILE = 99.99
SAMPLE_CAP = 1 << 18  # magnitudes kept per tensor for the percentile and the histogram
KL_BINS = 2048


@dataclass
class TensorStats:
    min: float
    max: float
    magnitudes: np.ndarray  # a seeded random subsample of |x| over all calibration inputs

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max))

    @property
    def nonnegative(self) -> bool:
        return self.min >= 0.0


def gather(arrays: list[np.ndarray], seed: int = 0) -> TensorStats:
    """The stats of one tensor over the calibration inputs (one array per input)."""
    rng = np.random.default_rng(seed)
    flat = [a.reshape(-1) for a in arrays]
    per = max(1, SAMPLE_CAP // len(flat))
    kept = [np.abs(f if f.size <= per else f[rng.integers(0, f.size, per)]) for f in flat]
    return TensorStats(
        float(min(f.min() for f in flat)), float(max(f.max() for f in flat)), np.concatenate(kept)
    )


def kl_threshold(magnitudes: np.ndarray, absmax: float, levels: int, bins: int = KL_BINS) -> float:
    """Entropy calibration: over candidate thresholds (histogram edges), the one minimizing
    KL(P || Q), P the clipped float histogram and Q that histogram merged into `levels` bins."""
    if absmax <= 0:
        return 0.0
    hist, edges = np.histogram(magnitudes, bins=bins, range=(0.0, absmax))
    hist = hist.astype(np.float64)
    levels = max(int(levels), 1)
    best, best_i = np.inf, bins
    for i in range(max(levels, 16), bins + 1, 4):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        if p.sum() == 0:
            continue
        # Q: the first i bins merged into `levels` groups, each group's mass spread evenly over
        # the bins of the group that were non-empty.
        groups = np.minimum((np.arange(i) * levels) // i, levels - 1)
        nonzero = (hist[:i] > 0).astype(np.float64)
        mass = np.bincount(groups, weights=hist[:i], minlength=levels)
        count = np.bincount(groups, weights=nonzero, minlength=levels)
        q = np.where(nonzero > 0, mass[groups] / np.maximum(count[groups], 1), 0.0)
        p /= p.sum()
        total = q.sum()
        if total == 0:
            continue
        q /= total
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if kl < best:
            best, best_i = kl, i
    return float(edges[best_i])


def threshold(stats: TensorStats, mode: str, levels: int, global_threshold: float = 8.0) -> float:
    if mode == "global":
        return float(global_threshold)
    if mode == "percentile":
        return float(min(np.percentile(stats.magnitudes, PERCENTILE), stats.absmax)) or stats.absmax
    if mode == "kl":
        return kl_threshold(stats.magnitudes, stats.absmax, levels) or stats.absmax
    return stats.absmax


MAX_SAMPLES = 64


def samples_from_npz(path: Path, specs: list[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """Calibration inputs from a user's .npz: one array per model input, named like it (a single
    input may use any name), holding N inputs stacked on a new first axis: shape (N, *input shape),
    or (N, *input shape[1:]) when the batch is 1. Raises StageError saying what does not fit."""
    from webapp.pipeline.errors import StageError

    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {name: archive[name] for name in archive.files}
    except Exception as exc:
        raise StageError(
            f"The calibration file is not a readable .npz of arrays ({type(exc).__name__})."
        ) from None
    if len(specs) == 1 and len(arrays) == 1:
        arrays = {specs[0].name: next(iter(arrays.values()))}
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise StageError(
            f"The calibration file has no array for input(s) {', '.join(missing)} "
            f"(it has: {', '.join(arrays) or 'nothing'})."
        )
    stacked = {}
    for spec in specs:
        a, shape = arrays[spec.name], tuple(spec.shape)
        if a.shape[1:] == shape:
            stacked[spec.name] = a
        elif shape[0] == 1 and a.shape[1:] == shape[1:]:
            stacked[spec.name] = a[:, None]
        else:
            raise StageError(
                f"Calibration array {spec.name!r} has shape {list(a.shape)}; expected [N, "
                f"{', '.join(str(d) for d in shape)}] (N inputs of the model's input shape)."
            )
        if a.dtype.kind not in "fiub":
            raise StageError(f"Calibration array {spec.name!r} is not numeric ({a.dtype}).")
    count = min(len(a) for a in stacked.values())
    if count == 0:
        raise StageError("The calibration file holds no inputs (N = 0).")
    return [
        {s.name: np.ascontiguousarray(stacked[s.name][i]).astype(s.dtype) for s in specs}
        for i in range(min(count, MAX_SAMPLES))
    ]
