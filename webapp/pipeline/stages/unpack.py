"""An ONNX model whose weights lie in external data files (how exporters save a model over protobuf's
2 GB, and many smaller ones), uploaded as one zip archive of the .onnx and its data files. Unpacked in
the sandbox, at the start of the import stage: the .onnx as `model.onnx`, each data file at its path
relative to the .onnx's folder in the archive, where the model's `location` fields name it."""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from webapp.pipeline.errors import StageError

if TYPE_CHECKING:
    import onnx

WEIGHT_BYTES = 1 << 20  # an initializer this large is a weight, never a shape


def unpack(archive: Path, folder: Path) -> Path:
    """The archive's one .onnx file and the files beside it (and below it) written into `folder`; returns
    the model's path there. Paths that would leave the folder are refused; other files are left out."""
    try:
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.infolist() if not m.is_dir()]
            models = [m for m in members if m.filename.lower().endswith(".onnx")]
            if len(models) != 1:
                raise StageError(
                    f"The zip archive holds {len(models)} .onnx files: it must hold one model, with its "
                    "external data files beside it."
                )
            root = PurePosixPath(models[0].filename).parent
            for m in members:
                path = PurePosixPath(m.filename)
                if m is not models[0] and not path.is_relative_to(root):
                    continue
                rel = PurePosixPath("model.onnx") if m is models[0] else path.relative_to(root)
                if path.is_absolute() or ".." in rel.parts or "\\" in m.filename:
                    raise StageError(
                        f"The zip archive's entry {m.filename!r} would be unpacked outside its folder."
                    )
                target = folder / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(m) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, OSError) as e:
        raise StageError(f"The zip archive could not be unpacked: {e}") from e
    return folder / "model.onnx"


def external_data(model: onnx.ModelProto, path: Path) -> bool:
    """Whether the model at `path` keeps weights in external data files (left there: load_weights reads
    them). Each file must lie inside the model's folder and exist there."""
    from onnx import external_data_helper as helper

    tensors = [t for t in helper._get_all_tensors(model) if helper.uses_external_data(t)]
    folder = path.parent.resolve()
    for location in sorted({helper.ExternalDataInfo(t).location for t in tensors}):
        file = (folder / location).resolve()
        if not file.is_relative_to(folder):
            raise StageError(f"The model names an external data file outside its folder: {location!r}.")
        if not file.is_file():
            raise StageError(
                f"The model keeps weights in the external data file {location!r}, which did not come with "
                "it: upload the .onnx and its data files as one .zip archive."
            )
    return bool(tensors)


def load_weights(model: onnx.ModelProto, path: Path, below: int | None = None) -> None:
    """The weights still in the external data files of the model at `path` (external_data checked them)
    read into it, or only those under `below` bytes; nothing to do for a model that keeps them inside or
    has read them already."""
    from onnx import external_data_helper as helper

    for tensor in helper._get_all_tensors(model):
        if helper.uses_external_data(tensor) and (below is None or tensor_bytes(tensor) < below):
            helper.load_external_data_for_tensor(tensor, str(path.parent.resolve()))


@contextmanager
def weights_read_in_place(path: Path) -> Iterator[None]:
    """The working folder the folder of the model at `path` while the block runs: ONNX then reads a tensor
    still in its external data file (external_data checked where each lies) from its location there, one
    tensor at a time as TVM's importer converts it (numpy_helper.to_array, given no folder), so the model's
    weights are never held whole beside TVM's constants (a 2 GB model's import peaked at 6.5 GB so)."""
    before = Path.cwd()
    os.chdir(path.parent)
    try:
        yield
    finally:
        os.chdir(before)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """A tensor's bytes from its declared shape and type: its data is not read, and may lie in a file."""
    from onnx import helper

    count = 1
    for d in tensor.dims:
        count *= d
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
