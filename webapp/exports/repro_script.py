"""Reproduces one kernel of a TVM Playground job, with apache-tvm and numpy alone (shipped as run.py in
the kernel's reproducer, /r/<job>/repro/<kernel>.zip; webapp/exports/repro.py packs it).

The folder holds the kernel's TIR as the job scheduled it (kernel.py), the same kernel before
scheduling (reference.py), the job's TVM target (target.json) and, where the model calls it with them,
its small constants (constants.npz: scales, clip bounds). This script builds both with tvm.compile, runs
them on the same seeded random inputs (and those constants), checks that the scheduled kernel computes what
the unscheduled one does (numpy, within float rounding), and times the scheduled one twice: warm, called
again and again on the same arguments, and cold, each call on other copies of them. For another CPU's
target (an Arm board's kernel on an x86 machine) it builds and stops: its code cannot run here.

    pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 numpy
    python run.py [--seed 0] [--runs 20] [--out outputs.npz]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# the job's benchmark threads and its int8 kernels' pair limit, where it had them
JOB = json.loads((HERE / "run.json").read_text()) if (HERE / "run.json").exists() else {}


def threads_asked(argv: list[str]) -> int | None:
    """--threads N, else the job's benchmark threads (run.json), else None (TVM's own default)."""
    if "--threads" in argv[:-1]:
        return int(argv[argv.index("--threads") + 1])
    return JOB.get("threads")


# TVM reads its thread count once, when it starts its thread pool: set before it is imported
THREADS = threads_asked(sys.argv)
if THREADS:
    os.environ["TVM_NUM_THREADS"] = str(THREADS)
import tvm  # noqa: E402


def load(name: str) -> tvm.tirx.PrimFunc:
    return tvm.script.from_source((HERE / name).read_text())


def random_args(func: tvm.tirx.PrimFunc, seed: int, pair_limit: int | None = None) -> list[np.ndarray]:
    """One seeded array per parameter, by its dtype: floats normal, 8-bit integers over their range,
    wider integers small (indices, biases). With a `pair_limit` (run.json: x86 without VNNI sums two
    uint8 x int8 products in int16, which saturates past 32,767), int8 values (the weights) lie within
    half of it, so that any two add up to at most the limit, as the job's quantizer keeps them."""
    rng = np.random.default_rng(seed)
    arrays = []
    for param in func.params:
        shape, dtype = [int(d) for d in param.shape], str(param.dtype)
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype in ("int8", "uint8"):
            lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
            if dtype == "int8" and pair_limit:
                lo, hi = -(pair_limit // 2), pair_limit // 2
            arrays.append(rng.integers(lo, hi + 1, shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 8, shape).astype(dtype))
    return arrays


def built(func: tvm.tirx.PrimFunc, target: tvm.target.Target | str) -> tvm.runtime.Module:
    """The kernel compiled by TVM's default pipeline for `target`, as a runtime module."""
    executable = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    return getattr(executable, "mod", executable)


def call(
    func: tvm.tirx.PrimFunc,
    target: tvm.target.Target | str,
    arrays: list[np.ndarray],
    dev: tvm.runtime.Device,
) -> tuple[list[np.ndarray], tvm.runtime.Module, list[tvm.runtime.Tensor]]:
    """The kernel built for `target` and run once on copies of `arrays`: (its arrays after, the module,
    the tensors)."""
    module = built(func, target)
    args = [tvm.runtime.tensor(a.copy(), dev) for a in arrays]
    module["main"](*args)
    return [a.numpy() for a in args], module, args


COLD_BYTES = 64 << 20  # the copies a cold timing rotates over: 32 of this machine's 2 MB L2 caches
COLD_COPIES = 1024


def loop_ms(module: tvm.runtime.Module, sets: list[list[tvm.runtime.Tensor]], runs: int) -> float:
    """ms a call of `module` called once on each argument set in turn: the median of `runs` passes."""
    main, passes = module["main"], []
    for _ in range(runs):
        start = time.perf_counter()
        for tensors in sets:
            main(*tensors)
        passes.append((time.perf_counter() - start) / len(sets))
    return float(np.median(passes)) * 1e3


def cold_ms(
    module: tvm.runtime.Module, arrays: list[np.ndarray], dev: tvm.runtime.Device, warm: float, runs: int
) -> tuple[float, int, float]:
    """The kernel's ms a call with its arguments read from beyond the caches, as a model's kernel reads
    weights another kernel's data has pushed out: calls rotated over copies of every argument, COLD_BYTES
    in all, less Python's own cost of a call (one set called as often, against `warm`, TVM's timer).
    (ms, copies, MB rotated over)."""
    size = max(sum(a.nbytes for a in arrays), 1)
    copies = max(2, min(COLD_COPIES, -(-COLD_BYTES // size)))
    sets = [[tvm.runtime.tensor(a, dev) for a in arrays] for _ in range(copies)]
    python = max(loop_ms(module, [sets[0]] * copies, runs) - warm, 0.0)
    return max(loop_ms(module, sets, runs) - python, 0.0), copies, copies * size / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=20, help="timed runs of the scheduled kernel")
    parser.add_argument("--out", type=Path, help="write the scheduled kernel's arrays after the call (.npz)")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="TVM's threads (default: as the job's benchmark, run.json)")  # fmt: skip
    args = parser.parse_args()

    target = tvm.target.Target(json.loads((HERE / "target.json").read_text()))
    kernel, reference = load("kernel.py"), load("reference.py")
    triple = str(target.attrs.get("mtriple", ""))  # none: this machine's own CPU
    arch = triple.split("-")[0] if triple else platform.machine()
    if target.kind.name != "llvm" or arch != platform.machine():
        built(kernel, target)
        print(f"built for {target}; it runs on {arch}, not this {platform.machine()} machine")
        return 0

    dev = tvm.cpu()
    arrays = random_args(reference, args.seed, JOB.get("int8_pair_limit"))
    if (HERE / "constants.npz").exists():  # the model's own scales and clip bounds, where the job wrote them
        with np.load(HERE / "constants.npz", allow_pickle=False) as given:
            for key in given.files:
                i = int(key.removeprefix("arg"))
                if i < len(arrays) and given[key].shape == arrays[i].shape:
                    arrays[i] = given[key].astype(arrays[i].dtype)
    packed = list(arrays)  # the scheduled kernel reads its weights repacked: prepack.py makes them
    for i, (mine, theirs) in enumerate(zip(kernel.params, reference.params, strict=True)):
        if [int(d) for d in mine.shape] != [int(d) for d in theirs.shape]:
            if not (HERE / "prepack.py").exists():
                print(f"argument {i} is in another layout than the reference's, and no prepack.py says how")
                return 1
            prepack = load("prepack.py")
            out = np.zeros([int(d) for d in mine.shape], str(mine.dtype))
            packed[i] = call(prepack, target, [arrays[i], out], dev)[0][-1]
    ours, module, tensors = call(kernel, target, packed, dev)
    expected, _, _ = call(reference, "llvm", arrays, dev)  # the unscheduled kernel, for this CPU
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, expected, strict=True)):
        if a.shape != b.shape:  # a repacked weight: an input, the same values in another layout
            continue
        if a.dtype.kind == "f":
            scale = max(float(np.abs(b).max()) if b.size else 0.0, 1.0)
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * scale, err_msg=f"argument {i}")
        else:  # integers: a requantized value may round the other way at a float's last bit
            off = np.abs(a.astype(np.int64) - b.astype(np.int64))
            assert off.max(initial=0) <= 1 and (off > 0).mean() <= 0.01, f"argument {i}: {off.max()} off"
        if a.size:
            worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
    timer = module.time_evaluator("main", dev, number=1, repeat=args.runs, min_repeat_ms=10)
    ms = float(np.median(timer(*tensors).results)) * 1e3
    cold, copies, mb = cold_ms(module, packed, dev, ms, max(3, args.runs // 4))
    print(f"matches the unscheduled kernel (largest difference {worst:.3g})")
    threads = f" on {args.threads} threads" if args.threads else ""
    print(f"{ms:.4f} ms a call, the median of {args.runs} runs{threads}, its arguments in the caches")
    print(
        f"{cold:.4f} ms a call cold: each call on other copies of its arguments"
        f" ({copies} copies, {mb:.0f} MB)"
    )
    if args.out:
        np.savez(args.out, *ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
