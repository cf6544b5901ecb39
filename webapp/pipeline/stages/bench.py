"""Benchmark stage: TVM vs PyTorch eager vs ONNX Runtime on the same inputs and thread count,
and the fidelity of TVM's outputs against the framework's fp32 reference.

Every runtime is timed by the same harness (`measure_interleaved`): the runtimes in turn, each slice
after a pause and a warm-up call, then calls timed one by one with perf_counter, in four rounds. A row's
median is that of its fastest round; its min, p90 and count are of all its calls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from webapp.machine import timing_slot
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.reports.graphs import time_graphs
from webapp.pipeline.reports.model_explorer import write_model_explorer
from webapp.pipeline.stages.conditions import machine
from webapp.pipeline.stages.fidelity import fidelity
from webapp.pipeline.stages.importers import TensorSpec
from webapp.pipeline.stages.profile import profile_builds, timed_kernels
from webapp.pipeline.stages.timing import (
    TIMINGS,
    free_cores,
    measure_interleaved,
    measure_watched,
    wait_quiet,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import onnxruntime
    import torch
    import tvm

    from webapp.pipeline.job import Job
    from webapp.pipeline.stages.build import Built
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.pipeline.stages.inspect import Inspected
    from webapp.targets import Target


def bench_threads() -> int:
    return int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)


def sgemm_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """This machine's fp32 matrix-multiply rate at `threads` (torch.mm, n x n, the best of `repeats`):
    the reference the kernel linter sets convolutions and matmuls against (reports/lint.py). A
    measured reference, not the hardware's peak."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        return 2 * n**3 / best_seconds(lambda: torch.mm(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(before)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn`, after one untimed."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def set_tvm_threads(threads: int) -> None:
    """TVM's thread pool to `threads` threads from here on, each free to run on any core, as at its
    start: told a count, TVM pins its threads to cores unless TVM_BIND_THREADS=0 (the main thread to
    core 0 with one thread), and a thread pinned to a busy core cannot leave it."""
    import tvm

    os.environ["TVM_BIND_THREADS"] = "0"
    tvm.get_global_func("runtime.config_threadpool")(1, threads)


def make_inputs(specs: list[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's shapes and dtypes, the same for every runtime; an integer input
    holds the values its use in the model allows (TensorSpec.values: ids below the table's rows, a
    Slice's starts and ends), else ones for a mask (Hugging Face's `attention_mask`: every token
    attended; 0 to 9 made OPT's positions, its mask's cumulative sum, run past their table), else 0
    to 9."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in specs:
        dtype, values = np.dtype(spec.dtype), spec.values
        if values is not None and values.given is not None:
            inputs[spec.name] = np.asarray(values.given, dtype).reshape(spec.shape)
        elif dtype.kind == "f":
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        elif dtype.kind == "b":
            inputs[spec.name] = rng.integers(0, 2, spec.shape).astype(dtype)
        elif values is not None and values.fill is not None:
            inputs[spec.name] = np.broadcast_to(np.asarray(values.fill, dtype), spec.shape).copy()
        elif values is None and "mask" in spec.name.lower():
            inputs[spec.name] = np.ones(spec.shape, dtype)
        else:
            high = values.high if values is not None and values.high else 10
            inputs[spec.name] = rng.integers(0, high, spec.shape).astype(dtype)
    return inputs


def flatten_outputs(out: Any) -> list[np.ndarray]:
    if isinstance(out, np.ndarray):
        return [out]
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, (list, tuple)) or hasattr(out, "__len__"):
        return [a for o in out for a in flatten_outputs(o)]
    return [np.asarray(out)]


def run_all(
    executable: tvm.runtime.Executable, samples: list[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """A build's outputs on each sample, run on this machine whatever the target (calibration, the
    precision search's points)."""
    import tvm
    from tvm import relax

    from webapp.targets import host

    dev = host().device()
    vm = relax.VirtualMachine(executable, dev)
    return [
        flatten_outputs(vm["main"](*[tvm.runtime.tensor(a, dev) for a in sample.values()]))
        for sample in samples
    ]


# ---------------------------------------------------------------- runtimes


def tvm_runner(
    executable: tvm.runtime.Executable, inputs: dict[str, np.ndarray], dev: tvm.runtime.Device | None = None
) -> Callable[[], Any]:
    """A call of the model on `dev`, the target's device (this machine's CPU when None)."""
    import tvm
    from tvm import relax

    from webapp.targets import host

    dev = dev or host().device()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs.values()]
    main = vm["main"]
    if dev.dlpack_device_type() == host().device().dlpack_device_type():
        return lambda: main(*args)

    def run() -> Any:  # a GPU runs the kernels after the call returns: a run ends when the device is done
        out = main(*args)
        dev.sync()
        return out

    return run


def pytorch_module(pt2: Path, threads: int) -> torch.nn.Module:
    """The .pt2's module, PyTorch on `threads` threads."""
    import torch

    from webapp.pipeline.stages.pt2 import flat_module, load_pt2

    torch.set_num_threads(threads)
    return flat_module(load_pt2(pt2))


def pytorch_runner(
    pt2: Path, inputs: dict[str, np.ndarray], threads: int, cuda: bool = False
) -> Callable[[], Any]:
    import torch

    module = pytorch_module(pt2, threads)
    args = [torch.from_numpy(a) for a in inputs.values()]
    if cuda:
        module, args = module.to("cuda"), [a.to("cuda") for a in args]

    def run() -> Any:
        with torch.no_grad():
            out = module(*args)
        if cuda:
            torch.cuda.synchronize()
        return out

    return run


def onnxruntime_session(
    model: Path | bytes, threads: int, cuda: bool = False, optimized: bool = True
) -> onnxruntime.InferenceSession:
    """An ONNX Runtime session of an .onnx (or a model's bytes) on `threads` threads (one operator at a
    time); `optimized` False: its graph optimizations off, each operator run as the model has it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    provider = "CUDAExecutionProvider" if cuda else "CPUExecutionProvider"
    return ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), options, providers=[provider]
    )


def onnxruntime_runner(
    model: Path | bytes,
    inputs: dict[str, np.ndarray],
    threads: int,
    cuda: bool = False,
    optimized: bool = True,
) -> Callable[[], list]:
    session = onnxruntime_session(model, threads, cuda, optimized)
    feed = dict(zip((i.name for i in session.get_inputs()), inputs.values(), strict=False))
    return lambda: session.run(None, feed)


def torch_outputs(out: Any) -> list[np.ndarray]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out.detach().cpu().numpy()]
    return [a for o in out for a in torch_outputs(o)]


def is_classifier(outputs: list[TensorSpec]) -> bool:
    """A single 2-D output [batch, classes] is read as class scores."""
    return (
        len(outputs) == 1
        and len(outputs[0].shape) == 2
        and isinstance(outputs[0].shape[1], int)
        and outputs[0].shape[1] > 1
    )


def benchmark(
    executables: dict,
    inputs: dict[str, np.ndarray],
    outputs: list[TensorSpec],
    references: dict[str, Path],
    device: str,
    budget_s: float = 3.0,
    report: Callable[..., None] = lambda f: None,
    dev: tvm.runtime.Device | None = None,
    reference_variant: str = "fp32",
    quiet_wait_s: float = 0.0,
) -> dict:
    """executables: {(variant, tuned): TVM executable}; references: {"pytorch": model.pt2, "onnxruntime":
    model.onnx}, the uploaded model (`reference_variant`: "int8" for a pre-quantized one), on a CUDA
    `dev`'s GPU where their runtime can (every build then also checked on the CPU). Holding the timing
    slot (webapp/machine/timing_slot.py), it waits for a quiet machine (quiet_wait_s in all, timing.py), and
    every runtime runs on the cores others leave free (`fewer_threads`: benchmarks/contention.py says why)."""
    # the machine's timing slot from the runtimes' loading on: the cores counted free are free of our jobs
    with timing_slot.hold("benchmark"):
        on_cuda = reference_cuda(dev)
        all_threads = bench_threads()
        waited = wait_quiet(quiet_wait_s / 2)  # half the wait at most: the rest for timing again
        threads = free_cores(all_threads)  # cores other processes keep busy: every runtime leaves them
        if threads < all_threads:
            set_tvm_threads(threads)
        makers = runners(executables, inputs, references, threads, dev, on_cuda, reference_variant)
        runs, outs, unavailable = first_runs(makers, report)
        timed = TIMINGS if quiet_wait_s else 1  # timed again where disturbed, with time to wait
        timings, conditions = measure_watched(
            runs, budget_s, lambda f: report(0.2 + 0.8 * f), quiet_wait_s - waited, timed
        )
        conditions["waited_s"] = round(conditions["waited_s"] + waited, 2)
        # a CPU build's kernels against this machine's sgemm (the linter's reference), not a GPU's
        sgemm = sgemm_reference(threads) if dev is None or str(dev).startswith("cpu") else None
    host_name, classifier = cpu_name(), is_classifier(outputs)
    rows = [
        {
            "runtime": runtime,
            "variant": variant,
            "tuned": tuned,
            "device": device if runtime == "tvm" or on_cuda[runtime] else host_name,
            "threads": threads,
            **timings[(runtime, variant, tuned)],
        }
        for runtime, variant, tuned in runs
    ]
    return {
        "benchmarks": rows,
        "fidelity": fidelities(
            executables, outs, references, inputs, threads, on_cuda, classifier, reference_variant
        ),
        "threads": threads,
        "nice": os.nice(0),  # the CPU priority it was measured at (the web's is 0)
        "conditions": conditions,
        "fewer_threads": fewer_threads(threads, all_threads),
        "machine": machine(),
        "sgemm": sgemm,
        "classifier": classifier,
        "unavailable_runtimes": unavailable,
    }


def fewer_threads(threads: int, of: int) -> dict | None:
    """Fewer threads than configured, every runtime alike, where other processes kept cores busy."""
    return {"threads": threads, "of": of, "busy_cores": of - threads} if threads < of else None


def runners(
    executables: dict,
    inputs: dict[str, np.ndarray],
    references: dict[str, Path],
    threads: int,
    dev: tvm.runtime.Device | None,
    on_cuda: dict[str, bool],
    reference_variant: str,
) -> dict:
    """(runtime, variant, tuned) -> a function that makes that runtime's run of the model: each TVM
    build, and the references the job has (PyTorch, ONNX Runtime), on the GPU where they can."""
    makers: dict[tuple[str, str, bool], Callable[..., Callable]] = {  # (...: a TVM one takes ex=ex)
        ("tvm", variant, tuned): (lambda ex=ex: tvm_runner(ex, inputs, dev))
        for (variant, tuned), ex in sorted(executables.items())
    }
    if "pytorch" in references:
        makers[("pytorch", "fp32", False)] = lambda: pytorch_runner(
            references["pytorch"], inputs, threads, on_cuda["pytorch"]
        )
    if "onnxruntime" in references:
        makers[("onnxruntime", reference_variant, False)] = lambda: onnxruntime_runner(
            references["onnxruntime"], inputs, threads, on_cuda["onnxruntime"]
        )
    return makers


def first_runs(makers: dict, report: Callable[..., None]) -> tuple[dict, dict, list[dict]]:
    """Each runtime made and run once: (its run, by key; its outputs; the reference runtimes that
    could not run the model, with why: reported, not fatal). A TVM build that fails raises."""
    runs, outs, unavailable = {}, {}, []
    for i, (key, make) in enumerate(makers.items()):
        runtime = key[0]
        try:
            runs[key] = make()
            out = runs[key]()
        except Exception as exc:
            if runtime == "tvm":
                raise
            unavailable.append({"runtime": runtime, "reason": f"{type(exc).__name__}: {str(exc)[:500]}"})
            runs.pop(key, None)
            continue
        outs[key] = torch_outputs(out) if runtime == "pytorch" else flatten_outputs(out)
        report(0.2 * (i + 1) / len(makers))
    return runs, outs, unavailable


def sgemm_reference(threads: int) -> dict | None:
    """This machine's sgemm rate at `threads`, the linter's reference; None where it cannot be measured
    (the measurements stand without it)."""
    try:
        return {"gflops": sgemm_gflops(threads), "threads": threads}
    except Exception as exc:
        print(f"sgemm reference left out: {type(exc).__name__}: {exc}")
        return None


def fidelities(
    executables: dict,
    outs: dict,
    references: dict[str, Path],
    inputs: dict[str, np.ndarray],
    threads: int,
    on_cuda: dict[str, bool],
    classifier: bool,
    reference_variant: str = "fp32",
) -> list[dict]:
    """Each build's outputs against each reference's (and a quantized build's against TVM fp32's); with
    references on a GPU, against the float model on the CPU too; a pre-quantized model's against its
    operators' own arithmetic too (unfused_reference)."""
    references_out = {
        f"{ref} (CUDA)" if on_cuda[ref] else ref: out for (ref, _, _), out in outs.items() if ref != "tvm"
    }
    if on_cuda["pytorch"] or on_cuda["onnxruntime"]:  # the float model on the CPU: what the GPU answers to
        references_out |= cpu_reference(references, inputs, threads)
    if reference_variant == "int8" and "onnxruntime" in references:
        references_out |= unfused_reference(references["onnxruntime"], inputs, threads)
    if ("tvm", "fp32", False) in outs and any(v != "fp32" for v, _ in executables):
        references_out["tvm fp32"] = outs[("tvm", "fp32", False)]
    fid = [
        {
            "variant": variant,
            "tuned": tuned,
            "reference": ref,
            **fidelity(outs[("tvm", variant, tuned)], ref_out, classifier),
        }
        for variant, tuned in sorted(executables)
        for ref, ref_out in references_out.items()
        if not (ref == "tvm fp32" and variant == "fp32")
    ]
    return fid


def reference_cuda(dev: tvm.runtime.Device | None) -> dict[str, bool]:
    """Which reference runtimes run on the GPU: where the TVM build runs on CUDA and the runtime
    has CUDA (this project installs CPU builds of both; a server with a GPU may install others)."""
    out = {"pytorch": False, "onnxruntime": False}
    if dev is None or dev.dlpack_device_type() != 2:  # kDLCUDA
        return out
    import onnxruntime as ort
    import torch

    out["pytorch"] = torch.cuda.is_available()
    out["onnxruntime"] = "CUDAExecutionProvider" in ort.get_available_providers()
    return out


def cpu_reference(references: dict[str, Path], inputs: dict[str, np.ndarray], threads: int) -> dict:
    """The float model's outputs on the CPU, by ONNX Runtime where the job has an .onnx (none where
    the runtime cannot run the model: it is then reported unavailable already)."""
    try:
        if "onnxruntime" in references:
            out = onnxruntime_runner(references["onnxruntime"], inputs, threads)()
            return {"onnxruntime on the CPU": flatten_outputs(out)}
        if "pytorch" in references:
            out = pytorch_runner(references["pytorch"], inputs, threads)()
            return {"pytorch on the CPU": torch_outputs(out)}
    except Exception:  # a reference that cannot run is not a failure of the job
        pass
    return {}


def unfused_reference(onnx_path: Path, inputs: dict[str, np.ndarray], threads: int) -> dict:
    """A pre-quantized model's outputs as its operators define them: in QDQ form (QLinearConv and the
    like as DequantizeLinear -> float op -> QuantizeLinear) run by ONNX Runtime with its graph
    optimizations off, so each op runs in float and rounds where the model says. ONNX Runtime's fused
    int8 kernels approximate it: on x86 without VNNI they sum pairs of products in int16 (vpmaddubsw),
    which saturates with 8-bit weights. {} where it cannot run (a model over 2 GB, say)."""
    import onnx

    from webapp.pipeline.stages.prequantized import to_qdq

    try:
        model = onnx.load(str(onnx_path))
        to_qdq(model)
        run = onnxruntime_runner(model.SerializeToString(), inputs, threads, optimized=False)
        return {UNFUSED: flatten_outputs(run())}
    except Exception as exc:  # a reference that cannot run is not a failure of the job
        print(f"the unfused reference left out: {type(exc).__name__}: {exc}")
        return {}


UNFUSED = "onnxruntime unfused"  # the reference name of unfused_reference's outputs


def cpu_name() -> str:
    from webapp import targets

    return targets.host().device_name()


def accuracy(executables: dict, dataset: str, dev: tvm.runtime.Device) -> list[dict]:
    """Top-1 accuracy of each TVM build on the dataset's held-out split, one image per run."""
    import tvm
    from tvm import relax

    from webapp.pipeline.datasets import load

    _, _, images, labels = load(dataset)
    predicted = {}
    for key, executable in sorted(executables.items()):
        main = relax.VirtualMachine(executable, dev)["main"]
        predicted[key] = np.array(
            [int(flatten_outputs(main(tvm.runtime.tensor(x[None], dev)))[0].argmax()) for x in images]
        )
    fp32 = predicted.get(("fp32", False))
    rows = []
    for (variant, tuned), classes in predicted.items():
        rows.append(
            {
                "variant": variant,
                "tuned": tuned,
                "dataset": f"{dataset} (held-out {len(labels)} images)",
                "images": len(labels),
                "top1": float(np.mean(classes == labels)),
                # the share of the images whose top-1 class is TVM fp32's (untuned): what quantizing
                # or tuning changed, measured where it means something
                "agree_fp32": None
                if fp32 is None or (variant, tuned) == ("fp32", False)
                else float(np.mean(classes == fp32)),
            }
        )
    return rows


def job_inputs(model: ImportedModel, job: Job) -> dict[str, np.ndarray]:
    """The input every runtime of a job runs on: random of the model's shapes, or for an example
    with a dataset a held-out image (in the range the model was trained and calibrated on)."""
    if job.dataset:
        from webapp.pipeline.datasets import load

        return {model.inputs[0].name: load(job.dataset)[2][:1]}
    return make_inputs(model.inputs)


def benchmark_stage(
    ctx: Context, report: Report, model: ImportedModel, built: Built, inspected: Inspected
) -> Given[None]:
    """The benchmark stage of a job whose code runs here: its builds against the frameworks'
    references on the target's device, each build's kernel profile (the kernel table's times, and
    the graphs coloured by them)."""
    shown = next(key for key, ex in built.executables.items() if ex is built.executable)
    measured = benchmark_job(built.executables, model, ctx.job, ctx.target, report, shown)
    kernels = timed_kernels(inspected.kernels, measured.get("profiles", []))
    time_graphs(ctx.dir, kernels)
    write_model_explorer(ctx.dir)
    return Given(None, measured | {"kernels": kernels})


def benchmark_job(
    executables: dict,
    model: ImportedModel,
    job: Job,
    target: Target,
    report: Callable[..., None],
    shown: tuple[str, bool] | None = None,
) -> dict:
    """The builds against the frameworks' references on the target's device, on a random input (a
    held-out image for an example with a dataset), accuracy on the dataset where there is one, and
    each build's kernel profile; `shown`, the build whose kernels the page lists (model.so)."""
    why = target.why_not_timed()
    if why:
        return {"benchmarks": [], "fidelity": [], "not_timed": why}
    inputs = job_inputs(model, job)
    device = target.device_name()
    budget = job.bench_budget_s
    dev = target.device()
    reference = "int8" if model.prequantized else "fp32"  # ONNX Runtime runs the quantized file itself
    results = benchmark(
        executables,
        inputs,
        model.outputs,
        job.references,
        device,
        budget,
        report,
        dev,
        reference,
        job.quiet_wait_s,
    )
    results["profiles"] = profile_builds(
        executables, inputs, dev, results["benchmarks"], shown, job.dir / "files"
    )
    if job.dataset:
        results["accuracy"] = accuracy(executables, job.dataset, dev)
    return results


# ---------------------------------------------------------------- whole builds of one model compared

MODEL_CHECK_S = 1.0  # per build: 4 slices of 0.25 s each, ~28 runs of ResNet-50
# The gain the records must show to be kept: more than this check's noise here. ResNet-18 with 5 records
# that each beat their rule, whose model was as fast either way: 12 checks gave tuned / default 0.989 to
# 1.088 (median 1.007), and a job's check 0.952.
MODEL_CHECK_GAIN = 0.02


def model_inputs(fused: tvm.IRModule) -> dict[str, np.ndarray] | None:
    """Seeded random inputs of a (fused) module's shapes, or None when an input has no fixed shape."""
    from tvm import relax

    from webapp.pipeline.stages.importers import type_spec

    params = fused["main"].params
    if not all(isinstance(p.ty, relax.TensorType) and p.ty.shape is not None for p in params):
        return None  # a tuple, or a tensor of unknown rank
    specs = [s for p in params for s in type_spec(p.name, p.ty)]
    if not all(isinstance(d, int) for s in specs for d in s.shape):
        return None
    return make_inputs(specs)


def time_models(
    executables: dict, inputs: dict[str, np.ndarray], dev: tvm.runtime.Device, budget_s: float = MODEL_CHECK_S
) -> dict[str, float]:
    """Builds of one model ({name: executable}) timed in turn, as the benchmark times runtimes: the
    median ms of each (of its fastest round)."""
    runs = {name: tvm_runner(exe, inputs, dev) for name, exe in executables.items()}
    for run in runs.values():
        run()
    with timing_slot.hold("builds compared"):
        timed = measure_interleaved(runs, budget_s)
    return {name: t["median_ms"] for name, t in timed.items()}
