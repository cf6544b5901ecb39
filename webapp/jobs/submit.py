"""Accepting a job: the checks the web process may do (never parsing the model), then store + queue.

One function serves the HTML form, the JSON API and anything else that submits.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import zipfile
from collections.abc import Mapping
from contextlib import ExitStack
from functools import lru_cache
from pathlib import Path
from typing import IO, NamedTuple

from webapp.catalog import EXAMPLES
from webapp.config import Config
from webapp.jobs.queue import JobQueue
from webapp.jobs.storage import store_once
from webapp.jobs.store import JobStore, new_job_id
from webapp.options import Busy, JobOptions, SubmitError, flag

# First byte of a serialized onnx.ModelProto: the tag of one of its fields (ir_version, producer_name,
# producer_version, domain, model_version, doc_string, graph, opset_import, metadata_props).
ONNX_FIRST_BYTES = {0x08, 0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72}
ZIP_MAGIC = b"PK\x03\x04"  # torch.export.save writes a zip archive
# form field -> file name of an uploaded tuning database (TVM's MetaSchedule JSON files)
TUNING_UPLOADS = {
    "tuning_workloads": "database_workload.json",
    "tuning_records": "database_tuning_record.json",
}


def sniff_model_format(head: bytes, filename: str) -> str:
    """'onnx' or 'pt2' (a zip: also an ONNX model's archive with its external data, archive_kind()),
    judged by the first bytes only."""
    if not head:
        raise SubmitError("The uploaded file is empty.")
    if head.startswith(ZIP_MAGIC):
        return "pt2"
    if head[0] in ONNX_FIRST_BYTES and not filename.lower().endswith(".pt2"):
        return "onnx"
    if filename.lower().endswith(".pt2"):
        raise SubmitError(f"{filename!r} is not a .pt2 file: a torch.export.save() file is a zip archive.")
    raise SubmitError(
        f"{filename!r} is neither an ONNX model nor a PyTorch .pt2 file (judged by its first bytes)."
    )


def submit_job(
    config: Config,
    store: JobStore,
    queue: JobQueue,
    form: Mapping[str, str],
    upload: IO[bytes] | None,
    filename: str = "",
    tuning_files: dict[str, IO[bytes]] | None = None,
    calibration: IO[bytes] | None = None,
    client: str = "",
) -> Submitted:
    """Check the request, save the upload into a new job folder (each input file kept once by its
    content hash), record and queue the job; returns its id and the token of its delete link. An
    identical job (same project version, options and input bytes) already done or under way answers
    instead (reused, no token), unless the form asks to `rerun`. `client` is the
    submitter's address: Busy when it, or the server, has as many jobs queued as allowed."""
    options = JobOptions.parse(form).to_json()  # plus what the upload was, below
    example = (form.get("example") or "").strip()
    if upload is None and not example:
        raise SubmitError("Upload a model file (.onnx or .pt2) or pick an example.")
    if upload is None and example not in EXAMPLES:
        raise SubmitError(f"Unknown example {example!r}; GET /api/examples lists them.")

    tuning_files = {k: v for k, v in (tuning_files or {}).items() if v is not None}
    if tuning_files and set(tuning_files) != set(TUNING_UPLOADS):
        raise SubmitError(
            "Tuning records come as two files: tuning_workloads (database_workload.json) "
            "and tuning_records (database_tuning_record.json)."
        )

    job_id = new_job_id()
    job_dir = store.job_dir(job_id)
    (job_dir / "input").mkdir(parents=True)
    try:
        if upload is not None:
            head = upload.read(16)
            kind = sniff_model_format(head, filename)
            options["model_file"] = f"model.{kind}"
            options["filename"] = filename[:200]
            save_upload(upload, head, job_dir / "input" / options["model_file"], config.max_upload_mb)
            if kind == "pt2":
                options["model_file"] = archive_kind(
                    job_dir / "input" / "model.pt2", filename, config.max_unzipped_mb
                )
        else:
            options["example"] = example
        if tuning_files:
            # Parsed later by the worker, line by line, as untrusted database lines (tuning_db.py).
            for field, name in TUNING_UPLOADS.items():
                stream = tuning_files[field]
                save_upload(
                    stream, stream.read(16), job_dir / "input" / "tuning" / name, config.max_upload_mb
                )
            options["tuning_upload"] = True
        if calibration is not None:
            if options["quantize"] == "none":
                raise SubmitError("Calibration data is for quantization: pick a quantize mode too.")
            head = calibration.read(16)
            if not head.startswith(ZIP_MAGIC):  # np.savez writes a zip; parsed only in the sandbox
                raise SubmitError("calibration_data must be a .npz file (numpy.savez), one array per input.")
            save_upload(calibration, head, job_dir / "input" / "calibration.npz", config.max_upload_mb)
            check_zip(job_dir / "input" / "calibration.npz", "calibration_data", config.max_unzipped_mb)
            options["calibration_data"] = True
    except SubmitError:
        shutil.rmtree(job_dir)
        raise
    inputs = job_dir / "input"
    digests = {
        str(p.relative_to(inputs)): store_once(config, p) for p in sorted(inputs.rglob("*")) if p.is_file()
    }
    fingerprint = job_fingerprint(options, digests)
    reuse = config.reuse_results and not flag(form.get("rerun"))
    earlier = store.find_identical(fingerprint) if reuse else None
    if earlier is not None:  # the same work, done (or under way) already: its result answers
        shutil.rmtree(job_dir)
        return Submitted(earlier, True, None)
    try:
        admit(config, store, client)
    except Busy:
        shutil.rmtree(job_dir)
        raise
    token = secrets.token_urlsafe(18)
    store.create(job_id, options, fingerprint, client, token)
    queue.enqueue(job_id)
    return Submitted(job_id, False, token)


class Submitted(NamedTuple):
    id: str
    reused: bool  # an earlier identical job's
    delete_token: str | None  # for the submitter's delete link; None for a reused job


def resubmit_job(
    config: Config, store: JobStore, queue: JobQueue, job: dict, input_shapes: str, client: str = ""
) -> Submitted:
    """A failed upload (`job`, as job_view shows it) submitted again with the input_shapes its failure
    asked for: the same file and calibration data, its other options as its form gave them."""
    if not job["options"].get("model_file"):
        raise SubmitError("Only an uploaded model can be submitted again from its result.")
    return submit_again(config, store, queue, job, {"input_shapes": input_shapes}, client)


def submit_again(
    config: Config, store: JobStore, queue: JobQueue, job: dict, changes: dict[str, str], client: str = ""
) -> Submitted:
    """`job` (as job_view shows it) submitted again with its options but `changes` (form values): the
    same example, or the same uploaded file and calibration data (its tuning record uploads are not
    kept with a job: they are not sent again)."""
    inputs = store.job_dir(job["id"]) / "input"
    model = job["options"].get("model_file")
    if job["options"].get("example"):
        model = None
    elif not model or not (inputs / model).is_file():
        raise SubmitError("This result's model is no longer on the server; submit it again from the form.")
    form = {k: form_value(v) for k, v in job["options"].items() if v is not None} | changes
    calibration = inputs / "calibration.npz"
    with ExitStack() as files:
        upload = files.enter_context((inputs / model).open("rb")) if model else None
        data = files.enter_context(calibration.open("rb")) if calibration.is_file() else None
        filename = job["options"].get("filename") or model or ""
        return submit_job(config, store, queue, form, upload, filename, None, data, client)


def point_changes(job: dict, point: object) -> dict[str, str]:
    """The changes that submit `job` again as one point (its index) of its precision search
    (quantization.precision_search): that point's layers in float, and no budget."""
    search = ((job.get("results") or {}).get("quantization") or {}).get("precision_search") or {}
    points = search.get("points") or []
    try:
        index = int(str(point))
    except ValueError:
        index = -1
    if not 0 <= index < len(points):
        raise SubmitError(
            f"This result has no precision search point {str(point)[:20]!r}"
            + (f"; its points are 0 to {len(points) - 1}." if points else " (it ran no search).")
        )
    if points[index]["layer_precision"] is None:
        raise SubmitError("That point is the float build: this result's model-fp32.so is its library.")
    return {"layer_precision": json.dumps(points[index]["layer_precision"]), "accuracy_budget": ""}


def form_value(value: object) -> str:
    """A stored option as a submission form gives it (JobOptions.parse reads strings)."""
    if isinstance(value, bool):
        return "1" if value else ""
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def admit(config: Config, store: JobStore, client: str) -> None:
    """Busy when the client, or everyone, has as many jobs queued or running as the caps allow."""
    cap = config.max_queued_per_client
    if cap and store.queued_count(client) >= cap:
        raise Busy(
            f"You have {cap} job{'s' if cap != 1 else ''} queued or running on this server, as many as one "
            "address may. "
            "Submit again when one of them has finished.",
            retry_after=30,
        )
    if config.max_queued and store.queued_count() >= config.max_queued:
        raise Busy(
            f"This server has {config.max_queued} jobs queued or running, as many as it takes. "
            "Try again in a few minutes.",
            retry_after=120,
        )


@lru_cache(maxsize=1)
def project_version() -> str:
    """A digest of the project's code and pins: a result is reused only by the same version."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted([*(root / "webapp").rglob("*.py"), root / "pyproject.toml"]):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def job_fingerprint(options: dict, inputs: dict[str, str]) -> str:
    """What decides a job's result: the project version, the options (not the upload's file name)
    and the bytes of every input file (model, tuning records, calibration data), given as
    {path in the input folder: sha256 of its bytes}."""
    options = {k: v for k, v in options.items() if k != "filename"}
    what = {"version": project_version(), "options": options, "inputs": inputs}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def check_zip(path: Path, what: str, max_mb: int) -> None:
    """A zip upload (.pt2, .npz) whose entries say they expand beyond max_mb, or that has absurdly many,
    is refused before anything unpacks it (only the archive's directory is read here)."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise SubmitError(f"{what} is not a readable zip archive ({e}).") from None
    size = sum(e.file_size for e in entries)
    if size > max_mb << 20 or len(entries) > 100_000:
        raise SubmitError(
            f"{what} would expand to {size / 1e6:,.0f} MB in {len(entries):,} entries when unpacked, more "
            f"than this server's limit of {max_mb:,} MB: refused (a zip bomb, or a model too large here)."
        )


def archive_kind(path: Path, filename: str, max_mb: int) -> str:
    """The name an uploaded zip (saved at `path`, input/model.pt2) is kept under: model.zip for an ONNX
    model with its external data files (an archive holding an .onnx), else model.pt2. Only the
    archive's directory is read here; it is unpacked in the sandbox (pipeline/stages/unpack.py)."""
    check_zip(path, "The .pt2 file" if filename.lower().endswith(".pt2") else "The zip archive", max_mb)
    with zipfile.ZipFile(path) as archive:
        if not any(name.lower().endswith(".onnx") for name in archive.namelist()):
            return path.name
    path.rename(path.with_name("model.zip"))
    return "model.zip"


def save_upload(upload: IO[bytes], head: bytes, path: Path, max_mb: int) -> None:
    limit, size = max_mb << 20, len(head)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.write(head)
        while chunk := upload.read(1 << 20):
            size += len(chunk)
            if size > limit:
                raise SubmitError(f"The file is larger than this server's limit of {max_mb} MB.")
            out.write(chunk)
