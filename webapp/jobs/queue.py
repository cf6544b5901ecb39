"""The job queue: huey on SQLite in the data folder, or on Redis when REDIS_URL is set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from huey import RedisHuey, SqliteHuey

from webapp.config import Config

if TYPE_CHECKING:
    from huey.consumer import Consumer


class JobQueue:
    def __init__(self, config: Config):
        self.config = config
        if config.redis_url:
            self.huey = RedisHuey("tvm-playground", url=config.redis_url)
        else:
            config.data_dir.mkdir(parents=True, exist_ok=True)
            self.huey = SqliteHuey("tvm-playground", filename=str(config.data_dir / "queue.db"))

        @self.huey.task(name="run_job")
        def run_job_task(job_id: str) -> None:
            from webapp.jobs.worker import run_job

            run_job(config, job_id)

        @self.huey.task(name="run_input")
        def run_input_task(job_id: str, run_id: str) -> None:
            from webapp.jobs.own_input import run_input

            run_input(config, job_id, run_id)

        @self.huey.task(name="run_lab")
        def run_lab_task(lab_id: str) -> None:
            from webapp.jobs.lab import run_lab

            run_lab(config, lab_id)

        self.run_job_task, self.run_input_task, self.run_lab_task = run_job_task, run_input_task, run_lab_task

    def enqueue(self, job_id: str) -> None:
        self.run_job_task(job_id)

    def enqueue_input(self, job_id: str, run_id: str) -> None:
        """A result's model on a user's input (webapp/jobs/own_input.py)."""
        self.run_input_task(job_id, run_id)

    def enqueue_lab(self, lab_id: str) -> None:
        """A kernel lab run (webapp/jobs/lab.py)."""
        self.run_lab_task(lab_id)

    def consumer(self, workers: int = 1) -> Consumer:
        """A huey consumer; `.start()` runs it in threads, `.run()` in the foreground."""
        return self.huey.create_consumer(
            workers=workers, worker_type="thread", periodic=False, initial_delay=0.2, max_delay=1.0
        )
