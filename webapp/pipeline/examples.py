"""The built-in example models, defined in plain PyTorch with seeded random weights.

torchvision is not installable next to the CPU torch build, so the classic
architectures are written out here. The transformer examples (bert, vit, gpt2, llama) are Hugging Face
models built from their configs. `write_example_files` exports one model as `.pt2` (torch.export) and
`.onnx`, the two formats a user can upload (the transformers' ONNX as people export them today: the
dynamo exporter, which keeps each node's module path).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from webapp.catalog import EXAMPLES


def conv_bn_relu(
    cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, relu: bool = True
) -> nn.Module:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(3, 16), conv_bn_relu(16, 32, stride=2), conv_bn_relu(32, 64, stride=2)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn_relu(cin, width, 3, stride), conv_bn_relu(width, width, relu=False))
        self.shortcut = shortcut(cin, width * self.expansion, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            conv_bn_relu(cin, width, 1),
            conv_bn_relu(width, width, 3, stride),
            conv_bn_relu(width, cout, 1, relu=False),
        )
        self.shortcut = shortcut(cin, cout, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return conv_bn_relu(cin, cout, 1, stride, relu=False)


class ResNet(nn.Module):
    def __init__(self, block, blocks_per_stage: list[int], num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(conv_bn_relu(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for i, n in enumerate(blocks_per_stage):
            width = 64 * 2**i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn_relu(cin, hidden, 1)] if expand != 1 else []
        layers += [
            conv_bn_relu(hidden, hidden, 3, stride, groups=hidden),
            conv_bn_relu(hidden, cout, 1, relu=False),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, output channels, repeats, first stride), as in the paper
    SETTINGS = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [conv_bn_relu(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn_relu(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class TransformerBlock(nn.Module):
    """Pre-norm encoder block with attention written out (matmul, softmax) so every op is visible."""

    def __init__(self, dim: int = 256, heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class DigitsCNN(nn.Module):
    """8x8 grey digits: two convolutions, a linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()
        )
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def train_digits(model: nn.Module, epochs: int = 40) -> nn.Module:
    """Seconds of Adam on the digits training split, seeded: the same weights every time."""
    from webapp.pipeline.datasets import digits

    x, y, _, _ = digits()
    x, y = torch.from_numpy(x), torch.from_numpy(y)  # type: ignore[assignment]  # the arrays as tensors
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same summation order every run
    try:
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator)
            for i in range(0, len(x), 64):
                batch = order[i : i + 64]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model


class LastOutput(nn.Module):
    """A Hugging Face model returning one tensor of its output (`key`), as an exporter wants it."""

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x, return_dict=True), self.key)


def hugging_face(name: str) -> nn.Module:
    """The transformers examples, from their configs with random (seeded) weights."""
    import transformers as hf

    if name == "bert":
        return LastOutput(
            hf.BertModel(hf.BertConfig(num_hidden_layers=4), add_pooling_layer=False), "last_hidden_state"
        )
    if name == "vit":
        return LastOutput(
            hf.ViTModel(hf.ViTConfig(num_hidden_layers=4), add_pooling_layer=False), "last_hidden_state"
        )
    return LastOutput(causal_lm(name, use_cache=False), "logits")


LM_SHAPES: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000,
              "max_position_embeddings": 4096},  # room for 2,048 cached tokens and more (rotary: no weights)
    # SmolLM2-135M's config.json, its weights random
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 8192},
    # Qwen2.5-0.5B's config.json (a Qwen2: biases on q, k and v), its weights random
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                     "max_position_embeddings": 32768, "use_sliding_window": False},
}  # fmt: skip
QWEN2 = ("qwen2.5-0.5b",)
# A model of more float weights than this is exported with them in a data file beside its .onnx
# (`<file>.data`, as torch.onnx.export writes it): one .onnx file holds at most 2 GB (protobuf's limit)
EXTERNAL_DATA_BYTES = 1 << 30


def causal_lm(name: str, use_cache: bool = True) -> Any:
    """The causal language model examples as Hugging Face builds them, random (seeded) weights."""
    import transformers as hf

    torch.manual_seed(0)
    if name == "gpt2":
        return hf.GPT2LMHeadModel(hf.GPT2Config(n_layer=4, use_cache=use_cache)).eval()
    if name in QWEN2:
        return hf.Qwen2ForCausalLM(hf.Qwen2Config(**LM_SHAPES[name], use_cache=use_cache)).eval()
    return hf.LlamaForCausalLM(hf.LlamaConfig(**LM_SHAPES[name], use_cache=use_cache)).eval()


def cache_shape(model: Any, past: int) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache of a Hugging Face causal LM: (1, key-value heads, past, head size)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return (1, heads, past, config.hidden_size // config.num_attention_heads)


class GeneratorStep(nn.Module):
    """A causal LM's call as Hugging Face's exporters (optimum) write it: the new tokens, the attention
    mask over cache and tokens, their positions and each layer's cached keys and values in; the logits
    and every layer's keys and values with the new tokens' out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: list
    ) -> tuple:
        import transformers as hf

        kv = hf.DynamicCache()
        for layer in range(len(cache) // 2):
            kv.update(cache[2 * layer], cache[2 * layer + 1], layer)
        out = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=kv,
            use_cache=True,
            return_dict=True,
        )
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def external_data(model: nn.Module) -> bool:
    """Whether the model's .onnx keeps its weights in a data file beside it (EXTERNAL_DATA_BYTES)."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) > EXTERNAL_DATA_BYTES


def written_atomically(out: Path, write: Callable[[Path], object]) -> Path:
    """`write(path)` into a hidden folder beside `out`, at out's name, then its files moved beside `out`,
    the model last: a reader never sees a half-written model, and the name of its data file, which
    the model records, stays right."""
    folder = out.with_name(f".{out.name}.partial")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    write(folder / out.name)
    for path in sorted(folder.iterdir(), key=lambda p: p.name == out.name):
        path.rename(out.with_name(path.name))
    folder.rmdir()
    return out


def write_generator_file(model: Any, out: Path) -> Path:
    """The example as it generates, as an .onnx with symbolic sequence and cache lengths and the input
    and output names Hugging Face's exporters give (input_ids, attention_mask, position_ids,
    past_key_values.<layer>.key|value; logits, present.<layer>.key|value) of a Hugging Face causal LM."""
    layers, seq, past = model.config.num_hidden_layers, 3, 5  # torch.export takes sizes of 2 and more
    cache = [torch.randn(*cache_shape(model, past)) for _ in range(2 * layers)]
    args = (
        torch.randint(0, model.config.vocab_size, (1, seq)),
        torch.ones(1, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq).unsqueeze(0),
        cache,
    )
    kv = [f"{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]
    tokens = torch.export.Dim("sequence_length", max=8192)
    cached = torch.export.Dim("past_sequence_length", max=8192)
    dynamic = ({1: tokens}, {1: torch.export.Dim.DYNAMIC}, {1: tokens}, [{2: cached}] * len(cache))
    names = ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{k}" for k in kv)]
    with torch.no_grad():
        return written_atomically(
            out,
            lambda path: torch.onnx.export(
                GeneratorStep(model).eval(),
                args,
                str(path),
                dynamo=True,
                external_data=external_data(model),
                dynamic_shapes=dynamic,
                input_names=names,
                output_names=["logits", *(f"present.{k}" for k in kv)],
            ),
        )


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn-small": SmallCNN,
    "resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
    "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]),
    "mobilenet-v2": MobileNetV2,
    "transformer-block": TransformerBlock,
    "digits-cnn": DigitsCNN,
    **{
        name: lambda name=name: hugging_face(name)
        for name in ("bert", "vit", "gpt2", "llama", "smollm2-135m", "qwen2.5-0.5b")
    },
}


def build_example(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = BUILDERS[name]()
    if EXAMPLES[name].dataset == "digits":
        return train_digits(model).eval()
    # Random BatchNorm statistics, so that the folded scales are not all ones.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None  # tracked: the default
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def example_input(name: str) -> torch.Tensor:
    example, generator = EXAMPLES[name], torch.Generator().manual_seed(1)
    if example.vocabulary:
        return torch.randint(0, example.vocabulary, example.input_shape, generator=generator)
    return torch.randn(*example.input_shape, generator=generator)


# torch.onnx.export's arguments for each exporter users export with: the dynamo exporter (today's default,
# weights inside the file) and the TorchScript one
ONNX_EXPORTERS: dict[str, dict[str, Any]] = {
    "dynamo": {"dynamo": True, "external_data": False},
    "torchscript": {"dynamo": False, "opset_version": 17},
}


def write_example_files(name: str, out_dir: Path) -> tuple[Path, Path]:
    """Write `<name>.pt2` and `<name>.onnx` into out_dir; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model, x = build_example(name), example_input(name)
    pt2, onnx_path = out_dir / f"{name}.pt2", out_dir / f"{name}.onnx"
    pt2_tmp = out_dir / f".{name}.partial.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(model, (x,)), str(pt2_tmp))
        if EXAMPLES[name].generator:
            write_generator_file(causal_lm(name), out_dir / f"{name}-generator.onnx")
        # the transformers as Hugging Face models are exported today, their weights inside the file (or
        # beside it, past 2 GB)
        exporter = ONNX_EXPORTERS["dynamo" if EXAMPLES[name].transformers else "torchscript"]
        if exporter["dynamo"] and external_data(model):
            exporter = exporter | {"external_data": True}
        written_atomically(
            onnx_path,
            lambda path: torch.onnx.export(
                model, (x,), str(path), input_names=["input"], output_names=["output"], **exporter
            ),
        )
    pt2_tmp.rename(pt2)  # last: the files are there when it is (webapp/jobs/worker.py)
    return pt2, onnx_path


if __name__ == "__main__":
    import sys

    write_example_files(sys.argv[1], Path(sys.argv[2]))
