"""Generate stage: a causal language model timed as it generates, the way llama.cpp's llama-bench
measures it. Prefill is the prompt run with an empty cache (its time is the time to the first token);
decode is one new token with a cache already holding N tokens (its rate is tokens per second). TVM,
ONNX Runtime (the same .onnx) and, for an example, PyTorch eager with its own cache run each point
in turn (timing.measure_watched), and the machine's memory bandwidth is measured in the same run:
decode reads every weight once a token, so bytes read / bandwidth bounds its rate.

The model is the ONNX form Hugging Face's exporters write for generation: `input_ids`, optionally
`attention_mask` and `position_ids`, and `past_key_values.<layer>.key|value` in; logits and
`present.*` out. TVM's importers take neither this file nor a .pt2 of it with symbolic lengths (the
ONNX one fails on its shape arithmetic, "Reshape expects the input data to be a Tensor"; the
exported-program one on a concat of its mask), so each point is its own build with the lengths
fixed: the page says so.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from webapp.machine import timing_slot
from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.memory import let_go
from webapp.pipeline.stages import genai, pt2
from webapp.pipeline.stages.fidelity import fidelity
from webapp.pipeline.stages.lm_inputs import Signature, SlidingCache, onnx_signature
from webapp.pipeline.stages.timing import measure_watched

if TYPE_CHECKING:
    from collections.abc import Callable

    from webapp.targets import Target

PREFILL_TOKENS = (16, 128, 512)  # llama-bench's pp512 and two shorter prompts
DECODE_CONTEXT = (128, 512, 2048)  # tokens already in the cache when one more is decoded
RUNTIMES = ("tvm", "onnxruntime", genai.RUNTIME, "pytorch")


# ---------------------------------------------------------------- the machine's memory bandwidth


def bandwidth(target: Target, nbytes: int, repeats: int = 10) -> dict:
    """This machine's memory bandwidth in GB/s over arrays of `nbytes` (at least 64 MiB: a decode step's
    bytes, so that a model held in the last-level cache is bound by that cache, as it runs): STREAM's
    triad as a TVM kernel built for the target (a = b + 3c, three arrays' bytes a pass, as STREAM counts
    them), and a read-only sum, torch.sum on the same threads (one array's bytes: the traffic of a
    matrix-vector product; a TVM sum reached half its rate here, TIR not vectorizing under a reduction);
    the best of `repeats` each."""
    import torch
    import tvm
    from tvm import s_tir, te

    n = max(nbytes, 64 << 20) // 64 * 16
    b, c = te.placeholder((n,), "float32", name="b"), te.placeholder((n,), "float32", name="c")
    a = te.compute((n,), lambda i: b[i] + tvm.tirx.const(3.0, "float32") * c[i], name="a")
    sch = s_tir.Schedule(te.create_prim_func([b, c, a]).with_attr("global_symbol", "triad"))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("a"))[0], [None, 16])
    sch.parallel(outer)
    sch.vectorize(inner)
    triad = tvm.compile(sch.mod, target=target.tvm)["triad"]
    dev = tvm.cpu()
    arrays = [tvm.runtime.tensor(np.ones(n, "float32"), dev) for _ in range(3)]
    data = torch.ones(n)
    out: dict[str, float] = {"bytes": 4 * n}
    for key, fn, moved in (("triad_gb_s", lambda: triad(*arrays), 3 * 4 * n), ("read_gb_s", data.sum, 4 * n)):
        fn()
        out[key] = round(moved / min(seconds(fn) for _ in range(repeats)) / 1e9, 2)
    return out


def seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- the stage


@dataclass(frozen=True)
class Point:
    phase: str  # "prefill": a prompt of `tokens`, empty cache; "decode": one token after `past` cached
    tokens: int
    past: int


POINTS = [Point("prefill", n, 0) for n in PREFILL_TOKENS] + [Point("decode", 1, n) for n in DECODE_CONTEXT]


@dataclass
class Runtimes:
    """What runs beside TVM: ONNX Runtime on the .onnx (`threads`), the example's Hugging Face model in
    PyTorch (`example`; None for an upload, which has none), ONNX Runtime GenAI's model folders
    ({variant: folder}, empty where it does not run) and the bytes each streams a decode step. Each is
    made at each point once TVM's builds are (`sessions`), and let go after it: a 2 GB model's import, and
    the export of its libraries, beside them went past the job's memory."""

    path: Path
    threads: int
    example: str | None
    genai_folders: dict[str, Path]
    genai_streamed: dict[str, int]

    def sessions(self) -> tuple[Any, dict[str, Any], Any]:
        """(an ONNX Runtime session of the .onnx, {variant: onnxruntime_genai.Model}, the Hugging Face
        model or None): the same seeded weights each time."""
        from webapp.pipeline.examples import causal_lm
        from webapp.pipeline.stages import bench

        eager = causal_lm(self.example) if self.example else None
        return bench.onnxruntime_session(self.path, self.threads), genai.load(self.genai_folders), eager


PT2_GENERATOR = "generator/generator.onnx"  # a .pt2 generator as ONNX, in the job's folder


def generating(ctx: Context) -> tuple[Path, Signature | None]:
    """The model the stage generates with (an example's generator export, or the upload itself) and its
    Signature, None where it does not generate."""
    path = ctx.job.generator or ctx.job.model
    read = {".pt2": pt2.generator_signature, ".onnx": onnx_signature}.get(path.suffix)
    return path, read(path) if read else None


def generator_file(ctx: Context) -> Path | None:
    """The .onnx the stage generates with: the model itself, or an uploaded .pt2 generator as ONNX
    (pt2.generator_onnx, written here once: what TVM builds and ONNX Runtime runs). None where the model
    does not generate."""
    path, sig = generating(ctx)
    if sig is None:
        return None
    return pt2.generator_onnx(path, ctx.dir / PT2_GENERATOR) if path.suffix == ".pt2" else path


def why_not_generated(ctx: Context) -> str | None:
    """Why the job has no generate stage (None: it has one)."""
    if generating(ctx)[1] is None:
        return (
            "not a causal language model with a KV cache (past_key_values inputs, as Hugging Face's "
            "exporters write one)"
        )
    if ctx.target.why_not_timed():
        return f"generation is timed where the code runs, and {ctx.target.name}'s code runs nowhere here"
    return None


def build_point(
    path: Path, sig: Signature, point: Point, target: Target, analyse: Callable[..., dict] | None = None
) -> dict[str, dict]:
    """The model built for one point's fixed lengths on the default rules: in float, and for a decode
    point also with its weights quantized (weight_only.SCHEMES). {variant: {"executable", "build_s",
    "packed"}}, each from the one import; with `analyse(executable, fused, lowered)`, its answer as the
    variant's "analysis" too."""
    from webapp.pipeline.passes.legalize import fuse
    from webapp.pipeline.rules import weight_only
    from webapp.pipeline.stages.build import build, schedule
    from webapp.pipeline.stages.importers import import_model

    t0 = time.monotonic()
    imported = import_model(path, sig.shapes(point.tokens, point.past))
    import_s = time.monotonic() - t0
    builds = {}
    for variant in ("fp32", *(weight_only.SCHEMES if point.phase == "decode" else ())):
        t0 = time.monotonic()
        mod, packed = weight_only.quantize_weights(imported.mod, weight_only.SCHEMES.get(variant), target)
        fused = fuse(mod, target)
        lowered, _ = schedule(fused, target)
        executable = build(lowered, target, None)
        seconds_ = time.monotonic() - t0 + (import_s if variant == "fp32" else 0)
        builds[variant] = {"executable": executable, "build_s": round(seconds_, 2), "packed": packed}
        if analyse is not None:
            builds[variant]["analysis"] = analyse(executable, fused, lowered)
        del fused, lowered
    return builds


def eager_runner(model: Any, sig: Signature, values: dict[str, np.ndarray]) -> Callable[[], Any]:
    """PyTorch eager as a generating loop calls it: the Hugging Face model with its DynamicCache."""
    import torch
    import transformers as hf

    given = {k: torch.from_numpy(v) for k, v in values.items()}
    cache = [given[name] for name in sig.cache]

    def run() -> Any:
        kv = hf.DynamicCache()
        for layer in range(len(cache) // 2):
            kv.update(cache[2 * layer], cache[2 * layer + 1], layer)
        with torch.no_grad():
            out = model(
                given["input_ids"],
                attention_mask=given.get("attention_mask"),
                position_ids=given.get("position_ids"),
                past_key_values=kv,
                use_cache=True,
            )
        return [out.logits]

    return run


GREEDY_PROMPT, GREEDY_STEPS = 8, 64  # tokens of a random prompt, then tokens decoded greedily


def greedy(step: Callable[[dict], list], sig: Signature, slots: int, prompt: list[int]) -> list[int] | None:
    """GREEDY_STEPS tokens decoded greedily after `prompt` with one decode build of `slots` cached tokens
    (lm_inputs.SlidingCache; `step(feed)` runs it). None for a model without an attention mask, which
    could not mask the empty slots."""
    if not sig.masked:
        return None
    decoder = SlidingCache(sig, slots, step)
    tokens = list(prompt)
    for i in range(len(prompt) + GREEDY_STEPS - 1):
        logits = decoder.step(tokens[i])
        if i >= len(prompt) - 1:
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


def agreement(tokens: list[int], reference: list[int]) -> dict:
    """How far two greedy decodings agree: the share of steps with the same token, the first that differs."""
    same = [a == b for a, b in zip(tokens, reference, strict=True)]
    return {
        "same_share": round(sum(same) / len(same), 4),
        "first_difference": same.index(False) if not all(same) else None,
    }


def greedy_runs(builds: dict, session: Any, sig: Signature, slots: int) -> dict | None:
    """Each build's and ONNX Runtime's greedy tokens from one random prompt, and their agreement: TVM fp32
    against ONNX Runtime, each quantized build against TVM fp32."""
    import tvm
    from tvm import relax

    from webapp.pipeline.stages import bench

    def vm_step(executable: Any) -> Callable[[dict], list]:
        main = relax.VirtualMachine(executable, tvm.cpu())["main"]
        return lambda feed: bench.flatten_outputs(main(*(tvm.runtime.tensor(v) for v in feed.values())))

    prompt = [int(t) for t in np.random.default_rng(2).integers(0, sig.vocabulary, GREEDY_PROMPT)]
    reference = greedy(lambda feed: session.run(None, feed), sig, slots, prompt)
    if reference is None:
        return None
    tokens = {"onnxruntime": reference}
    for variant, built in builds.items():  # a model with a mask: never None
        tokens[variant] = greedy(vm_step(built["executable"]), sig, slots, prompt) or []
    return {
        "prompt": prompt,
        "steps": GREEDY_STEPS,
        "tokens": tokens,
        "agreement": {
            v: agreement(t, tokens["fp32" if v != "fp32" else "onnxruntime"])
            for v, t in tokens.items()
            if v != "onnxruntime"
        },
    }


def keep_builds(ctx: Context, builds: dict) -> dict[str, str]:
    """The decode builds greedy decoding ran, as libraries in the job's files: the page's generation runs
    them (webapp/pipeline/own_prompt.py). {variant: file name}."""
    from webapp.pipeline.stages.build import export

    files = {v: f"generate-{v}.so" for v in builds}
    for v, name in files.items():
        export(builds[v]["executable"], ctx.target, ctx.dir / "files" / name)
    return files


def measure_point(
    ctx: Context, path: Path, sig: Signature, point: Point, rt: Runtimes, report: Report
) -> tuple[dict, list[dict]]:
    """One point built and timed: (its record, a row per runtime and TVM build)."""
    from webapp.pipeline.stages import bench

    let_go()  # the point before's sessions and builds
    builds = build_point(path, sig, point, ctx.target)
    let_go()  # the import's copies of the weights
    values = sig.values(point.tokens, point.past)
    session, genai_models, eager = rt.sessions()
    # ONNX Runtime first: it checks what TVM's kernels take on trust (a position past the model's table)
    runs = {("onnxruntime", "fp32"): lambda: session.run(None, values)}
    runs |= {("tvm", v): bench.tvm_runner(b["executable"], values) for v, b in builds.items()}
    logits = {key: bench.flatten_outputs(run())[0] for key, run in runs.items()}
    if eager is not None:  # timed, its logits not compared
        runs["pytorch", "fp32"] = eager_runner(eager, sig, values)
    for v, model in genai_models.items():  # its own inputs (a real prefix in its cache): timed only
        runs[genai.RUNTIME, v] = genai.runner(model, point.tokens, point.past, sig.vocabulary)
    against_ort = fidelity([logits["tvm", "fp32"]], [logits["onnxruntime", "fp32"]], classifier=False)
    with timing_slot.hold("generation"):  # one job times at a time on this machine; builds go on beside
        timed, conditions = measure_watched(
            runs, ctx.job.bench_budget_s, report, ctx.job.quiet_wait_s, timings=2
        )
    variants = {}
    for v, b in builds.items():
        against = None if v == "fp32" else fidelity([logits["tvm", v]], [logits["tvm", "fp32"]], False)
        variants[v] = {
            "build_s": b["build_s"],
            "streamed_bytes": b["packed"].streamed,
            "model_bytes": sig.weight_bytes - b["packed"].replaced + b["packed"].packed,
            "logits_sqnr_db": against["sqnr_db"] if against else None,
        }
    greedy_here = point.phase == "decode" and point.past == DECODE_CONTEXT[0] >= GREEDY_PROMPT + GREEDY_STEPS
    greedy_record = greedy_runs(builds, session, sig, point.past) if greedy_here else None
    runs, session, genai_models, eager = {}, None, {}, None  # let go before the export, which copies weights
    let_go()
    record = {
        "greedy": greedy_record,
        "libraries": keep_builds(ctx, builds) if greedy_record else None,
        "phase": point.phase,
        "tokens": point.tokens,
        "past": point.past,
        "build_s": builds["fp32"]["build_s"],
        "logits_sqnr_db": against_ort["sqnr_db"],
        "logits_max_abs_err": against_ort["max_abs_err"],
        "disturbed": conditions["disturbed"],
        "variants": variants,
    }
    rows = [
        {"runtime": k, "variant": v, "phase": point.phase, "tokens": point.tokens, "past": point.past}
        | {f: t[f] for f in ("median_ms", "p90_ms", "runs")}
        | ({"streamed_bytes": variants[v]["streamed_bytes"]} if k == "tvm" else {})
        | ({"streamed_bytes": rt.genai_streamed[v]} if k == genai.RUNTIME else {})
        for (k, v), t in timed.items()
    ]
    return record, rows


def rates(rows: list[dict], points: list[dict], sig: Signature, read_gb_s: float) -> list[dict]:
    """Each row's tokens per second, its speed against ONNX Runtime and, for decode, its share of the
    memory-bandwidth bound: the bytes a step reads (its matmuls' weights, float or packed, and the cache)
    at the measured read bandwidth. ONNX Runtime and PyTorch read the float weights TVM fp32 reads."""
    cache_itemsize = 4  # the cache tensors' float32 (every exporter here writes float32)
    ms = {(r["runtime"], r["variant"], r["phase"], r["tokens"], r["past"]): r["median_ms"] for r in rows}
    floats = {(p["phase"], p["tokens"], p["past"]): p["variants"]["fp32"]["streamed_bytes"] for p in points}
    out = []
    for row in rows:
        at = (row["phase"], row["tokens"], row["past"])
        seconds_ = row["median_ms"] / 1e3
        row = row | {
            "speedup_vs_onnxruntime": round(ms["onnxruntime", "fp32", *at] / row["median_ms"], 3),
            "speedup_vs_tvm_fp32": round(ms["tvm", "fp32", *at] / row["median_ms"], 3),
        }
        genai_ms = ms.get((genai.RUNTIME, row["variant"], *at))
        if row["runtime"] == "tvm" and genai_ms:  # TVM against GenAI in the same precision
            row["speedup_vs_onnxruntime_genai"] = round(genai_ms / row["median_ms"], 3)
        if row["phase"] == "prefill":  # time to first token, and the prompt's tokens a second
            out.append(
                row | {"ttft_ms": row["median_ms"], "tokens_per_s": round(row["tokens"] / seconds_, 2)}
            )
            continue
        cache = sum(int(np.prod(s)) for n, s in sig.shapes(1, row["past"]).items() if n in sig.cache)
        step_bytes = row.get("streamed_bytes", floats[at]) + cache * cache_itemsize
        bound_s = step_bytes / (read_gb_s * 1e9)
        out.append(
            row
            | {
                "tokens_per_s": round(1 / seconds_, 2),
                "bytes_per_token": step_bytes,
                "bound_tokens_per_s": round(1 / bound_s, 2),
                "bound_share": round(bound_s / seconds_, 3),
            }
        )
    return out


def model_positions(model: Any) -> int:
    """How many positions a Hugging Face causal LM has (GPT-2's table of 1,024; Llama's rotary 2,048 or its
    config's)."""
    config = model.config
    return int(
        getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None) or 1 << 30
    )


def with_genai(ctx: Context, eager: Any, threads: int) -> tuple[dict[str, Path], dict]:
    """ONNX Runtime GenAI's models of an example ({variant: folder}, each loaded once to check it) and
    what the result says of them: each variant's bytes, or why it does not run."""
    if eager is None:
        return {}, {"why_not": "its model builder takes a Hugging Face checkpoint, which an upload is not"}
    t0 = time.monotonic()
    try:
        folders = genai.build(eager, ctx.dir / "genai", threads)
        genai.load(folders)
    except Exception as e:  # noqa: BLE001 - TVM's figures go on without it; the page says why
        return {}, {"why_not": error_message(e)}
    about = {
        "build_s": round(time.monotonic() - t0, 2),
        "variants": {
            v: {"model_bytes": genai.model_bytes(f), "streamed_bytes": genai.streamed_bytes(f)}
            for v, f in folders.items()
        },
    }
    return folders, about


def runtimes(ctx: Context, path: Path, threads: int) -> tuple[Runtimes, dict, int]:
    """What runs beside TVM, what the result says of ONNX Runtime GenAI's models, and how many positions
    the model has (an example's; an upload's own errors say where it ends)."""
    from webapp.pipeline.examples import causal_lm

    eager = causal_lm(ctx.job.example) if ctx.job.example else None  # made again at each point
    folders, genai_about = with_genai(ctx, eager, threads)
    most = model_positions(eager) if eager is not None else 1 << 30
    streamed_by = {v: a["streamed_bytes"] for v, a in genai_about.get("variants", {}).items()}
    return Runtimes(path, threads, ctx.job.example, folders, streamed_by), genai_about, most


def measure_points(
    ctx: Context, path: Path, sig: Signature, rt: Runtimes, positions: int, report: Report
) -> tuple[list, list]:
    """Every point of POINTS measured up to the model's `positions`: (their records, the timed rows); a
    point that fails says why."""
    points: list[dict] = []
    rows: list[dict] = []
    for i, point in enumerate(POINTS):
        step = lambda f, i=i: report((i + f) / len(POINTS))  # noqa: E731
        about = {"phase": point.phase, "tokens": point.tokens, "past": point.past}
        if point.tokens + point.past > positions:
            points.append(about | {"error": f"past the model's {positions:,} positions"})
            continue
        try:
            record, timed = measure_point(ctx, path, sig, point, rt, step)
        except Exception as e:  # noqa: BLE001 - the other points go on; this one says why it has none
            points.append(about | {"error": error_message(e)})
            continue
        points.append(record)
        rows += timed
    return points, rows


def generation_stage(ctx: Context, report: Report) -> Given[None]:
    """The model built for each point of POINTS and timed there, TVM (in float, and with its weights
    quantized at the decode points) against ONNX Runtime (and, for an example, PyTorch eager and ONNX
    Runtime GenAI); then the memory bandwidth, over as many bytes as the float weights a decode step
    reads."""
    import torch

    from webapp.pipeline.stages import bench

    path = generator_file(ctx)
    sig = onnx_signature(path) if path else None
    assert path is not None and sig is not None  # why_not_generated() is None
    threads = bench.bench_threads()
    torch.set_num_threads(threads)
    rt, genai_about, most = runtimes(ctx, path, threads)
    try:
        points, rows = measure_points(ctx, path, sig, rt, most, report)
    finally:
        shutil.rmtree(ctx.dir / "genai", ignore_errors=True)
    done = [p for p in points if "error" not in p]
    if not any(p["phase"] == "decode" for p in done):
        raise StageError(f"No decode point could be measured: {points[-1].get('error')}")
    streamed = next(p for p in done if p["phase"] == "decode")["variants"]["fp32"]["streamed_bytes"]
    with timing_slot.hold("memory bandwidth"):  # over as many bytes as a decode step's weights
        measured = bandwidth(ctx.target, streamed)
    generation = {
        "device": bench.cpu_name(),
        "threads": threads,
        "builds": (
            f"{len(POINTS)} imports and their builds, one a point: TVM's importers do not take this model "
            "with symbolic lengths, so each prompt length and cache length is built with its lengths fixed"
            + (
                "; the .pt2, written as ONNX by torch.onnx.export, is what TVM builds and ONNX Runtime runs"
                if ctx.job.model.suffix == ".pt2"
                else ""
            )
        ),
        "runtimes": [k for k in RUNTIMES if any(r["runtime"] == k for r in rows)],
        "variants": list(done[-1]["variants"]),
        "genai": genai_about,
        "generate": next(
            (
                {"slots": p["past"], "libraries": p["libraries"], "vocabulary": sig.vocabulary}
                | {"model": str(path.relative_to(ctx.dir))}  # what ONNX Runtime runs on the page
                for p in done
                if p.get("libraries")
            ),
            None,
        ),
        "bandwidth": measured,
        "weight_bytes": sig.weight_bytes,
        "points": points,
        "rows": rates(rows, done, sig, measured["read_gb_s"]),
    }
    return Given(None, {"generation": generation})
