"""What the playground offers: built-in example models, target presets and job option choices.

Plain data, no TVM or torch import: the web layer lists these, the sandboxed
pipeline turns them into models and TVM targets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from webapp.targets import TARGETS  # noqa: F401  (the target presets, one module per kind)


@dataclass(frozen=True)
class Example:
    name: str
    title: str
    description: str
    input_shape: tuple[int, ...]
    classifier: bool = True
    dataset: str | None = None  # labelled data the example is trained and measured on
    vocabulary: int | None = None  # the input is token ids below this, not floats
    transformers: bool = False  # a Hugging Face model, exported as people export them (dynamo ONNX)
    # a causal language model: also exported as it generates (its KV cache as inputs and outputs, as
    # Hugging Face exporters write it), which the generate stage builds and times token by token
    generator: bool = False
    # the size of a real model (hundreds of MB of weights or more): the tests' loops over the examples
    # leave it out (benchmarks/llm.py measures it)
    full_size: bool = False

    @property
    def weights(self) -> dict:
        """What its weights are, said wherever its outputs are shown (results.model.weights)."""
        if self.dataset:
            text = f"trained (seeded) on the {self.dataset} dataset: its outputs are real predictions"
            return {"trained": True, "text": text}
        return {
            "trained": False,
            "text": "random (seeded), not trained: its outputs (classes, scores, tokens) mean nothing; "
            "it is here to be compiled and timed",
        }


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
        # Hugging Face models (transformers) built from their configs with random weights, 4 layers
        # each: the architectures people bring, small enough to compile in well under a minute.
        Example(
            "bert",
            "BERT (4 layers)",
            "Hugging Face BertModel at BERT-base width (768, 12 heads), 4 layers; 128 tokens in, "
            "hidden states out.",
            (1, 128),
            classifier=False,
            vocabulary=30522,
            transformers=True,
        ),
        Example(
            "vit",
            "ViT (4 layers)",
            "Hugging Face ViTModel at ViT-base width (768, 16x16 patches), 4 layers; 224x224 RGB "
            "input, 197 tokens' hidden states out.",
            (1, 3, 224, 224),
            classifier=False,
            transformers=True,
        ),
        Example(
            "gpt2",
            "GPT-2 (4 layers)",
            "Hugging Face GPT2LMHeadModel at GPT-2 small width (768), 4 layers, its LM head over the "
            "50,257-word vocabulary (tied to the embedding); 64 tokens in, logits out.",
            (1, 64),
            classifier=False,
            vocabulary=50257,
            transformers=True,
            generator=True,
        ),
        Example(
            "llama",
            "Llama (4 layers)",
            "Hugging Face LlamaForCausalLM, width 512, 8 query and 4 key-value heads (grouped-query "
            "attention), RMSNorm, SiLU MLP, rotary embeddings, 4 layers, 32,000-word vocabulary; 64 "
            "tokens in, logits out.",
            (1, 64),
            classifier=False,
            vocabulary=32000,
            transformers=True,
            generator=True,
        ),
        Example(
            "smollm2-135m",
            "SmolLM2-135M-shaped Llama",
            "A Llama at the shape of SmolLM2-135M: width 576, 30 layers, 9 query and 3 key-value heads, "
            "MLP 1,536, 49,152-word vocabulary tied to the embedding (134.5 M parameters, 538 MB in "
            "float32), random weights; 64 tokens in, logits out, and generation token by token.",
            (1, 64),
            classifier=False,
            vocabulary=49152,
            transformers=True,
            generator=True,
            full_size=True,
        ),
        Example(
            "qwen2.5-0.5b",
            "Qwen2.5-0.5B-shaped model",
            "A Qwen2 at the shape of Qwen2.5-0.5B: width 896, 24 layers, 14 query and 2 key-value heads "
            "(biases on the queries, keys and values), MLP 4,864, 151,936-word vocabulary tied to the "
            "embedding (494 M parameters, 1.98 GB in float32, past ONNX's 2 GB file limit: its weights "
            "are an external data file), random weights; 64 tokens in, logits out, and generation token "
            "by token.",
            (1, 64),
            classifier=False,
            vocabulary=151936,
            transformers=True,
            generator=True,
            full_size=True,
        ),
    ]
}


# The pipeline's stages, in order (webapp/pipeline/runner.py runs them; "remote", for a target whose
# board is not this server, runs after them in a sandbox of its own: webapp/pipeline/stages/remote.py).
# "generate", for a causal language model, builds and times it as it generates (prefill and decode).
STAGES = (
    "import", "optimize", "quantize", "tune", "build", "inspect", "benchmark", "bisect", "generate", "remote"
)  # fmt: skip


# The graphs a job draws (webapp/pipeline/reports/graphs.py, views/graph-<key>.json and
# files/graph-<key>.svg), by key, with the title of the page's tab; in the order of the tabs. "layers":
# the model folded by block of modules, for a model whose exporter kept its module paths.
GRAPHS = {"layers": "By layer", "imported": "Before fusion", "fused": "After fusion"}


@dataclass(frozen=True)
class CodeView:
    """A text the code panel shows: written by the inspect stage (webapp/pipeline/stages/inspect.py,
    the device code by webapp/pipeline/reports/device_code.py) at `path` in the job folder, read and
    coloured by webapp/codeviews.py, listed by the compare page and the graph viewer's kernel links.
    Adding a view is its entry in CODE_VIEWS and the code that writes its file."""

    title: str
    lexer: str  # the Pygments lexer's name (a device view's lexer is its target kind's)
    path: str | None  # relative to the job folder; "{kernel}" in it: one file per kernel
    whole: str | None = None  # the file of the whole module, where it has one
    device: bool = False  # a GPU build's device code (results["device_code"]["views"] says which)
    graph_link: str | None = None  # the graph viewer links a kernel to this view, under this word
    # whether a result has the view, besides what every view needs (a per-kernel view: kernels; a device
    # view: a device code that lists it); None: always
    needs: Callable[[dict], bool] | None = None
    # its title for a result, where that depends on the result (a GPU build's device code); None: title
    titled: Callable[[dict], str | None] | None = None

    @property
    def per_kernel(self) -> bool:
        return bool(self.path and "{kernel}" in self.path)

    def shown(self, name: str, results: dict) -> bool:
        """Whether the result has this view (`name`, its key in CODE_VIEWS)."""
        device = results.get("device_code") or {}
        if self.per_kernel and not results.get("kernels"):  # the inspect stage wrote none: a failed job
            return False
        if self.device and name not in device.get("views", ()):
            return False
        return self.needs is None or self.needs(results)

    def title_for(self, results: dict) -> str:
        return (self.titled(results) if self.titled else None) or self.title


def host_side(title: str) -> Callable[[dict], str | None]:
    """A GPU build's LLVM IR and assembly are its host side's, which launches the kernels."""
    return lambda r: f"{title}, host side (kernel launches)" if r.get("device_code") else None


def device_title(text: str) -> Callable[[dict], str | None]:
    """A device view's title from its device code's facts: `text` formatted with them."""
    return lambda r: text.format(**r["device_code"]) if r.get("device_code") else None


def has(key: str) -> Callable[[dict], bool]:
    return lambda r: bool(r.get(key))


# The code views, in the order the page offers them.
CODE_VIEWS = {
    "relax-imported": CodeView("Relax IR, imported", "python", "views/imported.py"),
    "relax-quantized": CodeView(
        "Relax IR, quantized (integer layers)", "python", "views/quantized.py", needs=has("quantization")
    ),
    "relax-optimized": CodeView("Relax IR, optimized", "python", "views/optimized.py", needs=has("kernels")),
    # a job that failed before optimize's end has none
    "passes": CodeView("IR after each pass", "python", None, needs=has("passes")),
    "tir": CodeView("TIR of a kernel", "python", "views/kernels/{kernel}.tir.py", graph_link="TIR"),
    "llvm": CodeView(
        "LLVM IR",
        "llvm",
        "views/kernels/{kernel}.ll",
        "files/module.ll",
        graph_link="LLVM IR",
        titled=host_side("LLVM IR"),
    ),
    "asm": CodeView(
        "Assembly",
        "gas",
        "views/kernels/{kernel}.s",
        "files/module.s",
        graph_link="assembly",
        titled=host_side("Assembly"),
    ),
    # not for a GPU build, nor a job from before llvm-mca
    "mca": CodeView(
        "llvm-mca: the hot loop on the CPU's model",
        "text",
        "views/kernels/{kernel}.mca.txt",
        needs=has("mca"),
    ),
    "device": CodeView(
        "Device code",
        "cuda",
        "views/kernels/{kernel}.device",
        device=True,
        titled=device_title("Device code ({language})"),
    ),
    "ptx": CodeView(
        "PTX", "ptx", "views/kernels/{kernel}.ptx", device=True, titled=device_title("PTX ({sm})")
    ),
    "sass": CodeView(
        "SASS",
        "gas",
        "views/kernels/{kernel}.sass",
        device=True,
        titled=device_title("SASS ({sm}, from ptxas)"),
    ),
    "bytecode": CodeView("VM bytecode", "text", "views/bytecode.txt", needs=has("kernels")),
}


# a kernel's TIR before scheduling, beside its views: the reference of its reproducer
# (webapp/exports/repro.py)
UNSCHEDULED_TIR = "views/kernels/{kernel}.unscheduled.py"
PREPACK_TIR = "views/kernels/{kernel}.prepack.py"  # its weights' repacking, where the schedule has one
# the small constants the model passes it (scales, clip bounds), by parameter: arg<i> in an .npz
KERNEL_CONSTANTS = "views/kernels/{kernel}.constants.npz"


def code_file(view: str, kernel: str = "") -> str:
    """Where a code view's text is, relative to the job folder (a kernel's, for a per-kernel view)."""
    # asked only of the views that have a file (path; "passes" has none)
    return cast(str, CODE_VIEWS[view].path).format(kernel=file_stem(kernel))


def file_stem(name: str, limit: int = 120) -> str:
    """A kernel's name as a file name: whole when short; else its start and a hash of all of it, as
    a long fused chain's name (one word per op) outgrows the file system's 255 bytes. The page and
    the JSON keep the full name."""
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return f"{name.encode()[: limit - 13].decode(errors='ignore')}-{digest}"


# "sweep": every bit-width (and int8 with every calibration mode) in one job, side by side
QUANTIZE_MODES = ("none", "int8", "int4", "int2", "int1", "sweep")
CALIBRATION_MODES = ("max", "percentile", "kl", "global")
WEIGHT_SCALE_MODES = ("max", "power2")
WEIGHT_GRANULARITY = ("channel", "tensor")

# What the form says of each choice the catalog offers (a choice without a line shows its name).
CHOICE_TEXT = {
    "quantize": {
        "none": "none: float32",
        "int8": "int8 (integer kernels, AVX-512 VNNI where the CPU has it)",
        "int4": "int4 values",
        "int2": "int2 values",
        "int1": "int1: binary weights",
        "sweep": "bits sweep: fp32, int8, int4, int2, int1 and every calibration mode, side by side",
    },
    "calibration": {
        "max": "max: the largest value seen",
        "percentile": "percentile: the 99.99th",
        "kl": "KL divergence (entropy, as TensorRT)",
        "global": "global: one threshold for all, no calibration run",
    },
    "weight_scale": {
        "max": "max: the largest weight",
        "power2": "power2: rounded up to a power of two (requantize by shift)",
    },
    "weight_granularity": {"channel": "per output channel", "tensor": "per tensor"},
}
# What the form calls each option (the compare page's option rows say them so)
OPTION_LABELS = {
    "example": "built-in example",
    "filename": "uploaded file",
    "target": "target",
    "input_shapes": "input shapes",
    "input_values": "input values",
    "tune_trials": "auto-tuning trials",
    "quantize": "precision",
    "calibration": "activation calibration",
    "global_scale": "global threshold",
    "weight_scale": "weight scales",
    "weight_granularity": "weight scales per",
    "skip_first": "keep the first layer in float",
    "skip_last": "keep the last layer in float",
    "bisect": "find the first diverging pass",
}


def option_text(name: str, value: Any) -> str:
    """An option's value as the form says it: its choice's words, yes / no, or "not given"."""
    if value is None or value == "":
        return "not given"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return CHOICE_TEXT.get(name, {}).get(value, str(value))
