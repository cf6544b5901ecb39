"""Quantize stage: the project's own post-training quantization on Relax (TVM 0.27 has none).

annotate (which conv2d / matmul layers) -> calibrate (run the float model, pick each activation's
clipping threshold) -> scales (weights per channel or per tensor, max or power of two) -> realize
(integer layers: uint8 x int8 with int32 accumulation, requantized to 8 bits between layers).
Bits below 8 use the same integer kernels with fewer levels: the values are b-bit, the arithmetic
is the CPU's 8-bit arithmetic (no CPU here has sub-byte dot products).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from webapp.options import JobOptions
from webapp.pipeline.passes.rewrites import convert_layout, fold_with_numpy
from webapp.pipeline.passes.running import RunningPass
from webapp.pipeline.stages.quantize.annotate import (
    Layer,
    bindings,
    find_layers,
    op_name,
    set_precision,
    skip_layers,
)
from webapp.pipeline.stages.quantize.calibrate import TensorStats, gather, threshold
from webapp.pipeline.stages.quantize.realize import LayerQuant, Realizer
from webapp.pipeline.stages.quantize.scales import ActQuant, is_power_of_two
from webapp.pipeline.steps import step
from webapp.targets import Target, host


@dataclass
class Quantized:
    mod: tvm.IRModule  # the integer model, Relax before legalization
    layers: list[LayerQuant]
    skipped: list[Layer]
    stats: dict  # Var -> TensorStats (empty with global calibration)
    options: JobOptions  # its quantize, calibration, weight_scale, ... options
    errors: list[dict] | None  # per quantized layer, against the float model; None: not computed yet
    calibration: dict = field(default_factory=dict)  # where the calibration inputs came from
    packed_bytes: int = 0  # the quantized weights bit-packed (files/weights-int<b>.npz)
    float_bytes: int = 0  # the same weights in float32

    variant: str = ""  # its name in the job: "int8", or in a sweep e.g. "int8 kl"
    origin: dict = field(default_factory=dict)  # a var of mod -> the vars of the float model it computes
    # its layers timed against the float build's, and those kept in float (stages.fallback)
    layer_speed: dict | None = None
    precision: dict | None = None  # the layers kept in float by the accuracy budget (stages.precision)

    @property
    def mode(self) -> str:
        if self.options.bits == 8:
            activations = self.layers[0].input.dtype if self.layers else "uint8"
            return f"int8 integer kernels ({activations} x int8, int32 accumulation)"
        return (
            f"int{self.options.bits} values on 8-bit integer kernels (no sub-byte arithmetic on this CPU; "
            "weights also saved bit-packed)"
        )

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
                "weight_bits": r.layer.weight_bits or self.options.bits,
                "power2": bool(
                    scales_power2(r.input.scale, r.weight_scale, r.output.scale if r.output else 1.0)
                ),
            }
            for r in self.layers
        ]

    def to_json(self) -> dict:
        return (
            {
                "options": {k: getattr(self.options, k) for k in QUANTIZE_OPTIONS}
                | {"bits": self.options.bits},
                "variant": self.variant,
                "mode": self.mode,
                "calibration": self.calibration,
                "weights": {"packed_bytes": self.packed_bytes, "float32_bytes": self.float_bytes},
                "layers": self.layer_table(),
                "layer_errors": self.errors or [],
                "skipped": [layer.name for layer in self.skipped],
            }
            | ({"layer_speed": self.layer_speed} if self.layer_speed else {})
            | ({"precision_search": self.precision} if self.precision else {})
        )


# The job options that decide a quantized build (what the page and the JSON repeat of them).
QUANTIZE_OPTIONS = (
    "quantize",
    "calibration",
    "weight_scale",
    "weight_granularity",
    "global_scale",
    "skip_first",
    "skip_last",
    "accuracy_budget",
    "layer_precision",
)


def scales_power2(*scales: float | np.ndarray) -> bool:
    return all(is_power_of_two(s) for s in scales)


def integer_layout(mod: tvm.IRModule) -> tvm.IRModule:
    """The integer model in NHWC when every convolution in it is integer: the dot-product kernels
    then read input channels where they lie and write whole vectors of output channels
    (webapp.pipeline.rules.int8.conv2d_nhwc_int8). Layout changes are left at the model's edges only.
    With a float convolution left (a skipped layer) the model stays NCHW, where the float rules are;
    so does a model the conversion cannot take (the int8 NCHW rule schedules it: never a failure)."""
    convs = [b.value for b in bindings(mod["main"]) if op_name(b.value) == "relax.nn.conv2d"]
    if not convs or any(str(c.args[0].ty.dtype) == "float32" for c in convs):
        return mod
    with tvm.transform.PassContext(opt_level=3, instruments=[RunningPass()]):
        try:
            converted = convert_layout(mod)
        except Exception:  # noqa: BLE001 - the model stays in NCHW
            traceback.print_exc()
            return mod
        # the weights' transposes with numpy: FoldConstant built a function for each (457 on PP-OCR's
        # direction classifier, ~20 ms apiece)
        return relax.transform.FoldConstant()(fold_with_numpy(converted))


def with_main(mod: tvm.IRModule, func: relax.Function) -> tvm.IRModule:
    """`func` as the main of `mod`, beside mod's other functions: the PrimFuncs an importer made,
    which main calls (the ONNX importer's maximum and minimum for a Clip with bounds from Constant
    nodes, as torch.onnx's TorchScript exporter writes ReLU6)."""
    out = mod.clone()
    out.update_func(out.get_global_var("main"), func)
    return out


def with_outputs(mod: tvm.IRModule, func: relax.Function, extra: list) -> tvm.IRModule:
    """The module with func (no dataflow blocks) as a main returning (its result, *extra), in
    dataflow form again."""
    bb = relax.BlockBuilder()
    with bb.function("main", list(func.params), attrs=dict(func.attrs or {})):
        for block in func.body.blocks:
            for binding in block.bindings:
                bb.emit_normalized(binding)
        bb.emit_func_output(relax.Tuple([func.body.body, *extra]))
    return relax.transform.ConvertToDataflow()(with_main(mod, bb.get()["main"]))


@dataclass
class Observed:
    """The float model as quantization sees it: its layers and every tensor quantization touches,
    run on the calibration inputs. The same for every bit-width and calibration mode of a job."""

    func: relax.Function  # without dataflow blocks
    layers: list[Layer]
    tensors: list  # the inputs and results of the quantized layers
    float_of: dict  # tensor -> its value on each calibration input
    given: dict = field(default_factory=dict)  # tensor -> ActQuant: a pre-quantized model's own
    module: tvm.IRModule | None = None  # func's module, with the functions main calls (with_main)


def observe(
    mod: tvm.IRModule,
    options: JobOptions,
    samples: list[dict[str, np.ndarray]],
    report: Callable[..., None] = lambda f: None,
    prequantized: dict | None = None,
    dtype: str = "uint8",
) -> Observed:
    """With `prequantized` (ImportedModel.prequantized), the layers the model quantized keep its
    scales (for activations of `dtype`), and the others stay in float."""
    from webapp.pipeline.stages.bench import run_all
    from webapp.pipeline.stages.build import compile_relax
    from webapp.pipeline.stages.optimize import canonical

    with tvm.transform.PassContext(opt_level=3, instruments=[RunningPass()]):
        module = relax.transform.ToNonDataflow()(canonical(mod))
    func = module["main"]
    layers = find_layers(func)
    if not layers:
        raise ValueError("The model has no conv2d or matmul with constant weights: nothing to quantize.")
    skip_layers(layers, options.skip_first, options.skip_last)
    set_precision(layers, options.layer_precision)
    given = {}
    if prequantized is not None:
        acts = {v.name: v for layer in layers for v in (layer.data, layer.out)}
        # var name -> (scale, zero point, dtype) (importers.prequantized_by_var)
        given_acts: dict[str, tuple[float, int, str]] = prequantized["acts"]
        given = {acts[name]: given_act(*p, dtype) for name, p in given_acts.items() if name in acts}
        for layer in layers:
            scales = prequantized["weights"].get(layer.head.name)
            layer.given_scale = np.asarray(scales, np.float64) if scales else None  # []: from its values
            # scales the model computes at run time: calibrated
            calibrated = bool(prequantized.get("dynamic"))
            layer.quantized = layer.quantized and scales is not None and (layer.data in given or calibrated)
    quantized = [layer for layer in layers if layer.quantized]
    if not quantized:
        raise ValueError("Every quantizable layer was skipped (skip first / skip last): nothing to quantize.")
    # Every layer's input and result, whichever are quantized: the float model returning them as well,
    # run on this machine whatever the target. TVM's FuseTIR failed on NudeNet returning those of all
    # layers but one kept in float by layer_precision ("Check failed: func_info_.global_name != fused").
    tensors = list(dict.fromkeys(t for layer in layers for t in (layer.data, layer.out)))
    executable, _ = compile_relax(with_outputs(module, func, tensors), host())
    report(0.2)
    with step(f"calibration: the float model run on {len(samples)} inputs"):
        runs = run_all(executable, samples)
    n_out = len(runs[0]) - len(tensors)
    float_of = {t: [run[n_out + i] for run in runs] for i, t in enumerate(tensors)}
    return Observed(func, layers, tensors, float_of, given, module)


def given_act(scale: float, zero_point: int, dtype: str, target_dtype: str) -> ActQuant:
    """A pre-quantized model's 8-bit activation as the target's kernels take it (uint8 on x86, int8
    on Arm): the same values, the zero point shifted by 128 where the signedness differs."""
    shift = 0 if dtype == target_dtype else (128 if target_dtype == "uint8" else -128)
    qmin, qmax = (0, 255) if target_dtype == "uint8" else (-128, 127)
    return ActQuant(float(scale), int(zero_point) + shift, qmin, qmax, target_dtype)


def quantize(
    mod: tvm.IRModule | None,
    target: Target,
    options: JobOptions,
    samples: list[dict[str, np.ndarray]],
    report: Callable[..., None] = lambda f: None,
    observed: Observed | None = None,
    errors: bool = True,
) -> Quantized:
    """`observed`, when given, is the float run several quantizations of one job share (observe());
    `errors` false leaves the per-layer errors out (None: variants.QuantizedJob.complete_errors)."""
    if observed is None:  # a global threshold calibrates nothing: one input, for the per-layer error
        observed = observe(mod, options, samples if options.calibration != "global" else samples[:1], report)
    func, layers = observed.func, observed.layers
    # a layer put in float after observe() (fallback, precision search) leaves its tensors in float32
    live = {t for layer in layers if layer.quantized for t in (layer.data, layer.out)}
    tensors = [t for t in observed.tensors if t in live]
    stats = {t: gather(observed.float_of[t]) for t in tensors} if options.calibration != "global" else {}
    report(0.5)
    dtype = target.activation_dtype  # the 8-bit activations its int8 kernels multiply
    acts = {}
    for t in tensors:
        if t in observed.given:  # the pre-quantized model's own scale
            acts[t] = observed.given[t]
            continue
        nonnegative = (
            t in stats
            and stats[t].nonnegative
            or any(layer.out.same_as(t) and layer.nonnegative_out for layer in layers)
        )
        probe = ActQuant.make(1.0, nonnegative, options.bits, False, dtype)
        levels = probe.qmax - probe.zero_point  # positive levels, for KL's histogram
        limit = threshold(stats[t], options.calibration, levels) if t in stats else options.global_scale
        acts[t] = ActQuant.make(limit, nonnegative, options.bits, options.weight_scale == "power2", dtype)
    means = channel_means(observed)
    realizer = Realizer(
        func,
        layers,
        acts,
        options,
        pair_limit=target.int8_pair_limit(),
        means=means,
        saturating=target.converts_saturating,
        fixed_point=target.requantizes_fixed_point,
    )
    qfunc = realizer.run()
    report(0.6)
    pairs, fixed = target.int8_pair_limit(), target.requantizes_fixed_point
    errs = layer_errors(observed, acts, options, samples[0], pairs, means, fixed) if errors else None
    report(1.0)
    return Quantized(
        integer_layout(with_main(observed.module, qfunc)),
        realizer.report,
        [layer for layer in layers if not layer.quantized],
        stats,
        options,
        errs,
        variant=f"int{options.bits}",
        origin=realizer.origin,
    )


def channel_means(observed: Observed) -> dict:
    """Each quantized layer's float input -> its mean per input channel over the calibration runs (axis
    1 of a conv2d's NCHW input, the last of a matmul's), for the bias correction."""
    means = {}
    for layer in observed.layers:
        arrays = observed.float_of.get(layer.data)
        if arrays is None or not layer.quantized:
            continue
        axis = 1 if layer.kind == "conv2d" else arrays[0].ndim - 1
        means[layer.data] = np.mean(
            [np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1).mean(axis=1) for a in arrays], axis=0
        )
    return means


def layer_errors(
    observed: Observed,
    acts: dict,
    options: JobOptions,
    sample: dict[str, np.ndarray],
    pair_limit: int | None = None,
    means: dict | None = None,
    fixed_point: bool = False,
) -> list[dict]:
    """Each quantized layer's result in the integer model (scaled back to float) against the float
    model's, on one input: the error as it accumulates layer after layer (the target's arithmetic,
    run here); and its input's (input_sqnr_db)."""
    from webapp.pipeline.stages.bench import run_all
    from webapp.pipeline.stages.build import compile_relax
    from webapp.pipeline.stages.fidelity import fidelity

    func, layers, float_of = observed.func, observed.layers, observed.float_of
    exposed = Realizer(
        func, layers, acts, options, expose=True, pair_limit=pair_limit, means=means, fixed_point=fixed_point
    )
    executable, _ = compile_relax(with_main(observed.module, exposed.run()), host())
    outs = run_all(executable, [sample])[0]
    n = len(exposed.report)
    ours, inputs = outs[len(outs) - 2 * n : len(outs) - n], outs[len(outs) - n :]
    return [
        {
            "layer": r.layer.name,
            "vars": [v.name for v in (r.layer.head, *r.layer.absorbed)],  # its bindings in the float model
            **fidelity([q], [float_of[r.layer.out][0]], classifier=False),
            # its input's, as the integer model computes it: what the layer adds is the difference
            "input_sqnr_db": fidelity([x], [float_of[r.layer.data][0]], classifier=False)["sqnr_db"],
        }
        for r, q, x in zip(exposed.report, ours, inputs, strict=True)
    ]


__all__ = ["Quantized", "Observed", "observe", "quantize", "TensorStats"]
