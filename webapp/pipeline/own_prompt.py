"""A generating result's model decoding the user's prompt, in the sandbox (`python -m
webapp.pipeline.own_prompt <run_dir>`): the prompt (token ids, or text where the user sent the model's
tokenizer.json) fed a token at a time to each decode build the generate stage kept (TVM fp32 and its
weight-only builds, lm_inputs.SlidingCache), to ONNX Runtime and, for an example, to PyTorch eager with
its own cache, all in turn a step, then as many new tokens as asked decoded greedily. After every step
result.json says the tokens so far and each one's time, so that the run's page shows them as they come.
What the worker prepared is in input/run.json (webapp/jobs/own_input.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from webapp.jsonfile import write_json_atomic
from webapp.pipeline import own_input
from webapp.pipeline.own_input import InputError
from webapp.pipeline.stages.lm_inputs import Signature, SlidingCache, onnx_signature


def prompt_tokens(spec: dict, folder: Path, vocabulary: int) -> tuple[list[int], Any]:
    """The prompt's token ids, and the tokenizer that made them (None: the user typed ids)."""
    tokenizer = None
    if spec.get("tokenizer"):
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(folder / spec["tokenizer"]))
        except Exception as e:  # noqa: BLE001 - the file is the user's: any failure is its fault
            raise InputError(f"The tokenizer.json could not be read: {str(e)[:300]}") from None
        ids = tokenizer.encode(spec["prompt"]).ids
    else:
        try:
            ids = [int(t) for t in spec["prompt"].replace(",", " ").split()]
        except ValueError:
            raise InputError(
                "Type token ids (whole numbers separated by spaces), or send the model's tokenizer.json "
                "with the text."
            ) from None
    if not ids:
        raise InputError("The prompt has no tokens.")
    bad = [t for t in ids if not 0 <= t < vocabulary]
    if bad:
        raise InputError(
            f"Token {bad[0]} is outside the model's vocabulary of {vocabulary:,} (0 to {vocabulary - 1:,})."
        )
    if len(ids) + spec["new_tokens"] > spec["slots"]:
        raise InputError(
            f"The prompt's {len(ids)} tokens and {spec['new_tokens']} new ones are more than the "
            f"{spec['slots']} tokens the kept decode build holds: shorten the prompt or ask for fewer."
        )
    return ids, tokenizer


def vm_step(path: Path) -> Callable[[dict], list]:
    """A kept decode library as SlidingCache runs it."""
    import tvm
    from tvm import relax

    from webapp.pipeline.stages import bench

    main = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())["main"]
    return lambda feed: bench.flatten_outputs(main(*(tvm.runtime.tensor(v) for v in feed.values())))


class EagerDecoder:
    """PyTorch eager as a generating loop calls it: the example's Hugging Face model and its
    DynamicCache, a token a step."""

    def __init__(self, example: str):
        import transformers as hf

        from webapp.pipeline.examples import causal_lm

        self.model, self.kv, self.position = causal_lm(example), hf.DynamicCache(), 0

    def step(self, token: int) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.model(
                torch.tensor([[token]]),
                attention_mask=torch.ones(1, self.position + 1, dtype=torch.int64),
                position_ids=torch.tensor([[self.position]]),
                past_key_values=self.kv,
                use_cache=True,
            )
        self.kv, self.position = out.past_key_values, self.position + 1
        return out.logits[0, -1].numpy()


def decoders(spec: dict, folder: Path, sig: Signature) -> dict[str, Callable[[int], np.ndarray]]:
    """{runtime: step(token) -> the next token's logits}: TVM's kept builds, ONNX Runtime, PyTorch."""
    from webapp.pipeline.stages import bench

    out: dict[str, Callable[[int], np.ndarray]] = {}
    for label, rel in spec["libraries"].items():
        out[label] = SlidingCache(sig, spec["slots"], vm_step(folder / rel)).step
    session = bench.onnxruntime_session(folder / spec["model"], spec["threads"])
    out["onnxruntime"] = SlidingCache(sig, spec["slots"], lambda feed: session.run(None, feed)).step
    if spec.get("example"):
        out["pytorch"] = EagerDecoder(spec["example"]).step
    return out


def rows(tokens: dict[str, list[int]], ms: dict[str, list[float]], prompt: int, tokenizer: Any) -> list[dict]:
    """Each runtime's tokens so far and their times: the prompt's steps (the wait for the first token),
    then a step a new token; and how its tokens agree with its reference's (ONNX Runtime's for TVM fp32
    and PyTorch, TVM fp32's for a weight-only build)."""
    from webapp.pipeline.stages.generation import agreement

    out = []
    for runtime, made in tokens.items():
        new = ms[runtime][prompt:]
        median = float(np.median(new)) if new else None
        reference = "TVM fp32" if runtime.startswith("TVM ") and runtime != "TVM fp32" else "onnxruntime"
        out.append(
            {
                "runtime": runtime,
                "tokens": made,
                "text": tokenizer.decode(made) if tokenizer is not None else None,
                "step_ms": [round(m, 3) for m in new],
                "first_token_ms": round(sum(ms[runtime][:prompt]), 2) if made else None,
                "median_ms": round(median, 3) if median else None,
                "tokens_per_s": round(1e3 / median, 2) if median else None,
                "against": (
                    {"reference": reference} | agreement(made, tokens[reference])
                    if made and runtime != reference and reference in tokens
                    else None
                ),
            }
        )
    return out


def run(folder: Path) -> None:
    """The prompt decoded by every runtime in turn, a step each; result.json rewritten after each step."""
    spec = json.loads((folder / "input" / "run.json").read_text())
    sig = onnx_signature(folder / spec["model"])
    if sig is None or not sig.masked:
        raise InputError("The model is not a causal language model with an attention mask and a KV cache.")
    prompt, tokenizer = prompt_tokens(spec, folder, sig.vocabulary)
    steps = decoders(spec, folder, sig)
    tokens: dict[str, list[int]] = {k: [] for k in steps}
    ms: dict[str, list[float]] = {k: [] for k in steps}
    about = {
        "prompt": prompt,
        "prompt_text": spec["prompt"] if tokenizer is not None else None,
        "new_tokens": spec["new_tokens"],
        "slots": spec["slots"],
        "threads": spec["threads"],
    }
    for i in range(len(prompt) + spec["new_tokens"] - 1):
        for runtime, step in steps.items():
            fed = prompt[i] if i < len(prompt) else tokens[runtime][-1]
            t0 = time.perf_counter()
            logits = step(fed)
            ms[runtime].append((time.perf_counter() - t0) * 1e3)
            if i >= len(prompt) - 1:
                tokens[runtime].append(int(logits.argmax()))
        so_far = rows(tokens, ms, len(prompt), tokenizer)
        write_json_atomic(folder / "result.json", {"status": "running", **about, "runtimes": so_far})
    done = rows(tokens, ms, len(prompt), tokenizer)
    write_json_atomic(folder / "result.json", {"status": "done", **about, "runtimes": done})


def main(folder: Path) -> int:
    try:
        run(folder)
        return 0
    except Exception as e:  # noqa: BLE001 - an input no check caught, or our bug: said on the run's page
        write_json_atomic(folder / "result.json", own_input.failed(e))
        return 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
