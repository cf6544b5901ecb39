"""The kernel lab's runs: a user's kernel and schedule (TVMScript and Python) built for a CPU preset and
shown at every level, each run a permanent short link (/lab/<id>). The code runs only in the sandbox
(webapp/pipeline/lab.py), with limits of its own (LIMITS); a run lives in data/lab/<id>/, the sandbox's
to write, and its status beside it (<id>.status.json, the worker's). Runs are queued like jobs."""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from webapp.catalog import UNSCHEDULED_TIR, file_stem
from webapp.codeviews import safe_job_file
from webapp.config import Config
from webapp.jobs.own_input import claim, claim_file, status_file
from webapp.jobs.store import read_untrusted_json
from webapp.jsonfile import read_plain, write_json_atomic
from webapp.machine.sandbox import LAB_UIDS, PROJECT_ROOT, run_sandboxed, user_process_count
from webapp.options import SubmitError
from webapp.targets import TARGETS
from webapp.targets.base import LLVMCPU

MAX_CODE_CHARS = 64_000
# What one run may take: a kernel's build is well under a second; a naive reference of a large kernel
# and its timing take seconds; anything near these limits is the code's own doing.
LIMITS = {
    "wall_limit_s": 60,
    "cpu_limit_s": 120,
    "memory_limit_mb": 6144,
    "process_limit": 256,  # per user: counts the threads of jobs running beside it too
    "output_limit_mb": 64,
}
TEXTS = {"tir": "tir.py", "llvm": "kernel.ll", "asm": "kernel.s", "mca": "mca.txt"}  # what a run writes
MAX_TEXT_BYTES = 4 << 20
REPLACED = "A later edit replaced this build before it ended."


def lab_root(config: Config) -> Path:
    return config.data_dir / "lab"


def lab_dir(config: Config, lab_id: str) -> Path:
    return lab_root(config) / lab_id


STARTERS = PROJECT_ROOT / "lab_starters"  # kernels to start from: one .py each, a comment first


def starters() -> dict[str, str]:
    """name -> code of each starter kernel, by name."""
    return {p.stem: p.read_text() for p in sorted(STARTERS.glob("*.py"))}


def kernel_code(job_dir: Path, results: dict, kernel: str) -> tuple[str, str] | None:
    """A kernel of a finished CPU build as lab code (its TIR before scheduling, with an empty schedule that
    names its blocks) and the job's target; None where the job has no such kernel's texts or its target is
    none of the lab's."""
    row: dict = next((k for k in results.get("kernels") or [] if k["name"] == kernel), {})
    target = str((results.get("target") or {}).get("preset") or "")
    path = safe_job_file(job_dir, UNSCHEDULED_TIR.format(kernel=file_stem(kernel)))
    data = read_plain(path, MAX_CODE_CHARS) if path is not None else None
    if not row.get("reproducer") or target not in lab_targets() or data is None:
        return None
    tir = data.decode(errors="replace").replace(
        "# from tvm.script import tirx as T", "from tvm.script import tirx as T"
    )
    blocks = ", ".join(f'"{b}"' for b in dict.fromkeys(re.findall(r'T\.sblock\("([^"]+)"\)', tir)))
    head = f"# Kernel {kernel} of job {job_dir.name} ({target}), before scheduling; the result's\n"
    head += "# Scheduled TIR view shows how the playground's rules scheduled it. Write your own below.\n"
    schedule = (
        "\n\ndef schedule(sch):\n"
        f"    # its blocks: {blocks}\n"
        "    # e.g. loops = sch.get_loops(sch.get_sblock(...)), then sch.split, sch.reorder, sch.vectorize,\n"
        "    # sch.parallel on them\n"
        "    pass\n"
    )
    return head + tir.rstrip() + schedule, target


def lab_targets() -> list[str]:
    """The presets the lab builds for: every CPU compiled by TVM's LLVM back end, boards included."""
    return [name for name, t in TARGETS.items() if isinstance(t, LLVMCPU)]


def create_lab(config: Config, code: object, target: object, parent: object = None, client: str = "") -> str:
    """Saves a kernel's code and target as a new queued run; its id (raises SubmitError). `parent`: the
    build the edit was made on; a build of the same client's still queued or running is stopped (the
    page shows only the newest)."""
    if not isinstance(code, str) or not code.strip():
        raise SubmitError("Send the kernel's code: TVMScript defining main, and a schedule(sch) function.")
    if len(code) > MAX_CODE_CHARS:
        raise SubmitError(f"The code is {len(code):,} characters; the lab takes {MAX_CODE_CHARS:,} at most.")
    if target not in lab_targets():
        raise SubmitError(f"Choose a CPU target: {', '.join(lab_targets())}.")
    lab_id = secrets.token_urlsafe(6)
    folder = lab_dir(config, lab_id)
    (folder / "input").mkdir(parents=True)
    write_json_atomic(folder / "input" / "lab.json", {"code": code, "target": target})
    status = {"status": "queued", "created": time.time(), "target": target, "client": client}
    before = read_untrusted_json(status_file(lab_dir(config, str(parent))), 1 << 16) if is_id(parent) else {}
    if isinstance(before, dict):
        status["parent"] = parent
        if before.get("client") == client and before.get("status") in ("queued", "running"):
            replaced_file(lab_dir(config, str(parent))).touch()
    write_json_atomic(status_file(folder), status)
    return lab_id


def is_id(lab_id: object) -> bool:
    return isinstance(lab_id, str) and re.fullmatch(r"[\w-]{1,32}", lab_id) is not None


def replaced_file(folder: Path) -> Path:
    """Where the web process says that a later edit replaced a build: the worker stops it."""
    return folder.with_name(folder.name + ".replaced")


def waiting_labs(config: Config) -> list[str]:
    """Runs no worker claimed: queued again at a worker's start."""
    return [
        s.name.removesuffix(".status.json")
        for s in sorted(lab_root(config).glob("*.status.json"))
        if not claim_file(s.with_name(s.name.removesuffix(".status.json"))).exists()
    ]


def queued_before(config: Config, created: float) -> int:
    """Lab runs queued before `created` that no worker has taken yet."""
    statuses = (read_untrusted_json(path, 1 << 16) or {} for path in lab_root(config).glob("*.status.json"))
    return sum(
        1 for status in statuses if status.get("status") == "queued" and status.get("created", 0) < created
    )


def run_lab(config: Config, lab_id: str) -> None:
    """The worker's part: claim the run once, run the code in the sandbox under LIMITS, record its end."""
    folder = lab_dir(config, lab_id)
    status = claim(folder)
    if status is None:
        return

    def replaced() -> str | None:
        return REPLACED if replaced_file(folder).exists() else None

    error = replaced() or run_code(config, folder, replaced)
    ended = "stopped" if error == REPLACED else "failed" if error else "done"
    status |= {"status": ended, "ended": time.time()}
    write_json_atomic(status_file(folder), status | ({"error": str(error)[:4000]} if error else {}))


def run_code(config: Config, folder: Path, stop: Callable[[], str | None] | None = None) -> str | None:
    """The code of folder/input/lab.json run in the sandbox under LIMITS (or the server's own, where
    lower); None, or why it ended without a result (a limit, our bug). The code's own errors are in its
    result.json."""
    lower = {k: min(v, getattr(config, k)) for k, v in LIMITS.items()}
    limited = dataclasses.replace(config, **lower)  # type: ignore[arg-type]  # the int fields named
    try:
        with lab_user(folder.parent) as uid:
            command = [sys.executable, "-m", "webapp.pipeline.lab", str(folder)]
            outcome = run_sandboxed(folder, limited, command, stop=stop, uid=uid, slot=False)
    except Exception as exc:  # our bug: said on the run's page
        return f"Could not run the code: {exc}"
    result = read_untrusted_json(folder / "result.json", 1 << 20)
    if outcome.limit or not isinstance(result, dict) or result.get("status") not in ("done", "failed"):
        return outcome.limit or "The run ended without a result."
    return None


@contextmanager
def lab_user(root: Path, wait_s: float = 30.0) -> Iterator[int]:
    """A user of LAB_UIDS for one build, the build's alone (a lock file each in `root`) and with no process
    left (those of the build before it end with its sandbox's pid namespace, a moment later): a fork bomb
    takes its own user's processes, no other build's."""
    deadline = time.monotonic() + wait_s
    while True:
        for uid in LAB_UIDS:
            fd = os.open(root / f".user-{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if user_process_count(uid) == 0 or os.geteuid() != 0:  # not root: the sandbox keeps this user
                try:
                    yield uid
                finally:
                    os.close(fd)  # the lock goes with it
                return
            os.close(fd)
        if time.monotonic() > deadline:
            raise RuntimeError("every lab user is busy: try again in a minute")
        time.sleep(0.2)


def folder_view(folder: Path, view: dict) -> dict:
    """`view` (the status) with what the sandbox found in the folder, checked field by field (it wrote
    them): a code's error makes a run that ended "failed", with the stage and the code's line."""
    found = read_untrusted_json(folder / "result.json", 1 << 20)
    found = clean_result(found) if isinstance(found, dict) else {}
    if found.get("status") == "failed" and view["status"] == "done":  # the code's error: the run is failed
        view |= {"status": "failed", "error": found.get("error"), "stage": found.get("stage")}
        view["line"] = found.get("line")
    view["result"] = found
    view["texts"] = {k: text_of(folder, name) for k, name in TEXTS.items()}
    return view


def text_of(folder: Path, name: str) -> str | None:
    """One of the texts a run wrote, where it is a plain file within MAX_TEXT_BYTES."""
    data = read_plain(folder / name, MAX_TEXT_BYTES)
    return data.decode(errors="replace") if data is not None else None


def lab_view(config: Config, lab_id: str) -> dict | None:
    """A run as its page and JSON show it: the worker's status, the code and target asked, and what the
    sandbox found, checked field by field (it wrote them)."""
    if not is_id(lab_id):
        return None
    folder = lab_dir(config, lab_id)
    status = read_untrusted_json(status_file(folder), 1 << 16)
    asked = read_untrusted_json(folder / "input" / "lab.json", 1 << 20)
    if not isinstance(status, dict) or not isinstance(asked, dict):
        return None
    view = {"id": lab_id, "status": status["status"], "code": asked["code"], "target": asked["target"]}
    view |= {k: status[k] for k in ("created", "started", "ended", "error", "parent") if k in status}
    return folder_view(folder, view)


def number(x: object) -> float | None:
    """x where it is a finite number the sandbox wrote (JSON allows 1e999 and 10**400), else None."""
    if not isinstance(x, int | float) or isinstance(x, bool) or (isinstance(x, int) and abs(x) > 1 << 53):
        return None
    return float(x) if math.isfinite(x) else None


def part(r: dict, key: str) -> dict:
    """r[key] where it is an object, else {}."""
    value = r.get(key)
    return value if isinstance(value, dict) else {}


def clean_result(r: dict) -> dict:
    """The sandbox's result.json, only the fields the page uses, each of its type."""
    out: dict = {k: str(r[k])[:4000] for k in ("status", "stage", "error", "device", "phase") if k in r}
    line = number(r.get("line"))
    out["line"] = int(line) if line is not None and line.is_integer() else None
    span = r.get("hot_loop")
    ends = [number(x) for x in span] if isinstance(span, list) and len(span) == 2 else []
    out["hot_loop"] = [int(x) for x in ends if x is not None] if ends and None not in ends else None
    mca = part(r, "mca")
    figures = ("cycles_per_iteration", "ipc", "ops_per_iteration")
    out["mca"] = {k: number(v) for k, v in mca.items() if k in figures}
    out["mca"] |= {k: str(v)[:300] for k, v in mca.items() if k in ("bottleneck", "why", "limit")}
    time_ = part(r, "time")
    out["time"] = (
        {
            "ms": number(time_.get("ms")),
            "by": "measured" if time_.get("by") == "measured" else "llvm-mca",
            "runs": number(time_.get("runs")),
            "threads": number(time_.get("threads")),
        }
        if time_
        else None
    )
    check = part(r, "check")
    wrong = check["wrong"] if isinstance(check.get("wrong"), list) else []
    out["check"] = {
        "matches": check.get("matches") if isinstance(check.get("matches"), bool) else None,
        "largest_difference": number(check.get("largest_difference")),
        "wrong": [str(x)[:100] for x in wrong][:50],
        "why": str(check["why"])[:300] if "why" in check else None,
    }
    out |= {k: number(r.get(k)) for k in ("code_s", "build_s", "total_s")}
    return out
