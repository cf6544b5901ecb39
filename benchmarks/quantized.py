"""fp32 against int8, in TVM and in ONNX Runtime, measured in one run.

TVM: the example through the whole pipeline (sandboxed, as a job runs) with quantize=int8, which
benchmarks its fp32 build (default schedule rules) and its int8 build side by side. ONNX Runtime,
the peer: the same .onnx in fp32, quantized by ONNX Runtime's own static quantizer
(`quantize_static`, QDQ format, uint8 activations x int8 weights per channel, calibrated on the same
8 random inputs TVM calibrates on), and by its dynamic quantizer (`quantize_dynamic`, int8 weights per
channel, activations quantized at run time: what transformers are usually given). Same harness
(webapp/pipeline/stages/bench.py), same thread count, same input. Prints medians, the ratios, and
each TVM build's rate (the model's multiply-adds as 2 ops each, per second) as a share of this
machine's sgemm rate measured in the same run (cpu_models.py).

The ratios hold on a shared machine whose speed changes by the minute: the five runtimes (the job's
fp32 and int8 libraries, loaded here, and ONNX Runtime's three sessions) are timed in turn within one loop
(webapp/pipeline/stages/timing.py). Chaining ratios from two loops, as this script did before,
let a slow spell in one loop move MobileNetV2's int8 ratio from 0.83x to 1.51x between runs: in that 1.51x
run TVM int8 took 2.14 ms and ONNX Runtime int8 2.54 ms.

    .venv/bin/python benchmarks/quantized.py [--models resnet18,resnet50,mobilenet-v2,transformer-block]
        [--json out.json] [--record]

--record appends the run to benchmarks/results/quantized.json (benchmarks/tables.py renders it into
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from cpu_models import sgemm_peak_gflops
from record import keep, script_parser

from webapp.config import Config

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ.setdefault(_var, str(Config.from_env().bench_threads))


def ort_int8(onnx_path: Path, out: Path, specs) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from webapp.pipeline.stages.bench import make_inputs

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([make_inputs(specs, seed=1 + i) for i in range(8)])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(
        str(onnx_path),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return out


def ort_dynamic(onnx_path: Path, out: Path) -> Path:
    """ONNX Runtime's dynamic quantizer: int8 weights, activations quantized per call (MatMulInteger)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(onnx_path), str(out), weight_type=QuantType.QInt8, per_channel=True)
    return out


def measure_model(config: Config, name: str, tmp: Path, target: str = "x86-host") -> dict:
    import tvm

    from webapp.cli import compile_locally
    from webapp.jobs.worker import ensure_example_files
    from webapp.pipeline.stages import bench, timing
    from webapp.pipeline.stages.importers import import_model

    out = tmp / name
    error = compile_locally(config, name, {"target": target, "quantize": "int8"}, out)
    if error:
        raise RuntimeError(f"{name}: failed at {error['stage']}: {error['message']}")
    result = json.loads((out / "result.json").read_text())
    fid = next(f for f in result["fidelity"] if f["variant"] == "int8" and f["reference"] == "tvm fp32")

    _, onnx_path = ensure_example_files(config, name)
    specs = import_model(onnx_path).inputs
    inputs = bench.make_inputs(specs)
    quantized = ort_int8(onnx_path, tmp / f"{name}.int8.onnx", specs)
    dynamic = ort_dynamic(onnx_path, tmp / f"{name}.dynamic.onnx")
    threads = config.bench_threads
    runs, outs = {}, {}
    # The job's two libraries (a built-in example's, compiled in the sandbox) and ONNX Runtime's two
    # sessions, all timed in turn in one loop: each ratio below compares runtimes timed together.
    for variant, library in (("tvm fp32", "model-fp32.so"), ("tvm int8", "model.so")):
        runs[variant] = bench.tvm_runner(tvm.runtime.load_module(str(out / "files" / library)), inputs)
        runs[variant]()
    for variant, path in (("ort fp32", onnx_path), ("ort int8", quantized), ("ort dynamic", dynamic)):
        runs[variant] = bench.onnxruntime_runner(path, inputs, threads)
        outs[variant] = bench.flatten_outputs(runs[variant]())
    ms = {
        variant: t["median_ms"]
        for variant, t in timing.measure_interleaved(runs, config.bench_budget_s).items()
    }
    ort_fid = bench.fidelity(outs["ort int8"], outs["ort fp32"], classifier=False)
    dynamic_fid = bench.fidelity(outs["ort dynamic"], outs["ort fp32"], classifier=False)
    return {
        "model": name,
        "target": target,
        "threads": threads,
        "tvm_fp32_ms": ms["tvm fp32"],
        "tvm_int8_ms": ms["tvm int8"],
        "ort_fp32_ms": ms["ort fp32"],
        "ort_int8_ms": ms["ort int8"],
        "ort_dynamic_ms": ms["ort dynamic"],
        "tvm_ort_fp32": ms["tvm fp32"] / ms["ort fp32"],
        "tvm_ort_int8": ms["tvm int8"] / ms["ort int8"],
        "tvm_ort_dynamic": ms["tvm int8"] / ms["ort dynamic"],
        "tvm_int8_sqnr_db": fid["sqnr_db"],
        "ort_int8_sqnr_db": ort_fid["sqnr_db"],
        "ort_dynamic_sqnr_db": dynamic_fid["sqnr_db"],
        "vpdpbusd": result.get("instructions", {}).get("vpdpbusd", 0),
        "gflop": result.get("model_flop", 0) / 1e9,
    }


def main() -> int:
    parser = script_parser(__doc__, "quantized")
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet-v2,transformer-block")
    parser.add_argument(
        "--target", default="x86-host", help="the x86 preset TVM builds for (its code must run on this CPU)"
    )
    parser.add_argument("--budget", type=float, default=5.0, help="timing seconds per runtime and model")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(bench_budget_s=args.budget, data_dir=Path(tmp) / "data")
        peak = sgemm_peak_gflops(config.bench_threads)
        print(
            f"{config.bench_threads} threads; medians in ms; SQNR of int8 against the same runtime's fp32; "
            f"% peak: of the sgemm reference, {peak:.1f} GFLOP/s measured now"
        )
        print(
            f"{'model':<18} {'TVM fp32':>9} {'TVM int8':>9} {'speedup':>8} {'ORT fp32':>9} {'ORT int8':>9} "
            f"{'speedup':>8} {'ORT dyn':>9} {'TVM/ORT fp32':>12} {'TVM/ORT int8':>12} {'TVM/ORT dyn':>11} "
            f"{'SQNR TVM':>9} {'SQNR ORT':>9} {'SQNR dyn':>9} "
            f"{'fp32 %peak':>10} {'int8 %peak':>10}"
        )
        for name in args.models.split(","):
            r = measure_model(config, name, Path(tmp), args.target)
            for key in ("tvm_fp32", "tvm_int8"):
                r[f"{key}_peak_pct"] = 100 * r["gflop"] / (r[f"{key}_ms"] / 1e3) / peak
            rows.append(r)
            print(
                f"{name:<18} {r['tvm_fp32_ms']:9.3f} {r['tvm_int8_ms']:9.3f} "
                f"{r['tvm_fp32_ms'] / r['tvm_int8_ms']:7.2f}x "
                f"{r['ort_fp32_ms']:9.3f} {r['ort_int8_ms']:9.3f} "
                f"{r['ort_fp32_ms'] / r['ort_int8_ms']:7.2f}x {r['ort_dynamic_ms']:9.3f} "
                f"{r['tvm_ort_fp32']:11.2f}x {r['tvm_ort_int8']:11.2f}x {r['tvm_ort_dynamic']:10.2f}x "
                f"{r['tvm_int8_sqnr_db']:8.1f} {r['ort_int8_sqnr_db']:8.1f} {r['ort_dynamic_sqnr_db']:8.1f} "
                f"{r['tvm_fp32_peak_pct']:9.1f}% {r['tvm_int8_peak_pct']:9.1f}%",
                flush=True,
            )
    about = {"budget_s": args.budget, "target": args.target, "sgemm_peak_gflops": peak}
    keep(args, "quantized", config.bench_threads, rows, **about)
    return 0


if __name__ == "__main__":
    sys.exit(main())
