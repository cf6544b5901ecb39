"""The shared tuning database of each target: MetaSchedule's two JSON-lines files under
data/tuning/<key>/, copied into a job folder before its run and merged back after it.

A job's pipeline appends to its copy (new workloads at the end, records pointing at workload lines),
so merging re-numbers the job's workload lines into the shared file. Lines that are not of the
database's shape are dropped: the files come back from the sandbox.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from webapp.config import Config
from webapp.targets import TARGETS

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
MAX_FILE_BYTES = 256 << 20


# Records shipped with the project for the built-in examples (made by scripts/tune_examples.py).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "tuning_records"


def database_key(preset: str) -> str:
    """The folder name of a preset's shared database (its target kind decides, e.g. x86-host-avx512)."""
    return TARGETS[preset].database_key()


def shared_dir(config: Config, preset: str) -> Path:
    return config.data_dir / "tuning" / database_key(preset)


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_lines(path: Path) -> list[str]:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def copy_in(config: Config, preset: str, job_tuning_dir: Path) -> int:
    """Put the target's shared database into the job; returns how many records it holds."""
    job_tuning_dir.mkdir(parents=True, exist_ok=True)
    shared = shared_dir(config, preset)
    with locked(shared):
        shipped = SHIPPED_DIR / database_key(preset)
        if (
            config.shipped_tuning_records
            and not (shared / RECORDS).is_file()
            and (shipped / RECORDS).is_file()
        ):
            for name in (WORKLOADS, RECORDS):  # a new data folder starts from the shipped records
                shutil.copyfile(shipped / name, shared / name)
        for name in (WORKLOADS, RECORDS):
            if (shared / name).is_file():
                shutil.copyfile(shared / name, job_tuning_dir / name)
            else:
                (job_tuning_dir / name).write_text("")
    return len(read_lines(job_tuning_dir / RECORDS))


def canonical(line: str) -> str:
    try:
        return json.dumps(json.loads(line), separators=(",", ":"))
    except ValueError:
        return line


def is_workload(entry: object) -> bool:
    return isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)


def is_record(entry: object) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], int)
        and isinstance(entry[1], list)
    )


def merge_back(config: Config, preset: str, job_tuning_dir: Path) -> int:
    """Add the job's new workloads and records to the shared database; returns the records added."""
    shared = shared_dir(config, preset)
    with locked(shared):
        return merge_database(job_tuning_dir, shared)


def merge_database(source: Path, dest: Path) -> int:
    """Add source's workloads and records (two database files of untrusted origin) to dest's."""
    workloads = read_lines(dest / WORKLOADS)
    index = {line: i for i, line in enumerate(workloads)}
    records = read_lines(dest / RECORDS)
    known = {canonical(line) for line in records}
    renumber: dict[int, int] = {}
    for j, line in enumerate(read_lines(source / WORKLOADS)):
        try:
            ok = is_workload(json.loads(line))
        except ValueError:
            ok = False
        if not ok:
            continue
        if line not in index:
            index[line] = len(workloads)
            workloads.append(line)
        renumber[j] = index[line]
    added = 0
    for line in read_lines(source / RECORDS):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not is_record(entry) or entry[0] not in renumber:
            continue
        new = json.dumps([renumber[entry[0]], entry[1]], separators=(",", ":"))
        if new not in known:
            known.add(new)
            records.append(new)
            added += 1
    dest.mkdir(parents=True, exist_ok=True)
    for name, lines in ((WORKLOADS, workloads), (RECORDS, records)):
        tmp = dest / f".{name}.tmp"
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(dest / name)
    return added
