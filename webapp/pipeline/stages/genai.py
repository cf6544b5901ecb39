"""ONNX Runtime GenAI beside TVM in the generate stage: Microsoft's generation runtime, its model made by
its own model builder from the Hugging Face checkpoint (so for the examples only: an upload is an
.onnx, not a checkpoint), in float and in the builder's int4 (MatMulNBits, blocks of 32 along the
reduced axis, accuracy level 4: activations in int8 as its matrix products run on CPUs, the builder's
default for them). Its generator runs as a generating program runs it: prefill is a prompt appended to
a new generator (until its logits), decode one token appended when the cache holds `past` tokens
(the generator rewound to them between calls), the cache filled a chunk of tokens at a time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.lm_inputs import initializer_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

RUNTIME = "onnxruntime-genai"
BUILDS = {"fp32": "fp32", "int4-g32": "int4"}  # our variant's name: the builder's precision
BUILD_TIMEOUT_S = 1800
FILL_CHUNK = 128  # tokens a call while a decode point's cache is filled


def stub_tokenizer(model: Any, folder: Path) -> None:
    """A tokenizer the builder accepts beside a checkpoint of random weights: one word a token id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(model.config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2")
    fast.save_pretrained(folder)


def build(model: Any, folder: Path, threads: int) -> dict[str, Path]:
    """The builder's models of a Hugging Face causal LM, {variant: model folder}, each set to run on
    `threads` threads. Raises StageError with the builder's last words where it does not take the model."""
    checkpoint = folder / "checkpoint"
    model.save_pretrained(checkpoint)
    stub_tokenizer(model, checkpoint)
    out = {}
    for variant, precision in BUILDS.items():
        out[variant] = folder / variant
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint)]
        command += ["-o", str(out[variant]), "-p", precision, "-e", "cpu", "-c", str(folder / "cache")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise StageError(
                f"ONNX Runtime GenAI's model builder did not take the model ({precision}): {last}"
            )
        config_file = out[variant] / "genai_config.json"
        config = json.loads(config_file.read_text())
        config["model"]["decoder"]["session_options"] |= {"intra_op_num_threads": threads}
        config_file.write_text(json.dumps(config, indent=1))
    shutil.rmtree(checkpoint)
    shutil.rmtree(folder / "cache", ignore_errors=True)
    return out


def streamed_bytes(model_dir: Path) -> int:
    """Bytes of the weights a decode step streams: the initializers that its matrix products read
    (float weights, or int4 blocks with their scales and zero points)."""
    import onnx

    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    read = {name for n in graph.node if n.op_type in ("MatMul", "MatMulNBits", "Gemm") for name in n.input}
    return initializer_bytes(graph, read)


def model_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("model.onnx*"))


def runner(model: Any, tokens: int, past: int, vocabulary: int) -> Callable[[], None]:
    """A call of the GenAI model `model` (an onnxruntime_genai.Model) at one point: `tokens` new tokens
    (a prompt) on an empty cache, or one token after `past` cached (the prompt run once, before)."""
    import onnxruntime_genai as og

    rng = np.random.default_rng(3)

    def generator(length: int) -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length + 1)
        return og.Generator(model, params)

    if past == 0:
        prompt = rng.integers(3, vocabulary, tokens).astype(np.int32)
        return lambda: generator(tokens).append_tokens(prompt)
    held = generator(past + 1)
    cached = rng.integers(3, vocabulary, past).astype(np.int32)
    for start in range(0, past, FILL_CHUNK):  # each chunk's logits, not the whole cache's (1.2 GB at 2,048)
        held.append_tokens(cached[start : start + FILL_CHUNK])
    token = np.array([5], np.int32)

    def step() -> None:
        held.rewind_to(past)
        held.append_tokens(token)

    return step


def load(folders: dict[str, Path]) -> dict[str, Any]:
    import onnxruntime_genai as og

    return {variant: og.Model(str(folder)) for variant, folder in folders.items()}
