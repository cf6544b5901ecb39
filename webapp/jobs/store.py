"""The job store: a table of job records (SQLite in the data folder, or PostgreSQL when DATABASE_URL
is set), and each job's folder under data/jobs/<id>.

The record holds what the web layer decides (options, status, error) and who runs the job (worker,
heartbeat); the folder holds what the sandboxed pipeline writes (progress.json, result.json,
artifacts). `job_view` joins the two into the one dict that both the result page and the JSON API
render.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webapp.catalog import STAGES
from webapp.config import Config
from webapp.jsonfile import read_plain

if TYPE_CHECKING:
    import psycopg

    # a cursor of either engine, its rows dicts (sqlite3.Row: by column name too)
    Cursor = sqlite3.Cursor | psycopg.Cursor[dict[str, Any]]

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{22,64}$")

# One schema for both engines (DOUBLE PRECISION: PostgreSQL's REAL is 4 bytes, too few for a time).
COLUMNS = (
    ("id", "TEXT PRIMARY KEY"),
    ("created", "DOUBLE PRECISION NOT NULL"),
    ("status", "TEXT NOT NULL"),
    ("options", "TEXT NOT NULL"),
    ("error", "TEXT"),
    ("started", "DOUBLE PRECISION"),
    ("finished", "DOUBLE PRECISION"),
    ("worker", "TEXT"),
    # added since the first schema: stores made before them gain them at start
    ("attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("note", "TEXT"),
    ("fingerprint", "TEXT"),
    ("heartbeat", "DOUBLE PRECISION"),  # the running worker's last sign of life
    ("client", "TEXT"),  # the submitter's address (admission control counts its queued jobs)
    ("expired", "TEXT"),  # JSON: when the retention policy removed the large artifacts, why, which
    ("delete_token", "TEXT"),  # sha256 of the token of the submitter's delete link
)
FIRST_COLUMNS = 8


def new_job_id() -> str:
    return secrets.token_urlsafe(18)  # 144 random bits


def read_untrusted_json(path: Path, max_bytes: int = 64 << 20) -> Any:
    """JSON the sandboxed pipeline wrote: a regular file inside the job folder, bounded in size."""
    data = read_plain(path, max_bytes)
    try:
        return json.loads(data) if data is not None else None
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None


class JobStore:
    """Every query is written once, with `?` placeholders (on PostgreSQL they become `%s`)."""

    def __init__(self, data_dir: Path, database_url: str | None = None):
        self.data_dir = data_dir
        self.jobs_dir = data_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.database_url = database_url
        self.db_path = data_dir / "jobs.db"
        self.local = threading.local()  # one connection per thread (SQLite: and per process), kept
        first = ", ".join(f"{name} {kind}" for name, kind in COLUMNS[:FIRST_COLUMNS])
        with self.cursor() as cur:
            if not database_url:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"CREATE TABLE IF NOT EXISTS jobs ({first})")
            have = self.column_names(cur)
            for name, kind in COLUMNS[FIRST_COLUMNS:]:
                if name not in have:
                    cur.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
            cur.execute("CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status)")
            cur.execute("CREATE INDEX IF NOT EXISTS jobs_fingerprint ON jobs (fingerprint)")

    def column_names(self, cur: Cursor) -> set[str]:
        if self.database_url:
            cur.execute("SELECT column_name AS name FROM information_schema.columns WHERE table_name='jobs'")
        else:
            cur.execute("PRAGMA table_info(jobs)")
        return {row["name"] for row in cur.fetchall()}

    @contextmanager
    def cursor(self) -> Iterator[Cursor]:
        """A cursor whose rows are dicts, in a transaction committed at the end of the block."""
        if not self.database_url:
            # one connection per thread and process (a forked child opens its own): opening one per
            # query was a third of a cached page's time
            mine = getattr(self.local, "sqlite", None)
            if mine is None or mine[0] != os.getpid():
                db = sqlite3.connect(self.db_path, timeout=30)
                db.row_factory = sqlite3.Row
                self.local.sqlite = mine = (os.getpid(), db)
            with mine[1] as db:  # a transaction: committed at the end of the block, or rolled back
                cur = db.cursor()
                try:
                    yield cur
                finally:
                    cur.close()
            return
        import psycopg
        from psycopg.rows import dict_row

        conn = getattr(self.local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(
                self.database_url, row_factory=dict_row, autocommit=True, connect_timeout=10
            )
            self.local.conn = conn
        try:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
        except psycopg.OperationalError:
            conn.close()  # the server went away: the next query connects again
            raise

    def query(self, sql: str, *params: object) -> list[dict]:
        with self.cursor() as cur:
            cur.execute(self.placeholders(sql), params)
            return [dict(row) for row in cur.fetchall()]

    def change(self, sql: str, *params: object) -> int:
        """Run an UPDATE / INSERT / DELETE; returns how many rows it changed."""
        with self.cursor() as cur:
            cur.execute(self.placeholders(sql), params)
            return cur.rowcount

    def placeholders(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.database_url else sql

    def job_dir(self, job_id: str) -> Path:
        if not ID_PATTERN.match(job_id):
            raise ValueError("bad job id")
        return self.jobs_dir / job_id

    def create(
        self, job_id: str, options: dict, fingerprint: str | None = None, client: str = "", token: str = ""
    ) -> None:
        """A queued job; `token` is its delete link's (only its hash is kept)."""
        self.change(
            "INSERT INTO jobs (id, created, status, options, fingerprint, client, delete_token) "
            "VALUES (?, ?, 'queued', ?, ?, ?, ?)",
            job_id,
            time.time(),
            json.dumps(options),
            fingerprint,
            client,
            token_hash(token) if token else None,
        )

    def find_identical(self, fingerprint: str) -> str | None:
        """The newest job of this fingerprint that is done or under way (a failed one is not reused)."""
        rows = self.query(
            "SELECT id FROM jobs WHERE fingerprint = ? AND status IN ('done', 'queued', 'running') "
            "AND expired IS NULL ORDER BY created DESC LIMIT 1",
            fingerprint,
        )
        return rows[0]["id"] if rows else None

    def get(self, job_id: str) -> dict | None:
        if not ID_PATTERN.match(job_id):
            return None
        rows = self.query("SELECT * FROM jobs WHERE id = ?", job_id)
        if not rows:
            return None
        job = rows[0]
        job["options"] = json.loads(job["options"])
        job["error"] = json.loads(job["error"]) if job["error"] else None
        job["expired"] = json.loads(job["expired"]) if job["expired"] else None
        return job

    def claim(self, job_id: str, worker: str) -> bool:
        """Mark a queued job running on `worker`; False when another worker has it already."""
        now = time.time()
        return 1 == self.change(
            "UPDATE jobs SET status = 'running', started = ?, worker = ?, heartbeat = ? "
            "WHERE id = ? AND status = 'queued'",
            now,
            worker,
            now,
            job_id,
        )

    def beat(self, job_id: str, worker: str) -> bool:
        """The running worker's sign of life; False when the job is no longer its own."""
        return 1 == self.change(
            "UPDATE jobs SET heartbeat = ? WHERE id = ? AND status = 'running' AND worker = ?",
            time.time(),
            job_id,
            worker,
        )

    def mark_finished(
        self, job_id: str, error: dict | None, worker: str, started: float | None = None
    ) -> bool:
        """Record a job's end, while `worker` still holds it (a worker given up for lost, whose job
        runs elsewhere now, records nothing), in the attempt that began at `started` if given (a
        worker's threads share its name); False when nothing was recorded."""
        return 1 == self.change(
            "UPDATE jobs SET status = ?, error = ?, finished = ?, heartbeat = NULL "
            "WHERE id = ? AND status = 'running' AND worker = ?" + (" AND started = ?" if started else ""),
            "failed" if error else "done",
            json.dumps(error) if error else None,
            time.time(),
            job_id,
            worker,
            *([started] if started else []),
        )

    def take_over(self, job_id: str, worker: str, me: str) -> bool:
        """A running job of the lost `worker` becomes `me`'s; False when it is no longer `worker`'s."""
        return 1 == self.change(
            "UPDATE jobs SET worker = ? WHERE id = ? AND status = 'running' AND worker = ?",
            me,
            job_id,
            worker,
        )

    def requeue(self, job_id: str, worker: str, note: str) -> bool:
        """A running job back in the queue for another attempt, with the reason on its page; False
        when it is no longer `worker`'s (another worker's recovery took it first)."""
        return 1 == self.change(
            "UPDATE jobs SET status = 'queued', started = NULL, worker = NULL, heartbeat = NULL, "
            "attempts = attempts + 1, note = ? WHERE id = ? AND status = 'running' AND worker = ?",
            note,
            job_id,
            worker,
        )

    def request_cancel(self, job_id: str) -> bool:
        """Flag a running job to stop tuning (the pipeline polls the flag file); False if not running."""
        job = self.get(job_id)
        if job is None or job["status"] != "running":
            return False
        (self.job_dir(job_id) / "cancel").write_text("cancel requested\n")
        return True

    def running(self) -> list[dict]:
        """The running jobs: id, worker, heartbeat and attempts."""
        return self.query("SELECT id, worker, heartbeat, attempts FROM jobs WHERE status = 'running'")

    def expirable(self) -> list[dict]:
        """Finished jobs whose artifacts are still there, oldest first: id and finished."""
        return self.query(
            "SELECT id, finished FROM jobs WHERE status IN ('done', 'failed') AND expired IS NULL "
            "ORDER BY finished"
        )

    def mark_expired(self, job_id: str, what: dict) -> None:
        self.change("UPDATE jobs SET expired = ? WHERE id = ?", json.dumps(what), job_id)

    def may_delete(self, job_id: str, token: str) -> bool:
        """Whether `token` is the one of this job's delete link."""
        job = self.get(job_id)
        stored = (job or {}).get("delete_token") or ""
        return bool(stored and token) and hmac.compare_digest(stored, token_hash(token))

    def mark_deleted(self, job_id: str) -> None:
        self.change(
            "UPDATE jobs SET status = 'deleted', options = '{}', fingerprint = NULL WHERE id = ?", job_id
        )

    def waiting(self) -> list[str]:
        """The queued jobs' ids, oldest first."""
        return [r["id"] for r in self.query("SELECT id FROM jobs WHERE status = 'queued' ORDER BY created")]

    def queue_place(self, job_id: str, created: float, recent: int = 20) -> dict:
        """Where a queued job stands: its place in the queue (1: next), the jobs running now, and the
        median time from start to end of the last `recent` jobs that ended (None before any)."""
        ahead = self.query("SELECT COUNT(*) AS n FROM jobs WHERE status = 'queued' AND created < ?", created)
        running = self.query("SELECT COUNT(*) AS n FROM jobs WHERE status = 'running'")
        took = self.query(
            "SELECT finished - started AS s FROM jobs WHERE status IN ('done', 'failed') "
            "AND started IS NOT NULL AND finished IS NOT NULL ORDER BY finished DESC LIMIT ?",
            recent,
        )
        durations = sorted(r["s"] for r in took)
        median = durations[len(durations) // 2] if durations else None
        return {"place": int(ahead[0]["n"]) + 1, "running": int(running[0]["n"]), "median_s": median,
                "recent": len(durations)}  # fmt: skip

    def recent_examples(self, limit: int) -> list[dict]:
        """The newest finished jobs of the built-in examples (never an upload): id and options."""
        rows = self.query(
            "SELECT id, options FROM jobs WHERE status = 'done' AND options LIKE ? ORDER BY finished DESC "
            "LIMIT ?",
            '%"example": %',
            limit * 3,
        )
        jobs = [{"id": r["id"], "options": json.loads(r["options"])} for r in rows]
        return [j for j in jobs if j["options"].get("example")][:limit]

    def queued_count(self, client: str | None = None) -> int:
        """Jobs waiting or running, of one client address or of everyone."""
        sql = "SELECT COUNT(*) AS n FROM jobs WHERE status IN ('queued', 'running')"
        rows = self.query(sql + " AND client = ?", client) if client is not None else self.query(sql)
        return int(rows[0]["n"])


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@functools.cache
def open_store(data_dir: Path, database_url: str | None) -> JobStore:
    return JobStore(data_dir, database_url)


def job_store(config: Config) -> JobStore:
    """The job store of a configuration (one per data folder and database in a process)."""
    return open_store(config.data_dir, config.database_url)


def job_view(store: JobStore, job_id: str, url_root: str = "") -> dict | None:
    """Everything known about a job, as /api/jobs/<id>, /r/<id>.json and the result page show it."""
    job = store.get(job_id)
    if job is None:
        return None
    job_dir = store.job_dir(job_id)
    progress = read_untrusted_json(job_dir / "progress.json") or {}
    stages = progress.get("stages") or [
        {"name": s, "status": "pending", "seconds": None, "progress": None} for s in STAGES
    ]
    queue = None
    if job["status"] == "queued":
        stages = [{**s, "status": "queued"} for s in stages]
        queue = queue_estimate(store.queue_place(job_id, job["created"]))
    return {
        "id": job_id,
        "status": job["status"],
        "created": job["created"],
        "started": job["started"],
        "finished": job["finished"],
        "options": job["options"],
        "stages": stages,
        "error": job["error"],
        "note": job["note"],  # e.g. "retried after the worker stopped"
        "expired": job["expired"],  # {"at", "reason", "files"} once the retention policy removed artifacts
        "queue": queue,  # a queued job's place, and when it may start (queue_estimate)
        # stopped while other jobs held the machine's timing slot (the worker's own record)
        "paused_s": seconds_or_none(progress.get("paused_s")),
        "results": read_untrusted_json(job_dir / "result.json") or {},
        "url": f"{url_root}/r/{job_id}",
        "api_url": f"{url_root}/api/jobs/{job_id}",
    }


def seconds_or_none(value: Any) -> float | None:
    """A count of seconds from an untrusted file: a finite number >= 0, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None


def queue_estimate(place: dict) -> dict:
    """A queued job's place and about when it starts: the jobs ahead of it, shared among the workers
    busy now (at least one), each taking the recent median; the running ones half done. None where no
    job has ended yet to take the median of."""
    median = place["median_s"]
    workers = max(place["running"], 1)
    start = median * ((place["place"] - 1) / workers + (0.5 if place["running"] else 0)) if median else None
    return place | {"start_in_s": start}
