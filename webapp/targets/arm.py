"""64-bit Arm CPUs (aarch64): cross-compiled with Debian's aarch64 toolchain. No preset yet: the
Raspberry Pi boards (rpi4, rpi5) and the device pool that runs them come with their own issue."""

from __future__ import annotations

from webapp.targets.base import LLVMCPU, has_feature


class Arm(LLVMCPU):
    kind = "arm"
    arch = "aarch64"
    cross_compiler = "aarch64-linux-gnu-g++"
    activation_dtype = "int8"  # sdot multiplies int8 by int8
    dot_instructions = (("sdot", 4, "int8", "llvm.aarch64.neon.sdot.v4i32.v16i8", "dotprod"),)

    @classmethod
    def matches(cls, tvm_target) -> bool:
        return tvm_target.kind.name == "llvm" and str(tvm_target.attrs.get("mtriple", "")).startswith(
            ("aarch64", "arm64")
        )

    @classmethod
    def vector_shape(cls, tvm_target) -> tuple[int, int]:
        return 4, 32  # NEON: 128-bit vectors, 32 registers

    def tvm_target(self):
        target = super().tvm_target()
        assert has_feature(target, "neon"), f"{self.name}: an aarch64 target without NEON"
        return target


PRESETS: list[Arm] = []
