"""What every kind of target answers, and the part shared by the LLVM CPU kinds.

A target kind is a class; a preset is an instance of it (a name, a title and a TVM target dict).
The pipeline is handed the preset and asks it, never a target string: its TVM target (`tvm`), which
device runs and times the code, which schedule-rule family and rewrites it takes, which passes lower
it, how wide its vectors are, which dot-product instruction and 8-bit activations its int8 kernels
use, how the library is linked, what its device code is written in, and whether it can run here at
all. TVM is imported inside the methods, so the web process can list presets without loading it.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from functools import cache, cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from webapp.asm import Dialect

if TYPE_CHECKING:
    from tvm.runtime import Device, Executable, Module
    from tvm.target import Target as TVMTarget


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    description: str
    spec: dict = field(default_factory=dict)  # the TVM target as a JSON dict
    board: str | None = None  # the device pool's key for the boards that run its code (e.g. "rpi5")
    clock_ghz: float | None = None  # a board's nominal clock (llvm-mca's predicted kernel times)

    kind: ClassVar[str] = ""  # the kind's name, as /api/targets says it
    arch: ClassVar[str] = ""  # the machine architecture the built code runs on
    gpu: ClassVar[bool] = False  # its kernels run on GPU threads, launched by host code on this CPU
    # its schedule-rule family, by name (webapp.pipeline.rules.schedules.FAMILIES): the first rule
    # of the family that fits a kernel schedules it
    rule_family: ClassVar[str] = ""
    no_quantization: ClassVar[str] = ""  # why quantized builds are refused for the kind, if they are
    rewrites: ClassVar[tuple[str, ...]] = ()  # the project's Relax rewrites it runs first, by name
    # whether a float beyond an int's range converts to that int's bound (AArch64's fcvt*), not to an
    # arbitrary value (x86's cvttps2dq gives INT_MIN): a quantized layer then clips in integers
    converts_saturating: ClassVar[bool] = False
    # whether a quantized layer requantizes its int32 values to 8 bits by a fixed-point multiply in
    # int64 (integer vector instructions) rather than in float32 (Realizer.fixed_point_multiply)
    requantizes_fixed_point: ClassVar[bool] = False

    # the project's TIR rewrites its host code gets before TVM lowers it, by name
    # (webapp.pipeline.passes.lowering.TIR_REWRITES)
    tir_rewrites: ClassVar[tuple[str, ...]] = ()
    reproducible: ClassVar[bool] = True  # a kernel's TIR runs alone (a reproducer, webapp/exports/repro.py)
    # the kernels' assembly as llvm-mca, the linter and the hot-loop finder read it (webapp.asm); None:
    # not read (a GPU's assembly is its host side's, which launches the kernels)
    dialect: ClassVar[Dialect | None] = None
    mca_triple: ClassVar[str] = ""  # llvm-mca's -mtriple for its code
    # 8-bit activations as its int8 kernels multiply them ("uint8", "int8"): each family says
    activation_dtype: ClassVar[str]
    # GPUs' device modules (webapp.targets.gpu.GPU): declared only, without a value, so that a kind
    # without them has none (targets.device_lexers asks getattr(kind, "lexer", None))
    language: ClassVar[str]  # what the device module is written in
    lexer: ClassVar[str]  # the Pygments lexer that colours it
    source_suffix: ClassVar[str]  # of the whole device module's download: device.<suffix>
    binaries: ClassVar[bool]  # its device code is also assembled here (CUDA: PTX and SASS)

    if TYPE_CHECKING:  # declared for the type checker only: a kind without them has no such attribute

        @property
        def core(self) -> str:
            """A board's CPU core as QEMU names it (Arm); targets.emulated_boards asks hasattr(t, "core")."""
            ...

        def vector_shape(self) -> tuple[int, int]:
            """(float32 lanes per vector register, number of vector registers): the CPU kinds'."""
            ...

    # --- what the web process may ask (no TVM) ---
    @property
    def can_run_here(self) -> bool:
        return platform.machine() == self.arch and not self.board

    @property
    def runs_cpu_code_here(self) -> bool:
        """Whether this server's CPU runs its code: its builds, layers and own inputs timed here."""
        return self.can_run_here

    @property
    def timed_on_board(self) -> str | None:
        """The device pool's board kind that runs and times its code; None: timed here, or nowhere."""
        return self.board

    @property
    def form_group(self) -> tuple[int, str]:
        """Where the form lists it: (its group's place, the group's heading)."""
        if self.can_run_here:
            return 0, "Run on this server"
        if self.board:
            return 1, "Run on a board of the device pool (TVM RPC)"
        return 3, "Compile only: not run here"

    def tune_refusal(self) -> str | None:
        """Why tuning trials are refused for it (tuning measures where the code runs), or None."""
        if self.board:
            return (
                f"Tuning runs its measurements where the code runs; for {self.name} that is a board of "
                "the device pool, which tuning does not use yet. Submit with tune_trials 0."
            )
        if not self.can_run_here:
            return f"Tuning measures the code where it runs: {self.runs_on}. Submit with tune_trials 0."
        return None

    @property
    def runs_on(self) -> str:
        """Where its code is run and timed, in words."""
        if self.can_run_here:
            return "this server"
        if self.board:
            return f"a '{self.board}' board of the device pool (TVM RPC): emulated here, or a real one"
        return f"nowhere here: this server is {platform.machine()}, the code is {self.arch} (built, not run)"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "kind": self.kind,
            "arch": self.arch,
            "tvm_target": self.spec,
            "can_run_here": self.can_run_here,
            "board": self.board,
            "runs_on": self.runs_on,
        }

    def analysis_threads(self, here: int) -> int:
        """The threads its kernels' predicted times assume: the cores its preset names (a board's), else
        `here` (this server's benchmark threads)."""
        return int(self.spec.get("num-cores") or here)

    def mca_cpu(self) -> tuple[str, float | None, str]:
        """llvm-mca's -mcpu for its code, the clock its predicted times assume (None: none) and where
        that clock comes from, in words."""
        return str(self.spec.get("mcpu", "generic")), self.clock_ghz, "the board's nominal clock"

    def database_key(self) -> str:
        """The shared tuning database this preset's records go to."""
        return self.name

    # --- what the sandboxed pipeline asks ---
    def tvm_target(self) -> TVMTarget:
        """A new TVM target for the preset."""
        raise NotImplementedError

    @cached_property
    def tvm(self) -> TVMTarget:
        """The preset's TVM target, made once per process: what the pipeline hands TVM."""
        return self.tvm_target()

    def int8_pair_limit(self) -> int | None:
        """The most two neighbouring int8 weights may add up to, in magnitude, where the target's int8
        kernels sum pairs of products in 16 bits (LLVMCPU: x86 without VNNI); None: any pair fits."""
        return None

    def why_not_timed(self) -> str | None:
        """Why its code cannot be timed by this server's pipeline (another CPU's code, a device this server
        lacks), or None: timed here, or on a board (the remote stage)."""
        return None if self.can_run_here or self.board else self.no_device_line()

    def no_device_line(self) -> str:
        """The benchmark stage's one line where the code cannot run here."""
        where = self.runs_on.removeprefix("nowhere here: ")
        return f"compiled for {self.name}; {where}, so nothing was timed"

    def device(self) -> Device:
        """The TVM device that runs its code."""
        raise NotImplementedError

    def device_name(self) -> str:
        """That device, in words."""
        raise NotImplementedError

    def legalize_passes(self) -> list:
        """TVM's passes from Relax (after the rewrites) to fused TIR kernels (before scheduling)."""
        raise NotImplementedError

    def lower_passes(self) -> list:
        """Scheduled kernels -> a module ready for tvm.compile(..., relax_pipeline=None)."""
        raise NotImplementedError

    def export_library(self, executable: Executable | Module, path: str) -> None:
        """Writes the built library to `path`, linked for the target."""
        export_library(executable, path)

    def device_module(self, host: Module) -> Module | None:
        """The device module its host module imports (GPUs); None: the code is all in the host's."""
        return None

    def register_tensor_intrinsics(self) -> None:
        """Makes TVM's own tensor intrinsics for the kind known to MetaSchedule before tuning."""


class LLVMCPU(Target):
    """A CPU that TVM's LLVM back end compiles for, scheduled by the project's default rules."""

    cross_compiler: ClassVar[str | None] = None  # g++ for another architecture, None: the system's
    rule_family = "cpu"

    def tvm_target(self) -> TVMTarget:
        import tvm

        spec = dict(self.spec)
        if spec.get("mcpu") == "host":
            spec["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
        spec.setdefault("num-cores", int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1))
        return tvm.target.Target(spec)

    def device(self) -> Device:
        import tvm

        return tvm.cpu(0)

    def device_name(self) -> str:
        return f"{self.arch} CPU ({self.tvm.attrs.get('mcpu', 'generic')})"

    def register_tensor_intrinsics(self) -> None:
        """TVM's x86 and Arm tensor intrinsics, without `import tvm.s_tir.tensor_intrin`.

        MetaSchedule imports that package whenever it creates a TuneContext; it parses every CUDA
        intrinsic too, 25-35 s on 2 cores, which CPU targets never use. A package object already in
        sys.modules makes that import a no-op, and its __path__ still lets the CPU submodules load.
        """
        import importlib
        import sys
        import types
        from pathlib import Path

        import tvm

        name = "tvm.s_tir.tensor_intrin"
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
            sys.modules[name] = package
        for submodule in ("x86", "arm_cpu"):
            importlib.import_module(f"{name}.{submodule}")

    # The project's Relax rewrites before TVM's legalization, by name (webapp.pipeline.passes.legalize):
    # grouped-query attention's query heads as rows of one matmul against the group's keys and values
    # (no repeated, transposed copy of the cache), attention's keys and other softmax rows padded to
    # whole vectors, fast math, 1-D convolutions as 2-D
    # ones, float convolutions channels last, stride-k transposed convolutions as GEMMs, output channels
    # padded to whole vectors, transposed weights computed with numpy, and 3x3 convolutions by Winograd.
    rewrites: ClassVar[tuple[str, ...]] = (
        "grouped_attention",
        "padded_keys",
        "padded_rows",
        "fast_math",
        "conv1d_as_conv2d",
        "channels_last",
        "upsampling",
        "padded_channels",
        "fold_with_numpy",
        "winograd",
    )

    def legalize_passes(self) -> list:
        """TVM's passes from Relax (after the rewrites) to fused TIR kernels (before scheduling)."""
        from tvm.relax.backend import cpu_generic

        return cpu_generic.library_dispatch_passes(self.tvm) + cpu_generic.legalize_passes(self.tvm)

    def lower_passes(self) -> list:
        """Scheduled kernels -> a module ready for tvm.compile(..., relax_pipeline=None)."""
        from tvm.relax.backend import cpu_generic

        return cpu_generic.pipeline.dataflow_lower_passes(self.tvm) + cpu_generic.finalize_passes(self.tvm)

    def vector_shape(self) -> tuple[int, int]:
        """(float32 lanes per vector register, number of vector registers)."""
        raise NotImplementedError

    # Integer dot-product instructions the kind may have, widest first: (name, int32 lanes,
    # activation dtype, LLVM intrinsic, the target feature that has it). Each lane adds 4 products.
    # The intrinsic is a tuple where there is no dot product: (the mnemonic, the LLVM intrinsics).
    dot_instructions: ClassVar[tuple[tuple[str, int, str, str | tuple[str, ...], str], ...]] = ()
    activation_dtype: ClassVar[str] = "uint8"  # 8-bit activations as its dot product multiplies them
    # The assembly mnemonic that multiplies the int8 kernels' 8-bit values, by the dot instruction
    # the target has (None: it has none, and the products are widened first).
    int8_mnemonics: ClassVar[dict[str | None, str]] = {}

    def dot_instruction(self, channels: int | None = None, skip: tuple = ()) -> str | None:
        """The integer dot-product instruction the target has (a dot_instructions name, not one of
        `skip`), if any: the widest whose lanes divide `channels` when given."""
        return next(
            (
                name
                for name, lanes, _, _, feature in self.dot_instructions
                if name not in skip
                and has_feature(self.tvm, feature)
                and (channels is None or channels % lanes == 0)
            ),
            None,
        )

    def int8_pair_limit(self) -> int | None:
        """The most two neighbouring int8 weights may add up to (in magnitude) on this target: 128 where
        its int8 kernels multiply with a pair of multiply-adds (x86 vpmaddubsw sums two uint8 x int8
        products in int16: 255 x 128 = 32,640 fits, 255 x 129 does not); None where any pair fits."""
        kind = self.dot_instruction()
        form = next((i for name, _, _, i, _ in self.dot_instructions if name == kind), None)
        return 128 if isinstance(form, tuple) and form[0] == "vpmaddubsw" else None

    def int8_mnemonic(self) -> str | None:
        """The instruction the target's int8 kernels multiply with (vpdpbusd, sdot, vpmaddwd...)."""
        return self.int8_mnemonics.get(self.dot_instruction())

    def export_library(self, executable: Executable | Module, path: str) -> None:
        from tvm.support import cc

        cross = cc.cross_compiler(self.cross_compiler) if self.cross_compiler else None
        export_library(executable, path, cross)


def export_library(executable: Executable | Module, path: str, fcompile: object = None) -> None:
    """TVM's export_library, with the serialized module (the VM's bytecode and every weight) written to
    a file that the assembler includes (`.incbin`) instead of TVM's own packing, which holds it in LLVM
    as a constant and then as an object file: one copy of the weights in memory at the export instead of
    three (400 MiB of weights: the peak rises 412 MiB, against 1,213 with TVM's packing; an MLP of 1.34 GB
    of weights: the build stage's peak 5.6 GB instead of 8.2). The parts are written beside the library,
    not in /tmp (a sandbox's /tmp is memory)."""
    import shutil
    import tempfile

    parts = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        # x86-64's small code model reaches 2 GB: a larger module goes in a large section, which the
        # linker places after the code and data that must reach each other
        pack = partial(pack_imports, large=fcompile is None and platform.machine() == "x86_64")
        executable.export_library(path, fcompile=fcompile, fpack_imports=pack, workspace_dir=parts)
    finally:
        shutil.rmtree(parts, ignore_errors=True)


def pack_imports(module: Module, is_system_lib: bool, prefix: str, workspace_dir: str, large: bool) -> str:
    """An assembly file defining the symbol TVM's loader reads the imported modules from
    (`__tvm_ffi__library_bin`: the bytes ModulePackImportsToC would write as a C array), its bytes
    included from a file written straight from TVM's tensor of them; in x86-64's large read-only
    section where `large`."""
    import numpy as np
    from tvm.runtime import _ffi_api

    data = os.path.join(workspace_dir, "devc.bin")
    blob = _ffi_api.ModulePackImportsToTensor(module)
    np.from_dlpack(blob).tofile(data)
    del blob
    symbol = f"{prefix}__tvm_ffi__library_bin"
    data = data.replace("\\", "\\\\").replace('"', '\\"')  # a string of the assembler's
    section, flags = (".lrodata", "al") if large else (".rodata", "a")
    asm = os.path.join(workspace_dir, "devc.S")
    with open(asm, "w") as f:  # %object: the form every ELF assembler takes (Arm reads @ as a comment)
        f.write(
            f'\t.section {section}.{symbol},"{flags}"\n\t.globl {symbol}\n'
            f'\t.type {symbol}, %object\n\t.balign 16\n{symbol}:\n\t.incbin "{data}"\n'
            f"\t.size {symbol}, . - {symbol}\n"
            '\t.section .note.GNU-stack,"",%progbits\n'  # no executable stack
        )
    return asm


@cache
def cpu_flags() -> set[str]:
    """This server's CPU flags, from /proc/cpuinfo (x86's "flags", Arm's "Features"; no TVM in the web
    process)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def has_feature(tvm_target: TVMTarget, feature: str) -> bool:
    from tvm.target.codegen import target_has_features

    return bool(target_has_features(feature, tvm_target))


MAX_FREQ = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"  # kHz


def host_clock_ghz() -> float | None:
    """This machine's clock: its cores' top frequency where the kernel says it (cpufreq), else
    /proc/cpuinfo's first `cpu MHz` (the current one; a virtual machine reports its nominal clock)."""
    try:
        return int(Path(MAX_FREQ).read_text()) / 1e6
    except (OSError, ValueError):
        pass
    try:
        m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) / 1000 if m else None
