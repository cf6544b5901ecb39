"""A job's folder as the pipeline reads and writes it: job.json (what the worker asked for),
result.json (what the job found so far) and progress.json (the stages' live status). The runner and
the remote stage (a later process) both keep their records here; Context is what every stage of a
job is given."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from webapp.jsonfile import write_json_atomic
from webapp.machine import timing_slot
from webapp.options import JobOptions
from webapp.pipeline import steps
from webapp.pipeline.errors import StageError, error_message
from webapp.pipeline.reports import facts
from webapp.targets import Target
from webapp.targets import get as get_target


@dataclass
class Job:
    """job.json, as the worker prepared it: the options and where the job's files are."""

    dir: Path
    options: JobOptions
    model: Path
    references: dict[str, Path]  # {"pytorch": .pt2, "onnxruntime": .onnx}, whichever it has
    dataset: str | None  # labelled data of an example (accuracy, calibration)
    calibration_data: Path | None  # the user's .npz
    bench_budget_s: float
    stage_budgets_s: dict  # stage -> its time budget (Config.stage_budgets_s)
    weights: dict | None = None  # an example's: {"trained", "text"} (catalog.Example.weights)
    quiet_wait_s: float = 0.0  # how long the benchmark may wait for a quiet machine (Config.quiet_wait_s)
    example: str | None = None  # the built-in example's name, for one that generates (catalog.Example)
    generator: Path | None = (
        None  # its generating form (.onnx with a KV cache), which the generate stage runs
    )
    archive: Path | None = None  # an uploaded .zip of an .onnx and its external data: `model` unpacked
    limits: dict | None = None  # the server's limits of a job (Config: memory, CPU and wall time, upload)

    @classmethod
    def load(cls, job_dir: Path) -> Job:
        spec = json.loads((job_dir / "job.json").read_text())
        return cls(
            job_dir,
            JobOptions.from_json(spec["options"]),
            job_dir / spec["model"],
            {k: job_dir / v for k, v in (spec.get("references") or {}).items()},
            spec.get("dataset"),
            job_dir / spec["calibration_data"] if spec.get("calibration_data") else None,
            float(spec.get("bench_budget_s", 3.0)),
            {str(k): float(v) for k, v in (spec.get("stage_budgets_s") or {}).items()},
            spec.get("weights"),
            float(spec.get("quiet_wait_s", 0.0)),
            spec.get("example"),
            job_dir / spec["generator"] if spec.get("generator") else None,
            job_dir / spec["archive"] if spec.get("archive") else None,
            spec.get("limits"),
        )


class Results:
    """result.json: what the job found so far, with the facts the page states derived from it."""

    def __init__(self, job_dir: Path, resume: bool = False):
        self.job_dir, self.data = job_dir, {}
        if resume:  # a later process (the remote stage) adds to what the pipeline found
            self.data = json.loads((job_dir / "result.json").read_text())

    def save(self, **update: Any) -> None:
        self.data.update(update)
        slot = timing_slot.summary(self.job_dir)  # the machine's timing slot: this job's waits for it
        if slot:
            self.data["timing_slot"] = slot
        files = self.job_dir / "files"
        self.data["files"] = sorted(p.name for p in files.iterdir() if p.is_file()) if files.is_dir() else []
        self.data.update(facts.derive(self.data))
        write_json_atomic(self.job_dir / "result.json", self.data)


def failed(exc: BaseException) -> str:
    """A stage's failure: its traceback in the log, then the message the user reads (last, where the
    sandbox looks for a limit that ended the run: webapp.machine.sandbox.describe_exit)."""
    traceback.print_exc()
    message = error_message(exc)
    print(message, file=sys.stderr, flush=True)
    return message


class Progress:
    """progress.json: the stages' live status, as the job page shows it."""

    def __init__(
        self, job_dir: Path, stages: tuple[str, ...], resume: bool = False, budgets: dict | None = None
    ):
        self.path = job_dir / "progress.json"
        self.budgets = budgets or {}  # stage -> seconds it may run (the watchdog ends the job past it)
        self.running = ""  # the stage running now: the one whose budget the watchdog (watch) checks
        self.stages = [{"name": s, "status": "pending", "seconds": None, "progress": None} for s in stages]
        self.error: dict[str, str] | None = None
        if resume:  # a later process (the remote stage) goes on where the pipeline stopped
            self.stages = json.loads(self.path.read_text())["stages"]
        self.started = self.stopped = self.waited_before = 0.0  # the running stage's (stage_seconds)
        self.last_write = 0.0
        self.lock = threading.Lock()  # a stage may report from a helper thread (tune.watch_dispatch)
        self.write()
        threading.Thread(target=self.watch, daemon=True).start()

    def watch(self) -> None:
        """Every second: the step the running stage is in (steps.now) into progress.json, where the
        worker reads it if the process dies (out of memory); and a stage past its time budget ends the
        job at once, its message naming the stage, its budget and the step (the process exits: a pass
        in TVM's C++ cannot be interrupted)."""
        last = time.monotonic()
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            if now - last > 3.0:  # the process was stopped (another job timing): not the stage's time
                self.stopped += now - last - 1.0
            last = now
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch goes on (a write that failed is retried)
                traceback.print_exc()

    def stage_seconds(self) -> float:
        """The running stage's own time: less what this process spent stopped, or waiting for the
        machine's timing slot while other jobs timed."""
        now = time.monotonic()
        waiting = timing_slot.waited_s - self.waited_before
        waiting += now - timing_slot.waiting_since if timing_slot.waiting_since is not None else 0.0
        return now - self.started - self.stopped - waiting

    def check(self) -> None:
        name = self.running
        if not name:
            return
        budget = self.budgets.get(name)
        if budget and self.stage_seconds() > budget:
            where = f", in {steps.now}" if steps.now else ", before its first named step"
            with self.lock:
                if self.running != name:  # it ended meanwhile
                    return
            self.finish(
                name,
                "failed",
                f"The {name} stage ran past its time budget of {budget:g} s{where}, and the job was "
                "stopped: a pass that does not end on this model, or a model too large for this server "
                "(its operator can raise PLAYGROUND_STAGE_BUDGETS).",
            )
            os._exit(3)
        stage = self.stage(name)
        if steps.now and stage.get("step") != steps.now:
            with self.lock:
                stage["step"] = steps.now
            self.write()

    def stage(self, name: str) -> dict:
        return next(s for s in self.stages if s["name"] == name)

    def write(self) -> None:
        with self.lock:
            write_json_atomic(self.path, {"stages": self.stages, "error": self.error})
            self.last_write = time.monotonic()

    def run_stage(self, name: str, fn: Callable[[Report], T], required: bool = True) -> T | None:
        """fn(report) with its status, seconds and progress recorded; a failure ends the job with its
        message on this stage, or, for a stage not `required`, marks the stage failed with its message
        (the stage's "error") and the job goes on."""
        self.start(name)
        try:
            out = fn(lambda fraction, detail=None: self.report(name, fraction, detail))
        except Exception as exc:
            message = failed(exc)
            if required:
                self.finish(name, "failed", message)
                raise SystemExit(1) from None
            self.stage(name)["error"] = message
            self.finish(name, "failed")
            return None
        except BaseException as exc:
            self.finish(name, "failed", failed(exc))
            raise SystemExit(1) from None
        self.finish(name)
        return out

    def start(self, name: str) -> None:
        steps.set_step("")
        memory_peak_reset()
        self.started, self.stopped, self.waited_before = time.monotonic(), 0.0, timing_slot.waited_s
        self.running = name
        self.stage(name).update(status="running", progress=0.0)
        self.write()

    def report(self, name: str, fraction: float, detail: dict | None = None) -> None:
        self.stage(name).update(
            progress=round(min(max(fraction, 0.0), 1.0), 3), seconds=round(time.monotonic() - self.started, 2)
        )
        if detail is not None:
            self.stage(name)["detail"] = detail
        if detail is not None or time.monotonic() - self.last_write > 0.5:
            self.write()

    def skip(self, name: str, why: str) -> None:
        self.stage(name).update(status="skipped", why=why)
        self.write()

    def finish(self, name: str, status: str = "done", error: str | None = None) -> None:
        self.running = ""
        self.stage(name).update(
            status=status,
            seconds=round(time.monotonic() - self.started, 2),
            progress=1.0 if status == "done" else self.stage(name)["progress"],
            memory=memory_peaks(),
        )
        if error is not None:
            self.error = {"stage": name, "message": error}
        self.write()


def memory_peak_reset() -> None:
    """Starts this process's peak resident memory anew (Linux: 5 to clear_refs), so that a stage's peak
    is its own; the peak address space cannot be reset, and stays the process's so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def memory_peaks() -> dict[str, int] | None:
    """This process's peak resident memory since the stage began (`resident_mb`) and its peak address
    space so far (`address_mb`, what the sandbox's memory limit counts), in MB; None off Linux."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kb = dict(re.findall(r"^(VmHWM|VmPeak):\s+(\d+) kB", status, re.M))
    if len(kb) < 2:
        return None
    return {"resident_mb": int(kb["VmHWM"]) >> 10, "address_mb": int(kb["VmPeak"]) >> 10}


T = TypeVar("T")
Report = Callable[..., None]  # report(fraction, detail=None): a stage's progress, 0 to 1


@dataclass
class Given(Generic[T]):
    """What a stage gives: the record the stages after it take, and what it adds to result.json (the
    runner saves it; no stage writes result.json or reads another's part of it)."""

    record: T
    saved: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """One job as every stage sees it, made once by the runner: what was asked (job.json), the target
    preset that answers every question about the target (webapp.targets; its TVM target is
    `target.tvm`), and the records the runner writes (result.json, progress.json). A stage is
    `stage(ctx, report, *inputs) -> Given`."""

    job: Job
    target: Target
    results: Results
    progress: Progress

    @classmethod
    def open(cls, job_dir: Path, stages: tuple[str, ...]) -> Context:
        job = Job.load(job_dir)
        target = get_target(job.options.target)
        return cls(job, target, Results(job_dir), Progress(job_dir, stages, budgets=job.stage_budgets_s))

    @property
    def dir(self) -> Path:
        return self.job.dir

    @property
    def options(self) -> JobOptions:
        return self.job.options

    def stage(self, name: str, stage: Callable[..., Given], *inputs: Any, skip: str | None = None,
              required: bool = True) -> Any:  # fmt: skip
        """Runs stage(ctx, report, *inputs) as the stage `name` (its status, seconds and progress
        recorded; a failure ends the job, unless the stage is not `required`: then it is marked failed
        with its message, and the job keeps what the stages before it made), saves what it gives to
        result.json and returns its record; or records it skipped, with why, when `skip` says why
        (None)."""
        if skip:
            return self.skip(name, skip)

        def run(report: Report) -> Given:
            try:
                return stage(self, report, *inputs)
            except StageError as e:
                if e.resubmit:  # the result page offers to submit the model again with these options
                    self.results.save(resubmit=e.resubmit)
                raise

        given = self.progress.run_stage(name, run, required)
        if given is None:  # a stage not required that failed
            return None
        self.results.save(**given.saved)
        return given.record

    def skip(self, name: str, why: str) -> None:
        self.progress.skip(name, why)
