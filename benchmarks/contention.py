"""TVM and ONNX Runtime while another process keeps one core busy, and what the playground can do about it.

A job's ResNet-50 (or another example) is built once with quantize=int8 (its fp32 and int8 libraries);
ONNX Runtime gets the same .onnx in fp32 and quantized by its own static quantizer (as
benchmarks/quantized.py). Each scenario then times the four in turn (webapp/pipeline/stages/timing.py:
measure_interleaved) in a fresh process at the jobs' CPU priority (nice 10):

- quiet: nothing else runs;
- busy core: a busy loop pinned to the last core (`taskset`, nice 0: another tenant's process) runs
  through the timing, every runtime with all cores' threads (the default);
- busy core, spin 0: the same, TVM's thread pool told not to spin (TVM_THREAD_POOL_SPIN_COUNT=0);
- busy core, free cores: the same, every runtime given as many threads as cores are free (what the
  benchmark does when it finds a core busy: timing.free_cores);
- busy core, timing at nice 0: the timing at the busy loop's priority (not a job's).

Each scenario runs --runs times after the one build; the table shows the medians.

    PYTHONPATH=. .venv/bin/python benchmarks/contention.py [--models resnet50] [--record]

--record appends the run to benchmarks/results/contention.json (benchmarks/tables.py renders it into
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from record import keep, script_parser

from webapp.config import Config

SCENARIOS = {  # name: (busy loop, environment, threads: "free" for the free cores, the timing's nice)
    "quiet": (False, {}, None, 10),
    "busy core": (True, {}, None, 10),
    "busy core, spin 0": (True, {"TVM_THREAD_POOL_SPIN_COUNT": "0"}, None, 10),
    "busy core, free cores": (True, {}, "free", 10),
    "busy core, timing at nice 0": (True, {}, None, 0),
}


def build(config: Config, name: str, tmp: Path) -> dict:
    """The job's two libraries and ONNX Runtime's two models, by path."""
    from quantized import ort_int8

    from webapp.cli import compile_locally
    from webapp.jobs.worker import ensure_example_files
    from webapp.pipeline.stages.importers import import_model

    out = tmp / name
    error = compile_locally(config, name, {"target": "x86-host", "quantize": "int8"}, out)
    if error:
        raise RuntimeError(f"{name}: failed at {error['stage']}: {error['message']}")
    _, onnx_path = ensure_example_files(config, name)
    specs = import_model(onnx_path).inputs
    return {
        "tvm fp32": str(out / "files" / "model-fp32.so"),
        "tvm int8": str(out / "files" / "model.so"),
        "ort fp32": str(onnx_path),
        "ort int8": str(ort_int8(onnx_path, tmp / f"{name}.int8.onnx", specs)),
        "specs": [[s.name, list(s.shape), s.dtype] for s in specs],
    }


def time_here(paths: dict, threads: int, budget_s: float, nice: int) -> dict:
    """In the scenario's own process: the four timed in turn, medians in ms, and the conditions."""
    import tvm

    from webapp.pipeline.stages import bench, timing
    from webapp.pipeline.stages.importers import TensorSpec

    os.nice(nice)  # 10: as a job's sandbox runs
    inputs = bench.make_inputs([TensorSpec(n, tuple(s), d) for n, s, d in paths["specs"]])
    if threads == 0:  # as many as cores are free, for every runtime
        threads = timing.free_cores(os.cpu_count() or 1)
        bench.set_tvm_threads(threads)
    runs = {}
    for key in ("tvm fp32", "tvm int8"):
        runs[key] = bench.tvm_runner(tvm.runtime.load_module(paths[key]), inputs)
    for key in ("ort fp32", "ort int8"):
        runs[key] = bench.onnxruntime_runner(Path(paths[key]), inputs, threads)
    for run in runs.values():
        run()
    with timing.Watch() as watch:
        timed = timing.measure_interleaved(runs, budget_s)
    return {"threads": threads, "ms": {k: t["median_ms"] for k, t in timed.items()}} | {
        "others_cores": watch.conditions()["others_cores"]
    }


def scenario(paths: dict, name: str, budget_s: float) -> dict:
    busy, env, threads, nice = SCENARIOS[name]
    cores = os.cpu_count() or 1
    loop = None
    if busy:
        loop = subprocess.Popen(
            ["taskset", "-c", str(cores - 1), sys.executable, "-c", "while True: pass"],
            start_new_session=True,
        )
    try:
        call = f"time_here(json.loads(sys.argv[1]), {0 if threads else cores}, {budget_s}, {nice})"
        code = "import json, sys; sys.path.insert(0, 'benchmarks'); from contention import time_here; "
        code += f"print(json.dumps({call}))"
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(paths)],
            env={**os.environ, "TVM_NUM_THREADS": str(cores), **env},
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        if loop is not None:
            os.killpg(loop.pid, 9)
            loop.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = script_parser(__doc__, "contention")
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--budget", type=float, default=4.0, help="timing seconds per runtime and scenario")
    parser.add_argument("--runs", type=int, default=3, help="of each scenario")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.from_env(data_dir=Path(tmp) / "data", bench_budget_s=0.5)
        for model in args.models.split(","):
            paths = build(config, model, Path(tmp))
            for run, name in ((run, name) for run in range(args.runs) for name in SCENARIOS):
                got = scenario(paths, name, args.budget)
                ms = got["ms"]
                rows.append({"model": model, "scenario": name, "run": run, **got})
                print(
                    f"{model:12} {name:24} threads {got['threads']}  others {got['others_cores']:.2f} cores  "
                    + "  ".join(f"{k} {v:8.2f}" for k, v in ms.items())
                    + f"  TVM/ORT fp32 {ms['tvm fp32'] / ms['ort fp32']:.2f}"
                    + f"  int8 {ms['tvm int8'] / ms['ort int8']:.2f}",
                    flush=True,
                )
    keep(args, "contention", os.cpu_count() or 1, rows, budget_s=args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
