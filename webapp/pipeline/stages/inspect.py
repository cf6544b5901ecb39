"""Inspect stage: what the compiler made, as files the result page shows.

- the computation graph before and after fusion (JSON and a Graphviz SVG, shapes on the edges);
- the TIR of every kernel, and its slice of the generated LLVM IR and assembly;
- the whole LLVM IR / assembly module, and operator statistics.
"""

from __future__ import annotations

import re
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import tvm

from webapp.asm import filter_asm, hot_loop
from webapp.catalog import CODE_VIEWS, KERNEL_CONSTANTS, PREPACK_TIR, UNSCHEDULED_TIR, code_file, file_stem
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.passes.winograd import direct_flop
from webapp.pipeline.reports import lint, mca
from webapp.pipeline.reports.device_code import write_device_code
from webapp.pipeline.reports.facts import worst_layer
from webapp.pipeline.reports.graphs import draw_graphs, error_graphs, kernel_blocks, op_counts, relax_graph
from webapp.pipeline.reports.model_explorer import write_model_explorer
from webapp.pipeline.rules.schedules import PREPACK, PREPACKS_ATTR
from webapp.pipeline.stages.bench import bench_threads
from webapp.pipeline.stages.optimize import relax_script
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages.build import Built
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.pipeline.stages.optimize import Fusion, Optimized
    from webapp.pipeline.stages.quantize.variants import QuantizedJob

CODE_SUFFIXES = {Path(v.path).suffix for v in CODE_VIEWS.values() if v.path}  # the texts ir.zip holds


# ---------------------------------------------------------------- graph


# ---------------------------------------------------------------- generated code


class CodeIndex:
    """Where each function of a module's LLVM IR and assembly starts, found in one pass over each
    text (a search per kernel over the whole text took most of the inspect stage on DenseNet-121)."""

    def __init__(self, ll: str, asm: str):
        self.ll, self.asm = ll, asm
        self.ll_starts = {m.group(1): m.start() for m in re.finditer(r"^define[^\n]*?@([^\s(]+)\(", ll, re.M)}
        self.asm_starts = {m.group(1): m.start() for m in re.finditer(r"^([^\s:#]+):\n", asm, re.M)}

    def llvm_function(self, name: str) -> str:
        start = self.ll_starts.get(name)
        if start is None:
            return ""
        end = self.ll.find("\n}", start)
        return self.ll[start : end + 2 if end >= 0 else len(self.ll)]

    def asm_function(self, name: str) -> str:
        start = self.asm_starts.get(name)
        if start is None:
            return ""
        end = re.compile(r"^\.Lfunc_end\d+:", re.M).search(self.asm, start)
        return self.asm[start : end.end() if end else len(self.asm)]

    def kernel_code(self, kernel: str) -> tuple[str, str]:
        """A kernel's LLVM IR and assembly: its compute body, the parallel loop bodies it hands to
        the thread pool (where the hot loops are), and its packed-call wrapper."""
        names = [f"{kernel}_compute_", f"__tvm_ffi_{kernel}", kernel]
        ll_parts = [t for t in (self.llvm_function(n) for n in names) if t]
        asm_parts = [t for t in (self.asm_function(n) for n in names) if t]
        lambdas = sorted(set(re.findall(r"@(__tvm_parallel_lambda[.\d]*)\b", "\n".join(ll_parts))))
        ll_parts += [self.llvm_function(n) for n in lambdas]
        asm_lambdas = sorted(set(re.findall(r"(\.L__tvm_parallel_lambda[.\d]*)\b", "\n".join(asm_parts))))
        asm_parts += [self.asm_function(n) for n in asm_lambdas]
        return "\n\n".join(t for t in ll_parts if t), "\n\n".join(t for t in asm_parts if t)


def host_code_module(executable: tvm.runtime.Executable) -> tvm.runtime.Module | None:
    for m in executable.mod.imports:
        if m.kind == "llvm":
            return m
    return None


# ---------------------------------------------------------------- the stage


def inspect_build(
    imported: tvm.IRModule,
    fused: tvm.IRModule,
    lowered: tvm.IRModule,
    executable: tvm.runtime.Executable,
    job_dir: Path,
    labels: dict[str, str],
    target: Target,
    report: Callable[..., None] = lambda f: None,
    graphs: dict | None = None,
    fusion: Fusion | None = None,
) -> dict:
    """The code views and kernel table of the build the page shows (`graphs`: drawn after optimize); for a
    GPU build its device code too (reports/device_code.py), the LLVM IR and assembly the host side's."""
    views, files = job_dir / "views", job_dir / "files"
    (views / "kernels").mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)

    graphs = graphs or draw_graphs(imported, fused, job_dir, fusion)
    report(0.4)

    host = host_code_module(executable)
    ll = host.inspect_source("ll") if host is not None else ""
    asm = host.inspect_source("s") if host is not None else ""
    (job_dir / cast(str, CODE_VIEWS["llvm"].whole)).write_text(ll)  # the whole module's views
    (job_dir / cast(str, CODE_VIEWS["asm"].whole)).write_text(asm)
    report(0.6)

    kernels, texts, executed = kernel_rows(
        lowered, fused, CodeIndex(ll, asm), labels, graphs["fused"]["ops"], fusion, job_dir, target
    )
    report(0.8)
    static = hot_loops(kernels, texts, executed, job_dir, target)
    device = write_device_code(host, target, [k["name"] for k in kernels], job_dir)
    sass = (files / device["sass"]).read_text() if device and device.get("sass") else ""
    for k in kernels if device else []:
        assert device is not None  # the loop runs only with device code
        resources = device["kernels"][k["name"]].get("resources")
        k.update({"device_functions": device["kernels"][k["name"]]["functions"]})
        k.update({"gpu": resources} if resources else {})
    for k in kernels:  # the linter's findings on the build (reports/lint.py)
        k["lint"] = lint.findings_or_why(k, *texts[k["name"]], target)
    report(0.9)

    (job_dir / code_file("relax-optimized")).write_text(relax_script(lowered))
    (job_dir / code_file("bytecode")).write_text(executable.as_text())
    write_ir_zip(job_dir)
    return (
        {
            "graphs": graphs,
            "kernels": kernels,
            "code_sizes": {"llvm_ir_bytes": len(ll), "asm_bytes": len(asm)},
            "model_flop": sum(k["flop"] * k["calls"] for k in kernels),
            "instructions": instruction_counts(asm) | instruction_counts(sass, COUNTED_SASS, SASS_MNEMONIC),
            "dtype_census": dtype_census(lowered),
        }
        | ({"device_code": device} if device else {})
        | ({"mca": static} if static else {})
    )


def kernel_rows(
    lowered: tvm.IRModule,
    fused: tvm.IRModule,
    code: CodeIndex,
    labels: dict,
    calls: dict,
    fusion: Fusion | None,
    job_dir: Path,
    target: Target,
) -> tuple[list[dict], dict[str, tuple[str, str]], dict[str, float]]:
    """The kernel table's rows of the build, each kernel's code views and reproducer files written:
    (rows, each kernel's (TIR, assembly as the page shows it), the operations each executes)."""
    kernels = []
    layers = fusion.layers() if fusion else {}
    blocks = kernel_blocks(job_dir)
    names = {gv.name_hint for gv in fused.get_global_vars()}
    lowered_names = {gv.name_hint for gv in lowered.get_global_vars()}
    prepacks = dict((lowered.attrs or {}).get(PREPACKS_ATTR, {}))  # the repackings folded at build
    texts: dict[str, tuple[str, str]] = {}  # kernel -> (its TIR, its assembly as the page shows it)
    executed: dict[str, float] = {}  # kernel -> the operations it executes (Winograd: its own)
    small_constants = call_constants(lowered)
    for gv, func in sorted(lowered.functions_items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        kernel_ll, kernel_asm = code.kernel_code(name)
        texts[name] = (func.script(), filter_asm(kernel_asm))
        unscheduled = fused[name] if name in names else func  # a weight repacking has no other form
        # counted on the kernel before scheduling: the counter cannot read tensorized code
        executed[name] = executed_flop(unscheduled)
        direct = direct_flop(unscheduled)
        prepack = prepacks.get(name)  # printed here, for the shown build only
        if prepack is None and name + PREPACK in lowered_names:
            prepack = lowered[name + PREPACK]
        kernel_files = {"tir": texts[name][0], "llvm": kernel_ll, "asm": kernel_asm}
        write_kernel_files(job_dir, name, kernel_files, unscheduled, prepack, small_constants.get(name))
        kernels.append(
            {
                "name": name,
                "schedule": labels.get(name, "naive"),
                "asm_lines": kernel_asm.count("\n"),
                "calls": calls.get(name, 0),
                "flop": direct if direct is not None else executed[name],
                "dtypes": kernel_dtypes(func),
                "layers": layers.get(name.removesuffix(PREPACK), []),
                "blocks": blocks.get(name.removesuffix(PREPACK), []),
                "reproducer": target.reproducible,  # its texts written: /r/<id>/repro/<name>.zip (repro.py)
            }
        )
    return kernels, texts, executed


def write_kernel_files(
    job_dir: Path,
    name: str,
    texts: dict[str, str],
    unscheduled: tvm.tirx.PrimFunc,
    prepack: tvm.tirx.PrimFunc | None,
    constants: dict[str, np.ndarray] | None,
) -> None:
    """A kernel's code views (`texts`: view -> its text), and its reproducer's files: its TIR before
    scheduling, its weights' repacking, the small constants the model passes it."""
    for view, text in texts.items():
        (job_dir / code_file(view, name)).write_text(text)
    (job_dir / UNSCHEDULED_TIR.format(kernel=file_stem(name))).write_text(unscheduled.script())
    if prepack is not None:
        (job_dir / PREPACK_TIR.format(kernel=file_stem(name))).write_text(prepack.script())
    if constants:
        np.savez(
            job_dir / KERNEL_CONSTANTS.format(kernel=file_stem(name)),
            **constants,  # type: ignore[arg-type]  # numpy's stub: a ** key might be allow_pickle
        )


def hot_loops(kernels: list[dict], texts: dict, executed: dict, job_dir: Path, target: Target) -> dict | None:
    """Each kernel's hot loop (the loop the Assembly view marks, its row's "hot_loop"): llvm-mca's,
    analysed (reports/mca.py, its summary returned), else the one with the most vector instructions.
    A board's kernels are predicted for the board's own cores, a server's at the threads its runs use."""
    static = None
    try:
        if target.dialect is not None:
            threads = target.analysis_threads(bench_threads())
            static = mca.analyse_kernels(kernels, texts, job_dir, target, executed, threads)
    except Exception as exc:  # llvm-mca's view is an extra: a job never fails of it
        print(f"llvm-mca's analysis left out: {type(exc).__name__}: {exc}")
    for k in kernels:
        span = (k.get("mca") or {}).get("lines")
        if not span and target.dialect is not None:
            span = hot_loop(texts[k["name"]][1], target.dialect)
        k["hot_loop"] = {"lines": list(span), "by": "mca" if "mca" in k else "vectors"} if span else None
    return static


TOP_KERNELS = 5  # the kernels with the longest estimated time, named in kernel_estimates' summary
MCA_BUDGET_S = 60  # llvm-mca's time for one build's kernels: the rest are left unanalysed, counted


def estimate_kernels(
    executable: tvm.runtime.Executable,
    fused: tvm.IRModule,
    lowered: tvm.IRModule,
    target: Target,
    seen: dict | None = None,
) -> tuple[list[dict], dict]:
    """llvm-mca's estimate of one build's kernels on the target's core (a board's, for code that does
    not run here): each kernel's hot loop analysed as the inspect stage analyses the job's kernels, its
    predicted ms over a model run (reports/mca.py: predicted_ms, operands in the L1 cache, the core's
    nominal clock, its cores) for its calls. Returns (a row per kernel analysed, the flop of all kernels
    and of those analysed): what is not analysed (no loop of vector arithmetic) is counted, not guessed.
    `seen`: llvm-mca's figures by assembly text, shared among builds whose kernels repeat."""
    cpu, clock, _ = target.mca_cpu()
    threads = target.analysis_threads(bench_threads())
    host = host_code_module(executable)
    code = CodeIndex("", host.inspect_source("s") if host is not None else "")
    calls = op_counts(relax_graph(fused))
    names = {gv.name_hint for gv in fused.get_global_vars()}
    seen = {} if seen is None else seen
    kernels, flop = [], {"all": 0.0, "analysed": 0.0}
    deadline = time.monotonic() + MCA_BUDGET_S
    for gv, func in sorted(lowered.functions_items(), key=lambda kv: kv[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc) or target.dialect is None:
            continue
        name, n = gv.name_hint, calls.get(gv.name_hint, 0)
        ops = executed_flop(fused[name] if name in names else func)
        flop["all"] += ops * n
        asm = filter_asm(code.kernel_code(name)[1])
        if asm not in seen and time.monotonic() < deadline:
            seen[asm] = mca.analyse(asm, target.dialect, target.mca_triple, cpu)[0]
        figures = seen.get(asm)
        ms = mca.predicted_ms(figures, ops, n, clock, threads) if figures else None
        if ms is None or figures is None:
            continue
        flop["analysed"] += ops * n
        kernels.append(
            {"name": name, "calls": n, "predicted_ms": round(ms, 6)}
            | {k: figures[k] for k in ("cycles_per_iteration", "limit", "bottleneck")}
        )
    return kernels, flop


def kernel_estimates(
    executable: tvm.runtime.Executable, fused: tvm.IRModule, lowered: tvm.IRModule, target: Target
) -> dict:
    """estimate_kernels' sum for one build (a board's decode step: board_generation.py), with the
    kernels that take longest. The sum is the compute bound: a model also waits for its weights from
    memory, which the estimate leaves out."""
    kernels, flop = estimate_kernels(executable, fused, lowered, target)
    total = sum(k["predicted_ms"] for k in kernels)
    cpu, clock, _ = target.mca_cpu()
    return {
        "cpu": cpu,
        "clock_ghz": clock,
        "threads": target.analysis_threads(bench_threads()),
        "kernels": sum(1 for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)),
        "analysed": len(kernels),
        "analysed_flop_share": round(flop["analysed"] / flop["all"], 3) if flop["all"] else None,
        "predicted_ms": round(total, 6),
        "predicted_tokens_per_s": round(1e3 / total, 2) if total else None,
        "top": sorted(kernels, key=lambda k: -k["predicted_ms"])[:TOP_KERNELS],
    }


# Instructions worth counting in the assembly: integer dot products (x86 VNNI, AVX-512BW / AVX2
# multiply-adds, Arm dot product and i8mm matrix multiply, NEON's widening multiply and pairwise
# add) and float fused multiply-adds.
COUNTED_INSTRUCTIONS = {
    "vpdpbusd": "uint8 x int8 dot product, 4 per lane (AVX-512 VNNI / AVX-VNNI)",
    "vpdpwssd": "int16 x int16 dot product, 2 per lane (VNNI)",
    "vpmaddubsw": "uint8 x int8 multiply-add to int16 (AVX2 / AVX-512BW)",
    "vpmaddwd": "int16 multiply-add to int32",
    "sdot": "int8 dot product, 4 per lane (Arm dot product)",
    "udot": "uint8 dot product, 4 per lane (Arm dot product)",
    "smmla": "int8 2x8 by 8x2 matrix multiply into a 2x2 int32 tile (Arm i8mm)",
    "smull": "int8 x int8 multiply to int16 (Arm NEON without a dot product)",
    "smlal": "int8 x int8 multiply added into int16 (Arm NEON)",
    "sadalp": "int16 pairs added into int32 (Arm NEON)",
    "vfmadd": "float fused multiply-add (x86 FMA)",
    "fmla": "float fused multiply-add (Arm NEON)",
}


ASM_MNEMONIC = r"^\s+([a-z][a-z0-9]*)"
# The same in NVIDIA's SASS (nvdisasm), for a CUDA build: dp4a, float FMA, tensor-core MMA.
COUNTED_SASS = {
    "IDP.4A": "int8 dot product of 4 pairs into int32 (dp4a)",
    "FFMA": "float fused multiply-add",
    "HMMA": "tensor-core matrix multiply-add (fp16/tf32)",
    "IMMA": "tensor-core matrix multiply-add (int8)",
}
SASS_MNEMONIC = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)"


def instruction_counts(
    text: str, counted: Iterable[str] = COUNTED_INSTRUCTIONS, mnemonic: str = ASM_MNEMONIC
) -> dict[str, int]:
    """Occurrences of each counted mnemonic (and its variants) in the assembly (or the SASS)."""
    mnemonics = re.findall(mnemonic, text, re.M)
    counts = {name: sum(1 for m in mnemonics if m.startswith(name)) for name in counted}
    return {name: n for name, n in counts.items() if n}


def kernel_dtypes(func: tvm.tirx.PrimFunc) -> str:
    """A kernel's signature by dtype: its inputs' dtypes -> its outputs' (the last parameter)."""
    dtypes = [str(p.dtype) for p in func.params if hasattr(p, "dtype")]
    return f"{' x '.join(dict.fromkeys(dtypes[:-1]))} -> {dtypes[-1]}" if dtypes else ""


def dtype_census(lowered: tvm.IRModule) -> dict:
    """The kernels counted by signature (input dtypes -> output dtype), and the tensors the kernels
    read and write counted by element type: where the arithmetic happens in int8, int32 or float32."""
    tensors: dict[str, int] = {}
    kernels: dict[str, int] = {}
    for _, func in lowered.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            for p in func.params:
                if hasattr(p, "dtype"):
                    tensors[str(p.dtype)] = tensors.get(str(p.dtype), 0) + 1
            sig = kernel_dtypes(func)
            kernels[sig] = kernels.get(sig, 0) + 1
    return {"tensors": tensors, "kernels": kernels}


def kernel_flop(func: tvm.tirx.PrimFunc) -> float:
    """Floating-point operations of one call (TVM's estimate: multiply-add counts as two). A Winograd
    kernel counts the direct convolution it computes (webapp.pipeline.passes.winograd.direct_flop): its
    GFLOP/s is then the effective rate, comparable with a direct kernel's, and a model's count does
    not depend on which algorithm ran."""
    direct = direct_flop(func)
    return direct if direct is not None else executed_flop(func)


def executed_flop(func: tvm.tirx.PrimFunc) -> float:
    """The operations a call executes, by TVM's estimate (0 where it cannot count them)."""
    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # the estimator rejects some scheduled loops; the count is informative only
        return 0.0


def write_ir_zip(job_dir: Path) -> None:
    """Every IR text of the job in one download."""
    with zipfile.ZipFile(job_dir / "files" / "ir.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted((job_dir / "views").rglob("*")):
            if path.is_file() and path.suffix in CODE_SUFFIXES:
                z.write(path, path.relative_to(job_dir / "views"))
        for path in sorted((job_dir / "files").glob("device.*")):
            z.write(path, path.name)
        for view in CODE_VIEWS.values():
            if view.whole:
                z.write(job_dir / view.whole, Path(view.whole).name)


@dataclass
class Inspected:
    kernels: list[dict]  # the kernel table's rows, as result.json keeps them (the benchmark adds times)


def inspect_stage(
    ctx: Context,
    report: Report,
    model: ImportedModel,
    optimized: Optimized,
    built: Built,
    quantized: QuantizedJob | None,
) -> Given[Inspected]:
    """The code views and kernel table; for a quantized job the graphs coloured by each quantized
    layer's error against fp32 (the page then shows the quantized model's fused graph)."""
    graphs = None if quantized else optimized.graphs
    fusion = built.fusion or optimized.fusion
    found = inspect_build(
        model.mod,
        built.fused,
        built.lowered,
        built.executable,
        ctx.dir,
        built.labels,
        ctx.target,
        report,
        graphs,
        fusion,
    )
    if quantized:
        layer_errors = quantized.to_json()["quantization"].get("layer_errors", [])
        worst = (worst_layer(layer_errors) or {}).get("layer")
        error_graphs(ctx.dir, layer_errors, worst, model.layers)
    write_model_explorer(ctx.dir)  # written again with the times after the benchmark
    return Given(Inspected(found["kernels"]), found)


SMALL_CONSTANT = 4096  # elements: scales, zero points, clip bounds, a bias; not a weight


def call_constants(lowered: tvm.IRModule) -> dict[str, dict[str, np.ndarray]]:
    """{kernel: the small constants the model's main passes it at its first call, by parameter (arg<i>)}:
    its reproducer runs the kernel on them rather than on random values, which would put a
    requantization's lower clip bound above its upper one (and a cast out of its type's range)."""
    from tvm import relax

    out: dict[str, dict[str, np.ndarray]] = {}
    for block in lowered["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            name = getattr(call.op, "name_hint", None) if isinstance(call, relax.Call) else None
            if name is not None and name not in out:
                out[name] = {
                    f"arg{i}": arg.value.numpy()
                    for i, arg in enumerate(call.args)
                    if isinstance(arg, tvm.ir.Constant) and int(np.prod(arg.value.shape)) <= SMALL_CONSTANT
                }
    return out
