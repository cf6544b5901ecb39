"""TVM against ONNX Runtime on the emulated Raspberry Pi boards, fp32 and int8, measured in one run.

For each model and board (rpi4: QEMU cortex-a72, NEON only; rpi5: QEMU cortex-a76, NEON and sdot;
graviton3, with --boards: QEMU's max core for a Neoverse V1, NEON, sdot and i8mm's smmla):
- TVM: one job through the whole pipeline (sandboxed, as a job runs) with target=<board> and
  quantize=int8, on a device pool this script starts on a free port: the job times its fp32 and its
  int8 build on the same emulated board in one session. The count of the instruction its int8
  kernels multiply with (sdot on rpi5, smull on rpi4, smmla on graviton3) is that of the job's assembly.
- ONNX Runtime, the peer: its aarch64 wheel in the same arm64 root file system (the "onnxruntime"
  extra of webapp/devices/rootfs.py), under the same qemu-aarch64 with the same QEMU_CPU and the same
  thread count, timed the way the board times TVM (a warm-up, then max(3, budget / first) runs, at
  most 50). fp32 is the example's .onnx; int8 is ONNX Runtime's own static quantizer run here
  (`quantize_static`: QDQ, uint8 activations x int8 weights per channel, calibrated on 8 random
  inputs, or on the dataset's training images for an example that has one).

The ONNX Runtime runs are not jailed: they run only our own example models, which are trusted.
bubblewrap is used for one thing there: qemu-aarch64 7.2 passes the host's x86 /proc/cpuinfo to the
emulated program, and the cpuinfo library inside onnxruntime then crashes while it imports (SIGSEGV),
so a /proc/cpuinfo of the board's core is bound over it.

All figures are emulated (QEMU on this host's CPU): use them for ratios measured in the same run, not
as predictions of a real Pi.

    .venv/bin/python benchmarks/pi.py [--models mlp,cnn-small] [--boards rpi4,rpi5] [--threads 2]
        [--budget 3] [--rootfs PATH] [--out benchmarks/pi.json] [--record]

--record also appends the run to benchmarks/results/pi.json (benchmarks/tables.py renders it into
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from record import host_cpu, record_run

from webapp.catalog import EXAMPLES
from webapp.cli import compile_locally
from webapp.config import Config
from webapp.devices.pool import start_pool, stop_processes
from webapp.devices.rootfs import LIBRARY_PATH, ensure_rootfs
from webapp.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
MODELS = "mlp,cnn-small,mobilenet-v2,resnet18,resnet50"
# /proc/cpuinfo of the boards' cores as a Pi reports them: (variant, part, revision, features).
CPUINFO = {
    "cortex-a72": ("0x0", "0xd08", "3", "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": (
        "0x4",
        "0xd0b",
        "1",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp",
    ),
    # graviton3's board: QEMU's max core, reported as the Neoverse V1 it stands for (i8mm, sve)
    "max": (
        "0x1",
        "0xd40",
        "1",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
        "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs dcpodp svei8mm svebf16 "
        "i8mm bf16 dgh rng",
    ),
}
BOARDS = [name for name, t in TARGETS.items() if t.board]  # rpi4, rpi5, graviton3

# Run by the root file system's Python under qemu-aarch64: times one .onnx, prints JSON.
ORT_SCRIPT = """
import json, sys, time
import numpy as np
import onnxruntime as ort

model, inputs, threads, budget, out = sys.argv[1:6]
options = ort.SessionOptions()
options.intra_op_num_threads = int(threads)
options.inter_op_num_threads = 1
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
with np.load(inputs) as data:
    feed = {i.name: data[f"arr_{k}"] for k, i in enumerate(session.get_inputs())}
t0 = time.perf_counter()
np.savez(out, *session.run(None, feed))
first = time.perf_counter() - t0
runs = int(max(3, min(50, float(budget) / max(first, 1e-6))))
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    session.run(None, feed)
    times.append((time.perf_counter() - t0) * 1e3)
times.sort()
print(json.dumps({"median_ms": float(np.median(times)), "p90_ms": float(np.percentile(times, 90)),
                  "min_ms": times[0], "runs": runs, "version": ort.__version__}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_version() -> str:
    out = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "unknown"


# ---------------------------------------------------------------- the device pool


# ---------------------------------------------------------------- TVM: a job on the board


def tvm_on_board(config: Config, name: str, board: str, out: Path) -> dict:
    error = compile_locally(config, name, {"target": board, "quantize": "int8"}, out)
    if error:
        raise RuntimeError(f"TVM {name} on {board}: failed at {error['stage']}: {error['message']}")
    result = json.loads((out / "result.json").read_text())
    rows = {b["variant"]: b for b in result["benchmarks"] if b["runtime"] == "tvm" and not b["tuned"]}
    fid = {(f["variant"], f["reference"]): f for f in result["fidelity"] if not f["tuned"]}
    sqnr = fid.get(("int8", f"TVM fp32 on {board}"), {}).get("sqnr_db")
    fp32_err = max((f.get("max_abs_err", 0.0) for (v, _), f in fid.items() if v == "fp32"), default=None)
    return {
        "device": result["device"]["name"],
        "tvm_fp32_ms": rows["fp32"]["median_ms"],
        "tvm_int8_ms": rows["int8"]["median_ms"],
        "tvm_runs": {v: r["runs"] for v, r in rows.items()},
        # what the int8 kernels multiply with on the board (sdot; smull on a Pi 4), in the assembly
        "int8_mnemonic": TARGETS[board].int8_mnemonic(),
        "int8_instructions": result.get("instructions", {}).get(TARGETS[board].int8_mnemonic(), 0),
        "tvm_fp32_max_abs_err": fp32_err,  # against PyTorch and ONNX Runtime on this host
        "tvm_int8_sqnr_db": sqnr,  # against TVM fp32 on the same board
        "layers": layer_split(result.get("quantization", {}).get("layer_speed") or {}),
    }


def layer_split(speed: dict) -> dict:
    """Where the quantized layers' time goes on the board (each kernel timed alone there: the job's
    quantization.layer_speed), by layer form: layers, fp32 and int8 ms, and how many int8 made slower."""
    split: dict = {}
    for row in speed.get("layers", []):
        form = split.setdefault(row["form"], {"layers": 0, "fp32_ms": 0.0, "int8_ms": 0.0, "slower": 0})
        form["layers"] += 1
        form["fp32_ms"] += row["fp32_ms"]
        form["int8_ms"] += row["quant_ms"]
        form["slower"] += row["ratio"] is not None and row["ratio"] > speed["slower_by"]
    return split


# ---------------------------------------------------------------- ONNX Runtime on the emulated board


def ort_int8(onnx_path: Path, out: Path, specs, dataset: str | None) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from webapp.pipeline.stages.bench import make_inputs

    if dataset:
        from webapp.pipeline.datasets import load

        images = load(dataset)[0][:8]
        samples = [{specs[0].name: images[i : i + 1]} for i in range(len(images))]
    else:
        samples = [make_inputs(specs, seed=1 + i) for i in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter(samples)

        def get_next(self):
            return next(self.samples, None)

    logging.disable(logging.WARNING)  # its advice to pre-process the model, printed each time
    try:
        quantize_static(
            str(onnx_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
        )  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    return out


def fake_cpuinfo(core: str, folder: Path) -> Path:
    variant, part, revision, features = CPUINFO[core]
    entry = (
        f"BogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
        f"CPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: {revision}\n\n"
    )
    path = folder / f"cpuinfo-{core}"
    path.write_text("".join(f"processor\t: {i}\n{entry}" for i in range(os.cpu_count() or 1)))
    return path


def ort_on_board(rootfs: Path, core: str, model: Path, inputs: Path, threads: int, budget: float, tmp: Path):
    """(timing, outputs) of ONNX Runtime running `model` under qemu-aarch64 as the board's core."""
    script, out = tmp / "ort_time.py", tmp / f"ort-out-{core}-{model.stem}.npz"
    script.write_text(ORT_SCRIPT)
    env = os.environ | {"QEMU_CPU": core, "LD_LIBRARY_PATH": LIBRARY_PATH, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(fake_cpuinfo(core, tmp)), "/proc/cpuinfo"]
    cmd += ["--die-with-parent", "qemu-aarch64-static", "-L", str(rootfs), str(rootfs / "usr/bin/python3.11")]
    cmd += [str(script), str(model), str(inputs), str(threads), str(budget), str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(
            f"ONNX Runtime on QEMU {core} failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}"
        )
    with np.load(out) as data:
        outputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    return json.loads(r.stdout.strip().splitlines()[-1]), outputs


# ---------------------------------------------------------------- the run


def measure(config: Config, names: list[str], boards: list[str], tmp: Path, log) -> list[dict]:
    """A row per model and board; one that fails records its error and the run goes on."""
    rows = []
    for name in names:
        model = None
        for board in boards:
            row = {"model": name, "board": board, "core": TARGETS[board].core}
            row["threads"] = config.bench_threads
            try:
                model = model or prepare_model(config, name, tmp, log)
                row |= measure_one(config, name, board, model, tmp, log)
            except Exception as exc:
                log(f"{name} on {board}: FAILED: {exc}")
                row["error"] = f"{type(exc).__name__}: {str(exc)[:1000]}"
            rows.append(row)
    return rows


def prepare_model(config: Config, name: str, tmp: Path, log) -> dict:
    """The example's .onnx, ONNX Runtime's int8 of it, the inputs, and ONNX Runtime's fp32 outputs here."""
    from webapp.jobs.worker import ensure_example_files
    from webapp.pipeline.stages import bench
    from webapp.pipeline.stages.importers import import_model

    _, onnx_path = ensure_example_files(config, name)
    specs = import_model(onnx_path).inputs
    inputs = bench.make_inputs(specs)
    np.savez(tmp / f"{name}.inputs.npz", *inputs.values())
    log(f"{name}: quantizing with ONNX Runtime's quantize_static (host)")
    return {
        "fp32": onnx_path,
        "int8": ort_int8(onnx_path, tmp / f"{name}.int8.onnx", specs, EXAMPLES[name].dataset),
        "inputs": tmp / f"{name}.inputs.npz",
        "host_fp32": bench.flatten_outputs(
            bench.onnxruntime_runner(onnx_path, inputs, config.bench_threads)()
        ),
    }


def measure_one(config: Config, name: str, board: str, model: dict, tmp: Path, log) -> dict:
    from webapp.pipeline.stages.bench import fidelity

    core = TARGETS[board].core
    log(f"{name} on {board}: TVM job (fp32 and int8 on the emulated board)")
    row = tvm_on_board(config, name, board, tmp / f"job-{name}-{board}")
    ort, outs = {}, {}
    for variant in ("fp32", "int8"):
        log(f"{name} on {board}: ONNX Runtime {variant} under QEMU {core}")
        ort[variant], outs[variant] = ort_on_board(
            config.rootfs,
            core,
            model[variant],
            model["inputs"],
            config.bench_threads,
            config.bench_budget_s,
            tmp,
        )
    row |= {
        "ort_version": ort["fp32"]["version"],
        "ort_fp32_ms": ort["fp32"]["median_ms"],
        "ort_int8_ms": ort["int8"]["median_ms"],
        "ort_runs": {v: t["runs"] for v, t in ort.items()},
        "ort_fp32_max_abs_err": fidelity(outs["fp32"], model["host_fp32"], False)["max_abs_err"],
        "ort_int8_sqnr_db": fidelity(outs["int8"], outs["fp32"], False)["sqnr_db"],
    }
    row["tvm_int8_speedup"] = row["tvm_fp32_ms"] / row["tvm_int8_ms"]
    row["ort_int8_speedup"] = row["ort_fp32_ms"] / row["ort_int8_ms"]
    row["tvm_over_ort_fp32"] = row["tvm_fp32_ms"] / row["ort_fp32_ms"]
    row["tvm_over_ort_int8"] = row["tvm_int8_ms"] / row["ort_int8_ms"]
    return row


def print_tables(rows: list[dict], boards: list[str]) -> None:
    def db(x):
        return f"{x:8.1f}" if x is not None else f"{'-':>8}"

    for board in boards:
        mine = [r for r in rows if r["board"] == board]
        if not mine:
            continue
        print(f"\n{board}: emulated (QEMU {mine[0]['core']}), {mine[0]['threads']} threads; medians in ms")
        print(
            f"{'model':<14} {'TVM fp32':>10} {'TVM int8':>10} {'int8 x':>7} {'int8 op':>11} {'ORT fp32':>10} "
            f"{'ORT int8':>10} {'int8 x':>7} {'TVM/ORT fp32':>12} {'TVM/ORT int8':>12} "
            f"{'SQNR TVM':>8} {'SQNR ORT':>8}"
        )
        for r in mine:
            if "error" in r:
                print(f"{r['model']:<14} failed: {r['error'][:300]}")
                continue
            print(
                f"{r['model']:<14} {r['tvm_fp32_ms']:10.2f} {r['tvm_int8_ms']:10.2f} "
                f"{r['tvm_int8_speedup']:6.2f}x {r['int8_instructions']:5d} {r['int8_mnemonic']:<5} "
                f"{r['ort_fp32_ms']:10.2f} "
                f"{r['ort_int8_ms']:10.2f} {r['ort_int8_speedup']:6.2f}x {r['tvm_over_ort_fp32']:11.2f}x "
                f"{r['tvm_over_ort_int8']:11.2f}x {db(r['tvm_int8_sqnr_db'])} {db(r['ort_int8_sqnr_db'])}"
            )
    print(
        "\nint8 x: fp32 time / int8 time of the same runtime. TVM/ORT: TVM's time / ONNX Runtime's "
        "(below 1: TVM faster). SQNR (dB): int8 outputs against the same runtime's fp32 on the board."
    )
    print("\nTVM's quantized layers by form, each kernel timed alone on the board (ms, fp32 -> int8):")
    for r in rows:
        for form, f in sorted((r.get("layers") or {}).items()):
            print(
                f"  {r['board']:<9} {r['model']:<14} {form:<18} {f['layers']:3d} layers "
                f"{f['fp32_ms']:9.2f} -> {f['int8_ms']:9.2f}, {f['slower']} slower in int8"
            )
    goal = [r for r in rows if "error" not in r and r["model"] in ("resnet50", "mobilenet-v2")]
    for r in goal:  # issue 31's bar on both boards
        met = r["tvm_int8_speedup"] >= 1.8 and r["tvm_over_ort_int8"] <= 1.0
        print(
            f"goal on {r['board']}, TVM int8 >= 1.8x TVM fp32 and <= 1.0x ONNX Runtime int8 for "
            f"{r['model']}: {r['tvm_int8_speedup']:.2f}x, {r['tvm_over_ort_int8']:.2f}x "
            f"({r['int8_instructions']} {r['int8_mnemonic']}), {'met' if met else 'NOT met'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=MODELS.split(","), help="examples (space or comma)")
    parser.add_argument("--boards", nargs="+", default=["rpi4", "rpi5"], help=f"of {', '.join(BOARDS)}")
    parser.add_argument("--threads", type=int, default=2, help="threads of TVM and of ONNX Runtime")
    parser.add_argument("--budget", type=float, default=3.0, help="timing seconds per runtime, model, board")
    parser.add_argument(
        "--rootfs", type=Path, default=Config.from_env().rootfs_dir,
        help="the arm64 root file system (built, or given the onnxruntime extra, if needed)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "pi.json", help="JSON written here")
    parser.add_argument("--record", action="store_true", help="append this run to benchmarks/results/pi.json")
    args = parser.parse_args()
    names = [n for m in args.models for n in m.split(",") if n]
    boards = [b for m in args.boards for b in m.split(",") if b]
    unknown = [n for n in names if n not in EXAMPLES] + [b for b in boards if b not in BOARDS]
    if unknown:
        parser.error(f"unknown model or board: {', '.join(unknown)}")
    if not shutil.which("bwrap") or not shutil.which("qemu-aarch64-static"):
        parser.error("needs bwrap and qemu-aarch64-static (apt-get install bubblewrap qemu-user-static)")

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    rootfs = ensure_rootfs(args.rootfs.resolve(), ("onnxruntime",), log=log)
    cpu = host_cpu()
    print(f"host CPU: {cpu} ({os.cpu_count()} cores); {qemu_version()}")
    print("every figure below is emulated: QEMU user mode on this host, not a real Raspberry Pi")
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(
            data_dir=Path(tmp) / "data",
            tracker=f"127.0.0.1:{free_port()}",
            rootfs=rootfs,
            bench_budget_s=args.budget,
            bench_threads=args.threads,
            board_wait_s=600,
        )
        config.devices_dir.mkdir(parents=True)
        log(f"starting the device pool (tracker {config.tracker}, root file system {rootfs})")
        pool = start_pool(config)
        try:
            rows = measure(config, names, boards, Path(tmp), log)
        finally:
            stop_processes(pool)
    print_tables(rows, boards)
    report = {
        "host_cpu": cpu,
        "qemu": qemu_version(),
        "threads": args.threads,
        "budget_s": args.budget,
        "emulated": True,
        "onnxruntime": next((r["ort_version"] for r in rows if "ort_version" in r), None),
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")
    if args.record:
        data = {k: v for k, v in report.items() if k not in ("host_cpu", "threads")}
        print(f"recorded in {record_run('pi', args.threads, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
