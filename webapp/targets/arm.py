"""64-bit Arm CPUs (aarch64): cross-compiled with Debian's aarch64 toolchain, run on the boards of
the device pool (webapp/devices): Raspberry Pi 4 and 5, emulated here under QEMU or real ones."""

from __future__ import annotations

from webapp.targets.base import LLVMCPU, has_feature


class Arm(LLVMCPU):
    kind = "arm"
    arch = "aarch64"
    cross_compiler = "aarch64-linux-gnu-g++"
    activation_dtype = "int8"  # sdot multiplies int8 by int8
    dot_instructions = (
        ("sdot", 4, "int8", "llvm.aarch64.neon.sdot.v4i32.v16i8", "dotprod"),
        # without a dot product: smull and smlal (int8 x int8 into int16), sadalp (pairs into int32)
        ("NEON", 4, "int8", ("smull", "llvm.aarch64.neon.smull", "llvm.aarch64.neon.saddlp"), "neon"),
    )
    int8_mnemonics = {"sdot": "sdot", "NEON": "smull"}

    def vector_shape(self) -> tuple[int, int]:
        return 4, 32  # NEON: 128-bit vectors, 32 registers

    def tvm_target(self):
        target = super().tvm_target()
        assert has_feature(target, "neon"), f"{self.name}: an aarch64 target without NEON"
        return target

    @property
    def core(self) -> str:
        """The board's CPU core, as LLVM and QEMU name it (the emulated board runs this core)."""
        return self.spec["mcpu"]


def raspberry_pi(name: str, title: str, core: str, features: list[str], description: str) -> Arm:
    spec = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": core, "mattr": features, "num-cores": 4}
    return Arm(name, title, description, spec, board=name)


PRESETS = [
    raspberry_pi(
        "rpi4",
        "Raspberry Pi 4 (Cortex-A72)",
        "cortex-a72",
        ["+neon"],
        "64-bit Raspberry Pi OS on a Pi 4: four Cortex-A72 cores with NEON, no dot product (int8 "
        "kernels multiply with smull and smlal into 16 bits, then add pairs with sadalp). Runs on an "
        "rpi4 board of the device pool.",
    ),
    raspberry_pi(
        "rpi5",
        "Raspberry Pi 5 (Cortex-A76)",
        "cortex-a76",
        ["+neon", "+dotprod"],
        "64-bit Raspberry Pi OS on a Pi 5: four Cortex-A76 cores with NEON and the sdot/udot dot "
        "product (int8 kernels use sdot). Runs on an rpi5 board of the device pool.",
    ),
]
