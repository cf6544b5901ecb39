"""Runs a job's stages in order inside the sandbox, recording each stage's status, seconds and
progress in progress.json and the results so far in result.json, both in the job folder.

The stages themselves know nothing of timing, progress files or error reporting: that is here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path

from webapp.catalog import STAGES
from webapp.pipeline.errors import StageError


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


class Progress:
    """progress.json: the stages' live status, as the job page shows it."""

    def __init__(self, job_dir: Path, stages: tuple[str, ...]):
        self.path = job_dir / "progress.json"
        self.stages = [{"name": s, "status": "pending", "seconds": None, "progress": None} for s in stages]
        self.error = None
        self.started = 0.0
        self.last_write = 0.0
        self.lock = threading.Lock()  # a stage may report from a helper thread (tune.watch_dispatch)
        self.write()

    def stage(self, name: str) -> dict:
        return next(s for s in self.stages if s["name"] == name)

    def write(self) -> None:
        with self.lock:
            write_json_atomic(self.path, {"stages": self.stages, "error": self.error})
            self.last_write = time.monotonic()

    def start(self, name: str) -> None:
        self.started = time.monotonic()
        self.stage(name).update(status="running", progress=0.0)
        self.write()

    def report(self, name: str, fraction: float, detail: dict | None = None) -> None:
        self.stage(name).update(
            progress=round(min(max(fraction, 0.0), 1.0), 3), seconds=round(time.monotonic() - self.started, 2)
        )
        if detail is not None:
            self.stage(name)["detail"] = detail
        if detail is not None or time.monotonic() - self.last_write > 0.5:
            self.write()

    def skip(self, name: str) -> None:
        self.stage(name).update(status="skipped")
        self.write()

    def finish(self, name: str, status: str = "done", error: str | None = None) -> None:
        self.stage(name).update(
            status=status,
            seconds=round(time.monotonic() - self.started, 2),
            progress=1.0 if status == "done" else self.stage(name)["progress"],
        )
        if error is not None:
            self.error = {"stage": name, "message": error}
        self.write()


def error_message(exc: BaseException) -> str:
    """A short message for an unexpected error: its type and first lines, never a traceback."""
    if isinstance(exc, StageError):
        return str(exc)
    if isinstance(exc, MemoryError) or "bad_alloc" in str(exc) or "Cannot allocate memory" in str(exc):
        limit = os.environ.get("PLAYGROUND_MEMORY_LIMIT_MB")
        return f"Out of memory: the job reached its memory limit ({limit} MB)." if limit else "Out of memory."
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith(("  File", "Traceback"))]
    text = " ".join(lines[:6])
    return f"{type(exc).__name__}: {text[:1500]}" if text else type(exc).__name__


def run_stage(progress: Progress, name: str, fn):
    progress.start(name)
    try:
        out = fn(lambda fraction, detail=None: progress.report(name, fraction, detail))
    except BaseException as exc:
        traceback.print_exc()
        progress.finish(name, "failed", error_message(exc))
        raise SystemExit(1) from None
    progress.finish(name)
    return out


def run(job_dir: Path) -> None:
    job = json.loads((job_dir / "job.json").read_text())
    progress = Progress(job_dir, STAGES)
    results: dict = {}

    def save(update: dict) -> None:
        results.update(update)
        write_json_atomic(job_dir / "result.json", results)

    # Imported here so that a broken TVM install still gives a clean "import" stage failure.
    def do_import(report):
        from webapp.pipeline.importers import import_model

        model = import_model(job_dir / job["model"], job.get("input_shapes") or {})
        (job_dir / "views").mkdir(exist_ok=True)
        (job_dir / "views" / "imported.py").write_text(model.mod.script())
        return model

    model = run_stage(progress, "import", do_import)
    save(
        {
            "model": {
                "framework": model.framework,
                "inputs": [s.to_json() for s in model.inputs],
                "outputs": [s.to_json() for s in model.outputs],
                "param_count": model.param_count,
                "framework_ops": model.framework_ops,
            }
        }
    )

    from webapp.pipeline.targets import make_target, target_json

    target = make_target(job["target"])
    save({"target": {"preset": job["target"], "tvm": target_json(target)}})

    from webapp.pipeline.optimize import optimize

    optimized = run_stage(progress, "optimize", lambda report: optimize(model.mod, target, job_dir, report))
    save({"passes": [vars(p) for p in optimized.passes]})

    dataset = job.get("dataset")
    quantized, failed_variants = [], []  # what quantized, and (in a sweep) what failed, where and why
    sweep = job.get("quantize") == "sweep"
    if job.get("quantize", "none") != "none":

        def do_quantize_all(report):
            from webapp.pipeline.quantize import observe

            variants = quant_variants(job)
            samples, source = calibration_samples(job, job_dir, model)
            # The float run, once for all the variants (only its first input when nothing calibrates)
            calibrating = any(options.calibration != "global" for _, options in variants)
            share = 1 / (len(variants) + 1)
            observed = observe(
                model.mod,
                variants[0][1],
                samples if calibrating else samples[:1],
                lambda f: report(f * share),
            )
            for i, (name, options) in enumerate(variants):
                step = lambda f, i=i: report((i + 1 + f) * share)  # noqa: E731
                try:
                    quantized.append(
                        do_quantize(job_dir, target, name, options, samples, source, observed, step)
                    )
                except Exception as exc:
                    if not sweep:
                        raise
                    traceback.print_exc()
                    failed_variants.append(
                        {"variant": name, "stage": "quantize", "message": error_message(exc)}
                    )
            if not quantized:
                raise StageError("Every variant failed: " + "; ".join(f["message"] for f in failed_variants))
            (job_dir / "views" / "quantized.py").write_text(quantized[0].mod.script())

        run_stage(progress, "quantize", do_quantize_all)
        save({"quantization": quantized[0].to_json()})
    else:
        progress.skip("quantize")

    tuning_dir = job_dir / "tuning"
    trials = int(job.get("tune_trials") or 0)
    records = tuning_dir / "database_tuning_record.json"
    if trials > 0 or (records.is_file() and records.stat().st_size > 0):
        from webapp.pipeline.tune import tune

        tuned = run_stage(
            progress,
            "tune",
            lambda report: tune(
                optimized.fused, target, tuning_dir, trials, report, lambda: (job_dir / "cancel").exists()
            ),
        )
        save({"tuning": tuned.to_json()})
    else:
        progress.skip("tune")

    from webapp.pipeline.build import build, fuse, kernel_seconds, record_choice, schedule

    def do_build(report):
        """The library to download (tuned kernels where there are records, default rules elsewhere) and
        the module it was built from; with records, also a twin on default rules only for the benchmark."""
        library = job_dir / "files" / "model.so"
        default, default_labels = schedule(optimized.fused, target)
        if "tuning" not in results:
            return {False: build(default, target, library)}, default, default_labels
        tuned, tuned_labels = schedule(optimized.fused, target, tuning_dir)
        if "tuned" not in tuned_labels.values():  # the database has no record for any kernel of this model
            return {False: build(default, target, library)}, default, default_labels
        (job_dir / "files").mkdir(exist_ok=True)
        for name in ("database_workload.json", "database_tuning_record.json"):
            shutil.copyfile(tuning_dir / name, job_dir / "files" / name)
        report(0.3)
        # A record is used only where its kernel beats the default rule's, timed here kernel by kernel.
        default_exe, tuned_exe = build(default, target, None), build(tuned, target, None)
        choice.extend(
            record_choice(
                kernel_seconds(tuned_exe, tuned), kernel_seconds(default_exe, default), tuned_labels
            )
        )
        keep = {c["kernel"] for c in choice if c["used"]}
        report(0.7)
        if not keep:  # every default rule beat its record: the records are not used
            default_exe.export_library(str(library))
            return {False: default_exe}, default, default_labels
        if len(keep) < len(choice):
            tuned, tuned_labels = schedule(optimized.fused, target, tuning_dir, keep_tuned=keep)
            tuned_exe = build(tuned, target, None)
        tuned_exe.export_library(str(library))
        return {True: tuned_exe, False: default_exe}, tuned, tuned_labels

    def do_build_all(report):
        """The float build; with quantization also the integer one, which becomes the library to
        download and the code the page shows (the float library is kept beside it)."""
        built = do_build(report)
        executables = {("fp32", t): ex for t, ex in built[0].items()}
        if not quantized:
            return executables, *built[1:], optimized.fused
        (job_dir / "files" / "model.so").rename(job_dir / "files" / "model-fp32.so")
        shown = None
        for q in list(quantized):
            try:
                fused = fuse(q.mod, target)
                lowered, qlabels = schedule(fused, target)
                library = job_dir / "files" / "model.so" if shown is None else None
                executables[(q.variant, False)] = build(lowered, target, library)
            except Exception as exc:
                if not sweep:
                    raise
                traceback.print_exc()
                quantized.remove(q)
                failed_variants.append(
                    {"variant": q.variant, "stage": "build", "message": error_message(exc)}
                )
                continue
            shown = shown or (lowered, qlabels, fused)
        if shown is None:
            raise StageError(
                "Every variant failed to build: " + "; ".join(f["message"] for f in failed_variants)
            )
        return executables, *shown

    choice: list[dict] = []  # per tuned kernel: its record's time against the default rule's
    executables, shown_module, labels, shown_fused = run_stage(progress, "build", do_build_all)
    if choice:
        save({"record_choice": choice})
    save({"library": {"file": "model.so", "bytes": (job_dir / "files" / "model.so").stat().st_size}})

    from webapp.pipeline.inspect import inspect_build

    if sweep:
        save({"quantization": quantized[0].to_json(), "sweep": sweep_summary(quantized, failed_variants)})
    shown = (
        executables[(quantized[0].variant, False)]
        if quantized
        else executables.get(("fp32", True)) or executables[("fp32", False)]
    )
    save(
        run_stage(
            progress,
            "inspect",
            lambda report: inspect_build(
                model.mod, shown_fused, shown_module, shown, job_dir, labels, report
            ),
        )
    )

    from webapp.pipeline import bench

    references = {k: job_dir / v for k, v in (job.get("references") or {}).items()}
    device = f"{os.uname().machine} CPU ({target.attrs.get('mcpu', 'generic')})"
    inputs = bench.make_inputs(model.inputs)
    if dataset:  # a held-out image, in the range the model was trained and calibrated on
        from webapp.pipeline.datasets import load

        inputs = {model.inputs[0].name: load(dataset)[2][:1]}

    def do_benchmark(report):
        results = bench.benchmark(
            executables, inputs, model.outputs, references, device, job.get("bench_budget_s", 3.0), report
        )
        if dataset:
            results["accuracy"] = bench.accuracy(executables, dataset)
        return results

    save(run_stage(progress, "benchmark", do_benchmark))


def quant_variants(job: dict) -> list:
    """(name, QuantOptions) of each quantized build the job asks for: one, or for a sweep int8, int4,
    int2 and int1 with the job's calibration, then int8 with each other calibration mode."""
    from dataclasses import replace

    from webapp.catalog import CALIBRATION_MODES
    from webapp.pipeline.quantize import QuantOptions

    options = QuantOptions.from_job(job)
    if job["quantize"] != "sweep":
        return [(f"int{options.bits}", options)]
    variants = [(f"int{b}", replace(options, bits=b)) for b in (8, 4, 2, 1)]
    others = [c for c in CALIBRATION_MODES if c != options.calibration]
    return variants + [(f"int8 {c}", replace(options, bits=8, calibration=c)) for c in others]


def sweep_summary(quantized: list, failed: list[dict]) -> dict:
    rows = [
        {"variant": q.variant, "bits": q.options.bits, "calibration": q.options.calibration, "mode": q.mode}
        | {"status": "done", "weights_bytes": q.packed_bytes}
        for q in quantized
    ]
    return {"variants": rows, "failed": failed}


def calibration_samples(job: dict, job_dir: Path, model) -> tuple[list[dict], str]:
    """The calibration inputs and where they came from: the user's .npz, the example's training
    images, or random inputs of the model's shapes."""
    from webapp.pipeline.bench import make_inputs
    from webapp.pipeline.quantize.calibrate import samples_from_npz

    if job.get("calibration_data"):
        return samples_from_npz(job_dir / job["calibration_data"], model.inputs), "uploaded .npz"
    if job.get("dataset"):
        from webapp.pipeline.datasets import load

        images = load(job["dataset"])[0][:64]
        return [{model.inputs[0].name: x[None]} for x in images], f"{job['dataset']} training images"
    return [make_inputs(model.inputs, seed=1 + i) for i in range(8)], "random inputs"


def do_quantize(job_dir: Path, target, name: str, options, samples, source: str, observed, report):
    """One quantized variant (webapp.pipeline.quantize) of the observed float model; its bit-packed
    weights are saved."""
    import numpy as np

    from webapp.pipeline.quantize import quantize
    from webapp.pipeline.quantize.scales import pack_bits

    if options.calibration == "global":
        source = f"none (one global threshold of {options.global_threshold:g})"
    quantized = quantize(None, target, options, samples, report, observed)
    quantized.variant = name
    quantized.calibration = {"source": source, "samples": len(samples)}
    slug = name.replace(" ", "-")
    packed = {r.layer.name: pack_bits(r.weight_q, options.bits) for r in quantized.layers}
    (job_dir / "files").mkdir(exist_ok=True)
    np.savez(job_dir / "files" / f"weights-{slug}.npz", **packed)
    quantized.packed_bytes = int(sum(p.nbytes for p in packed.values()))
    quantized.float_bytes = int(sum(r.weight_q.size * 4 for r in quantized.layers))
    return quantized


if __name__ == "__main__":
    run(Path(sys.argv[1]))
