"""GPUs: CUDA (NVIDIA, per compute capability), OpenCL, Metal (Apple) and WebGPU (browsers).

TVM compiles each into a device module (CUDA C, OpenCL C, Metal Shading Language, WGSL) imported by
an LLVM host module that launches its kernels. Every kernel must be bound to GPU threads before it
compiles at all: the GPU rules of webapp.pipeline.rules.gpu do that. The code runs and is timed
only where the server has such a device (a CUDA driver and GPU for the CUDA presets; TVM's wheel has
no OpenCL, Metal or Vulkan runtime, and WebGPU runs in a browser): elsewhere it is built and shown.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

from webapp.targets.base import Target

if TYPE_CHECKING:
    from types import ModuleType

    from tvm.runtime import Device, Module
    from tvm.target import Target as TVMTarget


class GPU(Target):
    gpu: ClassVar[bool] = True
    rule_family = "gpu"
    reproducible = False
    runtime: ClassVar[str] = ""  # TVM's target kind and device name ("cuda", "opencl", ...)
    language: ClassVar[str] = ""  # what the device module is written in
    lexer: ClassVar[str] = ""  # the Pygments lexer that colours it (webapp.codeviews)
    source_suffix: ClassVar[str] = ""  # of the whole device module's download: device.<suffix>
    binaries: ClassVar[bool] = False  # its device code is also assembled here (CUDA: PTX and SASS)
    int8_dot: ClassVar[str | None] = None  # the integer dot product its int8 rule uses (CUDA: dp4a)
    device_word: ClassVar[str] = ""  # the device the server lacks, in words: "CUDA GPU"
    activation_dtype: ClassVar[str] = "int8"  # quantized activations (dp4a multiplies int8 by int8)

    @property
    def arch(self) -> str:  # type: ignore[override]
        return str(self.spec.get("arch", self.runtime))

    @property
    def can_run_here(self) -> bool:
        return False

    @property
    def a_device(self) -> str:
        """The device its code runs on, with its article: "a CUDA GPU"."""
        return f"{'an' if self.device_word[0] in 'AEIOU' else 'a'} {self.device_word}"

    @property
    def runs_on(self) -> str:
        if self.can_run_here:
            return f"this server's {self.device_word}"
        return f"{self.a_device} (built here, not run: this server has none)"

    @property
    def runs_cpu_code_here(self) -> bool:
        return False

    @property
    def form_group(self) -> tuple[int, str]:
        if self.can_run_here:  # a CUDA GPU here: its presets come first
            return -1, "Run on this server"
        return 2, "GPU code: compiled and shown here, run only where such a GPU exists"

    def tune_refusal(self) -> str | None:
        where = (
            "this server's GPU, which tuning does not use yet."
            if self.can_run_here
            else f"{self.a_device}, and this server has none."
        )
        return (
            f"Tuning runs its measurements where the code runs; for {self.name} that is {where}"
            " Submit with tune_trials 0: the GPU default rules schedule every kernel."
        )

    def no_device_line(self) -> str:
        """The benchmark stage's one line where the code cannot run here."""
        return f"compiled for {self.name}; this server has no {self.device_word}, so nothing was timed"

    def why_not_timed(self) -> str | None:
        """Why its code is not timed: None where TVM's runtime sees its device here."""
        try:
            present = bool(self.device().exist)
        except Exception:  # a runtime TVM was built without (OpenCL, Metal, WebGPU)
            present = False
        return None if present else self.no_device_line()

    def device_module(self, host: Module) -> Module | None:
        return next((m for m in host.imports if m.kind == self.runtime), None)

    # --- what the sandboxed pipeline asks ---
    def tvm_target(self) -> TVMTarget:
        import tvm

        from webapp.targets import host

        return tvm.target.Target(self.spec, host=host().tvm)

    def device(self) -> Device:
        import tvm

        return tvm.device(self.runtime, 0)

    def device_name(self) -> str:
        return f"{self.device_word} ({self.tvm.attrs.get('arch', self.runtime)})"

    def backend(self) -> ModuleType:
        from tvm.relax.backend.gpu_generic import pipeline

        return pipeline

    def legalize_passes(self) -> list:
        """TVM's pipeline for the kind up to fused kernels, without its dlight scheduling (the
        project's GPU rules schedule, dlight's among them)."""
        backend = self.backend()
        legalize = [p for p in backend.legalize_passes(self.tvm) if p.info.name != "ApplyDefaultSchedule"]
        return backend.library_dispatch_passes(self.tvm) + legalize

    def lower_passes(self) -> list:
        backend = self.backend()
        return backend.dataflow_lower_passes(self.tvm) + backend.finalize_passes(self.tvm)


class CUDA(GPU):
    kind = "cuda"
    runtime = "cuda"
    language = "CUDA C"
    lexer = "cuda"
    source_suffix = "cu"
    binaries = True
    int8_dot = "dp4a"
    device_word = "CUDA GPU"

    @property
    def can_run_here(self) -> bool:
        return cuda_devices() > 0

    def backend(self) -> ModuleType:
        from tvm.relax.backend.cuda import pipeline

        return pipeline


class OpenCL(GPU):
    kind = "opencl"
    runtime = "opencl"
    language = "OpenCL C"
    lexer = "c"  # OpenCL C, as Pygments colours it
    source_suffix = "cl"
    device_word = "OpenCL device in TVM's runtime"


class Metal(GPU):
    kind = "metal"
    runtime = "metal"
    language = "Metal Shading Language"
    lexer = "cpp"  # Pygments has no Metal lexer; MSL is C++
    source_suffix = "metal"
    device_word = "Apple GPU (Metal)"


class WebGPU(GPU):
    kind = "webgpu"
    runtime = "webgpu"
    language = "WGSL"
    lexer = "wgsl"
    source_suffix = "wgsl"
    device_word = "browser with WebGPU"
    no_quantization = (
        "WebGPU's shading language (WGSL) has no 64-bit integers, which a quantized model's "
        "requantization can use (power-of-two scales' wide shifts), and quantized WebGPU builds are not "
        "checked here yet, so they are not offered. Submit webgpu with quantize none, or quantize for "
        "another target."
    )

    @property
    def runs_on(self) -> str:
        return "a browser with WebGPU, through TVM's web runtime (built here, not run)"

    def no_device_line(self) -> str:
        return (
            f"compiled for {self.name}; WebGPU code runs in a browser, not on this server, so nothing "
            "was timed"
        )


@lru_cache(maxsize=1)
def cuda_devices() -> int:
    """CUDA GPUs the driver sees (0 without a driver): asked of libcuda itself, so the web process
    needs no TVM."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda(name: str, title: str, sm: str, description: str) -> CUDA:
    return CUDA(name, title, description, {"kind": "cuda", "arch": sm})


PRESETS = [
    cuda(
        "cuda-sm80",
        "NVIDIA A100 (CUDA, sm_80)",
        "sm_80",
        "CUDA C for Ampere data-centre GPUs (A100, A30): compute capability 8.0, PTX and SASS for sm_80.",
    ),
    cuda(
        "cuda-sm89",
        "NVIDIA L4 / RTX 40 (CUDA, sm_89)",
        "sm_89",
        "CUDA C for Ada Lovelace GPUs (L4, L40, RTX 4090): compute capability 8.9, PTX and SASS for sm_89.",
    ),
    cuda(
        "cuda-sm90",
        "NVIDIA H100 (CUDA, sm_90)",
        "sm_90",
        "CUDA C for Hopper GPUs (H100, H200): compute capability 9.0, PTX and SASS for sm_90.",
    ),
    OpenCL(
        "opencl",
        "OpenCL GPU (generic)",
        "OpenCL C kernels for any OpenCL GPU (Intel, AMD, Mali, Adreno), launched by TVM's OpenCL runtime.",
        {"kind": "opencl"},
    ),
    Metal(
        "metal",
        "Apple GPU (Metal)",
        "Metal Shading Language for Apple silicon GPUs (M-series Macs, iPhones), launched by TVM's Metal "
        "runtime.",
        {"kind": "metal"},
    ),
    WebGPU(
        "webgpu",
        "WebGPU (browser)",
        "WGSL compute shaders for a browser's WebGPU, the code TVM's web runtime (tvmjs) runs.",
        {"kind": "webgpu"},
    ),
]
