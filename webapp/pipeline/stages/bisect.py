"""Pass bisection: the first step of a job's way from the imported model to its library after which the
outputs leave the reference. The points are the module as imported, in the canonical form the passes
start from, after each pass of the job's pipeline (the optimize stage's, re-run here with the module kept
after each), and the job's library (its schedules and code generation). Each point but the library is
built by TVM's own default pipeline for this machine's CPU (no project rule or rewrite in the way) and run
on the job's input; a point is off where its outputs' SQNR against the reference falls below the
tolerance. The reference: ONNX Runtime's (or PyTorch's) outputs for fp32, the first point's own where
neither runs, and for a quantized build the integer model before the passes (quantization's own error
is the quantize section's). Bisection assumes a point after an off one is off too: log2 of the points'
count builds. At the first off point, each binding of the module before and after it that both have is
compared, and those whose values changed are listed in computing order with their source layers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax

from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.passes.legalize import legalize_passes
from webapp.pipeline.stages.fidelity import fidelity
from webapp.pipeline.stages.layer_error import binding_values, layer_errors, run_module
from webapp.pipeline.stages.optimize import FUSION_PASS, CaptureTopLevelPasses, Fusion, Optimized, canonical
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages.build import Built
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.pipeline.stages.quantize.variants import QuantizedJob

TOLERANCE_DB = {"fp32": 60.0, "quantized": 40.0}  # the SQNR below which a point is off
CHANGED_SHOWN = 12  # bindings listed at the first off point


@dataclass
class Point:
    index: int  # its place among the points: 0 imported, 1 canonical, 2... after each pass, last the library
    name: str
    module: tvm.IRModule | None  # None: the job's library (run through `library`)
    pass_index: int | None = None  # its place among the pipeline's passes, for a pass
    fused: bool = False  # from the kernels' fusion (FuseTIR) on: main's bindings are calls of kernels


def points(
    mod: tvm.IRModule, target: Target, passes: list | None = None, quantized: bool = False
) -> list[Point]:
    """The module as imported, canonical (a float model's: an integer model is built as it is), and after
    each top-level pass of the pipeline (the job's: legalize_passes then the target's lowering, unless
    `passes` are given), then the library's place."""
    capture = CaptureTopLevelPasses()
    start = mod if quantized else canonical(mod)
    pipeline = passes if passes is not None else legalize_passes(target) + target.lower_passes()
    with target.tvm, tvm.transform.PassContext(opt_level=3, instruments=[capture]):
        tvm.transform.Sequential(pipeline, name="_pipeline")(start)
    out = [Point(0, "imported", mod)] + ([] if quantized else [Point(1, "canonical form", start)])
    for i, (name, _, snapshot) in enumerate(capture.snapshots):
        fused = name == FUSION_PASS or out[-1].fused
        out.append(Point(len(out), name, snapshot, pass_index=i, fused=fused))
    capture.snapshots.clear()
    return out + [Point(len(out), "the job's library (its schedules and code generation)", None)]


class Bisection:
    """Runs the points it is asked for, once each, and keeps what they gave."""

    def __init__(
        self,
        pts: list[Point],
        inputs: dict[str, np.ndarray],
        host: Target,
        library: Callable[[], list[np.ndarray]],
        reference: list[np.ndarray] | None,
        tolerance_db: float,
        report: Callable[[float], None] = lambda f: None,
    ):
        self.points, self.inputs, self.host, self.library = pts, inputs, host, library
        self.reference, self.tolerance_db = reference, tolerance_db
        # progress: the points run of those a bisection of this many points runs
        self.report, self.expected = report, max(2, int(np.ceil(np.log2(len(pts)))) + 3)
        self.rows: dict[int, dict] = {}

    def run(self, i: int) -> dict:
        """Point i's row: its fidelity against the reference and whether it is off, or why it did not run."""
        if i in self.rows:
            return self.rows[i]
        p, started = self.points[i], time.perf_counter()
        row: dict = {"index": i, "name": p.name, "pass_index": p.pass_index}
        try:
            out = self.library() if p.module is None else run_module(p.module, self.inputs, self.host)
        except Exception as exc:  # a module TVM's default pipeline cannot take alone: left out of the search
            row["error"] = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"
            )
        else:
            if self.reference is None:  # no runtime's: the first point that ran is the reference
                self.reference = out
            row |= fidelity(out, self.reference, classifier=False)
            sqnr = row.get("sqnr_db")
            row["off"] = bool("error" in row or (sqnr is not None and not sqnr >= self.tolerance_db))
        row["seconds"] = round(time.perf_counter() - started, 2)
        self.rows[i] = row
        self.report(min(len(self.rows) / self.expected, 0.95))
        return row

    def first_off(self) -> int | None:
        """The first point whose outputs are off (None: the library is not), by bisection between the
        last point known good and the first known off; a point that cannot run is stepped over."""
        good = 0
        for i in (0, 1):  # the import itself, then the canonical form
            row = self.run(i)
            if row.get("off"):
                return i
            good = i if "off" in row else good
        bad = len(self.points) - 1
        if self.run(bad).get("off") is not True:
            return None
        while True:
            between = [i for i in range(good + 1, bad) if "error" not in self.rows.get(i, {})]
            if not between:
                return bad
            mid = between[len(between) // 2]
            row = self.run(mid)
            if "off" not in row:
                continue  # could not run: the next choice steps over it
            good, bad = (mid, bad) if not row["off"] else (good, mid)


def in_dataflow_form(mod: tvm.IRModule) -> bool:
    """Whether main's bindings are values (dataflow blocks), not yet the VM's buffers written in place."""
    return any(isinstance(b, relax.DataflowBlock) for b in mod["main"].body.blocks)


def changed_bindings(
    before: tvm.IRModule,
    after: tvm.IRModule,
    inputs: dict[str, np.ndarray],
    host: Target,
    layers_of: Callable[[str, int], list[str]],
    tolerance_db: float,
) -> list[dict]:
    """The bindings both modules have (by name and shape) whose values differ beyond the tolerance, in
    the order the module after computes them: each with its fidelity against its value before and its
    source layers (`layers_of(name, its place among the bindings of main before)`)."""
    (was, places_before), (now, places_after) = (binding_values(m, inputs, host) for m in (before, after))
    rows = []
    for name, value in now.items():
        old = was.get(name)
        if old is None or old.shape != value.shape:
            continue
        f = fidelity([value.astype(np.float64)], [old.astype(np.float64)], classifier=False)
        sqnr = f.get("sqnr_db")
        if "error" not in f and sqnr is not None and not sqnr >= tolerance_db:
            layers = layers_of(name.split("#")[0], places_before[name][0])
            kernel = places_after[name][1] or places_before[name][1]  # the one it calls, or called before
            rows.append({"binding": name, "kernel": kernel, "layers": layers, **f})
    return rows


def bisect(
    mod: tvm.IRModule,
    target: Target,
    inputs: dict[str, np.ndarray],
    reference: tuple[str, list[np.ndarray] | None],
    library: Callable[[], list[np.ndarray]],
    layers_of: Callable[[str, int, Point], list[str]],
    tolerance_db: float,
    passes: list | None = None,
    report: Callable[[float], None] = lambda f: None,
    quantized: bool = False,
) -> dict:
    """The bisection of `mod`'s way through the target's pipeline (or `passes`) to the job's `library`
    against `reference` ((its name, its outputs); None outputs: the first point's), as result.json keeps
    it: the points run, the first off and, where it and the point before are in dataflow form, the
    bindings it changed (`layers_of(name, place, the point before)`: their source layers)."""
    from webapp.targets import host

    started = time.perf_counter()
    pts = points(mod, target, passes, quantized)
    search = Bisection(pts, inputs, host(), library, reference[1], tolerance_db, report)
    first = search.first_off()
    out: dict = {
        "reference": reference[0] if reference[1] is not None else pts[0].name,
        "tolerance_db": tolerance_db,
        "points": len(pts),
        "runs": [search.rows[i] for i in sorted(search.rows)],
        "first": None if first is None else search.rows[first],
    }
    if first is not None and first > 0:
        out |= what_changed(pts, first, search.rows, inputs, layers_of, tolerance_db)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def what_changed(
    pts: list[Point],
    first: int,
    rows: dict[int, dict],
    inputs: dict[str, np.ndarray],
    layers_of: Callable[[str, int, Point], list[str]],
    tolerance_db: float,
) -> dict:
    """The bindings the first off point changed against the last point before it that ran and kept to
    the reference (the one before it, unless that one could not build): {"changed", "changed_count",
    "compared_with"}, or {"changed_why_not"}."""
    from webapp.targets import host

    good = max((i for i, row in rows.items() if i < first and row.get("off") is False), default=None)
    if good is None:
        return {"changed_why_not": "no point before it could be built and run"}
    before, after = pts[good], pts[first]
    if after.module is None:
        why = "the step is the job's schedules and code generation: a kernel's reproducer compares its "
        return {"changed_why_not": why + "scheduled code with the same kernel unscheduled"}
    if before.module is None or not (in_dataflow_form(before.module) and in_dataflow_form(after.module)):
        return {"changed_why_not": "the module is in the VM's lowered form there: its bindings are buffers"}
    try:
        changed = changed_bindings(
            before.module, after.module, inputs, host(), lambda n, p: layers_of(n, p, before), tolerance_db
        )
    except Exception as exc:  # the bisection stands without them
        return {"changed_why_not": f"they could not be run: {type(exc).__name__}: {str(exc).strip()[:200]}"}
    return {"changed": changed[:CHANGED_SHOWN], "changed_count": len(changed), "compared_with": good}


NOT_ASKED = "not asked (bisect: off)"


def why_not_bisected(ctx: Context) -> str | None:
    """Why the job has no bisect stage (None: it has one)."""
    if not ctx.target.runs_cpu_code_here:
        return f"the job's library is for {ctx.target.name}, whose code does not run on this server"
    return None if ctx.options.bisect else NOT_ASKED


def bisect_stage(
    ctx: Context,
    report: Report,
    model: ImportedModel,
    optimized: Optimized,
    quantized: QuantizedJob | None,
    built: Built,
) -> Given[None]:
    """The bisection of each build the page shows (fp32, and the quantized variant kept), on the job's
    input; fp32 against ONNX Runtime's or PyTorch's outputs (the model's first point's where neither
    runs, or where the model is pre-quantized), a quantized build against its integer model."""
    from webapp.pipeline.stages import bench

    inputs = bench.job_inputs(model, ctx.job)
    found = (
        {} if model.prequantized else bench.cpu_reference(ctx.job.references, inputs, bench.bench_threads())
    )
    name, outputs = next(iter(found.items()), ("", None))
    float_layers = model.layers
    builds = [
        ("fp32", model.mod, (name.removesuffix(" on the CPU"), outputs), optimized.fusion, float_layers)
    ]
    for q in quantized.variants[:1] if quantized else []:
        if built.fusion is not None:
            builds.append((q.variant, q.mod, ("", None), built.fusion, origin_layers(q.origin, float_layers)))
    builds = [b for b in builds if (b[0], False) in built.executables]
    out = []
    for i, (variant, mod, reference, fusion, layer_of) in enumerate(builds):
        executable = built.executables[(variant, False)]
        library = lambda ex=executable: bench.flatten_outputs(bench.tvm_runner(ex, inputs)())  # noqa: E731
        tolerance = TOLERANCE_DB["fp32" if variant == "fp32" else "quantized"]
        done = lambda f, i=i: report((i + f) / len(builds))  # noqa: E731
        row = bisect(
            mod,
            ctx.target,
            inputs,
            reference,
            library,
            source_layers(fusion, layer_of),
            tolerance,
            report=done,
            quantized=variant != "fp32",
        )
        mark_reproducers(row, built, variant)
        out.append({"variant": variant} | row | pass_links(row, optimized, variant))
    return Given(None, {"bisection": out, "layer_error": per_layer(ctx, model, inputs)})


def per_layer(ctx: Context, model: ImportedModel, inputs: dict[str, np.ndarray]) -> dict:
    """The float model's layers against ONNX Runtime's (layer_error.py), drawn on the graphs; or why not."""
    from webapp.pipeline.reports.graphs import reference_error_graphs
    from webapp.pipeline.reports.model_explorer import write_model_explorer
    from webapp.pipeline.stages.bench import bench_threads

    path = ctx.job.references.get("onnxruntime")
    if path is None or model.prequantized:
        return {"why_not": "compared with ONNX Runtime layer by layer, which runs a float .onnx only"}
    try:
        found = layer_errors(model.mod, model.layers, path, inputs, bench_threads(), TOLERANCE_DB["fp32"])
    except Exception as exc:  # a reference that cannot run is not a failure of the job
        return {"why_not": f"it could not run: {type(exc).__name__}: {str(exc).strip()[:300]}"}
    reference_error_graphs(ctx.dir, found["layers"], (found["first_off"] or {}).get("layer"))
    write_model_explorer(ctx.dir)  # its overlay of these errors too
    return found


def mark_reproducers(row: dict, built: Built, variant: str) -> None:
    """Each changed binding's kernel that the job's shown build has (its page's kernels) says so: the
    page links its reproducer (/r/<job>/repro/<kernel>.zip)."""
    shown = variant == built.shown_variant
    kernels = {gv.name_hint for gv in built.lowered.get_global_vars()} if shown else set()
    for c in row.get("changed", []):
        c["reproducer"] = c["kernel"] in kernels


def source_layers(fusion: Fusion, layer_of: dict[str, str]) -> Callable[[str, int, Point], list[str]]:
    """A binding's source layers: by its place in the fused main from the fusion on, else by its name
    (the imported model's vars, as the passes before fusion keep them)."""

    def of(name: str, place: int, point: Point) -> list[str]:
        if point.fused:
            return fusion.site_layers(place)
        return [layer_of[name]] if name in layer_of else []

    return of


def origin_layers(origin: dict[str, list[str]], layers: dict[str, str]) -> dict[str, str]:
    """A quantized model's var -> the source layer of the first float var it computes that has one."""
    out = {}
    for var, computes in origin.items():
        layer = next((layers[v] for v in computes if v in layers), None)
        if layer is not None:
            out[var] = layer
    return out


def pass_links(row: dict, optimized: Optimized, variant: str) -> dict:
    """The job's pass index of the first off point (the passes view's diff), fp32's only: the passes
    the page lists are the float model's."""
    first = row.get("first") or {}
    k = first.get("pass_index")
    if variant != "fp32" or k is None or k >= len([p for p in optimized.passes if not p.onnx]):
        return {}
    record = [p for p in optimized.passes if not p.onnx][k]  # after the ONNX fold's record, if any
    return {"first_pass": {"index": record.index, "changed_ir": record.changed}}
