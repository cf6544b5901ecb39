"""x86-64 CPUs: built with LLVM for this server's CPU or a portable baseline, run and timed here."""

from __future__ import annotations

from pathlib import Path

from webapp.targets.base import LLVMCPU, has_feature


class X86(LLVMCPU):
    kind = "x86"
    arch = "x86_64"
    activation_dtype = "uint8"  # vpdpbusd multiplies uint8 activations by int8 weights
    dot_instructions = (
        ("VNNI", 16, "uint8", "llvm.x86.avx512.vpdpbusd.512", "avx512vnni"),  # vpdpbusd zmm
        ("VNNI-256", 8, "uint8", "llvm.x86.avx512.vpdpbusd.256", "avx512vnni"),  # ymm: 8 channels
    )

    @classmethod
    def matches(cls, tvm_target) -> bool:
        triple = str(tvm_target.attrs.get("mtriple", ""))
        return tvm_target.kind.name == "llvm" and (triple.startswith("x86_64") or not triple)

    @classmethod
    def vector_shape(cls, tvm_target) -> tuple[int, int]:
        if has_feature(tvm_target, "avx512f"):
            return 16, 32
        if has_feature(tvm_target, "avx2") or has_feature(tvm_target, "avx"):
            return 8, 16
        return 4, 16  # SSE2, the x86-64 baseline

    def database_key(self) -> str:
        """Records for this server's CPU are kept per vector ISA (e.g. x86-host-avx512): what a tuned
        schedule depends on most."""
        return f"{self.name}-{host_vector_isa()}" if self.spec.get("mcpu") == "host" else self.name


def host_vector_isa() -> str:
    """This server's widest x86 vector extension, from /proc/cpuinfo (no TVM in the worker)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    flags = set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())
    return next((isa.removesuffix("f") for isa in ("avx512f", "avx2", "avx") if isa in flags), "sse2")


PRESETS = [
    X86(
        "x86-host",
        "x86-64, this server's CPU",
        "LLVM for the CPU of the machine that runs the job (its mcpu is detected, e.g. znver4 with "
        "AVX-512), using all the vector extensions it has.",
        {"kind": "llvm", "mcpu": "host"},
    ),
    X86(
        "x86-avx2",
        "x86-64 with AVX2",
        "LLVM for x86-64 with AVX2 and FMA (Intel since Haswell, AMD since Zen): 256-bit vectors, "
        "16 vector registers.",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"},
    ),
    X86(
        "x86-generic",
        "x86-64, portable",
        "LLVM for the baseline x86-64 instruction set (SSE2 only): runs on any 64-bit x86 CPU.",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"},
    ),
]
