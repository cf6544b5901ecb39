"""Where a built-in example's time goes, kernel by kernel, on the default schedule rules (or with the
tuning records of a database folder): each compiled kernel timed on its own with random inputs and cold
caches (webapp.pipeline.stages.build.kernel_seconds, as the build compares records), with
its calls per inference, GFLOP/s, share of the summed time and the rule that scheduled it; then the
whole model's kernel profile as a job takes it (the VM's hook timing every call, the VM's own work with
its kernels skipped) against a run timed without the hook.

    .venv/bin/python benchmarks/kernel_profile.py resnet50 [--target x86-host] [--records DIR] [--top 15]
        [--quantize int8]

With --quantize, the quantized model (random calibration inputs, as a job without calibration data) is
profiled instead of the float one.

Runs the trusted example models in this process (no sandbox); uploads never come here.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import tvm

from webapp.config import Config
from webapp.jobs.worker import ensure_example_files
from webapp.options import JobOptions
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.stages import bench
from webapp.pipeline.stages.build import build, kernel_seconds, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.inspect import kernel_flop
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.profile import profile_kernels
from webapp.pipeline.stages.quantize.variants import quantize_job
from webapp.targets import get


def profile(name: str, preset: str, records: Path | None, quantize: str = "none") -> tuple[list[dict], dict]:
    _, onnx_path = ensure_example_files(Config.from_env(), name)
    target = get(preset)
    model = import_model(onnx_path)
    with tempfile.TemporaryDirectory() as tmp:
        if quantize == "none":
            fused = optimize(model.mod, target, Path(tmp)).fused
        else:  # quantized from the imported model, as a job's quantize stage does
            options = JobOptions(target=preset, quantize=quantize)
            (Path(tmp) / "views").mkdir()
            quantized = quantize_job(model, target, options, Path(tmp), None, None, lambda f: None)
            fused = fuse(quantized.variants[0].mod, target)
    lowered, labels = schedule(fused, target, records)
    executable = build(lowered, target, None)
    every = set(labels)
    seconds_of = kernel_seconds(executable, lowered, target.device(), every)
    main_text = lowered["main"].script()
    unscheduled = {gv.name_hint for gv in fused.get_global_vars()}
    rows = []
    for gv, func in lowered.functions_items():
        name = gv.name_hint
        calls = len(re.findall(rf"\b{re.escape(name)}\(", main_text))
        if not isinstance(func, tvm.tirx.PrimFunc) or not calls:
            continue
        seconds = seconds_of[name]
        # the unscheduled kernel's count where the scheduled one has none (tensorized int8 loops)
        flop = kernel_flop(func) or (name in unscheduled and kernel_flop(fused[name]))
        rows.append(
            {
                "kernel": name,
                "calls": calls,
                "ms": seconds * calls * 1e3,
                "gflops": flop / seconds / 1e9 if flop else None,
                "schedule": labels.get(name, "naive"),
            }
        )
    hooked = profile_kernels(executable, bench.make_inputs(model.inputs), runs=20)
    return sorted(rows, key=lambda r: -r["ms"]), hooked


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--records", type=Path, help="a tuning database folder to apply first")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--quantize", default="none", help="e.g. int8: profile the quantized model")
    args = parser.parse_args()
    rows, hooked = profile(args.model, args.target, args.records, args.quantize)
    total = sum(r["ms"] for r in rows)
    print(f"{args.model}: {len(rows)} kernels, {total:.3f} ms summed (each kernel timed alone)")
    for r in rows[: args.top]:
        rate = f"{r['gflops']:7.1f} GFLOP/s" if r["gflops"] else " " * 15
        print(
            f"  {r['ms']:8.3f} ms {100 * r['ms'] / total:5.1f}%  x{r['calls']:<2} {rate}  {r['kernel']}  "
            f"[{r['schedule']}]"
        )
    vm = f"{hooked['vm_ms']:.3f}" if hooked["vm_ms"] is not None else "not measured"
    print(
        f"in the model: kernels add up to {hooked['kernels_ms']:.3f} ms by the VM's hook (less its "
        f"{hooked['hook_us']:.1f} us a call), the VM's own work {vm} ms; a run timed without the hook "
        f"takes {hooked['run_ms']:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
