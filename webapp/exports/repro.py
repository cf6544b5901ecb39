"""A kernel's reproducer (/r/<job>/repro/<kernel>.zip): its TIR as the job scheduled it, the same kernel
before scheduling, its weight repacking where it has one, the job's TVM target, and a script
(webapp/exports/repro_script.py, as run.py) that builds and checks it with apache-tvm and numpy alone. Packed
from the texts the job's inspect stage wrote; nothing of them runs here."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

from webapp.catalog import KERNEL_CONSTANTS, PREPACK_TIR, UNSCHEDULED_TIR, code_file, file_stem
from webapp.codeviews import safe_job_file

SCRIPT = Path(__file__).with_name("repro_script.py")
MAX_TEXT_BYTES = 32 << 20
WARNING = (
    "These texts were written by the job's pipeline from the uploaded model. run.py parses them with\n"
    "TVMScript, which evaluates Python expressions in them: run it only where you would run code that\n"
    "came with the model.\n"
)
PREPACK_PY = "prepack.py"
CONSTANTS_NPZ = "constants.npz"


def archive_name(kernel: str) -> str:
    """The reproducer's folder and file name: the kernel's (which the pipeline wrote) in letters,
    digits, `.`, `-` and `_` only, so that unpacking it cannot leave its folder."""
    return "repro-" + re.sub(r"[^\w.-]", "_", file_stem(kernel, 60), flags=re.ASCII).lstrip(".")


def reproducer_zip(job_dir: Path, results: dict, kernel: str) -> bytes | None:
    """The zip of one kernel of a finished CPU build, or None (no such kernel, or its texts are gone)."""
    row: dict = next((k for k in results.get("kernels") or [] if k["name"] == kernel), {})
    target = (results.get("target") or {}).get("tvm")
    if not row.get("reproducer") or not target:
        return None
    parts = {
        "kernel.py": safe_job_file(job_dir, code_file("tir", kernel)),
        "reference.py": safe_job_file(job_dir, UNSCHEDULED_TIR.format(kernel=file_stem(kernel))),
    }
    if any(path is None for path in parts.values()):
        return None
    prepack = safe_job_file(job_dir, PREPACK_TIR.format(kernel=file_stem(kernel)))
    if prepack is not None:
        parts[PREPACK_PY] = prepack
    constants = safe_job_file(job_dir, KERNEL_CONSTANTS.format(kernel=file_stem(kernel)))
    if constants is not None:
        parts[CONSTANTS_NPZ] = constants
    folder = archive_name(kernel)
    readme = (
        f"Kernel {kernel} of a TVM Playground job, target {results['target'].get('preset')}.\n"
        "kernel.py: its TIR as the job scheduled it; reference.py: the same kernel before scheduling;\n"
        + ("prepack.py: its weights repacked as kernel.py reads them;\n" if PREPACK_PY in parts else "")
        + (
            "constants.npz: the model's small constants it is called with (scales, clip bounds);\n"
            if CONSTANTS_NPZ in parts
            else ""
        )  # fmt: skip
        + "target.json: the job's TVM target; run.json: the threads its benchmark ran on and, where\n"
        "its int8 kernels sum pairs of products in int16 (x86 without VNNI), the most two neighbouring\n"
        "weights may add up to: run.py draws 8-bit weights within it, as the job's quantizer keeps them.\n\n"
        "    pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 numpy\n"
        "    python run.py   # builds, checks against the reference on seeded random inputs, times\n\n"
        + WARNING
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in parts.items():
            assert path is not None  # each was checked above
            if path.stat().st_size > MAX_TEXT_BYTES:  # the sandbox wrote it: no unbounded read here
                return None
            z.writestr(f"{folder}/{name}", path.read_bytes())
        z.writestr(f"{folder}/target.json", json.dumps(target, indent=2) + "\n")
        # the job's benchmark threads (run.py times the kernel on as many) and its int8 kernels' pair
        # limit (run.py draws 8-bit weights within it)
        run = {"threads": results.get("threads"), "int8_pair_limit": results["target"].get("int8_pair_limit")}
        if any(run.values()):
            z.writestr(f"{folder}/run.json", json.dumps({k: v for k, v in run.items() if v}) + "\n")
        z.writestr(f"{folder}/run.py", SCRIPT.read_text())
        z.writestr(f"{folder}/README.txt", readme)
    return buffer.getvalue()
