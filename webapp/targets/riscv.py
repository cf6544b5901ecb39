"""64-bit RISC-V CPUs with the vector extension (RVV 1.0): cross-compiled with Debian's riscv64
toolchain, built and shown here, not run (no board of the device pool runs RISC-V yet): its kernels'
assembly is read as this module's dialect and its hot loops simulated by llvm-mca on the core's model."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from webapp.asm import Dialect
from webapp.targets.base import LLVMCPU, has_feature

if TYPE_CHECKING:
    from tvm.target import Target as TVMTarget

VLEN = 512  # the vector registers' bits (zvl512b): the X280's
# vector float arithmetic as LLVM writes it: a multiply-add counts two per element
MULTIPLY_ADDS = re.compile(r"vf(n)?m(acc|sac|add|sub)\.v[vf]")
ONE_OP = re.compile(r"vf(add|sub|mul|min|max)\.v[vf]")
# the element width and register group the instructions after it work at: vsetvli a5, s0, e32, m2, ...
VTYPE = re.compile(r"\be(\d+),\s*m(f?)(\d)")


def ops(instructions: list[tuple[str, str]]) -> float:
    """Operations of a run of RVV instructions: each at VLEN x LMUL / SEW elements, as the vsetvli
    before it says (e32 at LMUL 1 before the first)."""
    total, elements = 0.0, VLEN // 32
    for mnemonic, operands in instructions:
        vtype = VTYPE.search(operands) if mnemonic.startswith("vset") else None
        if vtype:
            sew, fraction, lmul = int(vtype.group(1)), vtype.group(2), int(vtype.group(3))
            elements = VLEN // sew // lmul if fraction else VLEN * lmul // sew
        elif MULTIPLY_ADDS.fullmatch(mnemonic):
            total += 2.0 * elements
        elif ONE_OP.fullmatch(mnemonic):
            total += elements
    return total


DIALECT = Dialect(
    "riscv64",
    "#",
    vector=re.compile(r"\bv\d+\b"),
    call=re.compile(r"\s+(call|tail|ret|jalr)\b"),
    packed=re.compile(r"^\s+v(?!setvli|setivli|setvl\b)[a-z0-9.]*\.(?:v|vv|vf|vx|vi|wv|wf|wx|vs|vm)\b"),
    ops=ops,
)


class RISCV(LLVMCPU):
    kind = "riscv"
    arch = "riscv64"
    cross_compiler = "riscv64-linux-gnu-g++"
    dialect = DIALECT
    mca_triple = "riscv64-linux-gnu"
    no_quantization = (
        "int8 kernels for RISC-V are not written yet (its vector extension has no int8 dot product the "
        "project's int8 rules use), so quantized riscv64 builds are not offered. Submit riscv64 with "
        "quantize none, or quantize for another target."
    )

    def vector_shape(self) -> tuple[int, int]:
        return VLEN // 32, 32  # float32 lanes at LMUL 1, 32 vector registers

    def mca_cpu(self) -> tuple[str, float | None, str]:
        return str(self.spec["mcpu"]), None, "none: the X280 comes at several clocks, so cycles, not ms"

    def tvm_target(self) -> TVMTarget:
        target = super().tvm_target()
        assert has_feature(target, "v"), f"{self.name}: a RISC-V target without the vector extension"
        return target


PRESETS = [
    RISCV(
        "riscv64",
        "RISC-V 64 with vectors (SiFive X280)",
        "64-bit RISC-V (RV64GCV) with the vector extension 1.0 at 512 bits, as SiFive's Intelligence X280 "
        "cores (Microchip's PIC64-HPSC has eight). Built and shown here, its hot loops simulated by "
        "llvm-mca on the X280's model (in cycles: the core comes at several clocks); not run: no board "
        "of the device pool runs RISC-V.",
        {
            "kind": "llvm",
            "mtriple": "riscv64-linux-gnu",
            "mcpu": "sifive-x280",
            "mabi": "lp64d",
            "mattr": ["+64bit", "+m", "+a", "+f", "+d", "+c", "+v", "+zvl512b"],
            "num-cores": 8,
        },
    )
]
