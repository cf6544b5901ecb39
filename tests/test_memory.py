"""A build's memory (webapp/pipeline/reports/memory.py), read from its lowered module: a 1x1
convolution's weights are its parameters, byte for byte; a padded 3x3 convolution's padding buffer is
its workspace; the example job's JSON has a row per build with its library's size."""

from __future__ import annotations

from tests.conftest import wait_for_job
from tests.test_api import submit
from tests.test_mca import conv_model
from webapp.pipeline.reports.memory import footprint
from webapp.pipeline.stages.build import schedule
from webapp.pipeline.stages.optimize import optimize
from webapp.targets import get


def lowered(mod, tmp_path):
    target = get("x86-host")
    return schedule(optimize(mod, target, tmp_path).fused, target, None)[0]


def test_parameters_activations_and_workspace_of_two_convolutions(tmp_path):
    one = footprint(lowered(conv_model(kernel=1, size=28), tmp_path))
    assert one["params_bytes"] == 64 * 64 * 4 and one["params"] == 1
    tensor = 28 * 28 * 64 * 4  # the input, the convolution's output and the output are this size
    assert tensor <= one["activations_bytes"] <= 3 * tensor and one["storages"] >= 1
    three = footprint(lowered(conv_model(), tmp_path))
    assert three["params_bytes"] >= 64 * 64 * 9 * 4  # its weights (repacked: at least as many)
    # the padded input, 58 x 58 x 64 floats, is the convolution's own buffer
    assert three["workspace_bytes"] >= 58 * 58 * 64 * 4 and "conv2d" in three["workspace_kernel"]


def test_the_job_has_a_memory_row_per_build(client):
    job = wait_for_job(client, submit(client, {"example": "cnn-small", "quantize": "int8"}).get_json()["id"])
    assert job["status"] == "done", job["error"]
    results = job["results"]
    rows = {m["variant"]: m for m in results["memory"]}
    assert set(rows) == {"fp32", "int8"}
    assert rows["int8"]["library_bytes"] == results["library"]["bytes"]  # model.so is the int8 build
    assert rows["int8"]["params_bytes"] < rows["fp32"]["params_bytes"]  # 8-bit weights against 32
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert 'id="memory"' in page and "largest workspace" in page
