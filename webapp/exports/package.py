"""A compiled model as one file, loadable with the TVM runtime alone: `tvm-playground compile -o
model.tar` packs a finished job's library with what it takes and returns, and the standalone runner
(webapp/exports/package_run.py, as run.py) that `tvm-playground run` and any TVM install can use."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import IO, cast

import tvm

RUNNER = Path(__file__).with_name("package_run.py")
DEVICES = {
    "llvm": "cpu",
    "cuda": "cuda",
    "rocm": "rocm",
    "opencl": "opencl",
    "metal": "metal",
    "vulkan": "vulkan",
}

README = """A model compiled by TVM Playground for {target} ({kind}), TVM {tvm}.

  model.so       the compiled library (a Relax VM executable)
  metadata.json  its inputs and outputs (names, shapes, dtypes), target and options
  run.py         runs it with numpy and the TVM runtime alone:
                 python run.py --inputs in.npz --output out.npz --print-time --repeat 10 [--profile]

Or from Python: vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module("model.so"), tvm.cpu());
vm["main"](*inputs).
"""


def make_package(job_dir: Path, out: Path) -> dict:
    """Write the package of a finished job to `out` (a .tar); returns its metadata."""
    result = json.loads((job_dir / "result.json").read_text())
    options = json.loads((job_dir / "job.json").read_text())["options"]
    target = result["target"]
    meta = {
        "format": "tvm-playground package 1",
        "library": "model.so",
        "device": DEVICES.get(target["tvm"].get("kind"), "cpu"),
        "target": target,
        "tvm": tvm.__version__,
        "inputs": result["model"]["inputs"],
        "weights": result["model"].get("weights"),  # an example's: random or trained
        "outputs": result["model"]["outputs"],
        "options": options,
        "variant": (result.get("quantization") or {}).get("variant", "fp32"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        tar.add(job_dir / "files" / "model.so", arcname="model.so")
        for name, text in (
            ("metadata.json", json.dumps(meta, indent=2)),
            ("run.py", RUNNER.read_text()),
            (
                "README.txt",
                README.format(target=target["preset"], kind=target["tvm"].get("kind"), tvm=tvm.__version__),
            ),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return meta


def unpack(package: Path, folder: Path) -> None:
    """A package's files into `folder` (its four names only: nothing else of the tar is read)."""
    with tarfile.open(package) as tar:
        for name in ("model.so", "metadata.json", "run.py"):
            member = tar.getmember(name)
            if not member.isfile():
                raise ValueError(f"{name} in {package} is not a file")
            # a regular file (isfile above): extractfile gives its reader, not None
            (folder / name).write_bytes(cast(IO[bytes], tar.extractfile(member)).read())
