"""The project's own passes around TVM's: Relax rewrites before legalization (fast math, channels
last, Winograd), the legalization a target names, and the TIR lowering pipeline."""

from __future__ import annotations
