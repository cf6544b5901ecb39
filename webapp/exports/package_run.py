"""Run a package made by `tvm-playground compile -o model.tar`, with the TVM runtime alone.

This file is also the package's run.py: it imports numpy and tvm.runtime, nothing of the playground,
so the package runs on any machine with the same TVM version:

    python run.py [--inputs in.npz] [--output out.npz] [--print-time] [--repeat N] [--profile]

next to model.so and metadata.json (or `tvm-playground run model.tar ...`, which does the same in
the sandbox). Inputs missing from --inputs are seeded random values of the right shape and dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm.runtime
from tvm.runtime.vm import VirtualMachine


def load(folder: Path) -> tuple[VirtualMachine, tvm.runtime.Device, dict]:
    """(vm, device, metadata) of the package unpacked in `folder`."""
    meta = json.loads((folder / "metadata.json").read_text())
    dev = tvm.runtime.device(meta.get("device", "cpu"), 0)
    return VirtualMachine(tvm.runtime.load_module(str(folder / meta["library"])), dev), dev, meta


def make_inputs(meta: dict, given: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for spec in meta["inputs"]:
        if spec["name"] in given:
            value = np.asarray(given[spec["name"]])
            if list(value.shape) != list(spec["shape"]):
                shape = list(value.shape)
                raise SystemExit(f"error: input {spec['name']!r} is {shape}; the model takes {spec['shape']}")
            out[spec["name"]] = value.astype(spec["dtype"])
        elif (spec.get("values") or {}).get("given") is not None:  # built with this value (input_values)
            out[spec["name"]] = np.asarray(spec["values"]["given"], spec["dtype"]).reshape(spec["shape"])
        elif spec["dtype"].startswith("float"):
            out[spec["name"]] = rng.standard_normal(spec["shape"]).astype(spec["dtype"])
        elif (spec.get("values") or {}).get("fill") is not None:  # e.g. a Slice's starts or ends
            out[spec["name"]] = np.broadcast_to(np.asarray(spec["values"]["fill"]), spec["shape"]).astype(
                spec["dtype"]
            )
        else:  # token ids below the table's rows, where the model says
            high = (spec.get("values") or {}).get("high") or 10
            out[spec["name"]] = rng.integers(0, high, spec["shape"]).astype(spec["dtype"])
    unknown = sorted(set(given) - set(out))
    if unknown:
        raise SystemExit(f"error: --inputs has {', '.join(unknown)}; the model's inputs are {', '.join(out)}")
    return out


def flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [a for v in value for a in flatten(v)]
    return [np.asarray(value)]


def run(folder: Path, given: dict, repeat: int = 0, profile: bool = False) -> dict:
    """Outputs {name: array}; with `repeat`, each run's ms; with `profile`, each kernel's ms per run."""
    vm, dev, meta = load(folder)
    inputs = make_inputs(meta, given)
    args = [tvm.runtime.tensor(inputs[s["name"]], dev) for s in meta["inputs"]]
    outputs = flatten(vm["main"](*args))
    names = [s["name"] for s in meta.get("outputs", [])]
    names = names if len(names) == len(outputs) else [f"output{i}" for i in range(len(outputs))]
    result = {"outputs": dict(zip(names, outputs, strict=True)), "weights": meta.get("weights")}
    if repeat:
        vm.set_input("main", *args)
        timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=repeat)
        result["ms"] = [t * 1e3 for t in timer("main").results]
    if profile:
        seconds: dict[str, float] = {}
        started: dict[str, float] = {}

        def hook(func, symbol, before_run, ret_value, *call_args):
            if "." not in symbol:  # a compiled kernel, not a vm.builtin.* call
                dev.sync()
                if before_run:
                    started[symbol] = time.perf_counter()
                elif symbol in started:
                    seconds[symbol] = seconds.get(symbol, 0.0) + time.perf_counter() - started.pop(symbol)
            return 0  # VMInstrumentReturnKind.NO_OP

        vm.set_instrument(hook)
        runs = max(repeat, 5)
        for _ in range(runs):
            vm["main"](*args)
        result["profile"] = {k: v / runs * 1e3 for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--package", default=str(Path(__file__).resolve().parent), help="the unpacked package"
    )
    parser.add_argument("--inputs", help=".npz of the inputs by name (missing ones: seeded random)")
    parser.add_argument("--output", help=".npz to write the outputs to")
    parser.add_argument("--print-time", action="store_true", help="time whole runs (median, min, max ms)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs with --print-time")
    parser.add_argument("--profile", action="store_true", help="each kernel's ms per run (the VM's hook)")
    args = parser.parse_args(argv)
    given = dict(np.load(args.inputs)) if args.inputs else {}
    result = run(Path(args.package), given, args.repeat if args.print_time else 0, args.profile)
    if result["weights"]:  # an example's model: random or trained, as its result page says
        print(f"weights: {result['weights']['text']}")
    for name, value in result["outputs"].items():
        print(f"{name}: shape {list(value.shape)} {value.dtype}")
    if args.output:
        np.savez(args.output, **result["outputs"])
        print(f"outputs written to {args.output}")
    if "ms" in result:
        ms = sorted(result["ms"])
        median = float(np.median(ms))
        print(f"Execution time ({len(ms)} runs): median {median:.4f} ms, min {ms[0]:.4f}, max {ms[-1]:.4f}")
    if "profile" in result:
        total = sum(result["profile"].values()) or 1.0
        print(f"{'kernel':<60} {'ms / run':>10} {'share':>7}")
        for name, ms in result["profile"].items():
            print(f"{name:<60} {ms:>10.4f} {100 * ms / total:>6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
