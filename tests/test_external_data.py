"""An ONNX model whose weights lie in external data files (as exporters save models over 2 GB) comes as
a .zip of the .onnx and its files, through the API and the command line (there also as an .onnx with
its model.onnx.data beside it); it is unpacked in the sandbox, and data files outside the model's
folder, or missing, fail the import with a clear message."""

from __future__ import annotations

import io
import json
import zipfile

import onnx
import pytest
from onnx import external_data_helper, numpy_helper

from tests.conftest import wait_for_job
from webapp.cli import compile_locally
from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.unpack import unpack


def with_external_data(source, folder, location="weights.bin"):
    """`source` saved into `folder` as model.onnx with every weight in the file `location`."""
    model = onnx.load(str(source))
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model, str(folder / "model.onnx"), save_as_external_data=True, location=location, size_threshold=0
    )
    return folder / "model.onnx"


def zipped(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def post(client, data: bytes, name: str) -> dict:
    resp = client.post(
        "/api/jobs",
        data={"target": "x86-host", "model": (io.BytesIO(data), name)},
        content_type="multipart/form-data",
    )
    assert resp.status_code == 202, resp.get_json()
    return wait_for_job(client, resp.get_json()["id"])


@pytest.mark.slow
def test_a_zip_of_an_onnx_and_its_data_file_runs_like_the_model_itself(client, example_files, tmp_path):
    model = with_external_data(example_files / "mlp.onnx", tmp_path / "mlp")
    weights = sum(numpy_helper.to_array(t).size for t in onnx.load(str(model)).graph.initializer)
    assert (tmp_path / "mlp" / "weights.bin").stat().st_size > 1000 and model.stat().st_size < 2000
    # zipped as a folder is: the model and its data under one directory
    archive = zipped({f"mlp/{p.name}": p.read_bytes() for p in (tmp_path / "mlp").iterdir()})
    job = post(client, archive, "mlp.zip")
    assert job["status"] == "done", job["error"]
    assert job["options"]["model_file"] == "model.zip"
    r = job["results"]
    assert r["model"]["param_count"] == weights
    # ONNX Runtime ran the unpacked model with its data file, and TVM computed what it computes
    assert {b["runtime"] for b in r["benchmarks"]} == {"tvm", "onnxruntime"}
    assert all(f["max_abs_err"] < 1e-4 for f in r["fidelity"]), r["fidelity"]


def test_external_data_outside_the_models_folder_or_missing_fails_at_import(client, example_files, tmp_path):
    model = onnx.load(str(example_files / "mlp.onnx"))
    for tensor in model.graph.initializer:
        external_data_helper.set_external_data(tensor, location="../../../../etc/hostname")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
    escaping = post(client, zipped({"model.onnx": model.SerializeToString()}), "escape.zip")
    assert escaping["status"] == "failed" and escaping["error"]["stage"] == "import"
    assert "outside its folder" in escaping["error"]["message"], escaping["error"]
    bare = with_external_data(example_files / "mlp.onnx", tmp_path / "bare")
    missing = post(client, zipped({"model.onnx": bare.read_bytes()}), "missing.zip")
    assert missing["status"] == "failed" and "'weights.bin'" in missing["error"]["message"]
    assert "one .zip" in missing["error"]["message"] and "Traceback" not in missing["error"]["message"]
    two = tmp_path / "two.zip"
    two.write_bytes(zipped({"a.onnx": bare.read_bytes(), "b.onnx": bare.read_bytes()}))
    with pytest.raises(StageError, match="holds 2 .onnx files"):
        unpack(two, tmp_path / "unpacked")


@pytest.mark.slow
def test_the_command_line_takes_an_onnx_with_its_data_file_beside_it(config, example_files, tmp_path):
    model = with_external_data(example_files / "mlp.onnx", tmp_path / "mlp", location="model.onnx.data")
    error = compile_locally(config, str(model), {"target": "x86-host"}, tmp_path / "out")
    assert error is None, error
    assert (tmp_path / "out" / "input" / "model.zip").is_file()
    assert (tmp_path / "out" / "unpacked" / "model.onnx.data").is_file()


@pytest.mark.slow
def test_an_example_past_2_gb_keeps_its_data_file_in_its_jobs_and_downloads_as_a_zip(
    config, example_files, tmp_path
):
    """An example exported with its weights beside it (qwen2.5-0.5b's form, `<name>.onnx.data`; here
    the mlp saved so): its job copies the data file beside the model, and its .onnx download is a .zip of
    both, which an upload takes."""
    from dataclasses import replace

    from webapp import create_app

    own = replace(config, data_dir=tmp_path / "data")
    own.examples_dir.mkdir(parents=True)
    source = onnx.load(str(example_files / "mlp.onnx"))
    onnx.save_model(
        source, str(own.examples_dir / "mlp.onnx"), save_as_external_data=True, location="mlp.onnx.data"
    )
    (own.examples_dir / "mlp.pt2").write_bytes((example_files / "mlp.pt2").read_bytes())
    error = compile_locally(own, "mlp", {"target": "x86-host"}, tmp_path / "job")
    assert error is None, error
    assert (tmp_path / "job" / "input" / "mlp.onnx.data").stat().st_size > 1000
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert {b["runtime"] for b in result["benchmarks"]} >= {"tvm", "onnxruntime"}  # ORT read the data too
    download = create_app(own).test_client().get("/api/examples/mlp.onnx")
    assert download.status_code == 200 and "mlp.zip" in download.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(download.data)) as archive:
        assert sorted(archive.namelist()) == ["mlp.onnx", "mlp.onnx.data"]
        archive.extractall(tmp_path / "unzipped")
    weights = {
        t.name: numpy_helper.to_array(t) for t in onnx.load(str(example_files / "mlp.onnx")).graph.initializer
    }
    got = onnx.load(str(tmp_path / "unzipped" / "mlp.onnx"))
    assert all((numpy_helper.to_array(t) == weights[t.name]).all() for t in got.graph.initializer)
