"""The job store: one SQLite table of job records, and each job's folder under data/jobs/<id>.

The record holds what the web layer decides (options, status, error); the folder holds what the
sandboxed pipeline writes (progress.json, result.json, artifacts). `job_view` joins the two into the
one dict that both the result page and the JSON API render.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from webapp.catalog import STAGES

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{22,64}$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    status TEXT NOT NULL,
    options TEXT NOT NULL,
    error TEXT,
    started REAL,
    finished REAL,
    worker TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    note TEXT,
    fingerprint TEXT
)
"""
# Columns added since the first schema, for stores made before them: (name, definition).
ADDED_COLUMNS = (("attempts", "INTEGER NOT NULL DEFAULT 0"), ("note", "TEXT"), ("fingerprint", "TEXT"))


def new_job_id() -> str:
    return secrets.token_urlsafe(18)  # 144 random bits


def read_untrusted_json(path: Path, max_bytes: int = 64 << 20):
    """JSON the sandboxed pipeline wrote: a regular file inside the job folder, bounded in size."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > max_bytes:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class JobStore:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.jobs_dir = data_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.db_path = data_dir / "jobs.db"
        with closing(self.connect()) as db, db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(SCHEMA)
            have = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, definition in ADDED_COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")

    def connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30)
        db.row_factory = sqlite3.Row
        return db

    def job_dir(self, job_id: str) -> Path:
        if not ID_PATTERN.match(job_id):
            raise ValueError("bad job id")
        return self.jobs_dir / job_id

    def create(self, job_id: str, options: dict, fingerprint: str | None = None) -> None:
        with closing(self.connect()) as db, db:
            db.execute(
                "INSERT INTO jobs (id, created, status, options, fingerprint) VALUES (?, ?, 'queued', ?, ?)",
                (job_id, time.time(), json.dumps(options), fingerprint),
            )

    def find_identical(self, fingerprint: str) -> str | None:
        """The newest job of this fingerprint that is done or under way (a failed one is not reused)."""
        with closing(self.connect()) as db:
            row = db.execute(
                "SELECT id FROM jobs WHERE fingerprint = ? AND status IN ('done', 'queued', 'running') "
                "ORDER BY created DESC LIMIT 1",
                (fingerprint,),
            ).fetchone()
        return row["id"] if row else None

    def get(self, job_id: str) -> dict | None:
        if not ID_PATTERN.match(job_id):
            return None
        with closing(self.connect()) as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        job = dict(row)
        job["options"] = json.loads(job["options"])
        job["error"] = json.loads(job["error"]) if job["error"] else None
        return job

    def mark_running(self, job_id: str, worker: str) -> None:
        with closing(self.connect()) as db, db:
            db.execute(
                "UPDATE jobs SET status = 'running', started = ?, worker = ? WHERE id = ?",
                (time.time(), worker, job_id),
            )

    def mark_finished(self, job_id: str, error: dict | None) -> None:
        with closing(self.connect()) as db, db:
            db.execute(
                "UPDATE jobs SET status = ?, error = ?, finished = ? WHERE id = ?",
                ("failed" if error else "done", json.dumps(error) if error else None, time.time(), job_id),
            )

    def requeue(self, job_id: str, note: str) -> None:
        """A running job back in the queue for another attempt, with the reason on its page."""
        with closing(self.connect()) as db, db:
            db.execute(
                "UPDATE jobs SET status = 'queued', started = NULL, worker = NULL, "
                "attempts = attempts + 1, note = ? WHERE id = ?",
                (note, job_id),
            )

    def request_cancel(self, job_id: str) -> bool:
        """Flag a running job to stop tuning (the pipeline polls the flag file); False if not running."""
        job = self.get(job_id)
        if job is None or job["status"] != "running":
            return False
        (self.job_dir(job_id) / "cancel").write_text("cancel requested\n")
        return True

    def running_on(self, worker_prefix: str) -> list[str]:
        with closing(self.connect()) as db:
            rows = db.execute("SELECT id, worker FROM jobs WHERE status = 'running'").fetchall()
        return [r["id"] for r in rows if (r["worker"] or "").startswith(worker_prefix)]


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
    if job["status"] == "queued":
        stages = [{**s, "status": "queued"} for s in stages]
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
        "results": read_untrusted_json(job_dir / "result.json") or {},
        "url": f"{url_root}/r/{job_id}",
        "api_url": f"{url_root}/api/jobs/{job_id}",
    }
