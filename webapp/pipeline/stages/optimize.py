"""Optimize stage: the Relax pipeline for the target, run pass by pass, keeping the IR after each pass."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tvm
from tvm import relax

from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.passes.legalize import legalize_passes
from webapp.pipeline.passes.rewrites import LAYOUT_PASS, align, computed, fold_with_numpy, main_bindings
from webapp.pipeline.passes.running import RunningPass
from webapp.pipeline.passes.tvm_gaps import around_tvm_gaps
from webapp.pipeline.reports.graphs import draw_graphs
from webapp.pipeline.stages.onnx_fold import fold_text
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages.importers import ImportedModel

# Passes whose module we keep for the graph views.
FUSION_PASS = "FuseTIR"
FUSE_OPS_PASS = "FuseOps"  # the pass that groups the bindings into kernels
# Ops whose legalization computes the output shape with a shape function of its own (canonical()).
SHAPE_FUNCTION_OPS = ("relax.dynamic_strided_slice",)


@dataclass
class PassRecord:
    index: int
    name: str
    seconds: float
    changed: bool
    file: str | None  # relative to the job folder; None when the IR did not change
    onnx: bool = False  # a step on the ONNX graph before TVM's import (its file a text, not Relax)


@dataclass
class Optimized:
    lowered: tvm.IRModule  # ready for tvm.compile(..., relax_pipeline=None)
    fused: tvm.IRModule  # after operator fusion, before lowering to the VM: the graph after fusion
    passes: list[PassRecord]
    fusion: Fusion  # which kernel each binding of the imported model went into
    graphs: dict | None = None  # the graphs drawn of it (reports/graphs.py), as result.json keeps them


def relax_script(mod: tvm.IRModule) -> str:
    """TVMScript of the Relax functions only (the kernels' TIR is shown per kernel)."""
    funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    return tvm.IRModule(funcs).script()


@tvm.instrument.pass_instrument
class CaptureTopLevelPasses:
    """Records the module after each top-level pass.

    FoldConstant builds and runs TIR internally, which reports hundreds of nested passes:
    only passes at depth <= 3 (pipeline > sequential > pass) are the pipeline's own.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.started: list[float] = []
        self.snapshots: list[tuple[str, float, tvm.IRModule]] = []
        self.running = ""  # the top-level pass running now: the one a failure names

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        self.depth += 1
        self.started.append(time.perf_counter())
        if self.depth <= 3 and info.name not in ("sequential", "_pipeline"):
            self.running = info.name

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        depth, started = self.depth, self.started.pop()
        self.depth -= 1
        if depth <= 3 and info.name not in ("sequential", "_pipeline"):
            # a copy: a later Python pass (dlight's, for GPUs) may change this module in place
            self.snapshots.append((info.name, time.perf_counter() - started, mod.clone()))


def canonical(mod: tvm.IRModule) -> tvm.IRModule:
    """Batch norm after a convolution folded into its weights and a bias, any other batch norm
    decomposed into plain arithmetic (which fuses into the kernel before it): the form both the float
    pipeline and quantization (webapp.pipeline.stages.quantize) start from."""
    if not batch_norm_in_training_mode(mod):  # both passes compute any batch norm as in inference
        mod = relax.transform.FoldBatchnormToConv2D()(mod)
        mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = around_tvm_gaps(mod)  # dropout, bool comparisons and sums, as plain TVM fails on them
    mod = fold_with_numpy(mod)  # the batch norms' arithmetic on constants, fast
    # FoldConstant tries each op by legalizing it; a dynamic_strided_slice's legalization emits a
    # shape function that FoldConstant (a function pass) never adds to the module, leaving a call to
    # an undefined function. Legalized first, there is nothing of it left for FoldConstant to try.
    mod = relax.transform.LegalizeOps(
        skip_ops=[op for op in tvm.ir.Op.list_op_names() if op not in SHAPE_FUNCTION_OPS]
    )(mod)
    return relax.transform.FoldConstant()(mod)


def batch_norm_in_training_mode(mod: tvm.IRModule) -> bool:
    """Whether a batch norm normalizes by the batch's own statistics (ONNX training_mode=1)."""
    batch_norm, found = tvm.ir.Op.get("relax.nn.batch_norm"), []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(batch_norm) and expr.attrs.training:
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def optimize(
    mod: tvm.IRModule,
    target: Target,
    job_dir: Path,
    report: Callable[..., None] = lambda f: None,
    layer_of: dict[str, str] | None = None,
    first: int = 0,
) -> Optimized:
    pass_dir = job_dir / "views" / "passes"
    pass_dir.mkdir(parents=True, exist_ok=True)
    capture, trace = CaptureTopLevelPasses(), FusionTrace(mod, layer_of or {})
    with target.tvm, tvm.transform.PassContext(opt_level=3, instruments=[capture, trace, RunningPass()]):
        pipeline = legalize_passes(target) + target.lower_passes()
        try:
            lowered = tvm.transform.Sequential(pipeline, name="_pipeline")(canonical(mod))
        except Exception as exc:
            if not capture.running:
                raise
            done = f" (after {len(capture.snapshots)} passes that ran)" if capture.snapshots else ""
            raise StageError(f"TVM's pass {capture.running} failed{done}: {error_message(exc)}") from exc

    passes, previous, fused = [], relax_script(mod), None
    for i, (name, seconds, snapshot) in enumerate(capture.snapshots, start=first):
        report((i + 1 - first) / len(capture.snapshots))
        text = relax_script(snapshot)
        changed = text != previous
        file = None
        if changed:
            file = f"views/passes/{i:02d}_{name}.py"
            (job_dir / file).write_text(text)
        passes.append(PassRecord(i, name, seconds, changed, file))
        previous = text
        if name == FUSION_PASS:
            fused = snapshot
    fused = fused if fused is not None else lowered
    capture.snapshots.clear()  # kept alive by TVM as the trace is (FusionTrace.fusion)
    return Optimized(lowered=lowered, fused=fused, passes=passes, fusion=trace.fusion())


@dataclass
class Fusion:
    """Which kernel each binding of the imported model went into, and which went into each call."""

    kernel_of: dict[str, str]  # a var of the imported main -> its kernel
    # a call of the fused main, by its place among main's bindings (names repeat there: two "lv"), ->
    # the imported vars it computes
    sites: dict[int, list[str]]
    layer_of: dict[str, str]  # a var of the imported main -> its source layer (ImportedModel.layers)
    by_kernel: dict[str, list[str]] | None = None  # layers(), where through() knows it better

    def layers(self) -> dict[str, list[str]]:
        """kernel -> the source layers fused into it (of every call of it), in the model's order."""
        if self.by_kernel is not None:
            return self.by_kernel
        out: dict[str, list[str]] = {}
        for var, layer in self.layer_of.items():
            kernel = self.kernel_of.get(var)
            if kernel is not None and layer not in out.setdefault(kernel, []):
                out[kernel].append(layer)
        return out

    def through(self, origin: dict[str, list[str]], layer_of: dict[str, str]) -> Fusion:
        """This fusion of a module made from another (the quantized model from the float one) in
        that module's names: `origin` maps each var here to the vars it computes there. A var there
        computed in several kernels (a layer's input quantized in the one before) is the last's."""
        kernel_of: dict[str, str] = {}
        by_kernel: dict[str, list[str]] = {}
        for var, computes in origin.items():  # in the order they were made
            for there in computes if var in self.kernel_of else []:
                kernel_of[there] = self.kernel_of[var]
                layers = by_kernel.setdefault(self.kernel_of[var], [])
                if there in layer_of and layer_of[there] not in layers:
                    layers.append(layer_of[there])
        sites = {
            place: list(dict.fromkeys(there for v in group for there in origin.get(v, [])))
            for place, group in self.sites.items()
        }
        return Fusion(kernel_of, sites, layer_of, by_kernel)

    def site_layers(self, binding: int) -> list[str]:
        """The source layers of one call in the fused main (the binding at that place)."""
        site = set(self.sites.get(binding, []))
        return list(dict.fromkeys(layer for v, layer in self.layer_of.items() if v in site))


@tvm.instrument.pass_instrument
class FusionTrace:
    """The module before and after FuseOps, for fusion_map."""

    def __init__(self, imported: tvm.IRModule, layer_of: dict[str, str]):
        self.imported, self.layer_of, self.before, self.after = imported, layer_of, None, None
        self.origin: dict[relax.Var, relax.Var]
        self.unconverted, self.origin = None, {}  # the layout pass's input; its vars -> the input's

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == FUSE_OPS_PASS:
            self.before = mod.clone()
        elif info.name == LAYOUT_PASS:
            self.unconverted = mod

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == FUSE_OPS_PASS:
            self.after = mod.clone()
        elif info.name == LAYOUT_PASS and not mod.same_as(self.unconverted):
            self.origin = align(self.unconverted, mod)

    def fusion(self) -> Fusion:
        """The fusion as traced; an empty one if it cannot be followed (the insight views then show
        less, the job goes on). The trace lets go of its modules then: TVM keeps an instrument alive
        after its pass context (the leak held a 2 GB model's weights three times over)."""
        try:
            return self.follow() if self.after is not None else Fusion({}, {}, self.layer_of)
        except Exception:  # noqa: BLE001 - never a job's failure
            traceback.print_exc()
            return Fusion({}, {}, self.layer_of)
        finally:
            self.imported = self.before = self.after = self.unconverted = None
            self.origin = {}

    def follow(self) -> Fusion:
        kernel_of, sites = fusion_map(self.before, self.after)
        # A tuple made of a kernel's result (a batch norm's, decomposed: (y, mean, var)), and a field
        # taken from it, go with that kernel.
        root: dict = {}  # a var with no kernel of its own -> the one it went with
        for b in main_bindings(self.before):
            value, fields = b.value, []
            if isinstance(value, relax.Tuple):
                fields = [f for f in value.fields if isinstance(f, relax.Var)]
            elif isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
                fields = [value.tuple_value]
            source = next((f for f in fields if f in kernel_of), None)
            if b.var not in kernel_of and source is not None:
                kernel_of[b.var], root[b.var] = kernel_of[source], root.get(source, source)
        if self.origin:  # the layout pass's vars as the ones they stand for
            back = self.origin.get
            kernel_of = {back(v, v): k for v, k in kernel_of.items()}
            root = {back(v, v): back(r, r) for v, r in root.items()}
            sites = {v: [back(g, g) for g in group] for v, group in sites.items()}
        # A binding a pass before fusion folded into another (a convolution into the batch norm
        # after it, a bias reshape into its constant) goes with the first reader that has a kernel.
        # Bindings computed from constants alone (weights made by ops, a bias reshape) are weights,
        # not a layer of the kernel that reads them.
        bindings = main_bindings(self.imported)
        readers: dict = {}
        for b in bindings:
            for var in relax.analysis.free_vars(b.value):
                readers.setdefault(var, []).append(b.var)
        inputs_computed = computed(self.imported)  # what depends on the model's inputs
        for b in reversed(bindings):
            reader = next((r for r in readers.get(b.var, []) if r in kernel_of), None)
            if b.var not in kernel_of and reader is not None and b.var in inputs_computed:
                kernel_of[b.var], root[b.var] = kernel_of[reader], root.get(reader, reader)
        for group in sites.values():
            group += [v for v, r in root.items() if r in group]
        # By name from here, the imported function's vars only: their names are unique (the
        # importer's block builder), and a var a pass made may have taken one of them.
        imported = {b.var for b in bindings}
        place = {b.var: i for i, b in enumerate(main_bindings(self.after))}
        return Fusion(
            {v.name: k for v, k in kernel_of.items() if v in imported},
            {place[v]: [g.name for g in group if g in imported] for v, group in sites.items() if v in place},
            self.layer_of,
        )


def fusion_map(before: tvm.IRModule, after: tvm.IRModule) -> tuple[dict, dict]:
    """Each var of `before`'s main -> the kernel computing it, and each call of `after`'s main -> the
    vars of `before` it computes, from the modules before and after FuseOps.

    A binding FuseOps leaves in main keeps its var and names its kernel in its call_tir. A fused group
    becomes a call of a function of its own (FuseTIR then makes it the kernel of that name), and
    groups of the same structure share one function: each call's group is found in `before` by
    matching the function's body backwards from its output, from the call's own arguments. Vars are
    told apart as objects, not by name: a pass names the vars it makes as it likes ("lv3" may be
    taken), and keeps the var of every binding it leaves in place.
    """
    defs = {b.var: b.value for b in main_bindings(before)}
    # before's fields of a tuple-valued binding (a split's parts), by (the tuple's var, index)
    fields = {
        (value.tuple_value, value.index): var
        for var, value in defs.items()
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var)
    }
    kernel_of: dict = {}
    sites: dict = {}
    origin: dict = {}  # a var of after's main -> the var of before's main it stands for
    for binding in main_bindings(after):
        value, var = binding.value, binding.var
        if isinstance(value, relax.Tuple):  # a tuple of vars: its fields, each as before's var
            origin[var] = [origin.get(f, f) if isinstance(f, relax.Var) else f for f in value.fields]
            continue
        if isinstance(value, relax.TupleGetItem) and isinstance(origin.get(value.tuple_value), list):
            origin[var] = origin[value.tuple_value][value.index]  # a field of a tuple (a group's outputs)
            continue
        if isinstance(value, relax.TupleGetItem) and (origin.get(value.tuple_value), value.index) in fields:
            # a field of one kernel's tuple result (GPT-2's query, key and value, split apart)
            origin[var] = fields[origin[value.tuple_value], value.index]
            continue
        if var in defs:  # a binding FuseOps left as it was
            origin.setdefault(var, var)
        if not isinstance(value, relax.Call):
            continue
        if isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_tir":
            kernel_of[var], origin[var], sites[var] = value.args[0].name_hint, var, [var]
        elif isinstance(value.op, tvm.ir.GlobalVar) and isinstance(after[value.op], relax.Function):
            args = [origin.get(a, a) if isinstance(a, relax.Var) else a for a in value.args]
            found, group = match_group(after, value.op.name_hint, args, defs, kernel_of)
            if group:
                sites[var] = list(dict.fromkeys(group.values()))
                origin[var] = found if isinstance(after[value.op].body.body, relax.Tuple) else found[0]
    return kernel_of, sites


def match_group(
    after: tvm.IRModule, kernel: str, args: list, defs: dict, kernel_of: dict
) -> tuple[list, dict]:
    """The bindings of before's main that a call of the fused function `kernel` (on `args`, as before's
    vars) computes, matched backwards from each of its outputs: (before's var of each output, or None;
    the group: the function's vars -> before's), each matched var given `kernel` in `kernel_of`."""
    func = after[kernel]
    match = GroupMatch(
        {b.var: b.value for b in main_bindings(after, kernel)},
        defs,
        dict(zip(func.params, args, strict=True)),
        kernel_of,
    )
    out = func.body.body  # its output, or a tuple of them
    found: list[relax.Var | None]
    found, group = [], {}
    for field in out.fields if isinstance(out, relax.Tuple) else [out]:
        found.append(None)
        for candidate in defs if isinstance(field, relax.Var) else []:
            match.group = {}
            if candidate not in kernel_of and match.var(field, candidate):
                found[-1] = candidate
                group.update(match.group)
                kernel_of.update(dict.fromkeys(match.group.values(), kernel))
                break
    return found, group


class GroupMatch:
    """Whether a fused function's body computes what bindings of the unfused main do, given what the
    function's parameters stand for (a var of main, or a constant); `group` collects the function's
    vars -> main's vars of the match being tried. It walks the two bodies with a stack of pairs to
    compare, not by recursion: a chain of thousands of ops is one fused group."""

    def __init__(self, inner: dict, defs: dict, params: dict, taken: dict):
        self.inner, self.defs, self.params, self.taken = inner, defs, params, taken
        self.group: dict = {}

    def var(self, a: relax.Var, b: relax.Var) -> bool:
        """Whether the function's var `a` (not a parameter) computes main's var `b`."""
        return self.match([(a, b)], first_is_var=True)

    def resolve(self, v: relax.Expr) -> relax.Expr:
        """A var of main through tuples made and taken apart again (x = (y, ...); z = x[0]: y)."""
        for _ in range(len(self.defs) + 1):
            value = self.defs.get(v) if isinstance(v, relax.Var) else None
            if isinstance(value, relax.Var):
                v = value
            elif isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
                made = self.defs.get(value.tuple_value)
                if not isinstance(made, relax.Tuple):
                    return v
                v = made.fields[value.index]
            else:
                return v
        return v

    def match(self, todo: list, first_is_var: bool = False) -> bool:
        while todo:
            a, b = todo.pop()
            if first_is_var or (isinstance(a, relax.Var) and a not in self.params):
                first_is_var = False
                if not isinstance(b, relax.Var) or a not in self.inner:
                    return False
                if b not in self.defs or b in self.taken:
                    return False
                if a in self.group:  # matched already (its body is compared once)
                    if not self.group[a].same_as(b):
                        return False
                    continue
                self.group[a] = b
                todo.append((self.inner[a], self.defs[b]))
            elif isinstance(a, relax.Var):  # a parameter: a var of main's, or a constant
                bound = self.params[a]
                if isinstance(bound, relax.Var):
                    if not (isinstance(b, relax.Var) and self.resolve(b).same_as(self.resolve(bound))):
                        return False
                elif isinstance(b, relax.Var):
                    return False
            elif type(a) is not type(b):
                return False
            elif isinstance(a, relax.Call):
                if isinstance(a.op, tvm.ir.Op):
                    same_op = a.op.same_as(b.op)
                else:
                    same_op = a.op.name_hint == getattr(b.op, "name_hint", None)
                if not same_op or len(a.args) != len(b.args):
                    return False
                todo += reversed(list(zip(a.args, b.args, strict=True)))
            elif isinstance(a, relax.Tuple):
                if len(a.fields) != len(b.fields):
                    return False
                todo += reversed(list(zip(a.fields, b.fields, strict=True)))
            elif isinstance(a, relax.TupleGetItem):
                if a.index != b.index:
                    return False
                todo.append((a.tuple_value, b.tuple_value))
            elif isinstance(a, tvm.ir.GlobalVar) and a.name_hint != b.name_hint:
                return False
            # else constants, shapes, prim values: the ops and the dataflow tell groups apart
        return True


def optimize_stage(ctx: Context, report: Report, model: ImportedModel) -> Given[Optimized]:
    """The optimized model, its passes kept, and its graphs drawn at once: the page shows them while
    the job goes on."""
    folded = []  # the ONNX graph's shape arithmetic folded before import: the first step shown
    if model.folded:
        file = "views/passes/onnx_folded.txt"
        (ctx.dir / file).parent.mkdir(parents=True, exist_ok=True)
        (ctx.dir / file).write_text(fold_text(model.folded))
        name = f"{model.folded['tool']}: shape arithmetic folded (ONNX, before import)"
        folded = [PassRecord(0, name, model.folded["seconds"], "error" not in model.folded, file, onnx=True)]
    optimized = optimize(model.mod, ctx.target, ctx.dir, report, model.layers, first=len(folded))
    optimized.graphs = draw_graphs(model.mod, optimized.fused, ctx.dir, optimized.fusion, model.modules)
    return Given(
        optimized, {"passes": [vars(p) for p in folded + optimized.passes], "graphs": optimized.graphs}
    )
