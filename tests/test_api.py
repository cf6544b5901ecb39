"""The JSON API end to end, with a real worker and sandbox: submit, poll, fetch, download, bad input."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from tests.conftest import int8_instruction, wait_for_job
from webapp.jobs.store import JobStore
from webapp.jobs.worker import run_job
from webapp.pipeline.reports.facts import build_name
from webapp.result_text import headline_lines


def submit(client, data: dict, file: tuple[bytes, str] | None = None, calibration: dict | None = None):
    """POST /api/jobs; `calibration`, arrays by name, goes up as a calibration_data .npz."""
    data = {"target": "x86-host", **data}
    if file is not None:
        data["model"] = (io.BytesIO(file[0]), file[1])
    if calibration is not None:
        npz = io.BytesIO()
        np.savez(npz, **calibration)
        data["calibration_data"] = (io.BytesIO(npz.getvalue()), "calib.npz")
    return client.post("/api/jobs", data=data, content_type="multipart/form-data")


def onnx_bytes(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_lists_examples_and_targets(client):
    names = [e["name"] for e in client.get("/api/examples").get_json()]
    assert {"mlp", "cnn-small", "resnet18", "resnet50", "mobilenet-v2", "transformer-block"} <= set(names)
    targets = {t["name"]: t for t in client.get("/api/targets").get_json()}
    assert targets["x86-host"]["can_run_here"] and targets["x86-generic"]["can_run_here"]
    assert targets["x86-host"]["description"]


def test_example_job_runs_every_stage_and_its_library_loads(client, tmp_path):
    resp = submit(client, {"example": "cnn-small"})
    assert resp.status_code == 202
    created = resp.get_json()
    assert len(created["id"]) >= 22 and created["url"].endswith(f"/r/{created['id']}")
    job = wait_for_job(client, created["id"])
    assert job["status"] == "done", job["error"]
    names = [s["name"] for s in job["stages"]]
    assert names == [
        "import",
        "optimize",
        "quantize",
        "tune",
        "build",
        "inspect",
        "benchmark",
        "bisect",
        "generate",
        "remote",
    ]
    stages = {s["name"]: s for s in job["stages"]}
    # skipped stages, each with why: x86-host runs here, not on a board; quantize=none; no trials asked
    # and no records for x86-host yet
    assert stages.pop("remote")["why"] == "timed on this server, not on a board of the device pool"
    assert stages.pop("quantize")["why"].startswith("no quantization asked")
    assert stages.pop("tune")["why"] == "no tuning trials asked, and no shared tuning records for x86-host"
    assert stages.pop("generate")["why"].startswith("not a causal language model with a KV cache")
    assert stages.pop("bisect")["why"] == "not asked (bisect: off)" and job["results"]["bisect_offered"]
    assert all(s["status"] == "done" and s["seconds"] is not None for s in stages.values())
    # each stage's own peak resident memory, under the job's address-space peak and the server's limit
    limits = job["results"]["limits"]
    assert limits == {"memory_mb": 16384, "cpu_s": 3600, "wall_s": 600, "upload_mb": 4096}
    for s in stages.values():
        assert 50 < s["memory"]["resident_mb"] <= s["memory"]["address_mb"] < limits["memory_mb"], s
    html = client.get(f"/r/{created['id']}").get_data(as_text=True)
    assert "A job on this server runs within 16,384 MB of address space" in html
    assert f"{stages['build']['memory']['resident_mb']:,} MB</span>" in html
    runtimes = {b["runtime"] for b in job["results"]["benchmarks"]}
    assert runtimes == {"tvm", "pytorch", "onnxruntime"}
    # its weights are random, and the result says so wherever its outputs are shown
    weights = job["results"]["model"]["weights"]
    assert not weights["trained"] and "random (seeded), not trained" in weights["text"]
    assert weights["text"] in client.get(f"/r/{created['id']}").get_data(as_text=True)
    assert f"Weights: {weights['text']}" in headline_lines(job["results"])
    assert all(b["median_ms"] > 0 and b["p90_ms"] >= b["median_ms"] for b in job["results"]["benchmarks"])
    # one row per reference, each run once (a CPU job has no extra CPU reference, as a GPU job has)
    assert sorted(f["reference"] for f in job["results"]["fidelity"]) == ["onnxruntime", "pytorch"]
    for f in job["results"]["fidelity"]:
        assert f["max_abs_err"] < 1e-4 and f["cosine"] > 0.9999 and f["top1_agree"] == 1.0
    assert {b["device"] for b in job["results"]["benchmarks"]} == {job["results"]["benchmarks"][0]["device"]}
    assert client.get(f"/r/{created['id']}.json").get_json() == job
    # the kernel profile as a Chrome/Perfetto trace: a process per build, a track per run, a slice per call
    trace = json.loads(client.get(f"/r/{created['id']}/files/kernel-trace.json").get_data())
    (profile,) = job["results"]["profiles"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {1} and {e["tid"] for e in slices} == set(
        range(1, profile["runs"] + 1)
    )
    calls = {name: k["calls"] for name, k in profile["kernels"].items()}
    for run in range(1, profile["runs"] + 1):
        mine = sorted((e for e in slices if e["tid"] == run), key=lambda e: e["ts"])
        assert {e["name"]: sum(1 for x in mine if x["name"] == e["name"]) for e in mine} == calls
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(mine, mine[1:], strict=False))  # in turn

    # where the time goes: a profile per build, its kernels on the page's table, slowest first
    results = job["results"]
    assert [(p["variant"], p["tuned"], p["shown"]) for p in results["profiles"]] == [("fp32", False, True)]
    profile = results["profiles"][0]
    kernel_names = {k["name"] for k in results["kernels"]}
    assert set(profile["kernels"]) <= kernel_names and len(profile["kernels"]) >= len(kernel_names) - 1
    # each kernel's own measured ms, the VM's own work between them measured apart: their shares of
    # the run add up to 1, the table's ms to the profile's kernels (how they add up against the benchmark's
    # median is a measurement: benchmarks/kernel_times.py)
    assert sum(k["share"] for k in profile["kernels"].values()) + profile["vm_share"] == pytest.approx(1.0)
    median = next(b["median_ms"] for b in job["results"]["benchmarks"] if b["runtime"] == "tvm")
    assert profile["benchmark_ms"] == median
    assert profile["accounted_ms"] == pytest.approx(profile["kernels_ms"] + profile["vm_ms"])
    assert profile["accounted_of_run"] == pytest.approx(profile["accounted_ms"] / profile["run_ms"])
    assert sum(k["ms"] for k in job["results"]["kernels"] if k["ms"]) == pytest.approx(profile["kernels_ms"])
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    hint = re.search(r'<p class="hint" id="kernel-profile">.*?</p>', page, re.S).group(0)
    assert f"{100 * profile['accounted_of_run']:.0f}% of a run without the hook" in hint
    assert f"{100 * profile['accounted']:.0f}% of this build's benchmark median ({median:.3f} ms" in hint
    vm_row = re.search(r'<tr id="kernel-vm-row".*?</tr>', page, re.S).group(0)
    assert f"{profile['vm_ms']:.3f}" in vm_row and f"<td>{profile['vm_calls']}</td>" in vm_row
    # each kernel names the source layers fused into it (ONNX node names)
    # every kernel lists its layers but the input's transpose to channels last (no layer of the model's)
    unlisted = [k["name"] for k in results["kernels"] if k["ms"] is not None and not k["layers"]]
    assert unlisted == ["transpose"], unlisted
    assert any("Conv" in layer for layer in results["kernels"][0]["layers"])
    times = [k["ms"] for k in results["kernels"] if k["ms"] is not None]
    # a kernel shorter than the hook's measured cost a call reads 0 (profile.py: spans less that cost)
    assert times == sorted(times, reverse=True) and all(ms >= 0 for ms in times) and times[0] > 0
    # a kernel the VM never calls (reshape: the VM makes it a view of its input) comes last, untimed
    assert [k["ms"] for k in results["kernels"][len(times) :]] == [None] * (
        len(results["kernels"]) - len(times)
    )
    assert results["kernels"][0]["name"].startswith("fused_conv2d")  # the convolutions take the most
    # the job ran llvm-mca in its sandbox: the slowest kernel's hot loop analysed, its report a code view
    assert results["mca"]["tool"].startswith("llvm-mca") and results["mca"]["analysed"] >= 1
    slowest = results["kernels"][0]
    assert slowest["mca"]["cycles_per_iteration"] > 0 and slowest["mca"]["predicted_ms"] > 0
    # the loop the Assembly view marks is the one llvm-mca read, found in the sandbox
    assert slowest["hot_loop"] == {"lines": slowest["mca"]["lines"], "by": "mca"}
    view = client.get(f"/r/{created['id']}?view=mca&kernel={slowest['name']}")
    assert view.status_code == 200 and b"Total Cycles" in view.data
    # the worker renders the long kernel views once after the job (webapp/codeviews.py: prerender),
    # and the code panel shows that HTML: the slowest kernel's LLVM IR is one of them (>100 KB)
    rendered = client.application.extensions["playground"]["store"].job_dir(created["id"]) / "rendered"
    deadline = time.monotonic() + 60
    while len(list(rendered.glob("code-*.html"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    slowest = client.get(f"/r/{created['id']}/code?view=llvm&kernel={results['kernels'][0]['name']}")
    kept = [path.read_text() for path in rendered.glob("code-*.html")]
    assert len(kept) >= 2 and any(html in slowest.get_data(as_text=True) for html in kept)
    page = client.get(f"/r/{created['id']}").get_data(as_text=True)
    assert 'id="kernel-profile"' in page and "<th>ms / run</th>" in page

    so = client.get(f"/r/{created['id']}/files/model.so")
    assert so.status_code == 200
    (tmp_path / "model.so").write_bytes(so.data)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "model.so")), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(np.zeros((1, 3, 32, 32), np.float32))).numpy()
    assert out.shape == (1, 10)

    ir = zipfile.ZipFile(io.BytesIO(client.get(f"/r/{created['id']}/files/ir.zip").data))
    assert "imported.py" in ir.namelist() and "module.ll" in ir.namelist()

    # the graphs for Google's Model Explorer, with the time overlay
    graphs = client.get(f"/r/{created['id']}/files/model-explorer-graphs.json").get_json()
    time_data = client.get(f"/r/{created['id']}/files/model-explorer-time.json").get_json()
    assert_model_explorer_graphs(graphs)
    assert_model_explorer_node_data(time_data, graphs)
    ids = {g["id"]: len(g["nodes"]) for g in graphs["graphs"]}
    assert ids == {k: results["graphs"][k]["nodes"] for k in ("imported", "fused")}
    fused_kernels = [n for n in graphs["graphs"][1]["nodes"] if n["label"] in kernel_names]
    assert len(time_data["fused"]["results"]) == len(
        [n for n in fused_kernels if n["label"] in profile["kernels"]]
    )
    assert any(n["namespace"] for n in graphs["graphs"][0]["nodes"])  # grouped by module path


# The shapes of Model Explorer's graph_builder (Graph, GraphNode, IncomingEdge, KeyValue, MetadataItem)
# and node_data_builder (ModelNodeData, GraphNodeData, NodeDataResult, GradientItem) dataclasses.
GRAPH_NODE_FIELDS = {"id", "label", "namespace", "subgraphIds", "attrs", "incomingEdges", "outputsMetadata"}
GRAPH_NODE_FIELDS |= {"inputsMetadata", "style", "config"}


def key_values(items) -> bool:
    return all(
        set(kv) == {"key", "value"} and isinstance(kv["key"], str) and isinstance(kv["value"], str)
        for kv in items
    )


def assert_model_explorer_graphs(data: dict) -> None:
    assert set(data) <= {"graphs", "graphCollections"} and data["graphs"]
    for graph in data["graphs"]:
        assert isinstance(graph["id"], str) and graph["nodes"]
        ids = [n["id"] for n in graph["nodes"]]
        assert len(set(ids)) == len(ids)
        for node in graph["nodes"]:
            assert set(node) <= GRAPH_NODE_FIELDS and {"id", "label"} <= set(node)
            assert isinstance(node["label"], str) and isinstance(node.get("namespace", ""), str)
            assert key_values(node.get("attrs", []))
            for edge in node.get("incomingEdges", []):
                assert set(edge) <= {"sourceNodeId", "sourceNodeOutputId", "targetNodeInputId"}
                assert edge["sourceNodeId"] in ids
                assert all(isinstance(v, str) for v in edge.values())
            for item in node.get("outputsMetadata", []):
                assert (
                    set(item) <= {"id", "attrs"} and isinstance(item["id"], str) and key_values(item["attrs"])
                )


def assert_model_explorer_node_data(data: dict, graphs: dict) -> None:
    ids = {g["id"]: {n["id"] for n in g["nodes"]} for g in graphs["graphs"]}
    assert data and set(data) <= set(ids)
    for graph_id, graph_data in data.items():
        assert graph_data["results"] and set(graph_data["results"]) <= ids[graph_id]
        assert all(set(r) <= {"value", "bgColor", "textColor"} for r in graph_data["results"].values())
        assert all(isinstance(r["value"], (int, float)) for r in graph_data["results"].values())
        stops = [g["stop"] for g in graph_data["gradient"]]
        assert 0 in stops and 1 in stops and all(0 <= s <= 1 for s in stops)


def test_uploaded_pt2_is_benchmarked_against_pytorch(client, example_files):
    pt2 = (example_files / "transformer-block.pt2").read_bytes()
    job = wait_for_job(client, submit(client, {}, (pt2, "block.pt2")).get_json()["id"])
    assert job["status"] == "done", job["error"]
    assert {b["runtime"] for b in job["results"]["benchmarks"]} == {"tvm", "pytorch"}
    assert job["results"]["fidelity"][0]["max_abs_err"] < 1e-3


@pytest.mark.parametrize(
    "content, name, message",
    [
        (b"", "empty.onnx", "empty"),
        (b"hello, I am a text file\n", "notes.onnx", "neither an ONNX model nor a PyTorch .pt2"),
        (b"\x08\x07hello", "fake.pt2", "not a .pt2 file"),
    ],
)
def test_refuses_a_file_that_is_not_a_model_at_once(client, content, name, message):
    resp = submit(client, {}, (content, name))
    assert resp.status_code == 400
    assert message in resp.get_json()["error"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"target": "arm-nonsense", "example": "mlp"}, "Unknown target"),
        ({"example": "nope"}, "Unknown example"),
        ({}, "Upload a model file"),
        ({"example": "mlp", "input_shapes": "{not json"}, "input_shapes must be JSON"),
    ],
)
def test_refuses_bad_options(client, data, message):
    resp = submit(client, data)
    assert resp.status_code == 400 and message in resp.get_json()["error"]


def failed_job(client, content: bytes, name: str, **form) -> dict:
    resp = submit(client, form, (content, name))
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "failed"
    return job


def test_truncated_onnx_fails_at_import_with_a_clear_message(client, example_files):
    data = (example_files / "cnn-small.onnx").read_bytes()
    job = failed_job(client, data[: len(data) // 3], "cut.onnx")
    assert job["error"]["stage"] == "import"
    assert "truncated" in job["error"]["message"] and "Traceback" not in job["error"]["message"]
    assert job["stages"][0]["status"] == "failed"


def test_unsupported_onnx_operator_is_named(client):
    # (ConvInteger was this example until pre-quantized models: it now runs, as float arithmetic)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    job = failed_job(client, onnx_bytes([helper.make_node("Det", ["x"], ["y"])], [x], [y], []), "det.onnx")
    assert job["error"]["stage"] == "import"
    assert "Det" in job["error"]["message"] and "not support" in job["error"]["message"]


def test_pt2_that_is_not_an_exported_program_fails_at_import(client):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"not a program")
    job = failed_job(client, buf.getvalue(), "model.pt2")
    assert job["error"]["stage"] == "import"
    assert "not a torch.export ExportedProgram" in job["error"]["message"]


def test_dynamic_input_without_input_shapes_fails_then_works_with_them(client):
    model = onnx_bytes(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
    )
    job = failed_job(client, model, "dyn.onnx")
    assert job["error"]["stage"] == "import" and "input_shapes" in job["error"]["message"]
    assert job["results"]["resubmit"] == {"input_shapes": {"x": [1, 16]}}  # what would get past it
    resp = submit(client, {"input_shapes": json.dumps({"x": [4, 16]})}, (model, "dyn.onnx"))
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job["error"]
    assert job["results"]["model"]["inputs"][0]["shape"] == [4, 16]
    # or from the failed result's page: the form offers the shapes, and submits the same file again
    failed = failed_job(client, model, "dyn2.onnx", quantize="none")
    page = client.get(f"/r/{failed['id']}").get_data(as_text=True)
    assert 'id="resubmit"' in page and "{&#34;x&#34;: [1, 16]}" in page
    again = client.post(f"/r/{failed['id']}/resubmit", data={"input_shapes": '{"x": [2, 16]}'})
    assert again.status_code == 303
    job = wait_for_job(client, again.headers["Location"].split("/r/")[1].split("?")[0])
    assert job["status"] == "done", job["error"]
    assert job["results"]["model"]["inputs"][0]["shape"] == [2, 16]
    assert job["options"]["filename"] == "dyn2.onnx" and job["options"]["quantize"] == "none"
    bad = client.post(f"/r/{failed['id']}/resubmit", data={"input_shapes": "not json"})
    assert bad.status_code == 400 and "input_shapes" in bad.get_data(as_text=True)


def test_server_keeps_serving_after_failures(client):
    job = wait_for_job(client, submit(client, {"example": "mlp"}).get_json()["id"])
    assert job["status"] == "done"


def test_job_over_the_memory_limit_fails_with_that_message(config, client):
    """A job run by a worker whose memory limit is too small for it."""
    resp = submit(client, {"example": "mlp"})
    job_id = resp.get_json()["id"]
    job = wait_for_job(client, job_id)  # the session's worker runs it normally first
    store = JobStore(config.data_dir)
    # a second job with the same model, run by a worker with a 600 MB limit
    from webapp.jobs.store import new_job_id

    small_id = new_job_id()
    store.job_dir(small_id).mkdir(parents=True)
    store.create(small_id, {**job["options"]})
    run_job(replace(config, memory_limit_mb=600), small_id)
    failed = client.get(f"/api/jobs/{small_id}").get_json()
    assert failed["status"] == "failed"
    assert "Memory limit reached (600 MB" in failed["error"]["message"]
    assert "It was in the import stage" in failed["error"]["message"]  # where the limit stopped it


def test_a_stage_past_its_time_budget_ends_the_job_at_once_naming_it(config, client):
    """A stage that runs longer than its budget (a runaway pass) fails the job within a second or two
    of the budget, and the message names the stage, its budget and the step it was in."""
    from webapp.jobs.store import new_job_id

    store = JobStore(config.data_dir)
    job_id = new_job_id()
    store.job_dir(job_id).mkdir(parents=True)
    store.create(job_id, {"example": "resnet18", "target": "x86-host"})
    started = time.monotonic()
    run_job(replace(config, stage_budgets_s={"build": 1}), job_id)
    failed = client.get(f"/api/jobs/{job_id}").get_json()
    assert failed["status"] == "failed" and failed["error"]["stage"] == "build"
    # the step it was in; on a loaded machine the budget can run out before the first named one
    assert re.match(
        r"The build stage ran past its time budget of 1 s, (in .+|before its first named step), and the job",
        failed["error"]["message"],
    ), failed["error"]["message"]
    stages = {s["name"]: s for s in failed["stages"]}
    assert stages["build"]["status"] == "failed" and stages["build"]["seconds"] < 5
    assert time.monotonic() - started < 120  # resnet18's build alone takes longer on 2 cores
    page = client.get(f"/r/{job_id}").get_data(as_text=True)
    assert "ran past its time budget" in page


def test_unknown_job_is_404_and_ids_are_unguessable(client):
    assert client.get("/api/jobs/AAAAAAAAAAAAAAAAAAAAAAAA").status_code == 404
    assert client.get("/r/nope").status_code == 404


def test_results_survive_a_restart(config, client):
    job_id = submit(client, {"example": "mlp"}).get_json()["id"]
    before = wait_for_job(client, job_id)
    from webapp import create_app

    fresh = create_app(config).test_client()  # a new app over the same data folder
    assert fresh.get(f"/api/jobs/{job_id}").get_json() == before
    assert fresh.get(f"/r/{job_id}").status_code == 200


@pytest.mark.parametrize("size_mb", [1.5, 3])
def test_refuses_a_file_over_the_size_limit(config, size_mb):
    from webapp import create_app

    small = create_app(replace(config, max_upload_mb=1)).test_client()
    content = b"\x08\x07" + b"\0" * int(size_mb * (1 << 20))
    resp = submit(small, {}, (content, "big.onnx"))
    assert resp.status_code == 400
    assert "larger than this server's limit of 1 MB" in resp.get_json()["error"]


@pytest.mark.isa
def test_quantized_upload_with_calibration_npz_reports_layers_and_speed(client, example_files, tmp_path):
    """int8 with power-of-two scales, KL calibration on the user's inputs: the JSON names every
    quantized layer with its scales and error, and benchmarks int8 beside fp32."""
    resp = submit(
        client,
        {"quantize": "int8", "calibration": "kl", "weight_scale": "power2"},
        ((example_files / "cnn-small.onnx").read_bytes(), "cnn.onnx"),
        calibration={"input": np.random.default_rng(0).standard_normal((6, 3, 32, 32)).astype(np.float32)},
    )
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job["error"]
    q = job["results"]["quantization"]
    assert q["calibration"] == {"source": "uploaded .npz", "samples": 6}
    # 3 convs and the classifier, less any the build measured slower in int8 and kept in float
    fallback = (q.get("layer_speed") or {}).get("fallback") or {}
    in_float = fallback["layers"] if fallback.get("kept") else []
    assert q["options"]["calibration"] == "kl" and q["skipped"] == in_float
    assert len(q["layers"]) + len(in_float) == 4
    assert all(layer["power2"] for layer in q["layers"])
    assert len(q["layer_errors"]) == len(q["layers"]) and all(e["cosine"] > 0.99 for e in q["layer_errors"])
    assert {(b["runtime"], b["variant"]) for b in job["results"]["benchmarks"]} >= {
        ("tvm", "fp32"),
        ("tvm", "int8"),
    }
    vs_fp32 = next(
        f for f in job["results"]["fidelity"] if f["variant"] == "int8" and f["reference"] == "tvm fp32"
    )
    assert vs_fp32["cosine"] > 0.99
    assert job["results"]["instructions"][int8_instruction("x86-host")] > 0  # vpdpbusd with VNNI
    assert "uint8 x int8" in " ".join(job["results"]["dtype_census"]["kernels"])
    # the quantized layers' error on the graphs, also for Model Explorer
    graphs = client.get(f"/r/{job['id']}/files/model-explorer-graphs.json").get_json()
    sqnr = client.get(f"/r/{job['id']}/files/model-explorer-sqnr.json").get_json()
    assert_model_explorer_node_data(sqnr, graphs)
    imported = client.get(f"/r/{job['id']}/graph-imported.json").get_json()
    convs = [n for n in imported["nodes"] if n["label"] == "nn.conv2d"]
    int8_convs = [n for n in convs if "sqnr_db" in n]  # a conv kept in float has no error against float
    assert len(convs) == 3 and all(n["kernel"] for n in convs)
    assert len(int8_convs) == 3 - sum("conv2d" in name for name in in_float)
    assert all(n["sqnr_db"] > 10 for n in int8_convs)
    # the layer where the SQNR falls most from the layer before it is marked, where it falls at all
    worst = job["results"]["quantization_summary"]["worst_layer"]
    assert sum(1 for n in imported["nodes"] if n.get("worst")) >= (1 if worst else 0)
    if not worst:
        errors = [e["sqnr_db"] for e in q["layer_errors"]]
        assert all(a is None or b is None or b >= a for a, b in zip(errors, errors[1:], strict=False)), errors


@pytest.mark.parametrize(
    "npz_arrays, message",
    [
        (
            {"other": np.zeros((2, 3, 32, 32), np.float32), "extra": np.zeros(1)},
            "no array for input(s) input",
        ),
        ({"input": np.zeros((2, 3, 16, 16), np.float32)}, "expected [N, 1, 3, 32, 32]"),
    ],
)
def test_bad_calibration_data_fails_at_quantize_with_what_is_wrong(
    client, example_files, npz_arrays, message
):
    model = ((example_files / "cnn-small.onnx").read_bytes(), "cnn.onnx")
    resp = submit(client, {"quantize": "int8"}, model, calibration=npz_arrays)
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "failed" and job["error"]["stage"] == "quantize"
    assert message in job["error"]["message"]


def test_refuses_calibration_data_that_is_not_npz_or_without_quantization(client):
    for form, message in (
        ({"quantize": "int8"}, "must be a .npz file"),
        ({}, "pick a quantize mode"),
    ):
        data = {
            "target": "x86-host",
            "example": "mlp",
            **form,
            "calibration_data": (io.BytesIO(b"hello"), "c.npz"),
        }
        resp = client.post("/api/jobs", data=data, content_type="multipart/form-data")
        assert resp.status_code == 400 and message in resp.get_json()["error"]


def test_a_busy_loop_through_the_benchmark_is_timed_three_times_and_the_headline_says_how_uncertain(
    config, client
):
    """The benchmark records how busy the machine was while it timed (webapp/pipeline/stages/
    conditions.py). Here a busy loop keeps one core busy through the whole job: the benchmark waits for
    the machine to be quiet (at most 2 s here, half of it before it counts the free cores), times three
    times, each disturbed, keeps the timing whose rounds lie closest together, and the headline states
    its ratios as uncertain, by how much, from the rounds timed side by side. It leaves the core the
    loop keeps busy (2 cores, as CI has)."""
    from webapp.jobs.store import new_job_id

    store = JobStore(config.data_dir)
    job_id = new_job_id()
    store.job_dir(job_id).mkdir(parents=True)
    store.create(job_id, {"example": "mlp", "target": "x86-host", "quantize": "int8"})
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        run_job(replace(config, quiet_wait_s=2.0), job_id)
    finally:
        os.killpg(busy.pid, signal.SIGKILL)
        busy.wait()
    job = client.get(f"/api/jobs/{job_id}").get_json()
    assert job["status"] == "done", job["error"]
    results = job["results"]
    conditions, machine = results["conditions"], results["machine"]
    timings = conditions["timings"]
    assert len(timings) == 3, timings
    assert all(
        t["others_cores"] > 0.25 and t["disturbed"].startswith("other processes used") for t in timings
    )
    assert conditions["disturbed"] == timings[conditions["kept"] - 1]["disturbed"]
    assert timings[conditions["kept"] - 1]["spread"] == min(t["spread"] for t in timings)
    assert conditions["waited_s"] >= 0.9  # it waited for quiet, 1 s before it counted the free cores
    # the headline's ratios: of the rounds timed side by side, stated as uncertain by half their range
    speed, quantized = results["headline"]["speed"], results["headline"]["quantized"]
    rows = {(b["runtime"], b["variant"]): b for b in results["benchmarks"]}
    tvm_row = next(b for b in results["benchmarks"] if build_name(b) == speed["tvm"])
    peer = next(b for b in results["benchmarks"] if build_name(b) == speed["peer"])
    ratios = sorted(p / t for p, t in zip(peer["rounds_ms"], tvm_row["rounds_ms"], strict=True))
    assert speed["peer_over_tvm"] == pytest.approx(float(np.median(ratios)))
    plus_minus = (ratios[-1] - ratios[0]) / 2 / speed["peer_over_tvm"]
    assert speed["uncertain"]["plus_minus"] == pytest.approx(plus_minus)
    assert speed["text"].endswith(
        f". Uncertain by ±{plus_minus:.0%}: timed 3 times, never undisturbed ({conditions['disturbed']}); "
        f"its 4 rounds put {speed['tvm']} at {ratios[0]:.2f}× to {ratios[-1]:.2f}× {speed['peer']}'s speed"
    ), speed["text"]
    fp32, int8 = rows[("tvm", "fp32")], rows[("tvm", "int8")]
    gains = sorted(f / i for f, i in zip(fp32["rounds_ms"], int8["rounds_ms"], strict=True))
    assert quantized["speedup"] == pytest.approx(float(np.median(gains)))
    assert (
        f"; its 4 rounds put int8 at {gains[0]:.2f}× to {gains[-1]:.2f}× TVM fp32's speed"
        in quantized["text"]
    )
    assert f"* {speed['text']}" in headline_lines(results)
    page = client.get(f"/r/{job_id}").get_data(as_text=True)
    assert re.search(r'<li id="headline-speed" class="\w+ uncertain">', page)
    assert speed["text"].replace("'", "&#39;") in page
    assert '<strong id="bench-disturbed">No timing was undisturbed' in page
    assert f"Timed 3 times, waiting {conditions['waited_s']:.1f} s in all" in page
    flags = open("/proc/cpuinfo").read()
    assert machine["cores"] == os.cpu_count() and ("model name" not in flags or machine["cpu"])
    assert ("AVX2" in machine["instruction_sets"]) == (" avx2 " in flags)
    # the busy loop kept one core busy: every runtime left it (timing.free_cores), where that leaves
    # fewer cores than the benchmark's threads (2, on a machine of 2 cores such as CI's)
    threads = min(config.bench_threads, os.cpu_count() - 1)
    assert {b["threads"] for b in job["results"]["benchmarks"]} == {threads}
    if threads < config.bench_threads:
        fewer = {"threads": threads, "of": config.bench_threads, "busy_cores": config.bench_threads - threads}
        assert job["results"]["fewer_threads"] == fewer
        assert f"Other processes kept {fewer['busy_cores']} of the\n    {fewer['of']} cores busy" in page
