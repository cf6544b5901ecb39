"""Targets: one module per kind of target (x86.py, arm.py, ...), each a class whose instances are
the presets users pick. Adding a preset is one entry in its kind's PRESETS; adding a kind is one
new module here with a Target subclass and its PRESETS."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from webapp.targets.base import LLVMCPU, Target

if TYPE_CHECKING:
    from tvm.target import Target as TVMTarget

KIND_MODULES = [
    importlib.import_module(f"{__name__}.{m.name}")
    for m in pkgutil.iter_modules(__path__)
    if m.name != "base"
]
KINDS: list[type[Target]] = sorted(
    {
        cls
        for m in KIND_MODULES
        for cls in vars(m).values()
        if isinstance(cls, type) and issubclass(cls, Target) and cls.kind
    },
    key=lambda cls: cls.kind,
)
TARGETS: dict[str, Target] = {t.name: t for m in KIND_MODULES for t in getattr(m, "PRESETS", [])}
HOST = "x86-host"  # the preset for this server's own CPU: where calibration runs


def get(name: str) -> Target:
    return TARGETS[name]


def host() -> Target:
    """This machine's CPU: where calibration and other measurements run, whatever the job's target."""
    return TARGETS[HOST]


def tir_rewrites(tvm_target: TVMTarget) -> tuple[str, ...]:
    """The TIR rewrites (Target.tir_rewrites) of the kind whose code a TVM target builds, by its triple."""
    triple = str(tvm_target.attrs.get("mtriple", ""))
    kinds = (k for k in KINDS if issubclass(k, LLVMCPU) and triple.startswith(f"{k.arch}-"))
    return next((k.tir_rewrites for k in kinds), ())


def device_lexers() -> dict[str, str]:
    """A device module's language -> the Pygments lexer that colours it, as each GPU kind says."""
    return {k.language: k.lexer for k in KINDS if getattr(k, "lexer", None)}


def emulated_boards() -> list[Target]:
    """The presets whose boards the device pool emulates (those that name a QEMU core)."""
    return [t for t in TARGETS.values() if t.board and hasattr(t, "core")]


def target_json(tvm_target: TVMTarget) -> dict:
    """The TVM target as the plain JSON dict the result page shows."""
    import tvm

    out = {"kind": tvm_target.kind.name}
    for key, value in dict(tvm_target.attrs).items():
        out[key] = [str(v) for v in value] if isinstance(value, (list, tuple, tvm.ir.Array)) else value
    return out
