"""The worker: takes a queued job, prepares its folder, runs the pipeline in the sandbox, records the end."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import cast

from webapp import targets
from webapp.catalog import EXAMPLES, STAGES
from webapp.codeviews import RENDERED, clear_rendered, prerender
from webapp.config import Config
from webapp.jobs.own_input import UNPACKED_MODEL, model_references
from webapp.jobs.store import JobStore, job_store, read_untrusted_json
from webapp.jobs.tuning_db import copy_in, merge_back, merge_database
from webapp.jsonfile import write_json_atomic
from webapp.machine.sandbox import Outcome, run_sandboxed
from webapp.options import JobOptions


def worker_name(config: Config) -> str:
    """host:pid; the host is the machine's name (PLAYGROUND_HOST), shared by its worker processes."""
    return f"{config.host}:{os.getpid()}"


def ensure_example_files(config: Config, name: str, nice: int = 0) -> tuple[Path, Path]:
    """The example's .pt2 and .onnx under data/examples, built once (trusted code, in a subprocess
    so that this process never loads torch, at CPU priority `nice`); a lock keeps two requests from
    building it at once."""
    pt2, onnx = config.examples_dir / f"{name}.pt2", config.examples_dir / f"{name}.onnx"
    if (
        pt2.exists()
        and onnx.exists()
        and (not EXAMPLES[name].generator or generator_file(config, name).exists())
    ):
        return pt2, onnx
    config.examples_dir.mkdir(parents=True, exist_ok=True)
    with open(config.examples_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (
            pt2.exists()
            and onnx.exists()
            and (not EXAMPLES[name].generator or generator_file(config, name).exists())
        ):
            subprocess.run(
                [sys.executable, "-m", "webapp.pipeline.examples", name, str(config.examples_dir)],
                check=True,
                capture_output=True,
                start_new_session=True,  # a stop signal to the worker's group (Ctrl-C) does not fail it
                preexec_fn=(lambda: os.nice(nice)) if nice else None,
            )
    return pt2, onnx


def generator_file(config: Config, name: str) -> Path:
    """The example's generating form (its KV cache as inputs), written beside its .onnx for a causal LM."""
    return config.examples_dir / f"{name}-generator.onnx"


def data_files(model: Path) -> list[Path]:
    """An .onnx's external data file as exporters name it (`model.onnx.data` beside `model.onnx`: torch's
    and onnx's default), where there is one; other layouts come as a .zip. The model is not parsed here."""
    beside = model.with_name(model.name + ".data")
    return [beside] if beside.is_file() else []


def copy_onnx(source: Path, out: Path) -> None:
    """An example's .onnx copied to `out`, with its weights' data file where it has one (a model past
    2 GB: `<file>.data`, under the name the model records, beside the copy)."""
    shutil.copyfile(source, out)
    for data in data_files(source):  # a copy: ONNX refuses a data file with several hard links
        shutil.copyfile(data, out.with_name(data.name))


def example_archive(config: Config, name: str) -> Path | None:
    """The example's .onnx and its weights' data file as one .zip (stored, not compressed), as an upload
    past 2 GB comes: made once, beside them; None for a model in one file."""
    _, onnx = ensure_example_files(config, name)
    data = data_files(onnx)
    archive = config.examples_dir / f"{name}.zip"
    if not data or archive.exists():
        return archive if data else None
    partial = config.examples_dir / f".{name}.partial.zip"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for path in (onnx, *data):
            z.write(path, path.name)
    partial.rename(archive)
    return archive


def prepare_job_folder(config: Config, job_dir: Path, stored: dict) -> None:
    """job.json for the pipeline: the job's options and where its files are; for an example, copies
    of its model files."""
    options = JobOptions.from_json(stored)
    copy_in(config, options.target, job_dir / "tuning")
    if stored.get("tuning_upload"):  # warm start from the records the user sent
        merge_database(job_dir / "input" / "tuning", job_dir / "tuning")
    spec = {
        "options": options.to_json(),
        "bench_budget_s": config.bench_budget_s,
        "quiet_wait_s": config.quiet_wait_s,
        "stage_budgets_s": config.stage_budgets_s,
        "limits": {  # what the job runs within, stated in its result
            "memory_mb": config.memory_limit_mb,
            "cpu_s": config.cpu_limit_s,
            "wall_s": config.wall_limit_s,
            "upload_mb": config.max_upload_mb,
        },
    }
    if stored.get("calibration_data"):
        spec["calibration_data"] = "input/calibration.npz"
    example = EXAMPLES.get(stored.get("example") or "")
    if example:
        spec["dataset"] = example.dataset
        spec["weights"] = example.weights
        pt2, onnx = ensure_example_files(config, example.name)
        (job_dir / "input").mkdir(exist_ok=True)
        copy_onnx(onnx, job_dir / "input" / "model.onnx")
        shutil.copyfile(pt2, job_dir / "input" / "reference.pt2")
        if example.generator:
            copy_onnx(generator_file(config, example.name), job_dir / "input" / "generator.onnx")
            spec |= {"example": example.name, "generator": "input/generator.onnx"}
        spec["model"] = "input/model.onnx"
    else:
        model = stored["model_file"]
        spec["model"] = f"input/{model}"
        if model.endswith(".zip"):  # an .onnx with its external data files: unpacked by the import stage
            spec |= {"model": UNPACKED_MODEL, "archive": f"input/{model}"}
    spec["references"] = model_references(stored)
    write_json_atomic(job_dir / "job.json", spec)


def finished_failing(stage: dict) -> bool:
    """A stage the job goes on without (the benchmark): failed, with its own message."""
    return stage.get("status") == "failed" and isinstance(stage.get("error"), str)


def close_progress(job_dir: Path, returncode: int, limit: str | None, paused_s: float = 0.0) -> dict | None:
    """After the sandbox exits: None if every stage is done, else the error to record, on the stage
    that failed. A limit that ended the run is named in preference to what the pipeline said.
    `paused_s`: how long the job's sandboxes were stopped while other jobs timed, kept in progress.json."""
    progress = read_untrusted_json(job_dir / "progress.json")
    if not isinstance(progress, dict) or not isinstance(progress.get("stages"), list):
        progress = {"stages": [{"name": s, "status": "pending"} for s in STAGES]}
    stages = [s for s in progress["stages"] if isinstance(s, dict)]
    recorded = progress.get("error") if isinstance(progress.get("error"), dict) else None
    paused = {"paused_s": round(paused_s, 1)}  # written by the worker, over whatever the sandbox wrote
    if (
        returncode == 0
        and not limit
        and not recorded
        and all(s.get("status") in ("done", "skipped") or finished_failing(s) for s in stages)
    ):
        write_json_atomic(job_dir / "progress.json", {**progress, **paused})
        return None
    unfinished = [s for s in stages if s.get("status") not in ("done", "skipped") and not finished_failing(s)]
    stage = (recorded or {}).get("stage") or (unfinished[0]["name"] if unfinished else STAGES[-1])
    message = (
        limit or (recorded or {}).get("message") or f"The pipeline process exited with code {returncode}."
    )
    if limit:  # where the process was when a limit ended it: the stage, and the pass it was in
        step = next((s.get("step") for s in stages if s.get("name") == stage and s.get("step")), None)
        message += f" It was in the {stage} stage" + (f", in {step}." if step else ".")
    for s in stages:
        if s.get("status") == "running" or s.get("name") == stage:
            s["status"] = "failed"
    error = {"stage": str(stage), "message": str(message)[:4000]}
    write_json_atomic(job_dir / "progress.json", {"stages": stages, "error": error, **paused})
    return error


def run_job(config: Config, job_id: str) -> None:
    store = job_store(config)
    job, me = store.get(job_id), worker_name(config)
    if job is None or not store.claim(job_id, me):  # gone, or another worker's (a repeated message)
        return
    # claimed just now: the job is there, its "started" this attempt's
    job_dir, started = store.job_dir(job_id), cast(dict, store.get(job_id))["started"]
    give_up_s = config.lost_after_s - config.heartbeat_s
    error: dict | None
    with Heartbeat(store, job_id, me, config.heartbeat_s, give_up_s) as beat:
        try:
            prepare_job_folder(config, job_dir, job["options"])
        except Exception as exc:  # an example that cannot be built is our bug, not the user's
            error = {"stage": "import", "message": f"Could not prepare the job: {exc}"}
        else:
            error = run_prepared_job(config, job_dir, job["options"]["target"], stop=beat.stopped)
    why = beat.stopped()
    if why:
        give_up(store, job_id, me, started, why, config.heartbeat_s)
        return
    finish(store, job_id, error, me)
    threading.Thread(target=prerender_code_views, args=(job_dir,), daemon=True).start()


def finish(
    store: JobStore, job_id: str, error: dict | None, worker: str, started: float | None = None
) -> bool:
    """Records the job's end (while `worker` holds it, in the attempt that began at `started` if
    given), once whatever the sandbox left at rendered/ is gone (webapp/codeviews.py: clear_rendered):
    from then on the web keeps the pages it renders there."""
    clear_rendered(store.job_dir(job_id))
    return store.mark_finished(job_id, error, worker, started)


def give_up(store: JobStore, job_id: str, me: str, started: float, why: str, every: float) -> None:
    """After a job's sandbox was stopped because the job is, or may be, no longer this worker's: once
    the store answers, the attempt this worker began at `started` fails with `why` if it is still its
    own (nothing else would end it: this worker's process lives); another's attempt is left alone."""
    print(f"job {job_id} stopped here: {why}", file=sys.stderr, flush=True)
    while True:
        try:
            finish(store, job_id, {"stage": "worker", "message": why}, me, started)
            return
        except Exception as exc:  # the store still away
            print(f"job {job_id}: the store: {exc}", file=sys.stderr, flush=True)
            time.sleep(every)


def prerender_code_views(job_dir: Path) -> None:
    """The finished job's long kernel views rendered once (webapp/codeviews.py: prerender), in a thread
    of low priority so that the next job is not slowed."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)  # Linux: a thread's own nice value
    started = time.monotonic()
    try:
        count = prerender(job_dir, read_untrusted_json(job_dir / "result.json") or {})
    except Exception as exc:  # a job folder removed meanwhile, an odd result.json: shown on demand instead
        print(f"code views of {job_dir.name} not rendered beforehand: {exc!r}", file=sys.stderr, flush=True)
        return
    print(f"code views of {job_dir.name}: {count} rendered in {time.monotonic() - started:.1f} s", flush=True)


class Heartbeat(threading.Thread):
    """While a job runs, its worker's sign of life in the store every `every` seconds: a job whose
    heartbeat stops (its machine lost) is retried by another worker (recover_interrupted). `stopped()`
    says why the job's sandbox must stop at once: the job is no longer this worker's (another took it
    over), or may soon not be (no beat has reached the store for `give_up_s`, less than the silence
    after which other workers take a job over; a beat may fail or hang)."""

    def __init__(self, store: JobStore, job_id: str, worker: str, every: float, give_up_s: float):
        super().__init__(daemon=True, name=f"heartbeat {job_id}")
        self.store, self.job_id, self.worker, self.every = store, job_id, worker, every
        self.give_up_s, self.last_beat, self.taken = give_up_s, time.monotonic(), False
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            sent = time.monotonic()  # the store stamps the beat no earlier than this
            try:
                self.taken = not self.store.beat(self.job_id, self.worker)
            except Exception as exc:  # the database away for a moment: the next beat tries again
                print(f"heartbeat of {self.job_id}: {exc}", file=sys.stderr, flush=True)
                continue
            if self.taken:
                return
            self.last_beat = sent

    def stopped(self) -> str | None:
        if self.taken:
            return "Another worker took this job over (this one had been out of touch with the job store)."
        silent = time.monotonic() - self.last_beat
        if silent > self.give_up_s:
            return (
                f"This worker could not reach the job store for {silent:.0f} s, so another worker may "
                "take the job over: its run here was stopped."
            )
        return None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()


def run_prepared_job(
    config: Config, job_dir: Path, target: str, stop: Callable[[], str | None] | None = None
) -> dict | None:
    """The sandboxed pipeline on a prepared job folder, its tuning records merged into the shared
    database (what it tuned counts even if it failed); returns the error, or None when it succeeded.
    When `stop` gives a reason, the sandbox is killed and the folder left as it is (another worker's
    now): returns None then (the caller asks `stop` again)."""
    outcome = run_sandboxed(job_dir, config, stop=stop)
    if stop is not None and stop():
        return None
    merge_back(config, target, job_dir / "tuning")
    paused = outcome.paused_s
    board = targets.get(target).timed_on_board
    if outcome.returncode == 0 and not outcome.limit and board:
        outcome = run_remote_stage(config, job_dir, board, stop)
        if stop is not None and stop():
            return None
        paused += outcome.paused_s
    return close_progress(job_dir, outcome.returncode, outcome.limit, paused)


def run_remote_stage(
    config: Config, job_dir: Path, key: str, stop: Callable[[], str | None] | None = None
) -> Outcome:
    """The remote stage (webapp/pipeline/stages/remote.py) on a job the pipeline prepared for a board of
    `key`: in a sandbox of its own that may reach the device pool, and reads no model, only built
    libraries. What it must trust comes from here, on its command line."""
    wait_s = board_wait_s(config, key)
    command = [sys.executable, "-m", "webapp.pipeline.stages.remote", str(job_dir), config.tracker, key]
    command += [str(wait_s), str(config.bench_budget_s)]  # as remote.Remote.from_argv reads them
    # never stopped for other jobs' timings: its work on an emulated board holds the slot itself, and a
    # real board's lease would stand idle
    return run_sandboxed(job_dir, config, command, network=True, stop=stop, pausable=False)


def board_wait_s(config: Config, key: str) -> float:
    """The full wait while the pool prepares or a board of the key is registered; half a minute when
    nothing would bring one (no pool, or one whose boards cannot start, and no board of the key)."""
    from webapp.devices.status import read_status
    from webapp.devices.tracker import TrackerError, pool_of, tracker_summary

    try:
        boards = pool_of(tracker_summary(config.tracker)).get(key, {}).get("boards", 0)
    except TrackerError:
        boards = 0
    if boards or read_status(config).get("state") == "preparing":
        return config.board_wait_s
    return min(config.board_wait_s, 30.0)


RETRIED = "retried after the worker stopped"
PIPELINE_OUTPUTS = (
    RENDERED,
    "progress.json",
    "result.json",
    "log.txt",
    "views",
    "files",
    "remote",
    "tuning",
    "job.json",
)


def recover_interrupted(config: Config, enqueue: Callable[[str], None]) -> list[str]:
    """Jobs whose worker is gone: a dead process of this machine (its sandboxes died with it), or a
    worker anywhere whose heartbeat has been silent for lost_after_s (its machine lost). Each is queued
    again once, with what its first attempt wrote removed, and fails with a plain message if its
    worker is lost again. Any worker may run this at any time: the store hands each job to one.
    Returns the ids queued again; `enqueue(job_id)` queues one."""
    store, now = job_store(config), time.time()
    requeued = []
    for job in store.running():
        host, _, pid = (job["worker"] or "").rpartition(":")
        if host == config.host:
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue
        elif (job["heartbeat"] or 0) > now - config.lost_after_s:
            continue
        job_id = job["id"]
        if job["attempts"] >= 1:
            message = (
                "The worker stopped while this job was running, twice (it was retried once): the job "
                "may be what stops it. Submit it again, or with other options."
            )
            finish(store, job_id, close_progress(store.job_dir(job_id), -1, message), job["worker"])
            continue
        if retry(store, job_id, job["worker"], RETRIED, worker_name(config)):
            enqueue(job_id)
            requeued.append(job_id)
    return requeued


def retry(store: JobStore, job_id: str, worker: str, note: str, me: str) -> bool:
    """Put a job the lost `worker` was running back in the queue, with what its attempt wrote
    removed (its inputs stay). The job is first taken over by `me` (this worker), so that no other
    recovery, and no worker that claims it once queued, meets the removal. False when it was no
    longer `worker`'s (another worker's recovery took it)."""
    if not store.take_over(job_id, worker, me):
        return False
    job_dir = store.job_dir(job_id)
    for name in PIPELINE_OUTPUTS:
        path = job_dir / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    return store.requeue(job_id, me, note)


def requeue_waiting(config: Config, enqueue: Callable[[str], None]) -> None:
    """Queue every waiting job again (a worker's start): a queue that lost its messages (a Redis
    without persistence, restarted) loses no job, and a repeated message is a no-op (run_job claims)."""
    for job_id in job_store(config).waiting():
        enqueue(job_id)


def look_after(config: Config, enqueue: Callable[[str], None]) -> threading.Thread:
    """A thread of the worker process: recover_interrupted every heartbeat period, the retention
    policy (collect_garbage) every gc_every_s."""
    from webapp.jobs.storage import collect_garbage

    def loop():
        next_gc = time.monotonic()
        while True:
            try:
                recover_interrupted(config, enqueue)
                if time.monotonic() >= next_gc:
                    next_gc = time.monotonic() + config.gc_every_s
                    collect_garbage(config)
            except Exception as exc:  # the database away for a moment: try again next period
                print(f"recovery: {exc}", file=sys.stderr, flush=True)
            time.sleep(config.heartbeat_s)

    thread = threading.Thread(target=loop, daemon=True, name="recovery")
    thread.start()
    return thread
