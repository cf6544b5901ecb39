"""One compiled model timed in blocks, in this process: whether its speed holds or moves over time.

    .venv/bin/tvm-playground compile resnet50 --out /tmp/r50
    TVM_NUM_THREADS=2 PYTHONPATH=. .venv/bin/python benchmarks/blocks.py /tmp/r50/files/model.so 1,3,224,224

Prints the median ms of each block (--blocks 3, of --seconds 3 each) of back-to-back calls on one
random float32 input of the given shape (bench.tvm_runner, as the benchmark calls a build). Run it
several times over to compare processes (docs/benchmarks.md: the same job three times).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("library")
    parser.add_argument("shape", help="the input's shape, e.g. 1,3,224,224")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pin", action="store_true", help="TVM's threads pinned, one a core")
    args = parser.parse_args()
    import tvm

    from webapp.pipeline.stages.bench import tvm_runner

    shape = tuple(int(d) for d in args.shape.split(","))
    inputs = {"x": np.random.default_rng(0).standard_normal(shape).astype("float32")}
    if args.pin:  # told a count, TVM pins each thread to a core
        tvm.get_global_func("runtime.config_threadpool")(1, int(os.environ.get("TVM_NUM_THREADS") or 1))
    run = tvm_runner(tvm.runtime.load_module(args.library), inputs)
    run()
    medians = []
    for _ in range(args.blocks):
        times, end = [], time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        medians.append(float(np.median(times)))
    print(" / ".join(f"{m:.1f}" for m in medians))


if __name__ == "__main__":
    main()
