"""Never silently slower: a quantized build's layers timed against the float build's, and the layers
int8 made slower kept in float when the whole model is then faster.

Where the target's code runs here (a CPU preset this machine can run), the build stage profiles the
float build and the first quantized variant (bench.profile_kernels: every kernel call timed within
whole-model runs) and gives each quantized layer the time of the kernel that computes it in each
build (for a kernel called for several layers, its time per call). A layer whose quantized kernel
took more than SLOWER_BY times its float kernel is quantized again in float, the model is built
again, and the two builds are timed in turn (bench.time_models): the one with the float layers is
kept when it is faster by more than bench.MODEL_CHECK_GAIN. quantization.layer_speed in
result.json says what was measured and what was kept, and the page shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from webapp.pipeline.stages.bench import MODEL_CHECK_GAIN, model_inputs, profile_kernels, time_models
from webapp.pipeline.stages.optimize import Fusion

# A layer counts as slower when its quantized kernel takes more than this times its float kernel's
# time: less than that is within what two profiles of one build differ by on a shared machine.
SLOWER_BY = 1.10


@dataclass
class Build:
    """A quantized variant as the build stage made it."""

    quantized: object  # quantize.Quantized
    fused: object  # its fused module
    built: object  # build.Built
    fusion: Fusion  # its kernels in the float model's names


def measures(target, float_fusion: Fusion | None) -> bool:
    """Whether the layers can be timed here: a CPU target whose code this machine runs, and the
    float build's fusion traced (which kernel computes each layer)."""
    return float_fusion is not None and not target.gpu and not target.board and target.can_run_here


def per_layer_ms(layers: list, fusion: Fusion, profile: dict) -> dict[str, tuple[str, float]]:
    """Each quantized layer (a realize.LayerQuant) -> the kernel that computes it in a build and that
    kernel's ms per call, from the build's profile: a kernel computing several of the layers (one call
    each, or one call for several) shares its time among them."""
    kernel_of = {r.layer.name: fusion.kernel_of.get(r.layer.head.name) for r in layers}
    sharing: dict[str, int] = {}
    for kernel in kernel_of.values():
        sharing[kernel] = sharing.get(kernel, 0) + 1
    out = {}
    for name, kernel in kernel_of.items():
        timed = profile["kernels"].get(kernel)
        if kernel is not None and timed is not None:
            out[name] = (kernel, timed["ms"] / max(timed["calls"], sharing[kernel], 1))
    return out


def layer_form(layer) -> str:
    """What a quantize.Layer computes: "conv2d", "depthwise conv2d", "grouped conv2d" or "matmul"."""
    if layer.kind == "conv2d" and int(layer.attrs.groups) > 1:
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


def check(variant: Build, float_build: Build, job, target, rebuild) -> Build:
    """The variant's layers timed against the float build's (quantized.layer_speed); the variant
    again with its slower layers in float (job: variants.QuantizedJob; rebuild(quantized) -> Build)
    where that is faster."""
    inputs = model_inputs(variant.fused)
    if inputs is None:  # an input without a fixed shape: nothing to time
        return variant
    dev = target.device()
    profiles = tuple(profile_kernels(b.built.executable, inputs, dev) for b in (float_build, variant))
    q = variant.quantized
    rows = layer_times(q.layers, float_build, variant, profiles)
    slower = [row["layer"] for row in rows if row["ratio"] is not None and row["ratio"] > SLOWER_BY]
    speed = {"device": target.device_name(), "slower_by": SLOWER_BY, "layers": rows, "slower": slower}
    q.layer_speed = speed
    if not slower:
        return variant
    if len(slower) == len(q.layers):  # no layer gains: the float build is the model without them
        speed["all_slower"] = True
        return variant
    mixed = rebuild(job.without(q, set(slower)))
    times = time_models({"quantized": variant.built.executable, "mixed": mixed.built.executable}, inputs, dev)
    kept = times["mixed"] < times["quantized"] * (1 - MODEL_CHECK_GAIN)
    speed["fallback"] = {
        "layers": slower,
        "quant_ms": times["quantized"],
        "mixed_ms": times["mixed"],
        "min_gain": MODEL_CHECK_GAIN,
        "kept": kept,
    }
    if not kept:
        return variant
    mixed.quantized.layer_speed = speed
    job.replace(q, mixed.quantized)
    return mixed
