"""Never silently slower: a quantized build's layers timed against the float build's, and the layers
int8 made slower kept in float when the whole model is then faster.

Where the target's code runs here (a CPU preset this machine can run), the build stage profiles the
float build and the first quantized variant (profile.profile_kernels: every kernel call timed within
whole-model runs) and gives each quantized layer the time of the kernel that computes it in each
build (for a kernel called for several layers, its time per call). A layer whose quantized kernel
took more than SLOWER_BY times its float kernel is quantized again in float, the model is built
again (the per-layer errors, a model compiled and run, are computed once, of the build kept:
variants.QuantizedJob.complete_errors), and the two builds are timed in turn (bench.time_models): the
one with the float layers is kept when it is faster by more than bench.MODEL_CHECK_GAIN (not in a
sweep, which compares each bit-width whole, nor for a model quantized by another tool, which runs as it
came). quantization.layer_speed in result.json says what was measured and what was kept, and the page
shows it. Timings decide, so two runs of one job on a busy machine can keep different
layers in float; what each kept is on its page.

A target timed on a board gets board_plan instead: the remote stage times each layer's kernel of
both builds alone on the board (board_speed); the layers it finds slower are named, not rebuilt,
since the build was made before the board was reached.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from webapp.pipeline.errors import error_message
from webapp.pipeline.stages.bench import MODEL_CHECK_GAIN, model_inputs, time_models
from webapp.pipeline.stages.optimize import Fusion
from webapp.pipeline.stages.profile import profile_kernels

# A layer counts as slower when its quantized kernel takes more than this times its float kernel's
# time: less than that is within what two profiles of one build differ by on a shared machine.
SLOWER_BY = 1.10

if TYPE_CHECKING:
    import tvm
    from tvm.relax.op.op_attrs import Conv2DAttrs

    from webapp.pipeline.stages.build import Built
    from webapp.pipeline.stages.quantize import Quantized
    from webapp.pipeline.stages.quantize.annotate import Layer
    from webapp.pipeline.stages.quantize.variants import QuantizedJob
    from webapp.targets import Target


@dataclass
class Build:
    """A quantized variant as the build stage made it."""

    quantized: Quantized | None  # None for the float build
    fused: object  # its fused module
    built: Built
    fusion: Fusion  # its kernels in the float model's names


def measures(target: Target, float_fusion: Fusion | None) -> bool:
    """Whether the layers can be timed here: a CPU target whose code this machine runs, and the
    float build's fusion traced (which kernel computes each layer)."""
    return float_fusion is not None and target.runs_cpu_code_here


def per_layer_ms(layers: list, fusion: Fusion, profile: dict) -> dict[str, tuple[str, float]]:
    """Each quantized layer (a realize.LayerQuant) -> the kernel that computes it in a build and that
    kernel's ms per call, from the build's profile: a kernel computing several of the layers (one call
    each, or one call for several) shares its time among them."""
    kernel_of = {r.layer.name: fusion.kernel_of.get(r.layer.head.name) for r in layers}
    sharing = Counter(kernel_of.values())
    out = {}
    for name, kernel in kernel_of.items():
        timed = profile["kernels"].get(kernel)
        if kernel is not None and timed is not None:
            out[name] = (kernel, timed["ms"] / max(timed["calls"], sharing[kernel], 1))
    return out


def layer_form(layer: Layer) -> str:
    """What a quantize.Layer computes: "conv2d", "depthwise conv2d", "grouped conv2d" or "matmul"."""
    if layer.kind == "conv2d" and int(cast("Conv2DAttrs", layer.attrs).groups) > 1:  # a conv2d has attrs
        return "depthwise conv2d" if layer.weight.shape[1] == 1 else "grouped conv2d"
    return layer.kind


def layer_times(
    layers: list, float_build: Build, quant_build: Build, profiles: tuple[dict, dict]
) -> list[dict]:
    """Per quantized layer: its kernel and ms in the float build and in the quantized one, with
    each kernel's schedule label, and their ratio (> 1: the quantized layer is slower)."""
    fp32 = per_layer_ms(layers, float_build.fusion, profiles[0])
    quant = per_layer_ms(layers, quant_build.fusion, profiles[1])
    rows = []
    for r in layers:
        name = r.layer.name
        if name not in fp32 or name not in quant:
            continue
        (fk, fms), (qk, qms) = fp32[name], quant[name]
        rows.append(
            {
                "layer": name,
                "form": layer_form(r.layer),
                "fp32_kernel": fk,
                "fp32_ms": fms,
                "fp32_schedule": float_build.built.labels.get(fk, "naive"),
                "quant_kernel": qk,
                "quant_ms": qms,
                "quant_schedule": quant_build.built.labels.get(qk, "naive"),
                "ratio": qms / fms if fms else None,
            }
        )
    return rows


def board_plan(variant: Build, float_build: Build, sweep: bool) -> dict | None:
    """For a target timed on a board, which this build cannot reach (its sandbox has no network): each
    quantized layer's kernel in both builds, with their labels, and each such kernel's arguments
    (shape, dtype), for the remote stage to time every kernel alone on the board (remote.py,
    time_layers). None when no layer can be followed into both builds, or when the plan fails (never
    the build's failure)."""
    try:
        return plan_layers(variant, float_build, sweep)
    except Exception:  # noqa: BLE001 - the job is timed on the board without its layers
        traceback.print_exc()
        return None


def plan_layers(variant: Build, float_build: Build, sweep: bool) -> dict | None:
    q = variant.quantized
    assert q is not None  # the variant planned is a quantized one
    rows = []
    for r in q.layers:
        head = r.layer.head.name
        fk, qk = float_build.fusion.kernel_of.get(head), variant.fusion.kernel_of.get(head)
        if fk is None or qk is None:
            continue
        rows.append(
            {
                "layer": r.layer.name,
                "form": layer_form(r.layer),
                "fp32_kernel": fk,
                "fp32_schedule": float_build.built.labels.get(fk, "naive"),
                "quant_kernel": qk,
                "quant_schedule": variant.built.labels.get(qk, "naive"),
            }
        )
    kernels = {
        "fp32": kernel_args(float_build.built.lowered, {row["fp32_kernel"] for row in rows}),
        q.variant: kernel_args(variant.built.lowered, {row["quant_kernel"] for row in rows}),
    }
    rows = [
        r for r in rows if r["fp32_kernel"] in kernels["fp32"] and r["quant_kernel"] in kernels[q.variant]
    ]
    if not rows:
        return None
    prequantized = any(r.layer.given_scale is not None for r in q.layers)
    return {
        "variant": q.variant,
        "quantized_layers": len(q.layers),
        "layers": rows,
        "kernels": kernels,
        "not_tried": "sweep" if sweep else "prequantized" if prequantized else "board",
    }


def kernel_args(lowered: tvm.IRModule, names: set[str]) -> dict[str, list]:
    """Kernel name -> its buffer arguments as [shape, dtype], for the kernels among `names` whose
    arguments are all buffers of fixed shape."""
    from tvm import tirx

    out = {}
    for gv, func in lowered.functions_items():
        if gv.name_hint not in names or not isinstance(func, tirx.PrimFunc):
            continue
        buffers = [p.ty for p in func.params]  # a buffer argument's type is its shape and dtype
        fixed = (
            isinstance(b, tirx.BufferType) and all(isinstance(d, tirx.IntImm) for d in b.shape)
            for b in buffers
        )
        if all(fixed):
            out[gv.name_hint] = [[[int(d) for d in b.shape], str(b.dtype)] for b in buffers]
    return out


def board_speed(plan: dict, times: dict, device: str) -> dict:
    """quantization.layer_speed of a job timed on a board: `times`, each build's kernel -> ms per call
    (timed alone on the board), given to the layers of the plan (board_plan)."""
    variant = plan["variant"]
    rows = []
    for row in plan["layers"]:
        fms, qms = times["fp32"].get(row["fp32_kernel"]), times[variant].get(row["quant_kernel"])
        if fms is not None and qms is not None:
            rows.append(row | {"fp32_ms": fms, "quant_ms": qms, "ratio": qms / fms if fms else None})
    slower = [row for row in rows if row["ratio"] is not None and row["ratio"] > SLOWER_BY]
    speed = {
        "device": device,
        "method": "alone",
        "slower_by": SLOWER_BY,
        "quantized_layers": plan["quantized_layers"],
        "timed": len(rows),
        "layers": rows,
        "slower": slower,
    }
    if slower:
        speed["not_tried"] = "all_slower" if len(slower) == plan["quantized_layers"] else plan["not_tried"]
    return speed


def check(
    variant: Build,
    float_build: Build,
    job: QuantizedJob,
    target: Target,
    rebuild: Callable[[Quantized], Build],
) -> Build:
    """The variant's layers timed against the float build's (quantized.layer_speed); the variant
    again with its slower layers in float (job: variants.QuantizedJob; rebuild(quantized) -> Build)
    where that is faster. Never the build's failure: a step that fails leaves the variant as it was,
    with the message (layer_speed's "error")."""
    try:
        return fall_back(variant, float_build, job, target, rebuild)
    except Exception as exc:  # noqa: BLE001 - the variant as built is kept
        traceback.print_exc()
        assert variant.quantized is not None  # the variant checked is a quantized one
        variant.quantized.layer_speed = (variant.quantized.layer_speed or {}) | {"error": error_message(exc)}
        return variant


def why_not_tried(job: QuantizedJob, q: Quantized) -> str | None:
    """Why the slower layers are not tried in float (layer_speed's "not_tried"), or None."""
    if job.sweep:  # a sweep compares bit-widths, each variant whole
        return "sweep"
    if any(r.layer.given_scale is not None for r in q.layers):  # quantized by another tool: kept as it is
        return "prequantized"
    if q.options.layer_precision is not None:  # each layer's precision given (a search's point)
        return "layer_precision"
    return None


def fall_back(
    variant: Build,
    float_build: Build,
    job: QuantizedJob,
    target: Target,
    rebuild: Callable[[Quantized], Build],
) -> Build:
    inputs = model_inputs(variant.fused)
    if inputs is None:  # an input without a fixed shape: nothing to time
        return variant
    dev = target.device()
    float_profile = profile_kernels(float_build.built.executable, inputs, dev)
    q = variant.quantized
    assert q is not None  # the variant checked is a quantized one
    variant_profile = profile_kernels(variant.built.executable, inputs, dev)
    rows = layer_times(q.layers, float_build, variant, (float_profile, variant_profile))
    if not rows:  # no layer could be followed into the kernels of both builds
        return variant
    slower = [row for row in rows if row["ratio"] is not None and row["ratio"] > SLOWER_BY]
    q.layer_speed = speed = {
        "device": target.device_name(),
        "slower_by": SLOWER_BY,
        "quantized_layers": len(q.layers),
        "timed": len(rows),
        "layers": rows,
        "slower": slower,
    }
    if not slower:
        return variant
    if len(slower) == len(q.layers):  # no layer gains: the float build (model-fp32.so) is that model
        speed["not_tried"] = "all_slower"
        return variant
    reason = why_not_tried(job, q)
    if reason is not None:
        speed["not_tried"] = reason
        return variant
    names = [row["layer"] for row in slower]
    mixed = rebuild(job.without(q, set(names), errors=False))  # errors: job.complete_errors, once kept
    assert mixed.quantized is not None  # rebuild's Build is of the quantized variant it was given
    times = time_models({"quantized": variant.built.executable, "mixed": mixed.built.executable}, inputs, dev)
    kept = times["mixed"] < times["quantized"] * (1 - MODEL_CHECK_GAIN)
    speed["fallback"] = {
        "layers": names,
        "quant_ms": times["quantized"],
        "mixed_ms": times["mixed"],
        "min_gain": MODEL_CHECK_GAIN,
        "kept": kept,
    }
    if not kept:
        return variant
    # the per-layer times of the build kept (its integer layers may have other kernels: a model with a
    # float convolution stays NCHW, quantize.integer_layout); the slower layers' rows stay as measured
    profile = profile_kernels(mixed.built.executable, inputs, dev)
    kept_rows = layer_times(mixed.quantized.layers, float_build, mixed, (float_profile, profile))
    mixed.quantized.layer_speed = speed | {"layers": kept_rows}
    job.replace(q, mixed.quantized)
    return mixed
