"""Uploads that plain TVM and ONNX Runtime take, through the whole job as a user submits it (the web
API, the worker, the sandbox): none of our own checks, names or random inputs may fail them."""

from __future__ import annotations

import io

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import wait_for_job


def upload(client, model, name: str = "model.onnx") -> dict:
    data = {"target": "x86-host", "model": (io.BytesIO(model.SerializeToString()), name)}
    resp = client.post("/api/jobs", data=data, content_type="multipart/form-data")
    assert resp.status_code in (200, 201, 202), resp.get_json()
    return wait_for_job(client, resp.get_json()["id"])


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # onnx's newest is past what this ONNX Runtime reads
    return model


def const(name: str, value) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def test_a_600_op_fused_chain_gets_a_file_name_that_fits_and_keeps_its_full_name(client):
    """Its fused kernel is named after its ops (1,800+ characters, past the file system's 255 bytes):
    the files of its code views take a shortened name, the page and the JSON the full one."""
    ops, nodes, inits, prev = ("Add", "Mul", "Sub"), [], [], "x"
    for i in range(600):
        inits.append(const(f"c{i}", np.full((1,), 1.0 + (i % 7) * 1e-3, np.float32)))
        nodes.append(helper.make_node(ops[i % 3], [prev, f"c{i}"], [f"t{i}"]))
        prev = f"t{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 64])
    job = upload(client, model_of(nodes, [x], [y], inits))
    assert job["status"] == "done", job.get("error")
    kernel = max((k["name"] for k in job["results"]["kernels"]), key=len)
    assert len(kernel) > 1000 and "_multiply_subtract_add_" in kernel
    page = client.get(f"/r/{job['id']}?view=asm&kernel={kernel}").get_data(as_text=True)
    assert "vaddps" in page or "addps" in page  # the kernel's own assembly, read from its short file
    assert any(b["runtime"] == "onnxruntime" for b in job["results"]["benchmarks"])


def test_integer_inputs_get_values_the_model_can_use(client):
    """Token ids index a 1,000-row table and a Slice takes its starts and ends at run time: random
    0-9 starts and ends failed the benchmark (an end before its start)."""
    table = const("table", np.random.default_rng(0).standard_normal((1000, 16)).astype(np.float32))
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Slice", ["emb", "starts", "ends", "axes"], ["sl"]),
        helper.make_node("ReduceSum", ["sl"], ["y"], keepdims=0),
    ]
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8]),
        helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("ends", TensorProto.INT64, [1]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    job = upload(client, model_of(nodes, inputs, [y], [table, const("axes", np.array([1], np.int64))]))
    assert job["status"] == "done", job.get("error")
    values = {i["name"]: i["values"] for i in job["results"]["model"]["inputs"]}
    assert values["ids"]["high"] == 1000 and values["starts"]["fill"] == [0] and values["ends"]["fill"] == [8]
    fidelity = [f for f in job["results"]["fidelity"] if f["reference"] == "onnxruntime"]
    assert fidelity and all(f["max_abs_err"] < 1e-3 for f in fidelity)
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert "random below 1000" in page and "given 0" in page


def test_a_benchmark_that_cannot_run_keeps_the_build(client):
    """Starts and ends reach the Slice through an Add the input analysis does not follow: random
    values make the first run fail. The benchmark is marked failed with its reason; the job is done
    with its build, code views and downloads."""
    nodes = [
        helper.make_node("Add", ["starts", "zero"], ["s"]),
        helper.make_node("Add", ["ends", "zero"], ["e"]),
        helper.make_node("Slice", ["x", "s", "e", "axes"], ["sl"]),
        helper.make_node("ReduceSum", ["sl"], ["y"], keepdims=0),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16]),
        helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("ends", TensorProto.INT64, [1]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    inits = [const("zero", np.array([0], np.int64)), const("axes", np.array([1], np.int64))]
    job = upload(client, model_of(nodes, inputs, [y], inits))
    assert job["status"] == "done" and job.get("error") is None, job.get("error")
    stage = next(s for s in job["stages"] if s["name"] == "benchmark")
    assert stage["status"] == "failed" and stage["error"]
    assert "model.so" in job["results"]["files"] and job["results"]["kernels"]
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert 'id="benchmark-failed"' in page and stage["error"][:40] in page
    assert client.get(f"/r/{job['id']}/files/model.so").status_code == 200
    log = client.get(f"/r/{job['id']}/files/log.txt")
    assert log.status_code == 200 and "Traceback" in log.get_data(as_text=True)


def test_a_file_the_onnx_checker_rejects_but_onnx_runtime_runs_is_a_warning(client):
    """IR version 3 wants every initializer listed among the graph's inputs; ONNX Runtime and TVM
    run such a file anyway, so the job does, and the page says what the checker found."""
    w = const("w", np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = model_of(nodes, [x], [y], [w], opset=9)
    model.ir_version = 3
    job = upload(client, model)
    assert job["status"] == "done", job.get("error")
    assert job["results"]["model"]["warnings"] == [
        "ONNX's checker finds the model not valid: w in initializer but not in graph input"
    ]
    assert any(b["runtime"] == "onnxruntime" for b in job["results"]["benchmarks"])
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert "w in initializer but not in graph input" in page


def test_bool_masks_that_plain_tvm_cannot_compile_build_and_match_pytorch(client, tmp_path):
    """The attention masks of packed sequences, as Hugging Face models compute them: a cumulative sum
    of a bool tensor (PyTorch: int64 counts; TVM's importer types it bool) and bools compared with
    `==`. Plain tvm.compile fails on both ("Check failed: t.MatchesCode(kDLFloat)")."""
    import torch

    class PackedMask(torch.nn.Module):
        def forward(self, x, segment_starts):
            starts = segment_starts != 0
            segment = starts.cumsum(-1)  # which packed sequence each token is in
            same = segment[:, :, None] == segment[:, None, :]
            both = starts[:, :, None] == starts[:, None, :]
            return (x @ x.transpose(-1, -2)) * same.float() + both.float()

    x, starts = torch.randn(1, 16, 8), torch.tensor([[1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]])
    path = tmp_path / "packed.pt2"
    torch.export.save(torch.export.export(PackedMask(), (x, starts)), str(path))
    resp = client.post(
        "/api/jobs",
        data={"target": "x86-host", "model": (io.BytesIO(path.read_bytes()), "packed.pt2")},
        content_type="multipart/form-data",
    )
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job.get("error")
    fidelity = [f for f in job["results"]["fidelity"] if f["reference"] == "pytorch"]
    assert fidelity and fidelity[0]["max_abs_err"] < 1e-4, fidelity


def test_a_kernel_tvm_cannot_compile_is_named_with_its_schedule(tmp_path):
    """Without the project's rewrite (passes/tvm_gaps.py), TVM's code generation fails on bools
    compared with ==: the build's error names the kernel that fails and how it was scheduled."""
    import pytest
    import tvm
    from tvm.script import relax as R

    from webapp.pipeline.passes.legalize import fuse
    from webapp.pipeline.stages.build import KernelBuildError, build, schedule
    from webapp.targets import get

    @tvm.script.ir_module
    class Masks:
        @R.function
        def main(a: R.Tensor((4, 16), "bool"), b: R.Tensor((4, 16), "bool")):
            with R.dataflow():
                same = R.equal(a, b)
                out = R.astype(same, "float32")
                R.output(out)
            return out

    target = get("x86-host")
    lowered, labels = schedule(fuse(Masks, target), target)
    with pytest.raises(KernelBuildError) as failed:
        build(lowered, target, None)
    (kernel,) = failed.value.kernels
    assert "equal" in kernel and labels[kernel] in str(failed.value)
    assert str(failed.value).startswith(f"TVM could not compile the kernel {kernel} (")
    assert "fcmp" in str(failed.value)  # LLVM compares the bools as floats


def test_a_pass_that_fails_is_named(example_files, tmp_path, monkeypatch):
    import pytest
    import tvm

    from webapp.pipeline.errors import StageError
    from webapp.pipeline.passes import legalize
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.optimize import optimize
    from webapp.targets import get

    @tvm.transform.module_pass(opt_level=0, name="BrokenRewrite")
    def broken(mod, _ctx):
        raise ValueError("no such layout")

    monkeypatch.setitem(legalize.REWRITES, "fast_math", broken)
    with pytest.raises(StageError, match=r"^TVM's pass BrokenRewrite failed \(after \d+ passes that ran\): "):
        optimize(import_model(example_files / "mlp.onnx").mod, get("x86-host"), tmp_path)


def unary_chain(length: int):
    """Sigmoid and Relu alternating: each sigmoid's fast exp reads its input five times, so inlining
    the chain into one expression grew without bound (the build ran out of memory after minutes),
    and the fusion map recursed once per op (RecursionError)."""
    nodes, prev = [], "x"
    for i in range(length):
        nodes.append(helper.make_node("Sigmoid" if i % 2 == 0 else "Relu", [prev], [f"t{i}"]))
        prev = f"t{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    return model_of(nodes, [x], [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 64])])


def test_a_600_op_unary_chain_builds_runs_and_agrees_with_onnx_runtime(client):
    job = upload(client, unary_chain(600))
    assert job["status"] == "done", job.get("error")
    fid = next(f for f in job["results"]["fidelity"] if f["reference"] == "onnxruntime")
    assert fid["max_abs_err"] < 1e-4
    # the fusion map followed the whole chain: every op is a layer of a kernel
    assert sum(len(k.get("layers", [])) for k in job["results"]["kernels"]) >= 600


def test_a_5000_op_unary_chain_builds_on_the_default_rules(tmp_path):
    import tvm
    from tvm import relax

    from webapp.pipeline.stages.build import build, schedule
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.optimize import optimize
    from webapp.targets import get

    (tmp_path / "m.onnx").write_bytes(unary_chain(5000).SerializeToString())
    target = get("x86-host")
    model = import_model(tmp_path / "m.onnx")
    optimized = optimize(model.mod, target, tmp_path, layer_of=model.layers)
    assert len(optimized.fusion.kernel_of) >= 5000  # every op's kernel found, without recursion
    lowered, labels = schedule(optimized.fused, target)
    vm = relax.VirtualMachine(build(lowered, target, None), tvm.cpu())
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(1, 64)
    expected = x
    for i in range(5000):
        expected = 1 / (1 + np.exp(-expected)) if i % 2 == 0 else np.maximum(expected, 0)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)
