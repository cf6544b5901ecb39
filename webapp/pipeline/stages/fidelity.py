"""How far a build's outputs lie from a reference's: the largest difference, cosine, SQNR, the top-1
agreement of a classifier's scores, and a word where an output is constant (what cosine and SQNR then
miss). Summed a chunk at a time in float64, so a language model's logits over a long prompt fit."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

FIDELITY_CHUNK = 1 << 20  # values a step: a prefill's logits (512 x 151,936) in float64 take GBs


def paired_chunks(ours: list[np.ndarray], reference: list[np.ndarray]) -> Iterator[tuple]:
    """The two lists' values side by side in float64, FIDELITY_CHUNK at a time (outputs split otherwise
    than the reference's are compared as one)."""
    if [o.size for o in ours] != [r.size for r in reference]:
        ours = [np.concatenate([o.ravel() for o in ours])]
        reference = [np.concatenate([r.ravel() for r in reference])]
    for o, r in zip(ours, reference, strict=True):
        o, r = o.ravel(), r.ravel()
        for i in range(0, o.size, FIDELITY_CHUNK):
            yield o[i : i + FIDELITY_CHUNK].astype(np.float64), r[i : i + FIDELITY_CHUNK].astype(np.float64)


def fidelity(ours: list[np.ndarray], reference: list[np.ndarray], classifier: bool) -> dict:
    size, ref_size = sum(o.size for o in ours), sum(r.size for r in reference)
    if size != ref_size:
        return {"error": f"output sizes differ: {size} vs {ref_size} values"}
    noise = signal = dot = ours_sq = max_abs = 0.0
    lows, highs = [], []  # each side's smallest and largest value: a constant output is named
    for a, b in paired_chunks(ours, reference):
        diff = a - b
        noise += float(np.sum(diff**2))
        signal += float(np.sum(b**2))
        ours_sq += float(np.sum(a**2))
        dot += float(np.dot(a, b))
        max_abs = float(np.max([max_abs, np.max(np.abs(diff))]))  # NaN stays NaN
        lows.append((a.min(), b.min()))
        highs.append((a.max(), b.max()))
    norms = math.sqrt(ours_sq * signal)
    result: dict[str, float | str | None] = {
        "max_abs_err": max_abs,
        # undefined where an output is all zeros and the two differ (not 0: a word says why)
        "cosine": dot / norms if norms > 0 else (1.0 if noise == 0 else None),
        "sqnr_db": (float(10 * math.log10(signal / noise)) if noise > 0 else None) if signal > 0 else None,
        "top1_agree": None,
    }
    if size:
        low, high = np.min(lows, axis=0), np.max(highs, axis=0)
        notes = (
            constant_output(low[1], high[1], size, "the reference"),
            constant_output(low[0], high[0], size, "TVM"),
        )
        constant = [note for note in notes if note]
        if constant:  # cosine and SQNR compare directions and energies: of a constant they say little
            result["degenerate"] = "; ".join(constant)
    first, ref_first = ours[0], reference[0]
    if classifier and first.ndim == 2 and first.shape[1] > 1:
        # On the inputs of this one run (its batch): with one input, 0 or 1 and no evidence of
        # anything; the page shows it only over several (accuracy() measures it on a dataset).
        result["top1_agree"] = float(np.mean(first.argmax(1) == ref_first.argmax(1)))
        result["top1_inputs"] = int(first.shape[0])
    return result


def constant_output(low: float, high: float, size: int, who: str) -> str | None:
    """Says so where an output (`size` values from `low` to `high`) is all zeros or one value everywhere (a
    model whose weights are constants, a broken build), which cosine and SQNR would show as a bare 0 or a
    blank."""
    if size < 2 or low != high:
        return None
    if low == 0:
        return f"{who}'s output is all zeros"
    return f"{who}'s output is {low:.6g} everywhere"
