"""64-bit Arm CPUs (aarch64): cross-compiled with Debian's aarch64 toolchain, run on the boards of
the device pool (webapp/devices): Raspberry Pi 4 and 5, emulated here under QEMU or real ones."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from webapp.asm import Dialect, per_instruction
from webapp.targets.base import LLVMCPU, has_feature

if TYPE_CHECKING:
    from tvm.target import Target as TVMTarget

OPS = {  # mnemonic -> operations per destination lane (its arrangement: .4s, 4 lanes)
    "fmla": 2,
    "fmls": 2,
    "sdot": 8,
    "udot": 8,
    "smmla": 16,  # 2x8 by 8x2 into 2x2: 8 multiply-adds per int32 lane
    "ummla": 16,
    "smull": 2,
    "smull2": 2,
    "smlal": 2,
    "smlal2": 2,
    "umull": 2,
    "umlal": 2,
}


def ops(mnemonic: str, operands: str) -> float:
    lanes = re.match(r"\s*v\d+\.(\d+)[bhsd]", operands)
    return OPS.get(mnemonic, 0) * int(lanes.group(1)) if lanes else 0.0


DIALECT = Dialect(
    "aarch64",
    "//",
    vector=re.compile(r"\b(?:v\d+\.\d*[bhsd]|q\d+)\b"),
    call=re.compile(r"\s+(bl|blr|br|ret)\b"),
    packed=re.compile(r"\bv\d+\.\d+[bhsd]\b"),  # a NEON register with an arrangement (v1.4s)
    ops=per_instruction(ops),
)


class Arm(LLVMCPU):
    kind = "arm"
    arch = "aarch64"
    dialect = DIALECT
    mca_triple = "aarch64-linux-gnu"
    tir_rewrites = ("floor_to_int",)  # fcvtms: floor and convert in one instruction
    cross_compiler = "aarch64-linux-gnu-g++"
    activation_dtype = "int8"  # sdot multiplies int8 by int8
    converts_saturating = True  # fcvtzs and fcvtms saturate
    requantizes_fixed_point = True  # smull / smlal into int64, a shift: no float vector instruction
    dot_instructions = (
        # i8mm's matrix multiply-accumulate: 2 x 8 by 8 x 2 int8 into a 2 x 2 int32 tile (rules/int8_mmla.py)
        ("i8mm", 2, "int8", ("smmla", "llvm.aarch64.neon.smmla.v4i32.v16i8"), "i8mm"),
        ("sdot", 4, "int8", "llvm.aarch64.neon.sdot.v4i32.v16i8", "dotprod"),
        # without a dot product: smull and smlal (int8 x int8 into int16), sadalp (pairs into int32)
        ("NEON", 4, "int8", ("smull", "llvm.aarch64.neon.smull", "llvm.aarch64.neon.saddlp"), "neon"),
    )
    int8_mnemonics = {"i8mm": "smmla", "sdot": "sdot", "NEON": "smull"}

    def vector_shape(self) -> tuple[int, int]:
        return 4, 32  # NEON: 128-bit vectors, 32 registers

    def tvm_target(self) -> TVMTarget:
        target = super().tvm_target()
        assert has_feature(target, "neon"), f"{self.name}: an aarch64 target without NEON"
        return target

    @property
    def core(self) -> str:
        """The board's CPU core as QEMU names it (the emulated board runs this core): LLVM's name, or
        `max` (every extension QEMU has) for a core QEMU 7.2 does not model."""
        return QEMU_CORES.get(self.spec["mcpu"], self.spec["mcpu"])


QEMU_CORES = {"neoverse-v1": "max"}  # QEMU 7.2 (Debian 12) models no core with i8mm


def board(name: str, title: str, core: str, features: list[str], clock_ghz: float, description: str) -> Arm:
    spec = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": core, "mattr": features, "num-cores": 4}
    return Arm(name, title, description, spec, board=name, clock_ghz=clock_ghz)


PRESETS = [
    board(
        "rpi4",
        "Raspberry Pi 4 (Cortex-A72)",
        "cortex-a72",
        ["+neon"],
        1.8,
        "64-bit Raspberry Pi OS on a Pi 4: four Cortex-A72 cores with NEON, no dot product (int8 "
        "kernels multiply with smull and smlal into 16 bits, then add pairs with sadalp). Runs on an "
        "rpi4 board of the device pool.",
    ),
    board(
        "rpi5",
        "Raspberry Pi 5 (Cortex-A76)",
        "cortex-a76",
        ["+neon", "+dotprod"],
        2.4,
        "64-bit Raspberry Pi OS on a Pi 5: four Cortex-A76 cores with NEON and the sdot/udot dot "
        "product (int8 kernels use sdot). Runs on an rpi5 board of the device pool.",
    ),
    board(
        "graviton3",
        "AWS Graviton3 (Neoverse V1)",
        "neoverse-v1",
        ["+neon", "+dotprod", "+i8mm"],
        2.6,
        "An Arm server core with the i8mm matrix multiply (AWS c7g, 4 vCPUs; Neoverse V1, as in "
        "Graviton3): int8 kernels use smmla, a 2 x 8 by 8 x 2 int8 block into a 2 x 2 int32 tile per "
        "instruction, where sdot does 4 x 4. Runs on a graviton3 board of the device pool: emulated "
        "here by QEMU's max core (QEMU 7.2 has no Neoverse V1), or a real instance over TVM RPC.",
    ),
]
