"""Tune stage: MetaSchedule on the fused kernels, with a trial budget, live progress and cancellation.

Records go to the job's `tuning/` folder, which the worker fills beforehand with the shared database of
the job's target and merges back afterwards (webapp/jobs/tuning_db.py), so the next job whose kernels
were tuned before starts tuned. The build stage (webapp.pipeline.stages.build.schedule) applies the records.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from webapp.machine import timing_slot
from webapp.pipeline.errors import StageError
from webapp.pipeline.job import Context, Given, Report
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.stages.inspect import kernel_flop
from webapp.targets import Target

if TYPE_CHECKING:
    from webapp.pipeline.stages.optimize import Optimized
    from webapp.pipeline.stages.quantize.variants import QuantizedJob


class TuningCancelled(Exception):
    pass


@dataclass
class Tuned:
    kernels: int  # kernels that can be tuned
    pretuned: int  # of which the database had records before this job
    trials: int  # measured by this job, never more than the budget
    budget: int  # the trials the job asked for
    cancelled: bool
    seconds: float
    tasks: list[dict] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)  # best estimated total latency after n trials
    unreadable_records: int = 0  # records dropped from the job's copy of the database (open_database)

    def to_json(self) -> dict:
        return vars(self)


WORKLOADS, RECORDS = "database_workload.json", "database_tuning_record.json"


def open_database(work_dir: Path) -> tuple[ms.database.JSONDatabase, int]:
    """MetaSchedule's JSON database in `work_dir`, and how many records were dropped to open it.

    One record TVM cannot replay on its workload (a trace that names a block the workload does not
    have: an upload's, say) makes JSONDatabase fail as a whole. Then each record is tried alone with
    its workload and the failing ones are dropped from this copy; if the whole still fails (a
    workload that equals another one but for its names), the copy starts empty: the job goes on
    untuned rather than fail."""
    from webapp.pipeline.rules.int8 import register_dots

    register_dots()
    try:
        return ms.database.JSONDatabase(work_dir=str(work_dir)), 0
    except Exception:  # a bare RuntimeError through TVM's FFI ("parallel_for_dynamic error")
        pass
    workloads = (work_dir / WORKLOADS).read_text().splitlines()
    records = [line for line in (work_dir / RECORDS).read_text().splitlines() if line.strip()]
    kept = [line for line in records if readable(line, workloads, work_dir / "record-check")]
    (work_dir / RECORDS).write_text("".join(line + "\n" for line in kept))
    try:
        return ms.database.JSONDatabase(work_dir=str(work_dir)), len(records) - len(kept)
    except Exception:
        for name in (WORKLOADS, RECORDS):
            (work_dir / name).write_text("")
        return ms.database.JSONDatabase(work_dir=str(work_dir)), len(records)


def readable(record: str, workloads: list[str], scratch: Path) -> bool:
    """Whether JSONDatabase opens `record` alone with its workload."""
    try:
        data = json.loads(record)
        workload = workloads[int(data[0])]
    except (ValueError, TypeError, IndexError, KeyError):
        return False
    scratch.mkdir(exist_ok=True)
    (scratch / WORKLOADS).write_text(workload + "\n")
    (scratch / RECORDS).write_text(json.dumps([0, *data[1:]]) + "\n")
    try:
        ms.database.JSONDatabase(work_dir=str(scratch))
        return True
    except Exception:
        return False


@derived_object
class InTimingSlot(ms.runner.PyRunner):
    """A runner that measures each batch of candidates with the machine's timing slot held
    (webapp/machine/timing_slot.py): the builds go on beside other jobs, the measurements do not."""

    def __init__(self, inner: ms.runner.Runner):
        self.inner = inner

    def run(self, runner_inputs: list[ms.runner.RunnerInput]) -> list[ms.runner.RunnerFuture]:
        with timing_slot.hold("tuning"):
            return self.inner.run(runner_inputs)


@derived_object
class KeptPoolBuilder(ms.builder.PyBuilder):
    """MetaSchedule's LocalBuilder, but with one pool of build processes for the whole search: LocalBuilder
    starts a new pool for each batch, and each of its processes spends 3 s importing TVM before it builds
    a kernel in well under one (on 2 cores, half the time of a small model's search). A process is
    replaced after USES builds (LocalBuilder's reason for new pools: memory its processes leak)."""

    USES = 32

    def __init__(self, max_workers: int, timeout_sec: float):
        from tvm.support.popen_pool import PopenPoolExecutor

        self.timeout_sec = timeout_sec
        self.pool = PopenPoolExecutor(max_workers, timeout_sec, maximum_process_uses=self.USES)

    def build(self, build_inputs: list[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
        from tvm.support.popen_pool import StatusKind

        args = [(fast_build, None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
        results = []
        for outcome in self.pool.map_with_error_catching(lambda a: _worker_func(*a), args):
            if outcome.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(outcome.value, None))
            elif outcome.status == StatusKind.TIMEOUT:
                message = f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"
                results.append(ms.builder.BuilderResult(None, message))
            else:
                message = f"LocalBuilder: An exception occurred\n{outcome.value}"
                results.append(ms.builder.BuilderResult(None, message))
        return results


@derived_object
class WithinBudget(ms.search_strategy.PySearchStrategy):
    """A search strategy that hands out at most the job's budget of candidates, over all tasks.

    MetaSchedule's task scheduler checks `max_trials_global` only before asking a task for its next
    batch, and sends the whole batch: a budget of 32 measured 36. Each task's strategy is a clone of
    this one; the clones share `left` and cut the last batch to what remains of the budget.
    """

    def __init__(self, inner: ms.search_strategy.SearchStrategy, left: list[int]):
        self.inner, self.left = inner, left

    def _initialize_with_tune_context(self, context) -> None:
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(
        self,
        max_trials: int,
        num_trials_per_iter: int,
        design_spaces: list[s_tir.Schedule],
        database: ms.database.Database | None = None,
        cost_model: ms.cost_model.CostModel | None = None,
    ) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self) -> list[ms.MeasureCandidate] | None:
        if self.left[0] <= 0:
            return None
        candidates = self.inner.generate_measure_candidates()
        if candidates is None:
            return None
        candidates = list(candidates)[: self.left[0]]
        self.left[0] -= len(candidates)
        return candidates

    def notify_runner_results(
        self, measure_candidates: list[ms.MeasureCandidate], results: list[ms.runner.RunnerResult]
    ) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self) -> WithinBudget:
        return WithinBudget(self.inner.clone(), self.left)


def fast_build(
    mod: tvm.IRModule, target: tvm.target.Target, _params: dict[str, tvm.runtime.Tensor] | None
) -> tvm.runtime.Module:
    """MetaSchedule's builder without its 30 s `import tvm.s_tir.tensor_intrin` in every worker
    (which times out on 2 cores)."""
    import tvm as _tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from webapp.pipeline.passes import lowering  # measured as the playground builds it

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return _tvm.tirx.build(mod, target=target, pipeline=lowering.PIPELINE)


def best_seconds(db: ms.database.Database, mod: tvm.IRModule) -> float | None:
    if not db.has_workload(mod):
        return None
    records = db.get_top_k(db.commit_workload(mod), 1)
    if not records or not records[0].run_secs:
        return None
    secs = [float(s) for s in records[0].run_secs]
    return sum(secs) / len(secs)


def extract_tasks(modules: dict[str, tvm.IRModule], target: Target) -> list[tuple[str, ms.ExtractedTask]]:
    """(variant, task) for the kernels of `modules` (variant -> fused module: "fp32", and a quantized
    job's variants), each workload once, under the first variant that has it."""
    tasks, seen = [], set()
    for variant, mod in modules.items():
        for task in ms.relax_integration.extract_tasks(mod, target.tvm):
            key = tvm_ffi.structural_hash(task.dispatched[0])
            if key not in seen:
                seen.add(key)
                tasks.append((variant, task))
    return tasks


def tune_contexts(
    tasks: list[ms.ExtractedTask], target: Target, work_dir: Path, strategy: ms.search_strategy.SearchStrategy
) -> tuple[list[ms.TuneContext], list[float]]:
    """One TuneContext per task: MetaSchedule's own design space (its schedule rules for the target),
    or where a rule of schedules.SPACES fits (the int8 kernels, on the project's dot-product
    intrinsics, which MetaSchedule's CPU rules never use) that rule's spaces, with the register
    tile's size sampled."""
    from webapp.pipeline.rules import schedules

    def ours(sch):
        return schedules.design_spaces(sch, target)

    contexts: list[ms.TuneContext]
    contexts, weights = [], []
    for task in tasks:
        own = bool(ours(s_tir.Schedule(task.dispatched[0])))
        space = (
            ms.space_generator.ScheduleFn(ours, sch_rules=[], postprocs=[], mutator_probs={})
            if own
            else "post-order-apply"
        )
        made, weight = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [task], str(work_dir), space=space, strategy=strategy, seed=1 + len(contexts)
        )
        contexts += made
        weights += weight
    return contexts, weights


class Search:
    """What the search has found so far, kept by its measure callback: each task's best measured seconds,
    the estimated model latency after each batch (`curve`), each task's improvements (`history`)."""

    def __init__(
        self,
        best: dict[int, float | None],
        weights: dict[int, int],
        trials: int,
        report: Callable[..., None],
        cancelled: Callable[[], bool],
    ):
        self.best, self.weights, self.trials = best, weights, trials
        self.report, self.cancelled = report, cancelled
        self.curve: list[dict] = []
        # per task, each trial count at which its best measured time improved (the first one included)
        self.history: dict[int, list[dict]] = {}
        self.done = 0
        self.stop_requested = False

    def measured(self, task_id: int, count: int, runner_results: list[ms.runner.RunnerResult]) -> None:
        self.done += count
        for trial, r in enumerate(runner_results, self.done - count + 1):
            if r.run_secs:
                secs = sum(float(s) for s in r.run_secs) / len(r.run_secs)
                if self.best.get(task_id) is None or secs < cast(float, self.best[task_id]):
                    self.best[task_id] = secs
                steps = self.history.setdefault(task_id, [])
                if not steps or secs * 1e6 < steps[-1]["us"]:
                    steps.append({"trials": trial, "us": round(secs * 1e6, 3)})
        total = estimated_total_ms(self.best, self.weights)
        if total is not None:
            self.curve.append({"trials": self.done, "ms": round(total, 4)})
        detail = {"trials": self.done, "budget": self.trials, "best_ms": total, "curve": self.curve[-200:]}
        self.report(min(self.done / self.trials, 1.0), detail)
        if self.cancelled():
            self.stop_requested = True
            raise TuningCancelled()

    def callback(self) -> ms.measure_callback.MeasureCallback:
        search = self

        @derived_object
        class Progress(ms.measure_callback.PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
                search.measured(task_id, len(measure_candidates), runner_results)

        return Progress()


def tune(
    fused: tvm.IRModule,
    target: Target,
    work_dir: Path,
    trials: int,
    report: Callable[[float, dict], None],
    cancelled: Callable[[], bool],
    quantized: dict[str, tvm.IRModule] | None = None,
) -> Tuned:
    """MetaSchedule on the kernels of `fused` and of a quantized job's builds (`quantized`: variant ->
    its fused module); the tasks are numbered in the order of extract_tasks."""
    started = time.monotonic()
    target.register_tensor_intrinsics()
    work_dir.mkdir(parents=True, exist_ok=True)
    variants = extract_tasks({"fp32": fused, **(quantized or {})}, target)
    tasks = [task for _, task in variants]
    if not tasks:
        raise StageError("This model has no kernels that MetaSchedule can tune.")
    db, unreadable = open_database(work_dir)
    before = {i: best_seconds(db, t.dispatched[0]) for i, t in enumerate(tasks)}
    weights = {i: int(t.weight) for i, t in enumerate(tasks)}
    search = Search(dict(before), weights, trials, report, cancelled)
    was_cancelled = run_search(tasks, target, work_dir, db, search) if trials > 0 else False
    return Tuned(
        kernels=len(tasks),
        pretuned=sum(1 for v in before.values() if v is not None),
        trials=search.done,
        budget=trials,
        cancelled=was_cancelled,
        seconds=time.monotonic() - started,
        tasks=task_table(variants, work_dir, weights, before, search.history),
        curve=search.curve,
        unreadable_records=unreadable,
    )


def run_search(
    tasks: list[ms.ExtractedTask], target: Target, work_dir: Path, db: ms.database.Database, search: Search
) -> bool:
    """MetaSchedule's evolutionary search over `tasks`, `search.trials` measurements in all, its records
    in `db`; whether the user cancelled it."""
    trials = search.trials
    watcher = watch_dispatch(work_dir, trials, search.report, lambda: search.done)
    note = f"preparing the search over {len(tasks)} kernels (about 30 s)"
    best_ms = estimated_total_ms(search.best, search.weights)
    search.report(0.0, {"trials": 0, "budget": trials, "best_ms": best_ms, "note": note})
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, init_min_unmeasured=32)
    contexts, task_weights = tune_contexts(tasks, target, work_dir, WithinBudget(strategy, [trials]))
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False)
    builder = KeptPoolBuilder(max_workers=2, timeout_sec=120)
    try:
        ms.tune_tasks(
            tasks=contexts,
            task_weights=task_weights,
            work_dir=str(work_dir),
            max_trials_global=trials,
            num_trials_per_iter=min(16, max(2, trials // max(1, len(tasks)))),
            builder=builder,
            runner=InTimingSlot(ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator)),
            database=db,
            cost_model="xgb",
            measure_callbacks=ms.MeasureCallback.create("default") + [search.callback()],
        )
    except Exception:
        if not search.stop_requested:  # TuningCancelled arrives as a bare RuntimeError through TVM's FFI
            raise
        return True
    finally:
        watcher.set()
        builder.pool.shutdown()
    return False


def task_table(variants: list, work_dir: Path, weights: dict, before: dict, history: dict) -> list[dict]:
    """The tuning table's rows: each task's best time in the database as it is on disk now (what
    counts), its rate, whether it had records before the job, and this job's search's improvements."""
    db, _ = open_database(work_dir)  # re-read: what is on disk is what counts
    table = []
    for i, (variant, t) in enumerate(variants):
        secs = best_seconds(db, t.dispatched[0])
        flop = kernel_flop(t.dispatched[0]["main"])
        table.append(
            {
                "name": t.task_name,
                "variant": variant,
                "weight": weights[i],
                "flop": flop,
                "latency_us": None if secs is None else secs * 1e6,
                "gflops": None if not secs else flop / secs / 1e9,
                "pretuned": before[i] is not None,
                # this job's search: its best measured time at each trial count where it improved
                "curve": history.get(i, []),
            }
        )
    return table


def watch_dispatch(
    work_dir: Path, trials: int, report: Callable[..., None], measured: Callable[[], int]
) -> threading.Event:
    """Until the returned event is set, report how many candidates MetaSchedule has sent to the builder.

    Its measure callbacks arrive only when a round's results are joined, after every task has been
    dispatched once: on a model with many kernels that takes minutes, and the page would show nothing.
    The task scheduler's log says each dispatch ("Sending 12 sample(s) to builder").
    """
    stop = threading.Event()
    log = work_dir / "logs" / "tvm.s_tir.meta_schedule.logging.task_scheduler.log"
    pattern = re.compile(r"Sending (\d+) sample\(s\) to builder")

    def run():
        while not stop.wait(2.0):
            try:
                sent = sum(int(n) for n in pattern.findall(log.read_text(errors="replace")))
            except OSError:
                continue
            if measured() == 0 and sent:
                report(
                    0.0,
                    {
                        "trials": 0,
                        "budget": trials,
                        "best_ms": None,
                        "note": f"{sent} candidates sent to the builder, first measurements pending",
                    },
                )

    threading.Thread(target=run, daemon=True).start()
    return stop


def estimated_total_ms(best: dict, weights: dict) -> float | None:
    """Sum of every kernel's best time by its call count; None until each kernel has one."""
    if any(v is None for v in best.values()):
        return None
    return sum(best[n] * weights[n] for n in best) * 1e3


def tunes(ctx: Context) -> bool:
    """Whether the job has a tune stage: trials asked for, or shared records copied into its folder."""
    records = ctx.dir / "tuning" / "database_tuning_record.json"
    return ctx.options.tune_trials > 0 or (records.is_file() and records.stat().st_size > 0)


def tune_stage(
    ctx: Context, report: Report, optimized: Optimized, quantized: QuantizedJob | None
) -> Given[Tuned]:
    # the first quantized variant's kernels too (a sweep's others share its workloads)
    qfused = {q.variant: fuse(q.mod, ctx.target) for q in quantized.variants[:1]} if quantized else None
    cancelled = (ctx.dir / "cancel").exists
    trials = ctx.options.tune_trials
    tuned = tune(optimized.fused, ctx.target, ctx.dir / "tuning", trials, report, cancelled, qfused)
    return Given(tuned, {"tuning": tuned.to_json()})
