"""Quantize stage: the project's own post-training quantization on Relax (TVM 0.27 has none).

annotate (which conv2d / matmul layers) -> calibrate (run the float model, pick each activation's
clipping threshold) -> scales (weights per channel or per tensor, max or power of two) -> realize
(integer layers: uint8 x int8 with int32 accumulation, requantized to 8 bits between layers).
Bits below 8 use the same integer kernels with fewer levels: the values are b-bit, the arithmetic
is the CPU's 8-bit arithmetic (no CPU here has sub-byte dot products).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import tvm
from tvm import relax

from webapp.pipeline.quantize.annotate import Layer, find_layers, skip_layers
from webapp.pipeline.quantize.calibrate import TensorStats, gather, threshold
from webapp.pipeline.quantize.realize import LayerQuant, Realizer
from webapp.pipeline.quantize.scales import ActQuant


@dataclass(frozen=True)
class QuantOptions:
    bits: int = 8
    calibration: str = "max"  # max | percentile | kl | global
    weight_scale: str = "max"  # max | power2
    per_channel: bool = True
    skip_first: bool = False
    skip_last: bool = False
    global_threshold: float = 8.0  # calibration "global": every activation clipped to +-this

    @staticmethod
    def from_job(job: dict) -> QuantOptions:
        return QuantOptions(
            bits=int(job["quantize"].removeprefix("int")),
            calibration=job.get("calibration", "max"),
            weight_scale=job.get("weight_scale", "max"),
            per_channel=job.get("weight_granularity", "channel") == "channel",
            skip_first=bool(job.get("skip_first")),
            skip_last=bool(job.get("skip_last")),
            global_threshold=float(job.get("global_scale") or 8.0),
        )


@dataclass
class Quantized:
    mod: tvm.IRModule  # the integer model, Relax before legalization
    layers: list[LayerQuant]
    skipped: list[Layer]
    stats: dict  # Var -> TensorStats (empty with global calibration)
    options: QuantOptions

    def layer_table(self) -> list[dict]:
        return [
            {
                "layer": r.layer.name,
                "kind": r.layer.kind,
                "input_scale": r.input.scale,
                "input_zero_point": r.input.zero_point,
                "input_levels": r.input.qmax - r.input.qmin + 1,
                "weight_scale_min": float(r.weight_scale.min()),
                "weight_scale_max": float(r.weight_scale.max()),
                "weight_scales": len(set(r.weight_scale.tolist())),
                "output_scale": r.output.scale if r.output else None,
                "requantize": r.requantize,
                "power2": bool(
                    scales_power2(r.input.scale, r.weight_scale, r.output.scale if r.output else 1.0)
                ),
            }
            for r in self.layers
        ]

    def to_json(self) -> dict:
        return {
            "options": asdict(self.options),
            "layers": self.layer_table(),
            "skipped": [layer.name for layer in self.skipped],
        }


def scales_power2(*scales) -> bool:
    from webapp.pipeline.quantize.scales import is_power_of_two

    return all(is_power_of_two(s) for s in scales)


def canonical(mod: tvm.IRModule) -> tvm.IRModule:
    """Batch norm folded into the convolutions, the rest decomposed, constants folded: the form both
    the float pipeline (webapp.pipeline.optimize) and quantization start from."""
    with tvm.transform.PassContext(opt_level=3):
        mod = relax.transform.FoldBatchnormToConv2D()(mod)
        mod = relax.transform.DecomposeOpsForInference()(mod)
        return relax.transform.FoldConstant()(mod)


def with_outputs(func: relax.Function, extra: list) -> tvm.IRModule:
    """The function (no dataflow blocks) returning (its result, *extra), in dataflow form again."""
    bb = relax.BlockBuilder()
    with bb.function("main", list(func.params), attrs=dict(func.attrs or {})):
        for block in func.body.blocks:
            for binding in block.bindings:
                bb.emit_normalized(binding)
        bb.emit_func_output(relax.Tuple([func.body.body, *extra]))
    return relax.transform.ConvertToDataflow()(bb.get())


def run_all(executable, samples: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    from webapp.pipeline.bench import flatten_outputs

    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(executable, dev)
    return [
        flatten_outputs(vm["main"](*[tvm.runtime.tensor(a, dev) for a in sample.values()]))
        for sample in samples
    ]


def quantize(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    options: QuantOptions,
    samples: list[dict[str, np.ndarray]],
    report=lambda f: None,
) -> Quantized:
    from webapp.pipeline.build import compile_relax

    func = relax.transform.ToNonDataflow()(canonical(mod))["main"]
    layers = find_layers(func)
    if not layers:
        raise ValueError("The model has no conv2d or matmul with constant weights: nothing to quantize.")
    skip_layers(layers, options.skip_first, options.skip_last)
    quantized = [layer for layer in layers if layer.quantized]
    if not quantized:
        raise ValueError("Every quantizable layer was skipped (skip first / skip last): nothing to quantize.")
    tensors = list(dict.fromkeys(t for layer in quantized for t in (layer.data, layer.out)))

    stats: dict = {}
    if options.calibration != "global":
        executable, _ = compile_relax(with_outputs(func, tensors), target)
        report(0.3)
        runs = run_all(executable, samples)
        n_out = len(runs[0]) - len(tensors)
        stats = {t: gather([run[n_out + i] for run in runs]) for i, t in enumerate(tensors)}
    report(0.5)
    acts = {}
    for t in tensors:
        nonnegative = t in stats and stats[t].nonnegative or any(
            layer.out.same_as(t) and layer.nonnegative_out for layer in layers
        )
        levels = 2**options.bits - 1 if nonnegative else max(2 ** (options.bits - 1) - 1, 1)
        limit = threshold(stats[t], options.calibration, levels) if t in stats else options.global_threshold
        acts[t] = ActQuant.make(limit, nonnegative, options.bits, options.weight_scale == "power2")
    realizer = Realizer(func, layers, acts, options)
    qfunc = realizer.run()
    return Quantized(
        tvm.IRModule({"main": qfunc}),
        realizer.report,
        [layer for layer in layers if not layer.quantized],
        stats,
        options,
    )


__all__ = ["QuantOptions", "Quantized", "quantize", "canonical", "TensorStats"]
