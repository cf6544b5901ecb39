"""Schedule rules: how each kernel is scheduled, by kind of target (CPU float rules, the int8 rules of
the dot-product instructions, GPU rules), and the helpers they share."""

from __future__ import annotations
