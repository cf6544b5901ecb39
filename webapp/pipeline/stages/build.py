"""Build stage: schedule the fused kernels, lower for the VM, compile, and export a shared library.

One place decides every kernel's schedule, for the worker, the CLI, the tests and the benchmarks:
the tuning database's best record where there is one ("tuned"), else a default rule
(webapp.pipeline.rules.schedules), else the naive loop nest.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tvm
from tvm import relax

from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.passes import lowering
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.passes.running import RunningPass
from webapp.pipeline.reports.memory import footprint
from webapp.pipeline.rules import schedules
from webapp.pipeline.rules.schedules import PREPACK
from webapp.pipeline.stages.optimize import FusionTrace
from webapp.pipeline.stages.tune import open_database
from webapp.pipeline.steps import step
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages import fallback
    from webapp.pipeline.stages.importers import ImportedModel
    from webapp.pipeline.stages.optimize import Fusion, Optimized
    from webapp.pipeline.stages.quantize import Quantized
    from webapp.pipeline.stages.quantize.variants import QuantizedJob
    from webapp.pipeline.stages.tune import Tuned


def schedule(
    fused: tvm.IRModule,
    target: Target,
    tuning_dir: Path | None = None,
    default_rules: bool = True,
    keep_tuned: set[str] | None = None,
) -> tuple[tvm.IRModule, dict[str, str]]:
    """The fused module lowered for the VM, and each kernel's schedule label. With `keep_tuned`, only
    those kernels take their record; the others go to the default rules."""
    with target.tvm, tvm.transform.PassContext(opt_level=3, instruments=[RunningPass()]):
        mod = fused
        if tuning_dir is not None:
            with open_database(tuning_dir)[0]:
                mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
            mod = mod.clone()
            for gv, f in mod.functions_items():
                if not schedules.is_scheduled(f):
                    continue
                if keep_tuned is None or gv.name_hint in keep_tuned:
                    mod[gv] = f.with_attr(schedules.SCHEDULE_ATTR, "tuned")
                else:
                    mod[gv] = fused[gv.name_hint]
        if default_rules:
            mod = schedules.default_schedules(mod, target)
            # Weight repacking blocks become their own kernels, which FoldConstant runs once, here.
            mod = schedules.split_weight_repacking(mod)
            prepacks = schedules.prepacks_by_kernel(mod)
            mod = relax.transform.FoldConstant()(mod)
            mod = relax.transform.DeadCodeElimination()(mod)
            # What is left of the repacking runs at every call (its operand is not a constant): it
            # inherited its kernel's attributes, so it is scheduled here as the copy it is.
            mod = mod.clone()
            for gv, f in mod.functions_items():
                if gv.name_hint.endswith(PREPACK):
                    mod[gv] = f.without_attr("tirx.is_scheduled").without_attr(schedules.SCHEDULE_ATTR)
            mod = schedules.default_schedules(mod, target)
        labels = schedules.labels(mod)
        lowered = tvm.transform.Sequential(target.lower_passes())(mod)
    if default_rules and prepacks:  # each kernel's weight repacking, as it was before it was folded
        lowered = lowered.with_attr(schedules.PREPACKS_ATTR, prepacks)
    return lowered, labels


def compile_relax(mod: tvm.IRModule, target: Target) -> tuple[tvm.runtime.Executable, dict[str, str]]:
    """A Relax module as imported (before legalization) compiled on the default rules, keeping no
    views: for the quantize stage's calibration and per-layer runs. Returns (executable, labels)."""
    lowered, labels = schedule(fuse(mod, target), target)
    return build(lowered, target, None), labels


FLUSH_BYTES = 64 << 20  # written before each timed run of a kernel: twice this machine's L3 cache


def kernel_seconds(
    executable: tvm.runtime.Executable,
    lowered: tvm.IRModule,
    dev: tvm.runtime.Device,
    names: set[str],
    repeat: int = 8,
) -> dict[str, float]:
    """The kernels `names` of a built module, each timed on its own with seeded random inputs: the
    fastest of `repeat` runs, each after FLUSH_BYTES of other data went through the caches. In a
    model a kernel's weights come from memory, read once per inference: timed warm, a tuning record
    for MobileNetV2's classifier beat the default rule (57 against 90 us) and lost in the model (264
    against 147 us); timed cold, 245 against 151. On a shared machine other work only ever slows a
    run down, so the fastest run is the steadiest figure to compare two schedules by."""
    import numpy as np

    library = executable.mod.imports[0]
    out = {}
    for gv, func in lowered.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or gv.name_hint not in names:
            continue
        rng = np.random.default_rng(0)
        args = [
            tvm.runtime.tensor(rng.random([int(d) for d in p.shape]).astype(p.dtype), dev)
            for p in func.params
        ]
        timer = library.time_evaluator(
            gv.name_hint, dev, number=1, repeat=repeat, min_repeat_ms=0, cache_flush_bytes=FLUSH_BYTES
        )
        out[gv.name_hint] = float(timer(*args).min)
    return out


def record_choice(tuned: dict[str, float], default: dict[str, float], labels: dict[str, str]) -> list[dict]:
    """Per tuned kernel, its record's time against its default-rule twin's (both from kernel_seconds,
    in this build): `faster` when the record won, or when the default rules have no twin to compare
    with. build_variant adds `used`: the faster records, unless the whole-model check dropped them."""
    out = []
    for name, seconds in sorted(tuned.items()):
        if labels.get(name) != "tuned":
            continue
        twin = default.get(name)  # the same kernel name in both builds (build.schedule keeps it)
        out.append(
            {
                "kernel": name,
                "tuned_us": seconds * 1e6,
                "default_us": None if twin is None else twin * 1e6,
                "faster": twin is None or seconds < twin,
            }
        )
    return out


def model_check(
    variant: str,
    fused: tvm.IRModule,
    tuned_exe: tvm.runtime.Executable,
    default_exe: tvm.runtime.Executable,
    dev: tvm.runtime.Device,
) -> dict | None:
    """The whole model with its faster records against the default rules alone (time_models, on
    seeded random inputs): `kept` when the records made it faster by more than MODEL_CHECK_GAIN.
    Records that each beat their rule on cold caches can still lose together: re-tuned records for
    ResNet-18 won on 20 of its 20 kernels, and the model took 14.89 ms against 14.15 on the rules
    (benchmarks/cpu_models.py, 2026-11-24). None when an input has no fixed shape."""
    from webapp.pipeline.stages.bench import MODEL_CHECK_GAIN, model_inputs, time_models

    inputs = model_inputs(fused)
    if inputs is None:
        return None
    times = time_models({"tuned": tuned_exe, "default": default_exe}, inputs, dev)
    return {
        "variant": variant,
        "tuned_ms": times["tuned"],
        "default_ms": times["default"],
        "min_gain": MODEL_CHECK_GAIN,
        "kept": times["tuned"] < times["default"] * (1 - MODEL_CHECK_GAIN),
    }


class KernelBuildError(StageError):
    """TVM failed to compile these kernels of the model (each alone fails too)."""

    def __init__(self, kernels: dict[str, str], labels: dict[str, str]):
        self.kernels, self.labels = kernels, labels
        super().__init__(self.describe({}))

    def describe(self, layers: dict[str, list[str]]) -> str:
        """The failing kernels with their schedule and the source layers they compute."""
        parts = []
        for name, message in list(self.kernels.items())[:3]:
            where = ", ".join(layers.get(name, [])[:4])
            parts.append(
                f"the kernel {name} ({self.labels.get(name, 'naive')}"
                + (f"; source layers {where}" if where else "")
                + f"): {message}"
            )
        more = f" (and {len(self.kernels) - 3} more kernels)" if len(self.kernels) > 3 else ""
        return "TVM could not compile " + "; ".join(parts) + more


def failing_kernels(lowered: tvm.IRModule, target: Target) -> dict[str, str]:
    """Each kernel that fails to compile on its own -> TVM's message: which kernel a failed build
    was stopped by."""
    failed = {}
    for gv, func in lowered.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        alone = tvm.IRModule({gv.name_hint: func.with_attr("global_symbol", gv.name_hint)})
        try:
            tvm.tirx.build(alone, target=target.tvm, pipeline=lowering.PIPELINE)
        except Exception as exc:  # noqa: BLE001 - the message is what is reported
            failed[gv.name_hint] = error_message(exc)
    return failed


def build(lowered: tvm.IRModule, target: Target, out: Path | None) -> tvm.runtime.Executable:
    """Returns the VM executable; writes the loadable library to `out` (a .so) unless it is None. A
    build TVM fails raises KernelBuildError naming the kernels that fail, where it finds them."""
    try:
        with step("tvm.compile: the kernels lowered and compiled by LLVM"):
            executable = tvm.compile(
                lowered, target=target.tvm, relax_pipeline=None, tir_pipeline=lowering.PIPELINE
            )
    except Exception:
        failed = failing_kernels(lowered, target)
        if failed:
            raise KernelBuildError(failed, schedules.labels(lowered)) from None
        raise
    if out is not None:
        with step("the library exported (linked)"):
            export(executable, target, out)
    return executable


def export(executable: tvm.runtime.Executable, target: Target, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    target.export_library(executable, str(out))


# ---------------------------------------------------------------- the stage


@dataclass
class Built:
    executables: dict  # (variant, tuned) -> VM executable: what the benchmark runs
    fused: tvm.IRModule  # the build the page shows (the quantized one in a quantized job)...
    lowered: tvm.IRModule  # ...scheduled and lowered,
    labels: dict[str, str]  # ...its kernels' schedule labels,
    executable: object  # ...and its executable (model.so)
    record_choice: list[dict] = field(default_factory=list)  # per tuned kernel: record vs rule
    libraries: dict = field(default_factory=dict)  # (variant, tuned) -> the library exported for it
    record_check: list[dict] = field(default_factory=list)  # per build with faster records: model_check
    fusion: Fusion | None = None  # a quantized build's Fusion (the float one is the optimize stage's)
    board_plan: dict | None = None  # the layers' kernels a board times alone (fallback.board_plan)
    memory: dict = field(default_factory=dict)  # variant -> its build's footprint (reports/memory.py)
    shown_variant: str = "fp32"  # the variant exported as model.so

    def add(self, other: Built) -> None:
        """Another build's executables, libraries and records' checks beside these (a quantized variant's)."""
        self.executables.update(other.executables)
        self.memory.update(other.memory)
        self.libraries.update(other.libraries)
        self.record_choice += other.record_choice
        self.record_check += other.record_check

    def to_json(self, library: Path) -> dict:
        out: dict[str, object] = {"library": {"file": library.name, "bytes": library.stat().st_size}}
        files = {"fp32": library.with_name("model-fp32.so"), self.shown_variant: library}
        sizes = {v: path.stat().st_size for v, path in files.items() if path.exists()}
        out["memory"] = [
            {"variant": v, **m, "library_bytes": sizes.get(v)} for v, m in self.memory.items() if m
        ]
        out |= {"record_choice": self.record_choice} if self.record_choice else {}
        return out | ({"record_check": self.record_check} if self.record_check else {})


def build_job(
    fused: tvm.IRModule,
    quantized: QuantizedJob | None,
    target: Target,
    tuning_dir: Path | None,
    job_dir: Path,
    report: Callable[..., None],
    layer_of: dict[str, str] | None = None,
    float_fusion: Fusion | None = None,
) -> Built:
    """The float build (tuned where records win, with its default-rule twin for the benchmark); with
    quantization also each quantized variant, the same way, the first of which becomes model.so and
    the code the page shows (the float library is kept beside it as model-fp32.so). The first
    variant's layers are timed against the float build's where the target runs here, and the ones
    int8 made slower are kept in float when that makes the model faster (stages.fallback); for a
    board, the plan of that timing is kept for the remote stage (Built.board_plan)."""
    from webapp.pipeline.stages import fallback

    library = job_dir / "files" / "model.so"
    built = build_variant("fp32", fused, target, tuning_dir)
    if quantized is None:
        return keep_library(built, target, tuning_dir, library)
    keep_library(built, target, tuning_dir, job_dir / "files" / "model-fp32.so")
    report(1 / (1 + len(quantized.variants)))
    shown = None
    for i, q in enumerate(list(quantized.variants)):
        report((1 + i) / (1 + len(quantized.variants)))
        try:
            qfused, variant, fusion = build_quantized(q, target, tuning_dir, layer_of)
            if shown is None:
                first = check_first(
                    fallback.Build(q, qfused, variant, fusion),
                    fallback.Build(None, fused, built, float_fusion),  # type: ignore[arg-type]  # None: not traced
                    quantized,
                    target,
                    lambda q: fallback.Build(q, *build_quantized(q, target, tuning_dir, layer_of)),
                )
                assert first.quantized is not None  # check_first gives back a quantized variant
                q, qfused, variant, fusion = first.quantized, first.fused, first.built, first.fusion
        except Exception as exc:  # in a sweep the other variants go on
            quantized.fail(q.variant, "build", exc)
            continue
        if shown is None:
            shown = keep_library(variant, target, tuning_dir, library)
            built.shown_variant = q.variant
            built.fused, built.fusion = qfused, fusion
        built.add(variant)
    if shown is None:
        messages = "; ".join(f["message"] for f in quantized.failed)
        raise StageError(f"Every variant failed to build: {messages}")
    quantized.complete_errors()  # of the variant as kept
    built.lowered, built.labels, built.executable = shown.lowered, shown.labels, shown.executable
    return built


def check_first(
    variant: fallback.Build,
    float_build: fallback.Build,
    job: QuantizedJob,
    target: Target,
    rebuild: Callable[[Quantized], fallback.Build],
) -> fallback.Build:
    """The first variant's layers timed against the float build's, its slower ones kept in float where
    that is faster (stages.fallback), where the target runs here; then with an accuracy budget the layers
    the budget keeps in float (stages.precision: timed here, estimated by llvm-mca for a board); for a
    board, the plan of the layers' timing there (Built.board_plan)."""
    from webapp.pipeline.stages import fallback, precision

    q = variant.quantized
    assert q is not None  # the variant checked is a quantized one
    checked = variant
    if fallback.measures(target, float_build.fusion):
        checked = fallback.check(variant, float_build, job, target, rebuild)
    if q.options.accuracy_budget:
        checked = precision.search(checked, float_build, job, target, rebuild)
    if target.timed_on_board and float_build.fusion is not None:
        float_build.built.board_plan = fallback.board_plan(checked, float_build, job.sweep)
    return checked


def build_quantized(
    q: Quantized, target: Target, tuning_dir: Path | None, layer_of: dict[str, str] | None
) -> tuple[tvm.IRModule, Built, Fusion]:
    """A quantized variant fused and built (build_variant), with its fusion in the float model's
    names (its vars stand for the float model's: q.origin)."""
    trace = FusionTrace(q.mod, {})
    qfused = fuse(q.mod, target, trace)
    built = build_variant(q.variant, qfused, target, tuning_dir)
    return qfused, built, trace.fusion().through(q.origin, layer_of or {})


def keep_library(built: Built, target: Target, tuning_dir: Path | None, library: Path) -> Built:
    """Exports the build's executable (tuned where its records were kept) as `library`, with the
    tuning database beside it when the model has records."""
    used = next(key for key, ex in built.executables.items() if ex is built.executable)
    if built.record_choice:
        assert tuning_dir is not None  # records are chosen only from tuning_dir's (build_variant)
        library.parent.mkdir(parents=True, exist_ok=True)
        for name in ("database_workload.json", "database_tuning_record.json"):
            shutil.copyfile(tuning_dir / name, library.parent / name)
    export(built.executable, target, library)
    built.libraries = {used: library}
    return built


def build_variant(variant: str, fused: tvm.IRModule, target: Target, tuning_dir: Path | None) -> Built:
    """One build of the job (the float model, or a quantized variant) on the default rules, or with
    the tuning records where they beat them: with records, each tuned kernel is timed against its
    default-rule twin, and the faster records are used if the whole model is then faster too
    (model_check)."""
    default, default_labels = schedule(fused, target)
    default_exe = build(default, target, None)
    tuned, tuned_labels = schedule(fused, target, tuning_dir) if tuning_dir else (None, {})
    choice, checked, keep = [], [], set()
    if "tuned" in tuned_labels.values():  # some kernel of this model has a record
        tuned_exe = build(tuned, target, None)
        dev = target.device()
        # Only the kernels with a record are compared (timing all 257 of DenseNet-121 took 13 s).
        with_record = {name for name, label in tuned_labels.items() if label == "tuned"}
        tuned_s = kernel_seconds(tuned_exe, tuned, dev, with_record)
        default_s = kernel_seconds(default_exe, default, dev, with_record)
        choice = [{"variant": variant} | c for c in record_choice(tuned_s, default_s, tuned_labels)]
        keep = {c["kernel"] for c in choice if c["faster"]}
        if keep and len(keep) < len(choice):
            tuned, tuned_labels = schedule(fused, target, tuning_dir, keep_tuned=keep)
            tuned_exe = build(tuned, target, None)
        check = model_check(variant, fused, tuned_exe, default_exe, dev) if keep else None
        if check is not None:
            checked.append(check)
            if not check["kept"]:  # the records lost together: none is used
                keep = set()
        for c in choice:
            c["used"] = c["kernel"] in keep
    if not keep:
        executables = {(variant, False): default_exe}
        return Built(
            executables, fused, default, default_labels, default_exe, choice, {}, checked,
            memory={variant: footprint(default)},
        )  # fmt: skip
    executables = {(variant, True): tuned_exe, (variant, False): default_exe}
    memory = {variant: footprint(tuned)}
    return Built(executables, fused, tuned, tuned_labels, tuned_exe, choice, {}, checked, memory=memory)


def build_stage(
    ctx: Context,
    report: Report,
    model: ImportedModel,
    optimized: Optimized,
    quantized: QuantizedJob | None,
    tuned: Tuned | None,
) -> Given[Built]:
    """The job's builds (webapp/pipeline/stages/build.py: build_job), on the tune stage's records where it
    ran (`tuned`: None where it was skipped)."""
    records = ctx.dir / "tuning" if tuned is not None else None
    try:
        built = build_job(
            optimized.fused, quantized, ctx.target, records, ctx.dir, report, model.layers, optimized.fusion
        )
    except KernelBuildError as exc:  # named with the source layers its kernels compute
        raise StageError(exc.describe(optimized.fusion.layers() if optimized.fusion else {})) from exc
    # the quantized variants again: a variant that failed to build is recorded as failed
    quantization = quantized.to_json() if quantized else {}
    return Given(built, built.to_json(ctx.dir / "files" / "model.so") | quantization)
