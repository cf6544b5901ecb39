"""x86-64 CPUs: built with LLVM for this server's CPU or a named instruction set, run and timed here
where this CPU has the instructions the code uses (built, not run, where it lacks them).

PLAYGROUND_HOST_PRESET=x86-avx2 (any x86 preset's name) makes `x86-host` build the code of that preset
instead of this CPU's: the whole project, its tests included, then behaves as on a machine with that
instruction set (an AVX-512 machine runs the AVX2 code its tests check)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass

from webapp.asm import Dialect, per_instruction
from webapp.targets.base import LLVMCPU, cpu_flags, has_feature, host_clock_ghz

HOST_PRESET_VARIABLE = "PLAYGROUND_HOST_PRESET"

# Operations per instruction (a multiply-add counts as two), by its vector register's width
OPS = {  # mnemonic pattern -> (element bits, operations per element)
    r"vf(n)?m(add|sub)\d+p[s]": (32, 2),
    r"vf(n)?m(add|sub)\d+p[d]": (64, 2),
    r"vf(n)?m(add|sub)\d+s[s]": (None, 2),
    r"vpdpbusds?": (32, 8),  # 4 uint8 x int8 multiply-adds per int32 lane
    r"vpdpwssds?": (32, 4),
    r"vpmaddubsw": (8, 2),  # u8 x s8 products summed in pairs: one multiply-add per byte
}
WIDTH = {"xmm": 128, "ymm": 256, "zmm": 512}


def ops(mnemonic: str, operands: str) -> float:
    for pattern, (bits, per_element) in OPS.items():
        if re.fullmatch(pattern, mnemonic):
            register = re.findall(r"%([xyz]mm)\d+", operands)
            width = WIDTH[register[-1]] if register else 128
            return per_element * (width // bits if bits else 1)
    return 0.0


DIALECT = Dialect(
    "x86_64",
    "#",
    vector=re.compile(r"%[xyz]mm\d+\b"),
    call=re.compile(r"\s+(callq?|retq?)\b"),
    # packed instructions (vpaddd, vmulps, vmovdqu, vbroadcastss...), not those on one element in xmm
    # registers (vmulss, vfmadd231sd)
    packed=re.compile(r"^\s+(v?p[a-z]\w*|\w+p[sd]|vmovdq\w*|vbroadcast\w*|vperm\w*)\s.*%[xyz]mm"),
    ops=per_instruction(ops),
)


@dataclass(frozen=True)
class X86(LLVMCPU):
    needs: tuple[str, ...] = ()  # the CPU flags (as /proc/cpuinfo names them) its code needs

    kind = "x86"
    arch = "x86_64"
    dialect = DIALECT
    mca_triple = "x86_64-linux-gnu"
    activation_dtype = "uint8"  # vpdpbusd multiplies uint8 activations by int8 weights
    dot_instructions = (
        ("VNNI", 16, "uint8", "llvm.x86.avx512.vpdpbusd.512", "avx512vnni"),  # vpdpbusd zmm
        ("VNNI-256", 8, "uint8", "llvm.x86.avx512.vpdpbusd.256", "avx512vnni"),  # ymm: 8 channels
        ("AVX-VNNI", 8, "uint8", "llvm.x86.avx512.vpdpbusd.256", "avxvnni"),  # {vex} vpdpbusd ymm
        # without a dot product: vpmaddubsw (pairs into int16), vpmaddwd by ones (into int32), an add
        (
            "AVX512BW",
            16,
            "uint8",
            ("vpmaddubsw", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
            "avx512bw",
        ),
        ("AVX2", 8, "uint8", ("vpmaddubsw", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"), "avx2"),
    )
    # without a dot product, the widened 16-bit products go through a multiply-add
    int8_mnemonics = {
        "VNNI": "vpdpbusd",
        "VNNI-256": "vpdpbusd",
        "AVX-VNNI": "vpdpbusd",
        "AVX512BW": "vpmaddubsw",
        "AVX2": "vpmaddubsw",
        None: "vpmaddwd",
    }

    @property
    def can_run_here(self) -> bool:
        return platform.machine() == self.arch and set(self.needs) <= cpu_flags()

    @property
    def runs_on(self) -> str:
        missing = sorted(set(self.needs) - cpu_flags())
        if platform.machine() == self.arch and missing:
            return f"nowhere here: this server's CPU lacks {', '.join(missing)} (built, not run)"
        return super().runs_on

    def mca_cpu(self) -> tuple[str, float | None, str]:
        """This machine's CPU for x86-host, the preset's named one; this machine's clock (its code runs
        here)."""
        return (
            str(self.tvm.attrs.get("mcpu", "generic")),
            host_clock_ghz(),
            "this machine's, as Linux reports it",
        )

    def vector_shape(self) -> tuple[int, int]:
        if has_feature(self.tvm, "avx512f"):
            return 16, 32
        if has_feature(self.tvm, "avx2") or has_feature(self.tvm, "avx"):
            return 8, 16
        return 4, 16  # SSE2, the x86-64 baseline

    def database_key(self) -> str:
        """Records for this server's CPU are kept per vector ISA (e.g. x86-host-avx512): what a tuned
        schedule depends on most."""
        if self.name != "x86-host":
            return self.name
        flags = cpu_flags() if self.spec.get("mcpu") == "host" else set(self.needs)
        return f"{self.name}-{vector_isa(flags)}"


def vector_isa(flags: set[str]) -> str:
    """The widest x86 vector extension among CPU flags."""
    return next((isa.removesuffix("f") for isa in ("avx512f", "avx2", "avx") if isa in flags), "sse2")


AVX2 = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2")
AVX512 = AVX2 + ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")

NAMED = [
    X86(
        "x86-avx2",
        "x86-64 with AVX2",
        "LLVM for x86-64 with AVX2 and FMA (Intel since Haswell, AMD since Zen): 256-bit vectors, "
        "16 vector registers, no integer dot product (int8 kernels multiply with vpmaddubsw and "
        "vpmaddwd, each pair of weights within their 16-bit sum's range).",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"},
        needs=AVX2,
    ),
    X86(
        "x86-avx512",
        "x86-64 with AVX-512, no VNNI (Skylake-SP)",
        "LLVM for x86-64 with AVX-512 (F, CD, BW, DQ, VL) but no VNNI dot product, as Intel's Skylake "
        "servers (Xeon Scalable, first generation): 512-bit vectors, 32 vector registers; int8 kernels "
        "multiply with vpmaddubsw and vpmaddwd, each pair of weights within their 16-bit sum's range.",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"},
        needs=AVX512,
    ),
    X86(
        "x86-avx512-vnni",
        "x86-64 with AVX-512 VNNI (Cascade Lake, Zen 4)",
        "LLVM for x86-64 with AVX-512 and its VNNI integer dot product (vpdpbusd: 4 uint8 x int8 "
        "products a lane), as Intel since Cascade Lake and AMD since Zen 4: int8 kernels use it.",
        {
            "kind": "llvm",
            "mtriple": "x86_64-linux-gnu",
            "mcpu": "cascadelake",
        },
        needs=(*AVX512, "avx512_vnni"),
    ),
    X86(
        "x86-avxvnni",
        "x86-64 with AVX2 and AVX-VNNI (Alder Lake, Zen 5)",
        "LLVM for x86-64 with AVX2 and the 256-bit VNNI dot product without AVX-512 (AVX-VNNI: "
        "vpdpbusd on ymm registers), as Intel's client CPUs since Alder Lake: int8 kernels use it.",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "alderlake"},
        needs=(*AVX2, "avx_vnni"),
    ),
    X86(
        "x86-generic",
        "x86-64, portable",
        "LLVM for the baseline x86-64 instruction set (SSE2 only): runs on any 64-bit x86 CPU.",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"},
    ),
]


def host_preset() -> X86:
    """x86-host: this CPU's code, or, under PLAYGROUND_HOST_PRESET, a named preset's standing in."""
    title = "x86-64, this server's CPU"
    stand_in = os.environ.get(HOST_PRESET_VARIABLE)
    if not stand_in:
        return X86(
            "x86-host",
            title,
            "LLVM for the CPU of the machine that runs the job (its mcpu is detected, e.g. znver4 with "
            "AVX-512), using all the vector extensions it has.",
            {"kind": "llvm", "mcpu": "host"},
        )
    named = {t.name: t for t in NAMED}
    if stand_in not in named:
        raise ValueError(f"{HOST_PRESET_VARIABLE}={stand_in}: not one of {', '.join(named)}")
    return X86(
        "x86-host",
        f"{title}, as {stand_in}",
        f"Standing in for this server's CPU ({HOST_PRESET_VARIABLE}={stand_in}): "
        + named[stand_in].description,
        named[stand_in].spec,
        needs=named[stand_in].needs,
    )


PRESETS = [host_preset(), *NAMED]
