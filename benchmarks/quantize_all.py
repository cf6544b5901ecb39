"""What compiles, quantizes: every model of the onnx package's light test data (AlexNet, DenseNet-121,
Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512) and the built-in examples,
quantized to int8 and built for each target; where the code runs here, the int8 build's output
against the fp32 build's on the same random input (SQNR, dB). A model whose int8 build fails, or
whose SQNR is under 25 dB, is listed with the reason. The light models' weights are synthetic
(their outputs nearly constant), so for them this checks that quantization and the build work; the
examples' SQNR is the meaningful one.

    PYTHONPATH=. .venv/bin/python benchmarks/quantize_all.py [--targets x86-host,rpi5]
        [--models squeezenet,mlp]

tests/test_quantize_everything.py runs a few of them (what fits in make test)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

MIN_SQNR_DB = 25.0
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_models() -> dict[str, Path]:
    return {p.stem.removeprefix("light_"): p for p in sorted(LIGHT.glob("light_*.onnx"))}


def int8_against_fp32(path: Path, preset: str, work: Path) -> dict:
    """The model quantized to int8 and built (fp32 and int8) for `preset`, in this process; where its
    code runs here, both run on one random input and the int8 output's SQNR against fp32 is given."""
    from webapp.options import JobOptions
    from webapp.pipeline.stages import bench
    from webapp.pipeline.stages.build import build_job
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.optimize import optimize
    from webapp.pipeline.stages.quantize.variants import quantize_job
    from webapp.targets import get

    started, target = time.monotonic(), get(preset)
    model = import_model(path)
    (work / "files").mkdir(parents=True, exist_ok=True)
    optimized = optimize(model.mod, target, work)
    quantized = quantize_job(model, target, JobOptions(quantize="int8"), work, None, None, lambda f: None)
    built = build_job(optimized.fused, quantized, target, None, work, lambda f: None, model.layers)
    q = quantized.variants[0]
    row = {
        "model": path.stem.removeprefix("light_"),
        "target": preset,
        "int8_layers": len(q.layers),
        "float_layers": len(q.skipped),
        "failed": quantized.failed,
        "sqnr_db": None,
    }
    if target.can_run_here and not quantized.failed:
        inputs = bench.make_inputs(model.inputs)
        outs = {
            variant: bench.flatten_outputs(bench.tvm_runner(ex, inputs)())
            for (variant, _), ex in built.executables.items()
        }
        sqnr = bench.fidelity(outs["int8"], outs["fp32"], False)["sqnr_db"]
        row["sqnr_db"] = float("inf") if sqnr is None else sqnr  # None: no noise at all
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def verdict(row: dict) -> str:
    if row["failed"]:
        return "FAILED: " + "; ".join(f"{f['stage']}: {f['message']}" for f in row["failed"])
    if row["sqnr_db"] is None:
        return "built (not run here)"
    return "ok" if row["sqnr_db"] >= MIN_SQNR_DB else f"LOSS: SQNR {row['sqnr_db']:.1f} dB < {MIN_SQNR_DB:g}"


def main() -> int:
    from webapp.catalog import EXAMPLES
    from webapp.config import Config
    from webapp.jobs.worker import ensure_example_files

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", default="x86-host,rpi5")
    parser.add_argument("--models", default="", help="light model or example names (default: all)")
    args = parser.parse_args()
    config = Config.from_env()
    models = light_models()
    for name in EXAMPLES:  # an example of a light model's name (resnet50) comes in its own row
        ensure_example_files(config, name)
        models[f"{name} (example)" if name in models else name] = config.examples_dir / f"{name}.onnx"
    chosen = args.models.split(",") if args.models else list(models)
    bad = 0
    print(f"{'model':<18} {'target':<9} {'int8 layers':>11} {'SQNR dB':>8} {'s':>6}  verdict")
    for name in chosen:
        for preset in args.targets.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    row = int8_against_fp32(models[name], preset, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - a failure is this script's finding
                    row = {
                        "model": name,
                        "target": preset,
                        "int8_layers": 0,
                        "sqnr_db": None,
                        "seconds": 0,
                        "failed": [
                            {"stage": "quantize or build", "message": f"{type(exc).__name__}: {exc}"[:300]}
                        ],
                    }
            sqnr = "-" if row["sqnr_db"] is None else f"{row['sqnr_db']:.1f}"
            sizes = f"{row['int8_layers']:>11} {sqnr:>8} {row['seconds']:>6}"
            print(f"{name:<18} {preset:<9} {sizes}  {verdict(row)}")
            bad += not verdict(row).startswith(("ok", "built"))
            sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
