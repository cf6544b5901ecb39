"""Do the kernel table's times hold? A job's kernel profile (webapp/pipeline/stages/profile.py) against
the benchmark's median and against each kernel's reproducer, timed on its own.

For each model: one job on x86-host (sandboxed, as `tvm-playground compile` runs one), then
- its parts: the kernels' measured ms and the VM's own work between them (runs with every kernel
  skipped), their sum against the benchmark's median of the same build;
- each kernel of at least --share of a run (at most --top): its ms a call in the run against its
  reproducer's (the job's /r/<id>/repro/<kernel>.zip, run.py: the kernel alone on random inputs, warm
  from its own last call), and llvm-mca's prediction for it (an estimate from its hot loop alone).

    .venv/bin/python benchmarks/kernel_times.py [--models resnet50:int8,bert] [--top 20] [--share 0.01]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from record import host_cpu

from webapp.cli import compile_locally
from webapp.config import Config
from webapp.exports.repro import archive_name, reproducer_zip


def reproducer_ms(job_dir: Path, results: dict, kernel: str, where: Path) -> tuple[float, float] | None:
    """The kernel's reproducer run here: its ms a call warm and cold (run.py's medians), or None."""
    packed = reproducer_zip(job_dir, results, kernel)
    if packed is None:
        return None
    zipfile.ZipFile(io.BytesIO(packed)).extractall(where)
    run = subprocess.run(
        [sys.executable, "run.py", "--runs", "50"], cwd=where / archive_name(kernel),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    warm = re.search(r"([\d.]+) ms a call, the median", run.stdout)
    cold = re.search(r"([\d.]+) ms a call cold", run.stdout)
    if not (warm and cold):
        print(f"  {kernel}: run.py said {(run.stdout + run.stderr)[-300:]}", file=sys.stderr)
        return None
    return float(warm.group(1)), float(cold.group(1))


def model_table(config: Config, model: str, quantize: str, top: int, share: float, tmp: Path) -> None:
    job_dir = tmp / f"{model}-{quantize}"
    error = compile_locally(config, model, {"target": "x86-host", "quantize": quantize}, job_dir)
    if error:
        print(f"{model} {quantize}: failed at {error['stage']}: {error['message'][:300]}")
        return
    results = json.loads((job_dir / "result.json").read_text())
    profile = next(p for p in results["profiles"] if p.get("shown"))
    variant = f"{profile['variant']}{' tuned' if profile['tuned'] else ''}"
    vm = profile.get("vm_ms")
    print(f"\n{model}, TVM {variant}: benchmark median {profile['benchmark_ms']:.3f} ms")
    if vm is None:
        print(f"  kernels {profile['kernels_ms']:.3f} ms; the VM's own work not measured")
    else:
        print(
            f"  kernels {profile['kernels_ms']:.3f} ms (measured, less the hook's "
            f"{profile['hook_us']:.1f} us a call) + the VM's own work {vm:.3f} ms (runs with the kernels "
            f"skipped, {profile['skipped_ms']:.3f} ms, less the hook's {profile['skip_hook_us']:.2f} us "
            f"a call) = "
            f"{profile['accounted_ms']:.3f} ms: {100 * profile['accounted']:.1f}% of the median; "
            f"{100 * profile['accounted_ms'] / profile['run_ms']:.1f}% of a run without the hook "
            f"({profile['run_ms']:.3f} ms, timed in the same rounds)"
        )
    print(
        "| kernel | share of a run | calls | in the run, ms a call | reproducer warm | run / warm "
        "| reproducer cold | run / cold | llvm-mca predicted, ms a call |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    kernels = [k for k in results["kernels"] if k.get("ms") and k.get("calls") and k["share"] >= share][:top]
    near_warm = between = 0
    for k in kernels:
        in_run = k["ms"] / k["calls"]
        warm, cold = reproducer_ms(job_dir, results, k["name"], tmp / "repro") or (None, None)
        mca = (k.get("mca") or {}).get("predicted_ms")
        mca = mca / k["calls"] if mca else None
        if warm and cold:
            near_warm += abs(in_run / warm - 1) <= 0.25
            between += 0.75 * min(warm, cold) <= in_run <= 1.25 * max(warm, cold)
        print(
            f"| {k['name'][:60]} | {100 * k['share']:.1f}% | {k['calls']} | {in_run:.4f} | "
            f"{f'{warm:.4f} | {in_run / warm:.2f}' if warm else '- | -'} | "
            f"{f'{cold:.4f} | {in_run / cold:.2f}' if cold else '- | -'} | {f'{mca:.4f}' if mca else '-'} |"
        )
    print(
        f"  {near_warm} of {len(kernels)} kernels within 25% of their reproducer's warm time; "
        f"{between} within 25% of its warm-to-cold range"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="resnet50:int8,bert", help="example[:quantize], comma-separated")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--share", type=float, default=0.01, help="kernels of at least this share of a run")
    args = parser.parse_args()
    print(f"CPU: {host_cpu()}")
    config = Config.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models.split(","):
            model, _, quantize = spec.partition(":")
            model_table(config, model, quantize or "none", args.top, args.share, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
