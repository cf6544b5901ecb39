"""Storage that stays bounded: uploads kept once by content hash, old artifacts expired by the
retention policy (`tvm-playground gc`, and the worker every hour), results deleted by their submitter.

An upload lives in data/uploads/<sha256>, hard-linked into each job folder that uses it (read-only
inside the sandbox); a blob no job links to any more is removed by the next collection. Expiry
removes a finished job's large artifacts (its inputs, compiled libraries, IR archive, board files and
tuning copy) and keeps what its page shows: result.json, the stages, the code views and the graphs."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from webapp.config import Config
from webapp.jobs.own_input import runs_dir
from webapp.jobs.store import job_store


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def store_once(config: Config, path: Path) -> str:
    """Keep the file at `path` once: it becomes a hard link to data/uploads/<its sha256> (the first
    copy of those bytes becomes the blob). Returns the digest."""
    digest = file_digest(path)
    uploads = config.data_dir / "uploads"
    uploads.mkdir(exist_ok=True)
    blob = uploads / digest
    while True:
        try:
            os.link(path, blob)  # these bytes are new here: this file becomes the blob
            os.chmod(blob, 0o444)
            return digest
        except FileExistsError:
            spare = path.with_name(path.name + ".link")
            try:
                os.link(blob, spare)
            except FileNotFoundError:  # collected just now as unused: make it again
                continue
            os.replace(spare, path)
            return digest


# What expiry removes from a job folder (files/: everything but the graphs' SVG pictures).
EXPIRED_DIRS = ("input", "remote", "tuning")
KEPT_FILES = (".svg",)


def expire_job(job_dir: Path) -> tuple[int, list[str]]:
    """Remove a finished job's large artifacts; returns (bytes freed, the downloads removed)."""
    freed, removed = 0, []
    targets = [job_dir / d for d in EXPIRED_DIRS] + [job_dir / "job.json"]
    files_dir = job_dir / "files"
    if files_dir.is_dir():
        for f in sorted(files_dir.iterdir()):
            if not f.name.endswith(KEPT_FILES):
                targets.append(f)
                removed.append(f.name)
    for path in targets:
        freed += remove(path)
    return freed, removed


def remove(path: Path) -> int:
    """Remove a file or folder; returns the bytes freed (a hard-linked file frees nothing)."""
    if path.is_symlink() or path.is_file():
        st = path.lstat()
        path.unlink()
        return st.st_size if st.st_nlink == 1 else 0
    if not path.is_dir():
        return 0
    freed = sum(remove(child) for child in path.iterdir())
    shutil.rmtree(path, ignore_errors=True)
    return freed


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size if st.st_nlink == 1 else 0  # uploads are counted as blobs
    return total


def collect_garbage(config: Config, now: float | None = None) -> dict:
    """The retention policy: finished jobs older than keep_days expire, then the oldest until the
    data (job folders and uploads) is within keep_gb; uploads no job uses are removed. Queued and
    running jobs are never touched. Returns what it did."""
    store, now = job_store(config), now or time.time()
    finished = store.expirable()  # oldest first
    uploads = config.data_dir / "uploads"
    total = 0
    if config.keep_gb:  # the whole data's size matters only to a cap on it
        total = sum(folder_bytes(store.job_dir(j["id"])) for j in finished)
        total += folder_bytes(uploads) if uploads.is_dir() else 0
    expired, freed = [], 0
    for job in finished:
        too_old = config.keep_days and job["finished"] < now - config.keep_days * 86400
        too_big = config.keep_gb and total - freed > config.keep_gb * (1 << 30)
        if not (too_old or too_big):
            continue
        reason = age_policy(config.keep_days) if too_old else f"the data passed {config.keep_gb:g} GB"
        bytes_freed, files = expire_job(store.job_dir(job["id"]))
        bytes_freed += remove(runs_dir(config, job["id"]))  # its own-input runs
        # under a size cap, the uploads this expiry left unused count at once; else once at the end
        freed += bytes_freed + (remove_unused_uploads(config) if config.keep_gb else 0)
        store.mark_expired(job["id"], {"at": now, "reason": reason, "files": files})
        expired.append(job["id"])
    freed += remove_unused_uploads(config)
    return {"expired": expired, "freed_bytes": freed}


def age_policy(days: float) -> str:
    return f"older than {days:g} day{'' if days == 1 else 's'}"


def remove_unused_uploads(config: Config) -> int:
    uploads, freed = config.data_dir / "uploads", 0
    if uploads.is_dir():
        for blob in uploads.iterdir():
            st = blob.lstat()
            if st.st_nlink == 1:
                blob.unlink()
                freed += st.st_size
    return freed


def delete_job(config: Config, job_id: str) -> None:
    """A result removed by its submitter: its folder, and the record kept only as 'deleted'."""
    store = job_store(config)
    shutil.rmtree(store.job_dir(job_id), ignore_errors=True)
    shutil.rmtree(runs_dir(config, job_id), ignore_errors=True)  # its own-input runs
    store.mark_deleted(job_id)
    remove_unused_uploads(config)
