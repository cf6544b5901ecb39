"""The pass bisection's time on a model whose pipeline has a pass broken on purpose (tests/test_bisect.py's
BrokenSign, after FuseTIR, flipping the first kernel call whose name has --kernel): the points of its way,
the points it ran, the seconds, what it named. Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/bisection.py [--models resnet50,bert] [--kernel conv2d,matmul]

A job with nothing broken runs three points (the imported module, its canonical form, the library):
`benchmarks/job_time.py --bisect` times that inside the whole job.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import tvm
from record import host_cpu, script_parser

from tests.test_bisect import broken_pass
from webapp.config import Config
from webapp.jobs.worker import ensure_example_files
from webapp.pipeline.passes.legalize import legalize_passes
from webapp.pipeline.stages import bench
from webapp.pipeline.stages.bisect import bisect, source_layers
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.layer_error import run_module
from webapp.pipeline.stages.optimize import canonical, optimize
from webapp.targets import get, host


def bisect_broken(path: Path, contains: str, scratch: Path) -> dict:
    model, target = import_model(path), get("x86-host")
    fusion = optimize(model.mod, target, scratch, layer_of=model.layers).fusion
    legalize = legalize_passes(target)
    after = 1 + next(i for i, p in enumerate(legalize) if p.info.name == "FuseTIR")
    broken = legalize[:after] + [broken_pass(contains)] + legalize[after:] + target.lower_passes()
    inputs = bench.make_inputs(model.inputs, seed=0)
    reference = bench.flatten_outputs(bench.onnxruntime_runner(path, inputs, bench.bench_threads())())

    def library():
        with target.tvm:
            return run_module(tvm.transform.Sequential(broken)(canonical(model.mod)), inputs, host())

    started = time.perf_counter()
    found = bisect(
        model.mod, target, inputs, ("onnxruntime", reference), library,
        source_layers(fusion, model.layers), 60.0, passes=broken,
    )  # fmt: skip
    return found | {"wall_s": time.perf_counter() - started}


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--kernel", default="conv2d,matmul", help="per model: the kernel name to flip")
    args = parser.parse_args()
    print(f"CPU: {host_cpu()}, {bench.bench_threads()} threads")
    config = Config.from_env()
    for model, contains in zip(args.models.split(","), args.kernel.split(","), strict=True):
        with tempfile.TemporaryDirectory() as scratch:
            found = bisect_broken(ensure_example_files(config, model)[1], contains, Path(scratch))
        ran = [r for r in found["runs"] if "off" in r]
        first, changed = found["first"] or {}, (found.get("changed") or [{}])[0]
        print(
            f"{model}: {found['points']} points, {len(found['runs'])} run ({len(ran)} built), "
            f"{found['wall_s']:.1f} s (the points {sum(r['seconds'] for r in found['runs']):.1f} s, the rest "
            "the bindings compared at the first off); "
            f"first off: {first.get('name')} (point {first.get('index')}); first changed binding: "
            f"{changed.get('binding')} in {changed.get('kernel')}, layers {changed.get('layers')}, "
            f"{found.get('changed_count')} changed",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
