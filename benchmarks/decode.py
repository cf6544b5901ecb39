"""One decoding step of the causal language models (GPT-2, Llama examples): one new token with a
KV cache of 128 tokens, in tokens per second, TVM against ONNX Runtime and PyTorch, measured in one run.

The step is the example's model wrapped so that the cache is its input: (token, keys and values of
every layer) -> (logits, every layer's keys and values with the new token's). It is exported as the
examples are (`torch.onnx.export(dynamo=True)`, and `torch.export` for PyTorch), the .onnx compiled
through the whole pipeline (sandboxed, as an uploaded model's job runs), and the three runtimes
timed in turn in one loop (webapp/pipeline/stages/timing.measure_interleaved) on the same inputs.

    PYTHONPATH=. .venv/bin/python benchmarks/decode.py [--models gpt2,llama] [--past 128] [--record]

--record appends the run to benchmarks/results/decode.json.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from record import keep, script_parser
from torch import nn

from webapp.config import Config

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(_var, str(Config.from_env().bench_threads))


class DecodeStep(nn.Module):
    """A causal LM's step: the new token and the cache in, the logits and the grown cache out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, token, *cache):
        import transformers as hf

        kv = hf.DynamicCache()
        for layer in range(len(cache) // 2):
            kv.update(cache[2 * layer], cache[2 * layer + 1], layer)
        out = self.model(token, past_key_values=kv, use_cache=True, return_dict=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def export_step(name: str, past: int, out: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """The example's decoding step as .onnx and .pt2, and its inputs (a token, a random cache)."""
    from webapp.pipeline.examples import build_example

    model = build_example(name).model  # the transformers model inside the example's wrapper
    model.config.use_cache = True
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    generator = torch.Generator().manual_seed(1)
    token = torch.randint(0, config.vocab_size, (1, 1), generator=generator)
    cache = [
        torch.randn(1, heads, past, head_dim, generator=generator)
        for _ in range(2 * config.num_hidden_layers)
    ]
    names = ["token", *[f"{kind}{i}" for i in range(config.num_hidden_layers) for kind in ("key", "value")]]
    step = DecodeStep(model).eval()
    onnx_path, pt2 = out / f"{name}-decode.onnx", out / f"{name}-decode.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(step, (token, *cache)), pt2)
        torch.onnx.export(
            step,
            (token, *cache),
            onnx_path,
            dynamo=True,
            external_data=False,
            input_names=names,
            verbose=False,
        )
    return onnx_path, pt2, {n: t.numpy() for n, t in zip(names, (token, *cache), strict=True)}


def measure_model(config: Config, name: str, past: int, tmp: Path) -> dict:
    import tvm

    from webapp.cli import compile_locally
    from webapp.pipeline.stages import bench, timing

    onnx_path, pt2, inputs = export_step(name, past, tmp)
    out = tmp / f"{name}-job"
    error = compile_locally(config, str(onnx_path), {"target": "x86-host"}, out)
    if error:
        raise RuntimeError(f"{name}: failed at {error['stage']}: {error['message']}")
    threads = config.bench_threads
    runs = {
        "tvm": bench.tvm_runner(tvm.runtime.load_module(str(out / "files" / "model.so")), inputs),
        "onnxruntime": bench.onnxruntime_runner(onnx_path, inputs, threads),
        "pytorch": bench.pytorch_runner(pt2, inputs, threads),
    }
    outputs = {k: bench.flatten_outputs(run()) for k, run in runs.items() if k != "pytorch"}
    fid = bench.fidelity(outputs["tvm"][:1], outputs["onnxruntime"][:1], classifier=False)
    ms = {k: t["median_ms"] for k, t in timing.measure_interleaved(runs, config.bench_budget_s).items()}
    return {
        "model": name,
        "past": past,
        "threads": threads,
        **{f"{k}_ms": v for k, v in ms.items()},
        **{f"{k}_tokens_per_s": 1e3 / v for k, v in ms.items()},
        "tvm_ort": ms["tvm"] / ms["onnxruntime"],
        "tvm_pytorch": ms["tvm"] / ms["pytorch"],
        "logits_sqnr_db": fid["sqnr_db"],
    }


def main() -> int:
    parser = script_parser(__doc__, "decode")
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--past", type=int, default=128, help="tokens already in the KV cache")
    parser.add_argument("--budget", type=float, default=4.0, help="timing seconds per runtime and model")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(bench_budget_s=args.budget, data_dir=Path(tmp) / "data")
        print(f"{config.bench_threads} threads; one new token after {args.past}; medians in ms (tokens/s)")
        print(
            f"{'model':<8} {'TVM':>16} {'ONNX Runtime':>16} {'PyTorch':>16} {'TVM/ORT':>8} "
            f"{'TVM/PyTorch':>11} {'SQNR':>6}"
        )
        for name in args.models.split(","):
            r = measure_model(config, name, args.past, Path(tmp))
            rows.append(r)
            cells = [
                f"{r[f'{k}_ms']:7.3f} ({r[f'{k}_tokens_per_s']:5.0f})"
                for k in ("tvm", "onnxruntime", "pytorch")
            ]
            print(
                f"{name:<8} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} {r['tvm_ort']:7.2f}x "
                f"{r['tvm_pytorch']:10.2f}x {r['logits_sqnr_db']:6.1f}",
                flush=True,
            )
    keep(args, "decode", config.bench_threads, rows, budget_s=args.budget, past=args.past)
    return 0


if __name__ == "__main__":
    sys.exit(main())
