"""What a causal language model with a KV cache takes, in the form Hugging Face's exporters write for
generation: `input_ids`, optionally `attention_mask` and `position_ids`, and
`past_key_values.<layer>.key|value` in (the generate stage's Signature), and the shapes of one decode step,
which a job's other stages take where the user gave none (the import stage's default_shapes). Reads the
ONNX graph only: no TVM."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from webapp.pipeline.stages.unpack import tensor_bytes

if TYPE_CHECKING:
    import onnx

DEFAULT_STEP = {"tokens": 1, "past": 128}  # the forward pass of a job's other stages: one decode step
CACHE_PREFIXES = ("past_key_values", "past_key", "past_value", "past.", "cache")  # "cache": a .pt2's list
ROLES = ("input_ids", "attention_mask", "position_ids")


@dataclass
class Signature:
    """The inputs of a generating model by role: token ids, mask and positions (where it has them), and
    each cache tensor with the axis that holds the cached tokens."""

    inputs: list[tuple[str, str, list]]  # (name, dtype, shape as declared) in the graph's order
    cache: dict[str, int]  # cache input -> its axis of cached tokens
    weight_bytes: int  # what one decode step reads: every weight once a token
    vocabulary: int  # the size of the logits' last axis

    def shapes(self, tokens: int, past: int) -> dict[str, list[int]]:
        """Every input's shape for `tokens` new tokens after `past` cached ones, batch 1."""
        out = {}
        for name, _, shape in self.inputs:
            if name in self.cache:
                fixed = [d if isinstance(d, int) else 1 for d in shape]
                fixed[self.cache[name]] = past
                out[name] = fixed
            else:
                out[name] = [1, past + tokens if name == "attention_mask" else tokens]
        return out

    def values(self, tokens: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs as a generating loop passes them: random token ids, a mask of ones, positions after the
        cache, a random cache (its values do not change the time a step takes)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, dtype, _ in self.inputs:
            shape = self.shapes(tokens, past)[name]
            if name == "input_ids":
                out[name] = rng.integers(0, self.vocabulary, shape).astype(dtype)
            elif name == "attention_mask":
                out[name] = np.ones(shape, dtype)
            elif name == "position_ids":
                out[name] = np.arange(past, past + tokens, dtype=dtype)[None]
            else:
                out[name] = rng.standard_normal(shape).astype(dtype)
        return out

    @property
    def masked(self) -> bool:
        """Whether the model takes an attention mask (a SlidingCache needs one)."""
        return any(name == "attention_mask" for name, _, _ in self.inputs)


class SlidingCache:
    """A decode build of `slots` cached tokens fed one token a step, as greedy decoding and the page's
    generation feed it: the cache starts as `slots` masked zeros, and each step keeps its newest `slots`
    (the oldest, masked, dropped), so one build serves every step up to `slots` tokens. `run(feed)` runs
    the model: its outputs, the logits then each cache tensor's new value in the order of the cache
    inputs (as Hugging Face's exporters write them). Needs a model with an attention mask, which masks
    the empty slots (`Signature.masked`)."""

    def __init__(self, sig: Signature, slots: int, run: Callable[[dict], list]):
        self.sig, self.slots, self.run = sig, slots, run
        self.types = {name: dtype for name, dtype, _ in sig.inputs}
        shapes = sig.shapes(1, slots)
        self.cache = {name: np.zeros(shapes[name], self.types[name]) for name in sig.cache}
        self.mask = np.zeros(slots, np.int64)
        self.position = 0

    def step(self, token: int) -> np.ndarray:
        """The logits of the next token after `token`."""
        feed = {
            "input_ids": np.array([[token]], self.types["input_ids"]),
            "attention_mask": np.append(self.mask, 1)[None].astype(self.types["attention_mask"]),
            "position_ids": np.array([[self.position]], self.types.get("position_ids", "int64")),
            **self.cache,
        }
        logits, *present = self.run({name: feed[name] for name, _, _ in self.sig.inputs})
        for (name, axis), value in zip(self.sig.cache.items(), present, strict=True):
            self.cache[name] = np.take(value, range(1, self.slots + 1), axis=axis)
        self.mask = np.append(self.mask[1:], 1)
        self.position += 1
        return np.asarray(logits)[0, -1]


def signature(model: onnx.ModelProto) -> Signature | None:
    """The model's Signature if it is a causal LM in Hugging Face's exported form, else None."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    inputs = []
    for v in model.graph.input:
        if v.name in initializers:
            continue
        dims = v.type.tensor_type.shape.dim
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        dtype = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
        inputs.append((v.name, dtype, shape))
    dims = model.graph.output[0].type.tensor_type.shape.dim if model.graph.output else []
    return signature_of(inputs, initializer_bytes(model.graph), (dims[-1].dim_value if dims else 0) or 2)


def signature_of(inputs: list[tuple[str, str, list]], weight_bytes: int, vocabulary: int) -> Signature | None:
    """The Signature of a model with these inputs ((name, dtype, shape), a dimension not fixed named by
    a string), if they are a generating model's: token ids, perhaps mask and positions, and 4-D cache
    tensors named as exporters name them; else None."""
    cache = {}
    for name, _, shape in inputs:
        if name.startswith(CACHE_PREFIXES) and len(shape) == 4:
            named = [i for i, d in enumerate(shape) if i > 0 and not isinstance(d, int)]
            cache[name] = next((i for i in named if "past" in str(shape[i])), named[0] if named else 2)
    others = {name for name, _, _ in inputs} - set(cache)
    if not cache or "input_ids" not in others or others - set(ROLES):
        return None
    return Signature(inputs, cache, weight_bytes, vocabulary)


def initializer_bytes(graph: onnx.GraphProto, names: set[str] | None = None) -> int:
    """Bytes of the graph's weights (those named in `names`, where given), from their declared shapes and
    types: the data itself is not read, and may lie in external files."""
    return sum(tensor_bytes(t) for t in graph.initializer if names is None or t.name in names)


@functools.cache
def onnx_signature(path: Path) -> Signature | None:
    """signature() of an .onnx file, read once a process; None for a file that is not a readable model
    (the import stage says why)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        return signature(onnx.load(str(path), load_external_data=False))
    except (DecodeError, RuntimeError, ValueError, OSError):
        return None


def default_shapes(model: onnx.ModelProto, input_shapes: dict) -> dict:
    """input_shapes for a generating model the user gave no lengths for: one decode step (DEFAULT_STEP),
    the dimensions the user gave kept."""
    sig = signature(model)
    if sig is None:
        return input_shapes
    return sig.shapes(DEFAULT_STEP["tokens"], DEFAULT_STEP["past"]) | input_shapes
