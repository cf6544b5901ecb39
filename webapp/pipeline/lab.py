"""The kernel lab's run, in the sandbox (webapp/jobs/lab.py queues it): a kernel in TVMScript and a schedule
written with TVM's own schedule API, typed by a user, built for a target and shown at every level.

    python -m webapp.pipeline.lab <folder>

input/lab.json holds {"code": ..., "target": a preset's name}. The code defines `main`, a TIR PrimFunc
(`@T.prim_func(s_tir=True)`, T being tvm.script.tirx), and optionally `schedule(sch)`, which changes
`sch` (a tvm.s_tir.Schedule of {"main": main}). `T`, `tvm`, `np` and `target` (the preset's TVM target)
are there already. The run writes, in the folder: tir.py (the scheduled kernel), kernel.ll, kernel.s
(filtered as the code views are), mca.txt (llvm-mca's report of the hot loop) and result.json: the
hot loop's lines, llvm-mca's figures, the scheduled kernel checked against the unscheduled one on the
same random inputs, and its time (measured in the timing slot where the target's code runs here,
llvm-mca's estimate elsewhere). An error says the stage and, where the code caused it, the line."""

from __future__ import annotations

import json
import linecache
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import tvm

    from webapp.targets.base import Target

SOURCE = "<lab>"  # the code's file name in tracebacks and TVMScript's diagnostics
RUNS = 20  # timed calls of the scheduled kernel (at least 10 ms in all each)


class LabError(Exception):
    """What went wrong, in the stage it went wrong in, at the code's line where known."""

    def __init__(self, stage: str, message: str, line: int | None = None):
        super().__init__(message)
        self.stage, self.message, self.line = stage, message, line


def code_line(exc: BaseException) -> int | None:
    """The line of the user's code an error comes from: the innermost frame in it, or a TVMScript
    diagnostic's `<lab>:line:column`."""
    found = re.search(re.escape(SOURCE) + r":(\d+):\d+", str(exc))
    if found:
        return int(found.group(1))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SOURCE]
    if frames:
        return frames[-1].lineno
    if isinstance(exc, SyntaxError) and exc.filename == SOURCE:
        return exc.lineno
    return None


def message_of(exc: BaseException) -> str:
    """The error's own words, without TVM's C++ backtrace."""
    text = str(exc).strip() or type(exc).__name__
    text = re.split(r"\n(?:Stack trace|Traceback|  File )", text)[0]
    said = text.find("Error message:")  # a ScheduleError: its reason first, then the IR it quotes
    if said >= 0:
        text = f"{text[: text.find(chr(10))]}\n{text[said:].strip()}\n\n{text[:said].strip()}"
    return f"{type(exc).__name__}: {text.removeprefix(type(exc).__name__ + ': ')}"[:4000]


def stage(name: str) -> Callable[[Callable], Callable]:
    """Runs a stage's function, its exceptions as LabErrors of that stage."""

    def wrap(fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except LabError:
                raise
            except Exception as exc:  # the user's code: any error is theirs to read
                raise LabError(name, message_of(exc), code_line(exc)) from exc

        return run

    return wrap


@stage("parse")
def load(code: str, names: dict) -> tuple:
    """The code run: its `main` PrimFunc and its `schedule` function (None when it has none)."""
    import tvm

    linecache.cache[SOURCE] = (len(code), None, code.splitlines(True), SOURCE)  # TVMScript reads it
    exec(compile(code, SOURCE, "exec"), names)
    func = names.get("main")
    if not isinstance(func, tvm.tirx.PrimFunc):
        found = [k for k, v in names.items() if isinstance(v, tvm.tirx.PrimFunc)]
        if len(found) != 1:
            raise LabError("parse", "The code defines no PrimFunc named main (@T.prim_func(s_tir=True)).")
        func = names[found[0]]
    schedule = names.get("schedule")
    if schedule is not None and not callable(schedule):
        raise LabError("parse", "`schedule` is not a function: def schedule(sch): ...")
    return func.with_attr("global_symbol", "main"), schedule


@stage("schedule")
def scheduled(func: tvm.tirx.PrimFunc, schedule: Callable | None) -> tvm.IRModule:
    """The IRModule of `main` after the user's schedule."""
    import tvm

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    if schedule is not None:
        schedule(sch)
    return sch.mod


def compiled(mod: tvm.IRModule, tvm_target: tvm.target.Target) -> tvm.runtime.Module:
    """The module built by TVM's default pipeline, as a runtime module."""
    import tvm

    executable = tvm.compile(mod, target=tvm_target)
    return getattr(executable, "mod", executable)


build = stage("build")(compiled)


def code_texts(module: tvm.runtime.Module, folder: Path, target: Target) -> dict:
    """kernel.ll, kernel.s (filtered) and the hot loop's llvm-mca report (mca.txt) in the folder; the hot
    loop's lines and llvm-mca's figures (or why none)."""
    from webapp.asm import filter_asm, loop_body
    from webapp.pipeline.reports import mca

    ll, asm = module.inspect_source("ll"), filter_asm(module.inspect_source("s"))
    (folder / "kernel.ll").write_text(ll)
    (folder / "kernel.s").write_text(asm)
    found = loop_body(asm, target.dialect) if target.dialect else None
    out: dict = {"hot_loop": list(found[1]) if found else None, "asm_lines": asm.count("\n")}
    cpu, clock, _ = target.mca_cpu()
    if target.dialect is None:
        figures, report = None, f"llvm-mca does not model {target.name}'s code"
    else:
        figures, report = mca.analyse(asm, target.dialect, target.mca_triple, cpu)
    (folder / "mca.txt").write_text(report)
    out["mca"] = figures if figures is not None else {"why": report}
    out["mca_cpu"] = {"cpu": cpu, "clock_ghz": clock}
    return out


def reference(func: tvm.tirx.PrimFunc, arrays: list[np.ndarray], dev: tvm.runtime.Device) -> list:
    """The unscheduled kernel, built for this CPU and run on copies of `arrays`: its tensors after. The
    outermost loop of each loop nest runs in parallel where TVM's schedule allows it (the same sums in
    the same order, on every core: a 1024x1024 matmul's naive loops take seconds on one)."""
    import tvm

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except tvm.TVMError:  # a kernel without the root block: left serial
        blocks = []
    for block in blocks:
        try:
            sch.parallel(sch.get_loops(block)[0])
        except (tvm.TVMError, IndexError):  # a loop TVM may not parallelise, or none: left serial
            pass
    module = compiled(sch.mod, tvm.target.Target("llvm"))
    tensors = [tvm.runtime.tensor(a.copy(), dev) for a in arrays]
    module["main"](*tensors)
    return tensors


@stage("check")
def checked(func: tvm.tirx.PrimFunc, module: tvm.runtime.Module, arrays: list[np.ndarray]) -> dict:
    """The scheduled kernel run on copies of `arrays`, against the unscheduled one built for this CPU:
    whether every argument agrees after the call (floats within 1e-3 relative), the largest difference."""
    import tvm

    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a.copy(), dev) for a in arrays]
    module["main"](*tensors)
    expected = reference(func, arrays, dev)
    worst, bad = 0.0, []
    for i, (t, e) in enumerate(zip(tensors, expected, strict=True)):
        a, b = t.numpy(), e.numpy()
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64)) if a.size else np.zeros(1)
        scale = max(float(np.abs(b).max()) if b.size else 0.0, 1.0)
        tolerance = 1e-3 * np.abs(b.astype(np.float64)) + 1e-4 * scale if a.dtype.kind == "f" else 0
        if np.any(diff > tolerance):
            bad.append(i)
        worst = max(worst, float(diff.max()))
    arguments = [str(p.name) for p in func.params]
    return {"matches": not bad, "largest_difference": worst, "wrong": [arguments[i] for i in bad]}


@stage("time")
def measured(module: tvm.runtime.Module, arrays: list[np.ndarray]) -> dict:
    """The scheduled kernel's ms a call, with the machine to itself: the median of up to RUNS timed
    calls, as many as fit in about a second (at least 3)."""
    import os

    import tvm

    from webapp.machine import timing_slot

    tensors = [tvm.runtime.tensor(a.copy(), tvm.cpu()) for a in arrays]
    with timing_slot.hold("lab"):
        first = module.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(*tensors).mean * 1e3
        runs = int(min(RUNS, max(3, 1000 / max(first, 1e-3))))
        timer = module.time_evaluator("main", tvm.cpu(), number=1, repeat=runs, min_repeat_ms=10)
        ms = float(np.median(timer(*tensors).results)) * 1e3
    threads = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)
    return {"ms": ms, "by": "measured", "runs": runs, "threads": threads}


def estimated(func: tvm.tirx.PrimFunc, figures: dict, target: Target) -> dict | None:
    """llvm-mca's time for the kernel where its code does not run here: its flop over the hot loop's
    operations a pass, at the loop's cycles a pass, at the preset's clock on its cores."""
    from webapp.pipeline.reports import mca
    from webapp.pipeline.stages.inspect import kernel_flop

    _, clock, _ = target.mca_cpu()
    threads = target.analysis_threads(1)
    ms = mca.predicted_ms(figures, kernel_flop(func), 1, clock, threads)
    return {"ms": ms, "by": "llvm-mca", "threads": threads, "clock_ghz": clock} if ms is not None else None


def dot_product(target: Target) -> dict | None:
    """The target's widest int8 dot-product instruction that is one instruction over 4 bytes a lane (as
    the project's int8 kernels use it, webapp/pipeline/rules/int8_dot.py), its tensor intrinsic
    registered: {"name", "intrinsic", "lanes", "activations"}; None where it has none (AVX2, plain NEON).
    The code reads it as `dot`."""
    from webapp.pipeline.rules import int8, int8_dot

    skip: tuple = ()
    while (kind := target.dot_instruction(skip=skip)) is not None:  # type: ignore[attr-defined]  # a CPU's
        if int8.form(kind) is int8_dot:
            lanes, activations = int8.DOT_INSTRUCTIONS[kind][:2]
            intrinsic = int8.register_dot(kind)
            return {"name": kind, "intrinsic": intrinsic, "lanes": lanes, "activations": activations}
        skip += (kind,)
    return None


def run(spec: dict, folder: Path) -> dict:
    """The lab's steps: load, schedule, build, the code texts, check and time (or estimate)."""
    import tvm

    from webapp.exports.repro_script import random_args
    from webapp.targets import get

    started = time.perf_counter()
    target = get(str(spec["target"]))
    if "tensorize" in str(spec["code"]):  # TVM's tensor intrinsics by name: 2.3 s, for the code that asks
        target.register_tensor_intrinsics()
    names = {"T": tvm.script.tirx, "tvm": tvm, "np": np, "target": target.tvm, "__name__": "lab"}
    names["dot"] = dot_product(target) if re.search(r"\bdot\b", str(spec["code"])) else None
    func, schedule = load(str(spec["code"]), names)
    mod = scheduled(func, schedule)
    (folder / "tir.py").write_text(mod.script())
    module = build(mod, target.tvm)
    built_s = time.perf_counter() - started
    result: dict = {"status": "done", "target": target.name, "device": target.device_name()}
    result |= code_texts(module, folder, target) | {"code_s": round(time.perf_counter() - started, 3)}
    write(folder, result | {"status": "running", "phase": "time"})
    if target.runs_cpu_code_here:  # the time first: the check runs the unscheduled kernel, slow when large
        arrays = random_args(func, 0, target.int8_pair_limit())
        result["time"] = measured(module, arrays)
        write(folder, result | {"status": "running", "phase": "check"})
        result["check"] = checked(func, module, arrays)
    else:
        result["check"] = {"why": f"{target.name}'s code does not run on this server's CPU"}
        figures = result["mca"] if "why" not in result["mca"] else None
        result["time"] = estimated(func, figures, target) if figures else None
    return result | {"build_s": round(built_s, 3), "total_s": round(time.perf_counter() - started, 3)}


def write(folder: Path, result: dict) -> None:
    """result.json, whole or as far as the run has come (status "running": the page shows it so far)."""
    part = folder / "result.json.part"
    part.write_text(json.dumps(result))
    part.replace(folder / "result.json")


def main(folder: Path) -> int:
    import os

    spec = json.loads((folder / "input" / "lab.json").read_text())
    me = os.getpid()
    try:
        result = run(spec, folder)
    except LabError as exc:
        result = {"status": "failed", "stage": exc.stage, "error": exc.message, "line": exc.line}
    except Exception as exc:  # a step outside the stages (an argument's dtype, say): said, not lost
        result = {"status": "failed", "stage": "run", "error": message_of(exc), "line": code_line(exc)}
    finally:
        if os.getpid() != me:  # a process the user's code forked: it says nothing, and goes at once
            os._exit(1)
    write(folder, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
