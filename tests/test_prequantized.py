"""Models quantized by ONNX Runtime's own tools (quantize_static), in QDQ and QLinearConv form: they
run on the project's integer kernels with the model's scales and match ONNX Runtime on the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import int8_instruction, wait_for_job
from tests.test_api import submit


def ort_quantized(
    source, out, fmt: str, input_name: str, shape, per_channel: bool = True, activations: str = "uint8"
) -> bytes:
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
        per_channel=per_channel,
        activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return out.read_bytes()


# The tests marked isa run again as on an AVX2-only CPU (make test): the int8 kernels differ there.


def exact_reference() -> str:
    """The fidelity reference the model's int8 arithmetic is checked against on this host: ONNX
    Runtime's own kernels where they compute it exactly (a dot-product instruction), else its unfused
    ops (bench.unfused_reference). On x86 without VNNI its kernels sum pairs of products in int16 and
    saturate: the convs model's per-channel weights put them 21 dB from its unfused run, ours 37."""
    from webapp.pipeline.stages.bench import UNFUSED
    from webapp.targets import get

    return "onnxruntime" if get("x86-host").int8_pair_limit() is None else UNFUSED


def save_model(path, nodes, x_shape, y_shape, weights: dict):
    """A float ONNX model of `nodes` from input x to output y, its weights float32 (integer arrays,
    a Reshape's shape, as they are), saved as ONNX Runtime's quantizers read it; returns `path`."""
    inits = [
        numpy_helper.from_array(v if np.issubdtype(v.dtype, np.integer) else v.astype(np.float32), k)
        for k, v in weights.items()
    ]
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what this ONNX Runtime reads
    onnx.save(model, str(path))
    return path


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
    references = {f["reference"]: f for f in r["fidelity"] if f["variant"] == "int8"}
    assert {"onnxruntime", "onnxruntime unfused"} <= set(references)  # its kernels and its ops' arithmetic
    vs_ort = references[exact_reference()]
    assert vs_ort["sqnr_db"] > min_sqnr_db and vs_ort["cosine"] > 0.999, vs_ort
    return vs_ort


@pytest.mark.isa
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


@pytest.fixture(scope="module")
def convs_model(tmp_path_factory):
    """Two convolutions and a ReLU, in float: what ONNX Runtime quantizes in the tests below."""
    tmp_path = tmp_path_factory.mktemp("convs")
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
    return save_model(tmp_path / "convs.onnx", nodes, [1, 3, 16, 16], [1, 16, 8, 8], weights)


@pytest.mark.isa
def test_a_qlinearconv_model_from_onnxruntime_runs_on_integer_kernels(client, convs_model, tmp_path):
    qop = ort_quantized(convs_model, tmp_path / "convs-qop.onnx", "QOperator", "x", (1, 3, 16, 16))
    assert {n.op_type for n in onnx.load_from_string(qop).graph.node} >= {"QLinearConv"}
    job = wait_for_job(client, submit(client, {}, (qop, "convs-qlinear.onnx")).get_json()["id"])
    assert_on_integer_kernels_like_onnxruntime(job, "QLinearConv/QLinearMatMul", 2, 25.0)
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert "<em>onnxruntime unfused</em>: the pre-quantized model's operators one by one" in page


def built_int8(path, work) -> tuple:
    """(import, the int8 variant, its executable, the int8 instructions in its code) of a
    pre-quantized model, through the job's stages in this process."""
    from webapp.options import JobOptions
    from webapp.pipeline.stages.build import build_job
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.inspect import host_code_module, instruction_counts
    from webapp.pipeline.stages.optimize import optimize
    from webapp.pipeline.stages.quantize.variants import quantize_job
    from webapp.targets import get

    target = get("x86-host")
    model = import_model(path)
    (work / "files").mkdir(parents=True, exist_ok=True)
    optimized = optimize(model.mod, target, work)
    quantized = quantize_job(model, target, JobOptions(), work, None, None, lambda f: None)
    built = build_job(optimized.fused, quantized, target, None, work, lambda f: None, model.layers)
    executable = built.executables["int8", False]
    asm = host_code_module(executable).inspect_source("s")
    mnemonic = int8_instruction("x86-host")
    return model, quantized.variants[0], executable, instruction_counts(asm, [mnemonic]).get(mnemonic, 0)


def against_onnxruntime(path, model, executable) -> dict:
    from webapp.pipeline.stages import bench

    inputs = bench.make_inputs(model.inputs, seed=7)
    ours = bench.flatten_outputs(bench.tvm_runner(executable, inputs)())
    if exact_reference() == bench.UNFUSED:
        theirs = bench.unfused_reference(path, inputs, 1)[bench.UNFUSED]
    else:
        theirs = bench.flatten_outputs(bench.onnxruntime_runner(path, inputs, 1)())
    return bench.fidelity(ours, theirs, False)


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_every_form_of_quantize_static_runs_on_integer_kernels_like_onnxruntime(
    form, per_channel, activations, convs_model, tmp_path
):
    """ONNX Runtime's static quantizer in each of its forms and types: both convolutions run on the
    int8 kernels, with the model's scales, as ONNX Runtime runs the file."""
    path = tmp_path / "q.onnx"
    ort_quantized(convs_model, path, form, "x", (1, 3, 16, 16), per_channel, activations)
    model, variant, executable, int8_ops = built_int8(path, tmp_path)
    assert model.prequantized["layers"] == 2 and len(variant.layers) == 2
    assert int8_ops > 0
    vs_ort = against_onnxruntime(path, model, executable)
    assert vs_ort["cosine"] > 0.999 and vs_ort["sqnr_db"] > 25, vs_ort


def test_grouped_convolutions_run_on_the_dot_product_kernels(tmp_path):
    """ShuffleNet's convolutions of a few groups (here 4, 1x1 and 3x3) run as one dense convolution
    with zeros between the groups, on the int8 dot-product kernels (the windowed rule they had took
    the light ShuffleNet to 3.3x ONNX Runtime int8), and compute what ONNX Runtime computes."""
    rng = np.random.default_rng(2)
    weights = {"w1": rng.standard_normal((32, 4, 1, 1)) * 0.3, "w2": rng.standard_normal((32, 8, 3, 3)) * 0.2}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="pointwise", group=4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="grouped", group=4, pads=[1, 1, 1, 1]),
    ]
    save_model(tmp_path / "grouped.onnx", nodes, [1, 16, 8, 8], [1, 32, 8, 8], weights)
    path = tmp_path / "grouped-qdq.onnx"
    ort_quantized(tmp_path / "grouped.onnx", path, "QDQ", "x", (1, 16, 8, 8))
    model, variant, executable, int8_ops = built_int8(path, tmp_path)
    assert len(variant.layers) == 2 and int8_ops > 0  # no dot-product instruction on the windowed rule
    vs_ort = against_onnxruntime(path, model, executable)
    assert vs_ort["cosine"] > 0.999, vs_ort


def test_weights_quantized_as_tensors_run_on_integer_kernels(tmp_path):
    """The onnx package's light SqueezeNet writes its weights with ConstantOfShape, which ONNX
    Runtime's quantize_static quantizes as activations (uint8, a zero point): its 26 convolutions
    still run on the int8 kernels, their weights given symmetric int8 scales (counted: requantized)."""
    light = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    path = tmp_path / "squeezenet-qdq.onnx"
    ort_quantized(light, path, "QDQ", "data_0", (1, 3, 224, 224))
    model, variant, executable, int8_ops = built_int8(path, tmp_path)
    pre = model.prequantized
    assert (pre["layers"], pre["requantized"], len(variant.layers)) == (26, 26, 26)
    assert int8_ops > 0
    vs_ort = against_onnxruntime(path, model, executable)
    assert vs_ort["degenerate"]  # a constant-weight model: its output is the same everywhere, and said so


@pytest.mark.isa
def test_a_dynamically_quantized_model_runs_on_integer_kernels_lstm_included(client, tmp_path):
    """quantize_dynamic's ConvInteger and MatMulInteger (activation scales computed at run time) run on
    the int8 kernels with the model's weight scales and calibrated activation scales; so do the matmuls
    of its DynamicQuantizeLSTM (an ONNX Runtime contrib operator), with scales from their weights."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((8, 3, 3, 3)) * 0.3,
        "b": rng.standard_normal(8) * 0.1,
        "shape": np.array([8, 1, 64]),
        "fc": rng.standard_normal((64, 32)) * 0.2,
        "lstm_w": rng.standard_normal((1, 64, 32)) * 0.2,
        "lstm_r": rng.standard_normal((1, 64, 16)) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["seq"], name="to_sequence"),  # 8 steps of 64
        helper.make_node("MatMul", ["seq", "fc"], ["m"], name="fc"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("LSTM", ["r", "lstm_w", "lstm_r"], ["y"], name="lstm", hidden_size=16),
    ]
    save_model(tmp_path / "model.onnx", nodes, [1, 3, 8, 8], [8, 1, 1, 16], weights)
    quantize_dynamic(str(tmp_path / "model.onnx"), str(tmp_path / "dyn.onnx"), weight_type=QuantType.QUInt8)
    dyn = onnx.load(str(tmp_path / "dyn.onnx"))
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"} <= {n.op_type for n in dyn.graph.node}
    job = wait_for_job(client, submit(client, {}, (dyn.SerializeToString(), "dynamic.onnx")).get_json()["id"])
    assert job["status"] == "done", job["error"]
    r = job["results"]
    pre = r["model"]["prequantized"]
    assert (pre["layers"], pre["dynamic"], pre["requantized"]) == (3, 3, 2)  # uint8 weights: requantized
    assert pre["in_float"] == []
    layers = [layer["layer"] for layer in r["quantization"]["layers"]]
    # the LSTM's input projection (8 steps x 32 -> 4 gates x 16) and its recurrent matmuls (16 -> 64), one
    # a step but the first (its state is zeros: folded away)
    assert layers[2:] == ["02 matmul 32x64"] + [f"{i:02d} matmul 16x64" for i in range(3, 10)], layers
    assert "calibrated" in r["quantization"]["calibration"]["source"]
    assert r["instructions"][int8_instruction("x86-host")] > 0
    vs_ort = next(f for f in r["fidelity"] if f["variant"] == "int8" and f["reference"] == exact_reference())
    assert vs_ort["cosine"] > 0.999, vs_ort


def test_a_rewrite_keeps_what_a_branch_reads_however_deep():
    """The quantizers a rewrite leaves behind are dropped, but not a tensor that only a branch nested
    in a branch reads, nor one a branch returns."""
    from webapp.pipeline.stages.prequantized import remove_dead

    inner = helper.make_graph(
        [helper.make_node("Identity", ["deep"], ["inner_out"])],
        "inner",
        [],
        [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, [1])],
    )
    returned = helper.make_graph(
        [], "returned", [], [helper.make_tensor_value_info("shallow", TensorProto.FLOAT, [1])]
    )
    outer = helper.make_graph(
        [helper.make_node("If", ["cond"], ["branch_out"], then_branch=inner, else_branch=inner)],
        "outer",
        [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [1])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["deep"], name="read_two_levels_down"),
            helper.make_node("Relu", ["x"], ["shallow"], name="returned_by_a_branch"),
            helper.make_node("Relu", ["x"], ["unused"], name="dead"),
            helper.make_node("If", ["cond"], ["y"], name="if", then_branch=outer, else_branch=returned),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    remove_dead(graph)
    assert [n.name for n in graph.node] == ["read_two_levels_down", "returned_by_a_branch", "if"]


def test_onnx_runtimes_other_qoperators_run_around_their_float_ops_like_onnxruntime(tmp_path):
    """quantize_static's QOperator form of a residual block with a classifier writes ONNX Runtime's
    contrib operators QLinearAdd, QLinearGlobalAveragePool and QGemm besides QLinearConv: each is read
    as its float op between the tensors' own scales; the convolutions run on the int8 kernels, and so
    does the classifier, which reads the pooled uint8 tensor through a Flatten that ONNX Runtime runs on
    the 8 bits themselves: dequantized before the Flatten, it keeps the pooled tensor's scale. So does
    the second convolution, behind a max pool on 8 bits between two QLinearConvs (as in ResNet)."""
    rng = np.random.default_rng(1)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)) * 0.3,
        "b1": rng.standard_normal(8) * 0.1,
        "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2,
        "b2": rng.standard_normal(8) * 0.1,
        "fc": rng.standard_normal((4, 8)) * 0.3,
        "fc_b": rng.standard_normal(4) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["p1", "c2"], ["sum"], name="residual"),
        helper.make_node("GlobalAveragePool", ["sum"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["y"], name="classifier", transB=1),
    ]
    save_model(tmp_path / "residual.onnx", nodes, [1, 3, 16, 16], [1, 4], weights)
    path = tmp_path / "residual-qop.onnx"
    ort_quantized(tmp_path / "residual.onnx", path, "QOperator", "x", (1, 3, 16, 16))
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm", "MaxPool"} <= ops, ops
    model, variant, executable, int8_ops = built_int8(path, tmp_path)
    assert model.prequantized["layers"] == 3
    assert [r.layer.kind for r in variant.layers] == ["conv2d", "conv2d", "matmul"]
    assert int8_ops > 0
    vs_ort = against_onnxruntime(path, model, executable)
    assert vs_ort["cosine"] > 0.999, vs_ort
