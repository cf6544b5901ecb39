"""Hugging Face transformer architectures as users bring them: each built from its config (random,
seeded weights, a few layers at its real width) and exported as its users export it, with the inputs
they pass (attention masks, token type ids, decoder ids), by `torch.onnx.export(dynamo=True)`, by the
TorchScript exporter, or to a `.pt2` (torch.export). benchmarks/transformer_sweep.py runs them.

    .venv/bin/python benchmarks/hf_models.py bert 128 dynamo /tmp/bert.onnx   # one export, by hand
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webapp.pipeline.examples import ONNX_EXPORTERS  # noqa: E402

HOW = (*ONNX_EXPORTERS, "pt2")


@dataclass(frozen=True)
class Arch:
    name: str
    family: str  # encoder, decoder, encoder-decoder, vision, audio
    build: Callable[[], torch.nn.Module]  # the model, from its config
    inputs: Callable[[int], dict[str, torch.Tensor]]  # what users pass, for a sequence length
    output: str  # the output users take (last_hidden_state, logits)
    max_seq: int = 1024  # the longest sequence the architecture takes (its position table)


def hf():  # transformers, imported where a model is built (slow to import)
    import transformers

    return transformers


def tokens(vocab: int, *names: str) -> Callable[[int], dict[str, torch.Tensor]]:
    """input_ids of `seq` random tokens, and each of `names`: attention_mask (all ones but the last
    quarter, padding, as a batch of one padded sentence has), token_type_ids (zeros, then ones for the
    second half: a sentence pair), decoder_input_ids (a quarter as many tokens)."""

    def make(seq: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(1)
        out = {"input_ids": torch.randint(0, vocab, (1, seq), generator=generator)}
        if "attention_mask" in names:
            out["attention_mask"] = torch.ones(1, seq, dtype=torch.int64)
            out["attention_mask"][:, seq - seq // 4 :] = 0
        if "token_type_ids" in names:
            out["token_type_ids"] = torch.zeros(1, seq, dtype=torch.int64)
            out["token_type_ids"][:, seq // 2 :] = 1
        if "decoder_input_ids" in names:
            out["decoder_input_ids"] = torch.randint(0, vocab, (1, max(1, seq // 4)), generator=generator)
        return out

    return make


def pixels(size: int = 224, channels: int = 3) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda _seq: {
        "pixel_values": torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(1))
    }


def audio(seconds: float = 1.0) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda _seq: {
        "input_values": torch.randn(1, int(16000 * seconds), generator=torch.Generator().manual_seed(1))
    }


def whisper_inputs(_seq: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "input_features": torch.randn(1, 80, 3000, generator=generator),
        "decoder_input_ids": torch.randint(0, 51865, (1, 4), generator=generator),
    }


def encoder(config: str, model: str, layers: int = 4, **extra) -> Callable[[], torch.nn.Module]:
    return lambda: getattr(hf(), model)(getattr(hf(), config)(num_hidden_layers=layers, **extra))


def causal(config: str, model: str, **extra) -> Callable[[], torch.nn.Module]:
    return lambda: getattr(hf(), model)(getattr(hf(), config)(use_cache=False, **extra))


MASK = ("attention_mask",)
PAIR = ("attention_mask", "token_type_ids")
BASE = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}  # BERT-base's width


def text_encoder(name: str, prefix: str, vocab: int, inputs: tuple, **extra) -> Arch:
    """`prefix`Model of 4 layers, as a tokenizer feeds it: a padded sentence (pair), 512 tokens at most."""
    model = encoder(f"{prefix}Config", f"{prefix}Model", **extra)
    return Arch(name, "encoder", model, tokens(vocab, *inputs), "last_hidden_state", 512)


def small_lm(name: str, prefix: str, **extra) -> Arch:
    """`prefix`ForCausalLM shaped as the Llama example: width 512, 8 query and 4 key-value heads, 4
    layers, 32,000 words; a prompt with its mask in, logits out."""
    config = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8}
    config |= {"num_key_value_heads": 4, "vocab_size": 32000} | extra
    return Arch(
        name,
        "decoder",
        causal(f"{prefix}Config", f"{prefix}ForCausalLM", **config),
        tokens(32000, *MASK),
        "logits",
    )


def lm(name: str, prefix: str, vocab: int, **config) -> Arch:
    """`prefix`LMHeadModel or ForCausalLM of its family's own width, 4 layers."""
    model = f"{prefix}LMHeadModel" if prefix == "GPT2" else f"{prefix}ForCausalLM"
    return Arch(name, "decoder", causal(f"{prefix}Config", model, **config), tokens(vocab, *MASK), "logits")


def vision(name: str, prefix: str, **extra) -> Arch:
    return Arch(
        name, "vision", encoder(f"{prefix}Config", f"{prefix}Model", **extra), pixels(), "last_hidden_state"
    )


ARCHS = {
    a.name: a
    for a in [
        # encoders: a padded sentence or sentence pair, as tokenizers give them
        text_encoder("bert", "Bert", 30522, PAIR),
        text_encoder("roberta", "Roberta", 50265, MASK),
        Arch(
            "distilbert",
            "encoder",
            lambda: hf().DistilBertModel(hf().DistilBertConfig(n_layers=4)),
            tokens(30522, *MASK),
            "last_hidden_state",
            512,
        ),
        text_encoder("albert", "Albert", 30000, PAIR, **BASE),
        text_encoder("electra", "Electra", 30522, PAIR),
        text_encoder("deberta-v2", "DebertaV2", 128100, PAIR, **BASE),
        text_encoder("xlm-roberta", "XLMRoberta", 250002, MASK),
        text_encoder("mpnet", "MPNet", 30527, MASK),
        Arch(
            "modernbert",
            "encoder",
            encoder("ModernBertConfig", "ModernBertModel"),
            tokens(50368, *MASK),
            "last_hidden_state",
            1024,
        ),
        # decoders: a prompt with its mask, logits out
        lm("gpt2", "GPT2", 50257, n_layer=4),
        small_lm("llama", "Llama"),
        small_lm("mistral", "Mistral"),
        small_lm("qwen2", "Qwen2"),
        small_lm("qwen3", "Qwen3", head_dim=64),
        small_lm("gemma", "Gemma", head_dim=64),
        small_lm("phi", "Phi"),
        lm(
            "gpt-neo",
            "GPTNeo",
            50257,
            num_layers=4,
            attention_types=[[["global", "local"], 2]],
            hidden_size=768,
            num_heads=12,
        ),
        lm("opt", "OPT", 50272, num_hidden_layers=4),
        lm("bloom", "Bloom", 250880, n_layer=4, hidden_size=768, n_head=12),
        # encoder-decoders: the source with its mask, a few decoder tokens
        Arch(
            "t5",
            "encoder-decoder",
            lambda: hf().T5Model(hf().T5Config(num_layers=4, num_decoder_layers=4, use_cache=False)),
            tokens(32128, "attention_mask", "decoder_input_ids"),
            "last_hidden_state",
            1024,
        ),
        Arch(
            "bart",
            "encoder-decoder",
            lambda: hf().BartModel(hf().BartConfig(encoder_layers=4, decoder_layers=4, use_cache=False)),
            tokens(50265, "attention_mask", "decoder_input_ids"),
            "last_hidden_state",
        ),
        # vision: one image
        vision("vit", "ViT"),
        vision("deit", "DeiT"),
        vision("beit", "Beit"),
        vision("dinov2", "Dinov2", image_size=224),
        Arch(
            "swin",
            "vision",
            lambda: hf().SwinModel(hf().SwinConfig(depths=[2, 2, 2, 2])),
            pixels(),
            "last_hidden_state",
        ),
        Arch(
            "segformer",
            "vision",
            lambda: hf().SegformerModel(hf().SegformerConfig()),
            pixels(512),
            "last_hidden_state",
        ),
        # audio front ends: a second of 16 kHz sound; Whisper's 30 s of log-mel frames
        Arch("wav2vec2", "audio", encoder("Wav2Vec2Config", "Wav2Vec2Model"), audio(), "last_hidden_state"),
        Arch("hubert", "audio", encoder("HubertConfig", "HubertModel"), audio(), "last_hidden_state"),
        Arch(
            "whisper",
            "audio",
            lambda: hf().WhisperModel(
                hf().WhisperConfig(encoder_layers=2, decoder_layers=2, use_cache=False)
            ),
            whisper_inputs,
            "last_hidden_state",
        ),
    ]
}


class Output(torch.nn.Module):
    """The model with its inputs by keyword, one output tensor: how exporters want it."""

    def __init__(self, model: torch.nn.Module, names: list[str], output: str):
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**dict(zip(self.names, args, strict=True)), return_dict=True), self.output)


def export(arch: Arch, seq: int, how: str, out: Path) -> Path:
    """The architecture exported to `out` (.onnx, or .pt2 for how="pt2"), as users export it."""
    if how not in HOW:
        raise ValueError(f"{how!r}: export with one of {', '.join(HOW)}")
    torch.manual_seed(0)
    inputs = arch.inputs(min(seq, arch.max_seq))
    model = Output(arch.build().eval(), list(inputs), arch.output).eval()
    args = tuple(inputs.values())
    with torch.no_grad():
        if how == "pt2":
            torch.export.save(torch.export.export(model, args), str(out))
        else:
            torch.onnx.export(
                model,
                args,
                str(out),
                input_names=list(inputs),
                output_names=[arch.output],
                **ONNX_EXPORTERS[how],
            )
    return out


if __name__ == "__main__":
    name, seq, how, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    print(export(ARCHS[name], seq, how, out))
