"""Models quantized by ONNX Runtime's own tools (quantize_static), in QDQ and QLinearConv form: they
run on the project's integer kernels with the model's scales and match ONNX Runtime on the same file."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import int8_instruction, wait_for_job
from tests.test_api import submit


def ort_quantized(source, out, fmt: str, input_name: str, shape) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)

    class Inputs(CalibrationDataReader):
        def __init__(self):
            self.inputs = iter(
                [{input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self):
            return next(self.inputs, None)

    quantize_static(
        str(source),
        str(out),
        Inputs(),
        quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return out.read_bytes()


pytestmark = pytest.mark.isa  # int8 kernels on x86-host


def assert_on_integer_kernels_like_onnxruntime(job: dict, form: str, layers: int, min_sqnr_db: float) -> dict:
    assert job["status"] == "done", job["error"]
    r = job["results"]
    assert r["model"]["prequantized"] == {"form": form, "layers": layers, "in_float": []}
    assert r["quantization"]["variant"] == "int8" and not r["quantization"]["skipped"]
    # its layers timed, never replaced by float ones (a tiny model's every layer can time slower in
    # int8, as x86-avx2 here on a busy machine: then "all_slower" is said first)
    speed = r["quantization"].get("layer_speed") or {}
    assert "fallback" not in speed and speed.get("not_tried") in (None, "prequantized", "all_slower")
    assert r["instructions"][int8_instruction("x86-host")] > 0  # vpdpbusd with VNNI
    rows = {(b["runtime"], b["variant"]) for b in r["benchmarks"]}
    assert ("onnxruntime", "int8") in rows and ("tvm", "int8") in rows  # ORT runs the quantized file
    vs_ort = next(f for f in r["fidelity"] if f["variant"] == "int8" and f["reference"] == "onnxruntime")
    assert vs_ort["sqnr_db"] > min_sqnr_db and vs_ort["cosine"] > 0.999, vs_ort
    return vs_ort


def test_a_qdq_resnet18_from_onnxruntime_runs_on_integer_kernels_with_its_own_scales(
    client, config, tmp_path
):
    from webapp.jobs.worker import ensure_example_files

    _, source = ensure_example_files(config, "resnet18")
    qdq = ort_quantized(source, tmp_path / "r18-qdq.onnx", "QDQ", "input", (1, 3, 224, 224))
    job = wait_for_job(client, submit(client, {}, (qdq, "resnet18-qdq.onnx")).get_json()["id"])
    vs_ort = assert_on_integer_kernels_like_onnxruntime(job, "QDQ", 21, 30.0)  # 20 convolutions and the fc
    assert vs_ort["top1_agree"] == 1.0
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert "Pre-quantized (QDQ), scales from the model" in page


def test_a_qlinearconv_model_from_onnxruntime_runs_on_integer_kernels(client, tmp_path):
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)) * 0.3,
        "b1": rng.standard_normal(8) * 0.1,
        "w2": rng.standard_normal((16, 8, 3, 3)) * 0.2,
        "b2": rng.standard_normal(16) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what this ONNX Runtime reads
    onnx.save(model, str(tmp_path / "convs.onnx"))
    qop = ort_quantized(
        tmp_path / "convs.onnx", tmp_path / "convs-qop.onnx", "QOperator", "x", (1, 3, 16, 16)
    )
    assert {n.op_type for n in onnx.load_from_string(qop).graph.node} >= {"QLinearConv"}
    job = wait_for_job(client, submit(client, {}, (qop, "convs-qlinear.onnx")).get_json()["id"])
    assert_on_integer_kernels_like_onnxruntime(job, "QLinearConv/QLinearMatMul", 2, 25.0)


def test_a_dynamically_quantized_model_runs_in_float_and_says_so(client, tmp_path):
    """quantize_dynamic's ConvInteger (scales computed at run time; TVM's importer lacks it) runs as
    the same arithmetic in float, listed on the page."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b": rng.standard_normal(8) * 0.1}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "conv.onnx"))
    quantize_dynamic(
        str(tmp_path / "conv.onnx"),
        str(tmp_path / "dyn.onnx"),
        weight_type=QuantType.QUInt8,
        op_types_to_quantize=["Conv"],
    )
    dyn = (tmp_path / "dyn.onnx").read_bytes()
    job = wait_for_job(client, submit(client, {}, (dyn, "conv-dynamic.onnx")).get_json()["id"])
    assert job["status"] == "done", job["error"]
    pre = job["results"]["model"]["prequantized"]
    assert pre["form"] == "dynamic (ConvInteger/MatMulInteger)" and pre["layers"] == 0
    assert len(pre["in_float"]) == 1 and "run as a float Conv" in pre["in_float"][0]
    vs_ort = next(f for f in job["results"]["fidelity"] if f["reference"] == "onnxruntime")
    assert vs_ort["max_abs_err"] < 1e-5  # the same integer arithmetic, exact in float here
    assert "run as a float Conv" in client.get(f"/r/{job['id']}").get_data(as_text=True)
