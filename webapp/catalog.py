"""What the playground offers: built-in example models and target presets.

Plain data, no TVM or torch import: the web layer lists these, the sandboxed
pipeline turns them into models and TVM targets.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Example:
    name: str
    title: str
    description: str
    input_shape: tuple[int, ...]
    classifier: bool = True
    dataset: str | None = None  # labelled data the example is trained and measured on


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in [
        Example("mlp", "MLP", "Multi-layer perceptron 784-256-128-10 (MNIST-sized).", (1, 784)),
        Example(
            "cnn-small",
            "Small CNN",
            "Three conv3x3-BatchNorm-ReLU blocks, global average pool, linear; 32x32 RGB input.",
            (1, 3, 32, 32),
        ),
        Example("resnet18", "ResNet-18", "ResNet-18 (basic blocks), 224x224 RGB input.", (1, 3, 224, 224)),
        Example(
            "resnet50", "ResNet-50", "ResNet-50 (bottleneck blocks), 224x224 RGB input.", (1, 3, 224, 224)
        ),
        Example(
            "mobilenet-v2",
            "MobileNetV2",
            "MobileNetV2 (inverted residuals, depthwise convolutions), 224x224 RGB input.",
            (1, 3, 224, 224),
        ),
        Example(
            "transformer-block",
            "Transformer encoder block",
            "One pre-norm encoder block: 4-head self-attention, LayerNorm, GELU MLP; 64 tokens of width 256.",
            (1, 64, 256),
            classifier=False,
        ),
        Example(
            "digits-cnn",
            "Digits CNN (trained)",
            "A small CNN trained in seconds (seeded) on scikit-learn's 8x8 handwritten digits; its page "
            "shows real top-1 accuracy on the 540 held-out images, for fp32 and quantized.",
            (1, 1, 8, 8),
            dataset="digits",
        ),
    ]
}


@dataclass(frozen=True)
class TargetPreset:
    name: str
    title: str
    description: str
    arch: str  # the machine architecture the built code runs on
    # TVM target as a JSON dict; "mcpu": "host" is replaced by the detected host CPU in the sandbox
    tvm_target: dict = field(default_factory=dict)

    @property
    def can_run_here(self) -> bool:
        return platform.machine() == self.arch

    def to_json(self) -> dict:
        return {**asdict(self), "can_run_here": self.can_run_here}


TARGETS: dict[str, TargetPreset] = {
    t.name: t
    for t in [
        TargetPreset(
            "x86-host",
            "x86-64, this server's CPU",
            "LLVM for the CPU of the machine that runs the job (its mcpu is detected, e.g. znver4 "
            "with AVX-512), using all the vector extensions it has.",
            "x86_64",
            {"kind": "llvm", "mcpu": "host"},
        ),
        TargetPreset(
            "x86-avx2",
            "x86-64 with AVX2",
            "LLVM for x86-64 with AVX2 and FMA (Intel since Haswell, AMD since Zen): 256-bit vectors, "
            "16 vector registers.",
            "x86_64",
            {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"},
        ),
        TargetPreset(
            "x86-generic",
            "x86-64, portable",
            "LLVM for the baseline x86-64 instruction set (SSE2 only): runs on any 64-bit x86 CPU.",
            "x86_64",
            {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"},
        ),
    ]
}

# The pipeline's stages, in order (webapp/pipeline/runner.py runs them).
STAGES = ("import", "optimize", "quantize", "tune", "build", "inspect", "benchmark")

# "sweep": every bit-width (and int8 with every calibration mode) in one job, side by side
QUANTIZE_MODES = ("none", "int8", "int4", "int2", "int1", "sweep")
CALIBRATION_MODES = ("max", "percentile", "kl", "global")
WEIGHT_SCALE_MODES = ("max", "power2")
WEIGHT_GRANULARITY = ("channel", "tensor")
