"""Configuration: defaults, overridden by environment variables, read once at start-up."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Several times what the corpus' largest models take on 2 cores (tests/corpus.py); a stage past its
# budget is a runaway pass or a model too large for this machine.
STAGE_BUDGETS_S = {"import": 600, "optimize": 900, "quantize": 1800, "build": 1800, "inspect": 900}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


@dataclass(frozen=True)
class Config:
    data_dir: Path = field(default_factory=lambda: Path("data").resolve())
    port: int = 8000
    redis_url: str | None = None  # the queue: huey on Redis (default: huey on SQLite in the data folder)
    database_url: str | None = None  # the job store: PostgreSQL (default: SQLite in the data folder)
    max_upload_mb: int = 4096  # a model over 2 GB comes as a .zip with its external data
    max_unzipped_mb: int = 4608  # what a zip upload (.pt2, .npz, an .onnx with its data) may expand to
    # Admission control: submissions per client address (flask-limiter's syntax; "" for none), and
    # caps on jobs queued or running, per address and in all (0 for none); past them, 429.
    submit_rate: str = "10 per minute;100 per day"
    lab_rate: str = "40 per minute;2000 per day"  # kernel lab builds per address (PLAYGROUND_LAB_RATE)
    max_queued_per_client: int = 3
    max_queued: int = 50
    # Retention: finished jobs' large artifacts expire after keep_days, and the oldest first while
    # the data passes keep_gb (0: never); `tvm-playground gc`, and the worker every gc_every_s.
    keep_days: float = 30.0
    keep_gb: float = 0.0
    gc_every_s: float = 3600.0
    # Limits of one sandboxed pipeline run.
    memory_limit_mb: int = 16384  # address space
    cpu_limit_s: int = 3600
    wall_limit_s: int = 3600
    nice: int = 10  # jobs run at lower CPU priority than the web, which stays quick while they compile
    process_limit: int = 512  # processes and threads
    output_limit_mb: int = 4096  # largest file the job may write
    bench_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    bench_budget_s: float = 2.0  # timing budget per runtime (ResNet-50: ~50 runs, a steady median)
    # How long a benchmark waits, at most, for the machine to be quiet before it times and before it
    # times again where other processes disturbed it (webapp/pipeline/stages/timing.py); 0: timed once
    quiet_wait_s: float = 30.0
    # Time budgets of the stages (seconds; PLAYGROUND_STAGE_BUDGETS, JSON, overrides some): a stage
    # past its budget ends the job, naming the stage and the pass it was in. The tune and benchmark
    # stages keep to budgets of their own (trials, bench_budget_s).
    stage_budgets_s: dict = field(default_factory=lambda: dict(STAGE_BUDGETS_S))
    unsandboxed: bool = False  # only for development where bubblewrap cannot run
    shipped_tuning_records: bool = True  # a new data folder starts from webapp/tuning_records
    # The device pool (webapp/devices): TVM's RPC tracker, and boards registered under a target's key.
    tracker: str = "127.0.0.1:9190"  # where clients and boards reach the tracker
    tracker_bind: str | None = None  # the address it listens on (0.0.0.0 to let real boards join)
    emulated_boards: bool = True  # one QEMU board per Arm board target, started by the pool
    # an identical job answers from an earlier one (PLAYGROUND_REUSE_RESULTS=0: never)
    reuse_results: bool = True
    # A running job's worker writes a heartbeat into the store; one silent for lost_after_s is given up
    # for lost (its machine gone) and the job retried by another worker. A worker whose beats have not
    # reached the store for lost_after_s - heartbeat_s stops its job's sandbox (at least 3 beats apart).
    host: str = field(default_factory=socket.gethostname)  # this machine's name in worker names
    heartbeat_s: float = 5.0
    lost_after_s: float = 60.0
    board_wait_s: float = 900.0  # how long a job waits for a free board before it fails
    rootfs: Path | None = None  # the boards' arm64 root file system (default: in the data folder)
    # The machine's timing slot (webapp/machine/timing_slot.py): a file on this machine's own disk, the
    # same for every worker on it (default: /tmp/tvm-playground-timing.lock; not in the data folder, which
    # several machines may share)
    timing_lock: Path | None = None

    def __post_init__(self) -> None:
        if self.lost_after_s < 3 * self.heartbeat_s:
            raise ValueError(
                f"PLAYGROUND_LOST_AFTER_S ({self.lost_after_s:g}) must be at least 3 x "
                f"PLAYGROUND_HEARTBEAT_S ({self.heartbeat_s:g}): a worker stops its job when no beat "
                "reached the store for lost_after_s - heartbeat_s."
            )

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        c = cls()
        c = replace(
            c,
            data_dir=Path(os.environ.get("PLAYGROUND_DATA") or c.data_dir).resolve(),
            port=env_int("PORT", c.port),
            redis_url=os.environ.get("REDIS_URL") or None,
            database_url=os.environ.get("DATABASE_URL") or None,
            max_upload_mb=env_int("PLAYGROUND_MAX_UPLOAD_MB", c.max_upload_mb),
            submit_rate=os.environ.get("PLAYGROUND_SUBMIT_RATE", c.submit_rate),
            lab_rate=os.environ.get("PLAYGROUND_LAB_RATE", c.lab_rate),
            max_queued_per_client=env_int("PLAYGROUND_MAX_QUEUED_PER_CLIENT", c.max_queued_per_client),
            max_queued=env_int("PLAYGROUND_MAX_QUEUED", c.max_queued),
            keep_days=float(os.environ.get("PLAYGROUND_KEEP_DAYS") or c.keep_days),
            keep_gb=float(os.environ.get("PLAYGROUND_KEEP_GB") or c.keep_gb),
            memory_limit_mb=env_int("PLAYGROUND_MEMORY_LIMIT_MB", c.memory_limit_mb),
            cpu_limit_s=env_int("PLAYGROUND_CPU_LIMIT_S", c.cpu_limit_s),
            wall_limit_s=env_int("PLAYGROUND_WALL_LIMIT_S", c.wall_limit_s),
            nice=env_int("PLAYGROUND_JOB_NICE", c.nice),
            process_limit=env_int("PLAYGROUND_PROCESS_LIMIT", c.process_limit),
            bench_threads=env_int("PLAYGROUND_BENCH_THREADS", c.bench_threads),
            bench_budget_s=float(os.environ.get("PLAYGROUND_BENCH_BUDGET_S") or c.bench_budget_s),
            quiet_wait_s=float(os.environ.get("PLAYGROUND_QUIET_WAIT_S") or c.quiet_wait_s),
            stage_budgets_s=c.stage_budgets_s
            | json.loads(os.environ.get("PLAYGROUND_STAGE_BUDGETS") or "{}"),
            unsandboxed=os.environ.get("PLAYGROUND_UNSANDBOXED") == "1",
            tracker=os.environ.get("PLAYGROUND_TRACKER") or c.tracker,
            tracker_bind=os.environ.get("PLAYGROUND_TRACKER_BIND") or None,
            emulated_boards=os.environ.get("PLAYGROUND_EMULATED_BOARDS", "1") != "0",
            reuse_results=os.environ.get("PLAYGROUND_REUSE_RESULTS", "1") != "0",
            host=os.environ.get("PLAYGROUND_HOST") or c.host,
            heartbeat_s=float(os.environ.get("PLAYGROUND_HEARTBEAT_S") or c.heartbeat_s),
            lost_after_s=float(os.environ.get("PLAYGROUND_LOST_AFTER_S") or c.lost_after_s),
            board_wait_s=float(os.environ.get("PLAYGROUND_BOARD_WAIT_S") or c.board_wait_s),
            rootfs=Path(os.environ["PLAYGROUND_ROOTFS"]).resolve()
            if os.environ.get("PLAYGROUND_ROOTFS")
            else None,
            timing_lock=Path(os.environ["PLAYGROUND_TIMING_LOCK"]).resolve()
            if os.environ.get("PLAYGROUND_TIMING_LOCK")
            else None,
        )
        return replace(c, **overrides)

    @property
    def timing_lock_path(self) -> Path:
        return self.timing_lock or Path("/tmp/tvm-playground-timing.lock")

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def devices_dir(self) -> Path:
        return self.data_dir / "devices"

    @property
    def rootfs_dir(self) -> Path:
        return self.rootfs or self.devices_dir / "rootfs"

    @property
    def examples_dir(self) -> Path:
        return self.data_dir / "examples"
