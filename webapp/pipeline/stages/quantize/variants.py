"""The quantize stage of a job: which quantized builds it asks for (one, or a sweep of bit-widths
and calibration modes), their calibration inputs, and each variant quantized from one shared float
run. In a sweep a variant that fails is recorded with its stage and message; the others go on."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from webapp.catalog import CALIBRATION_MODES, code_file
from webapp.options import JobOptions
from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.stages.quantize import Observed, Quantized, observe, quantize
from webapp.pipeline.stages.quantize.scales import pack_bits

if TYPE_CHECKING:
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.targets import Target


@dataclass
class QuantizedJob:
    variants: list[Quantized]  # the first is the one the page shows and model.so holds
    sweep: bool
    failed: list[dict] = field(default_factory=list)  # {"variant", "stage", "message"}
    # what quantize_variant was given besides a variant's name and options, for without()
    inputs: tuple = ()  # (job_dir, target, samples, source, observed)

    def fail(self, variant: str, stage: str, exc: BaseException) -> None:
        """A sweep goes on without a variant that failed (it is listed with why); a single
        quantized job fails."""
        if not self.sweep:
            raise exc
        traceback.print_exc()
        self.variants = [q for q in self.variants if q.variant != variant]
        self.failed.append({"variant": variant, "stage": stage, "message": error_message(exc)})

    def without(self, q: Quantized, layers: set[str], errors: bool = True) -> Quantized:
        """The variant q quantized again with `layers` (their names) kept in float, not yet saved
        (stages.fallback: the layers int8 made slower); without its per-layer errors if `errors` is
        false."""
        return self.again(q, layers, errors)

    def complete_errors(self) -> None:
        """The per-layer errors of each variant quantized without them: a single variant's, left out by
        quantize_job, computed once the build stage has chosen it (the variant as quantized, or again
        with its slower layers in float: stages.fallback), so that they are computed once a job."""
        for q in self.variants:
            if q.errors is None:
                q.errors = self.again(q, {layer.name for layer in q.skipped}, True).errors

    def again(self, q: Quantized, floated: set[str], errors: bool) -> Quantized:
        job_dir, target, samples, source, observed = self.inputs
        was = [layer.quantized for layer in observed.layers]
        for layer in observed.layers:
            layer.quantized = layer.quantized and layer.name not in floated
        try:
            return quantize_variant(
                job_dir, target, q.variant, q.options, samples, source, observed, save=False, errors=errors
            )
        finally:
            for layer, quantized in zip(observed.layers, was, strict=True):
                layer.quantized = quantized

    def run_here(self, q: Quantized | None, samples: list[dict[str, np.ndarray]]) -> list[list]:
        """q's integer model (the float model for None) compiled for this server's CPU and run on each
        sample: the target's integer arithmetic as layer_errors runs it (a board's points are compared
        so: stages.precision)."""
        from webapp.pipeline.stages.bench import run_all
        from webapp.pipeline.stages.build import compile_relax
        from webapp.targets import host

        mod = q.mod if q is not None else self.inputs[4].module
        return run_all(compile_relax(mod, host())[0], samples)

    def replace(self, old: Quantized, new: Quantized) -> None:
        """`new` in the place of `old` (the variant with layers kept in float), saved as old was."""
        self.variants[self.variants.index(old)] = new
        save_weights(self.inputs[0], new)
        self.write_view()

    def write_view(self) -> None:
        """The code view of the first variant's integer model (Relax, before legalization)."""
        (self.inputs[0] / code_file("relax-quantized")).write_text(self.variants[0].mod.script())

    def to_json(self) -> dict:
        out = {"quantization": self.variants[0].to_json()}
        if self.sweep:
            rows = [
                {"variant": q.variant, "bits": q.options.bits, "calibration": q.options.calibration}
                | {"mode": q.mode, "status": "done", "weights_bytes": q.packed_bytes}
                for q in self.variants
            ]
            out["sweep"] = {"variants": rows, "failed": self.failed}
        return out


def variant_options(options: JobOptions) -> list[tuple[str, JobOptions]]:
    """(name, options) of each quantized build the job asks for: one, or for a sweep int8, int4, int2
    and int1 with the job's calibration, then int8 with each other calibration mode."""
    if options.quantize != "sweep":
        return [(options.quantize, options)]
    variants = [(f"int{b}", replace(options, quantize=f"int{b}")) for b in (8, 4, 2, 1)]
    others = [c for c in CALIBRATION_MODES if c != options.calibration]
    return variants + [(f"int8 {c}", replace(options, quantize="int8", calibration=c)) for c in others]


def calibration_samples(
    model: ImportedModel, calibration_data: Path | None, dataset: str | None
) -> tuple[list[dict[str, np.ndarray]], str]:
    """The calibration inputs and where they came from: the user's .npz, the example's training
    images, or random inputs of the model's shapes."""
    from webapp.pipeline.stages.bench import make_inputs
    from webapp.pipeline.stages.quantize.calibrate import samples_from_npz

    if calibration_data is not None:
        return samples_from_npz(calibration_data, model.inputs), "uploaded .npz"
    if dataset:
        from webapp.pipeline.datasets import load

        images = load(dataset)[0][:64]
        return [{model.inputs[0].name: x[None]} for x in images], f"{dataset} training images"
    return [make_inputs(model.inputs, seed=1 + i) for i in range(8)], "random inputs"


def quantize_job(
    model: ImportedModel,
    target: Target,
    options: JobOptions,
    job_dir: Path,
    calibration_data: Path | None,
    dataset: str | None,
    report: Report,
) -> QuantizedJob:
    pre = (model.prequantized or {}).get("layers") and model.prequantized  # one int8 variant on its scales
    variants = [("int8", replace(options, quantize="int8"))] if pre else variant_options(options)
    samples, source = calibration_samples(model, calibration_data, dataset)
    if pre and pre.get("dynamic"):
        source = (
            f"the model's weight scales (pre-quantized, {pre['form']}); its activations' scales, which it "
            f"computes on each run, calibrated on {source}"
        )
    elif pre:
        source = f"none: the model's own scales (pre-quantized, {pre['form']}); error measured on {source}"
    # The float run, once for all the variants (only its first input when nothing calibrates).
    calibrating = any(o.calibration != "global" for _, o in variants)
    share = 1 / (len(variants) + 1)
    observed = observe(
        model.mod,
        variants[0][1],
        samples if calibrating else samples[:1],
        lambda f: report(f * share),
        pre,
        target.activation_dtype,
    )
    job = QuantizedJob([], options.quantize == "sweep", inputs=(job_dir, target, samples, source, observed))
    for i, (name, opts) in enumerate(variants):
        step = lambda f, i=i: report((i + 1 + f) * share)  # noqa: E731
        try:
            # a sweep's variants with their errors; a single one's once its build is chosen
            job.variants.append(
                quantize_variant(
                    job_dir, target, name, opts, samples, source, observed, step, errors=job.sweep
                )
            )
        except Exception as exc:
            job.fail(name, "quantize", exc)
    if not job.variants:
        raise StageError("Every variant failed: " + "; ".join(f["message"] for f in job.failed))
    job.write_view()
    return job


def quantize_variant(
    job_dir: Path,
    target: Target,
    name: str,
    options: JobOptions,
    samples: list[dict[str, np.ndarray]],
    source: str,
    observed: Observed,
    report: Report = lambda f: None,
    save: bool = True,
    errors: bool = True,
) -> Quantized:
    """One quantized variant of the observed float model; its bit-packed weights are saved unless
    `save` is false, its per-layer errors computed unless `errors` is."""
    if options.calibration == "global":
        source = f"none (one global threshold of {options.global_scale:g})"
    quantized = quantize(None, target, options, samples, report, observed, errors)
    quantized.variant = name
    quantized.calibration = {"source": source, "samples": len(samples)}
    quantized.float_bytes = int(sum(r.weight_q.size * 4 for r in quantized.layers))
    if save:
        save_weights(job_dir, quantized)
    return quantized


def save_weights(job_dir: Path, quantized: Quantized) -> None:
    """files/weights-<variant>.npz: each quantized layer's weights bit-packed."""
    bits = quantized.options.bits
    packed = {r.layer.name: pack_bits(r.weight_q, r.layer.weight_bits or bits) for r in quantized.layers}
    (job_dir / "files").mkdir(exist_ok=True)
    np.savez(job_dir / "files" / f"weights-{quantized.variant.replace(' ', '-')}.npz", **packed)  # type: ignore[arg-type]  # numpy's stub: a ** key might be allow_pickle
    quantized.packed_bytes = int(sum(p.nbytes for p in packed.values()))


def quantizes(ctx: Context, model: ImportedModel) -> bool:
    """Whether the job has a quantize stage: asked for, or a model with scales of its own."""
    return ctx.options.quantize != "none" or bool((model.prequantized or {}).get("layers"))


def quantize_stage(ctx: Context, report: Report, model: ImportedModel) -> Given[QuantizedJob]:
    job = ctx.job
    quantized = quantize_job(
        model, ctx.target, ctx.options, ctx.dir, job.calibration_data, job.dataset, report
    )
    return Given(quantized, quantized.to_json())
