"""What the result page states beyond the raw measurements (speedups, the reason for no speedup, the
worst layer, sweep rows, records used), computed once from the results and stored in result.json, so
that the page and its JSON twin say the same thing. Plain Python: no TVM."""

from __future__ import annotations


def derive(results: dict) -> dict:
    """Keys to merge into result.json at the end of the job (and after each stage, from what is known)."""
    return {}
