"""The CPU rewrites before legalization (webapp/pipeline/passes/rewrites.py): fast math, channels last, and
constants folded with numpy, each checked against what it replaces."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from webapp.options import JobOptions
from webapp.pipeline.passes.attention import padded_keys
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.passes.rewrites import channels_last, fold_with_numpy, main_bindings
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.quantize import quantize
from webapp.targets import get

RNG = np.random.default_rng(7)


def save(nodes, inputs: dict, weights: dict, path, out: tuple) -> None:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


def run_both(path, inputs: dict, preset: str = "x86-host") -> tuple[np.ndarray, np.ndarray, dict]:
    target = get(preset)
    optimized = optimize(import_model(path).mod, target, path.parent)
    lowered, labels = schedule(optimized.fused, target)
    vm = relax.VirtualMachine(build(lowered, target, None), tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return ours, session.run(None, inputs)[0], labels


def channels_last_calls(path) -> list:
    """The calls of main after the channels-last rewrite of the model at `path`."""
    with tvm.transform.PassContext(opt_level=3):
        converted = channels_last(import_model(path).mod)
    return [b.value for b in main_bindings(converted) if isinstance(b.value, relax.Call)]


def test_gelu_softmax_and_tanh_take_the_fast_approximations_within_1e5(tmp_path):
    """GELU's erf, softmax's exp and a tanh become TVM's fast approximations (kernels named after
    them), and the result stays within 1e-5 of ONNX Runtime's exact functions."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["s"]),
        helper.make_node("Erf", ["s"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["g0"]),
        helper.make_node("Mul", ["g0", "half"], ["g"]),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("Softmax", ["t"], ["y"], axis=-1),
    ]
    weights = {
        "w": RNG.normal(0, 0.05, (32, 64)),  # no tanh saturated at 1: no ties for the argmax
        "sqrt2": np.array(np.sqrt(2.0)),
        "one": np.array(1.0),
        "half": np.array(0.5),
    }
    save(nodes, {"x": (4, 32)}, weights, tmp_path / "m.onnx", (4, 64))
    inputs = {"x": RNG.normal(0, 2, (4, 32)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    assert any("fast_erf" in k for k in labels) and any("fast_tanh" in k for k in labels), labels
    assert any("fast_softmax" in k for k in labels), labels
    assert np.abs(ours - reference).max() < 1e-5
    assert np.argmax(ours, axis=-1).tolist() == np.argmax(reference, axis=-1).tolist()


def test_convolutions_go_channels_last_with_transposes_only_at_the_edges(tmp_path):
    """conv -> relu -> depthwise conv -> max pool -> 1x1 conv: every convolution in NHWC, one
    transpose in and one out, and the same result as ONNX Runtime."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "dw"], ["d"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("MaxPool", ["d"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2"], ["y"]),
    ]
    weights = {
        "w1": RNG.normal(0, 0.3, (16, 3, 3, 3)),
        "dw": RNG.normal(0, 0.3, (16, 1, 3, 3)),
        "w2": RNG.normal(0, 0.3, (32, 16, 1, 1)),
    }
    save(nodes, {"x": (1, 3, 16, 16)}, weights, tmp_path / "m.onnx", (1, 32, 8, 8))
    calls = channels_last_calls(tmp_path / "m.onnx")
    convs = [c for c in calls if c.op.name == "relax.nn.conv2d"]
    assert len(convs) == 3 and all(c.attrs.data_layout == "NHWC" for c in convs)
    transposes = [c for c in calls if c.op.name == "relax.permute_dims"]
    # the input's and the output's; the others transpose weights (constants, folded at build time)
    assert sum(not isinstance(t.args[0], tvm.ir.Constant) for t in transposes) == 2
    inputs = {"x": RNG.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
    assert "default rule: conv2d NHWC" in labels.values()
    assert "default rule: depthwise conv2d" in labels.values()


def test_a_model_with_grouped_convolutions_stays_nchw_on_the_grouped_rule(tmp_path):
    """A convolution of a few groups (ShuffleNet's) has a register-tiled rule in NCHW only: its model
    is not converted (in NHWC it took the light ShuffleNet from 8 to 56 ms), and runs as ONNX Runtime
    runs it; a depthwise convolution does not keep a model in NCHW (the test above)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "g"], ["y"], group=4),
    ]
    weights = {"w1": RNG.normal(0, 0.3, (32, 3, 3, 3)), "g": RNG.normal(0, 0.3, (32, 8, 1, 1))}
    save(nodes, {"x": (1, 3, 16, 16)}, weights, tmp_path / "m.onnx", (1, 32, 16, 16))
    convs = [c for c in channels_last_calls(tmp_path / "m.onnx") if c.op.name == "relax.nn.conv2d"]
    assert [c.attrs.data_layout for c in convs] == ["NCHW", "NCHW"]
    inputs = {"x": RNG.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
    assert "default rule: grouped conv2d" in labels.values()


def test_a_cnn_with_an_lstm_goes_channels_last(tmp_path):
    """A CRNN text recognizer (ddddocr's: convolutions, then an LSTM over the columns): the LSTM's
    outputs are a stack, on which TVM's ConvertLayout fails (the model stayed in NCHW); the stack is
    rewritten as a concat of expand_dims first, the convolution goes to NHWC, and the result is ONNX
    Runtime's."""
    hidden = 8
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["a", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        helper.make_node("LSTM", ["t", "W", "R", "B"], ["y"], hidden_size=hidden),
    ]
    weights = {
        "w": RNG.normal(0, 0.3, (4, 1, 3, 3)),
        "shape": np.array([1, 32, 10]),
        "W": RNG.normal(0, 0.3, (1, 4 * hidden, 32)),
        "R": RNG.normal(0, 0.3, (1, 4 * hidden, hidden)),
        "B": RNG.normal(0, 0.3, (1, 8 * hidden)),
    }
    save(nodes, {"x": (1, 1, 8, 10)}, weights, tmp_path / "m.onnx", (10, 1, 1, hidden))
    model = onnx.load(tmp_path / "m.onnx")  # the shape is int64, not the float save() makes
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([1, 32, 10], np.int64), "shape"))
    onnx.save(model, tmp_path / "m.onnx")
    calls = channels_last_calls(tmp_path / "m.onnx")
    assert [c.attrs.data_layout for c in calls if c.op.name == "relax.nn.conv2d"] == ["NHWC"]
    inputs = {"x": RNG.normal(0, 1, (1, 1, 8, 10)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)
    assert "default rule: conv2d NHWC" in labels.values(), labels


def test_a_transposed_convolution_between_nhwc_convolutions_runs_as_a_gemm(tmp_path):
    """A text detector's head (PP-OCR's DB: conv, then two stride-2 ConvTranspose up to the input's
    size): TVM legalizes conv2d_transpose only in NCHW, so channels last leaves it there (it was
    carried into NHWC and the build failed: "CodeGenVM cannot emit ... R.nn.conv2d_transpose"); then
    the upsampling rewrite makes each (stride = kernel) a GEMM on the NHWC activations and an
    interleave: no conv2d_transpose kernel is left, and the result is ONNX Runtime's."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "t1"], ["u"], strides=[2, 2]),
        helper.make_node("Relu", ["u"], ["r2"]),
        helper.make_node("Conv", ["r2", "w2"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("ConvTranspose", ["c", "t2"], ["v"], strides=[2, 2], group=1),
        helper.make_node("Sigmoid", ["v"], ["y"]),
    ]
    weights = {
        "w1": RNG.normal(0, 0.3, (8, 3, 3, 3)),
        "t1": RNG.normal(0, 0.3, (8, 4, 2, 2)),
        "w2": RNG.normal(0, 0.3, (8, 4, 3, 3)),
        "t2": RNG.normal(0, 0.3, (8, 1, 2, 2)),
    }
    save(nodes, {"x": (1, 3, 16, 16)}, weights, tmp_path / "m.onnx", (1, 1, 16, 16))
    calls = channels_last_calls(tmp_path / "m.onnx")
    assert [c.attrs.data_layout for c in calls if c.op.name == "relax.nn.conv2d"] == ["NHWC", "NHWC"]
    transposed = [c for c in calls if c.op.name == "relax.nn.conv2d_transpose"]
    assert [c.attrs.data_layout for c in transposed] == ["NCHW", "NCHW"]
    inputs = {"x": RNG.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    assert not [name for name in labels if "conv2d_transpose" in name], labels
    assert sum(label == "default rule: matmul" for label in labels.values()) == 2, labels
    # quantized, its integer convolutions NHWC, the transposed ones (float) still NCHW, and it builds
    samples = [{"x": RNG.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    target = get("x86-host")
    quantized = quantize(import_model(tmp_path / "m.onnx").mod, target, JobOptions(quantize="int8"), samples)
    assert len(quantized.layers) == 2
    lowered, _ = schedule(fuse(quantized.mod, target), target)
    vm = relax.VirtualMachine(build(lowered, target, None), tvm.cpu())
    int8 = vm["main"](tvm.runtime.tensor(inputs["x"])).numpy()
    assert np.abs(int8 - reference).max() < 0.05


def test_one_dimensional_convolutions_run_as_two_dimensional_ones(tmp_path):
    """An audio front end's 1-D convolutions (wav2vec2's: wide kernel and stride, a grouped one with
    dilation and padding): conv2d of height 1, on the conv2d rules (TVM's conv1d kernel took the
    generic row reduction), and the result is ONNX Runtime's."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[10], strides=[5]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3], pads=[2, 2], dilations=[2], group=4),
    ]
    weights = {"w1": RNG.normal(0, 0.3, (16, 1, 10)), "w2": RNG.normal(0, 0.3, (16, 4, 3))}
    save(nodes, {"x": (1, 1, 400)}, weights, tmp_path / "m.onnx", (1, 16, 79))
    inputs = {"x": RNG.normal(0, 1, (1, 1, 400)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
    assert not [name for name in labels if "conv1d" in name], labels
    assert sorted(label.split(":")[1].strip() for label in labels.values() if "conv2d" in label) == [
        "conv2d",
        "grouped conv2d",
    ], labels


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_output_channels_no_multiple_of_4_are_padded_to_whole_vectors(tmp_path, layout):
    """An STFT's 258 output channels (Silero VAD's: 258 = 2 x 129; a grouped conv after it keeps the
    model NCHW) and a detection head's 18 (channels last): the weights padded with zero filters, the
    output sliced back, both convolutions on the conv2d rules (they fell to a scalar windowed rule, or
    none), and the result is ONNX Runtime's."""
    if layout == "NCHW":
        nodes = [
            helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[256], strides=[128]),
            helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[3], pads=[1, 1], group=2),
        ]
        weights = {"w1": RNG.normal(0, 0.1, (258, 1, 256)), "w2": RNG.normal(0, 0.1, (16, 129, 3))}
        shape, out, expected = (1, 1, 576), (1, 16, 3), ["conv2d", "grouped conv2d"]
    else:
        nodes = [
            helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[1, 1]),
        ]
        weights = {"w1": RNG.normal(0, 0.2, (32, 3, 3, 3)), "w2": RNG.normal(0, 0.2, (18, 32, 1, 1))}
        shape, out, expected = (1, 3, 20, 20), (1, 18, 20, 20), ["conv2d NHWC", "conv2d NHWC"]
    save(nodes, {"x": shape}, weights, tmp_path / "m.onnx", out)
    inputs = {"x": RNG.normal(0, 1, shape).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
    convs = sorted(label.split(":")[1].strip() for name, label in labels.items() if "conv2d" in name)
    assert convs == expected, labels


@pytest.mark.parametrize("preset", ["x86-host", "x86-avx2"])
def test_attention_over_197_keys_pads_them_to_whole_vectors(tmp_path, preset):
    """ViT's attention (197 keys; torch.export's `where(isnan(p), 0, p)` after the softmax): the scores
    padded with -inf to 208 keys and the values with zero rows, softmax on the padded rows, and the
    result is ONNX Runtime's, with vectors of 16 and of 8 (the padding, fused into the scores' matmul,
    is no part of its register tiles: 8-wide tiles left the last 8 keys unwritten)."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["pz"]),
        helper.make_node("MatMul", ["pz", "v"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, (2, 197, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 197, 16))],
        [
            numpy_helper.from_array(RNG.normal(0, 0.5, (2, 16, 197)).astype(np.float32), "kt"),
            numpy_helper.from_array(RNG.normal(0, 1, (2, 197, 16)).astype(np.float32), "v"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "m.onnx"))
    with tvm.transform.PassContext(opt_level=3):
        padded = padded_keys(import_model(tmp_path / "m.onnx").mod)
    calls = [b.value for b in main_bindings(padded) if isinstance(b.value, relax.Call)]
    softmax = [c for c in calls if c.op.name == "relax.nn.softmax"]
    assert [[int(d) for d in c.args[0].ty.shape.values] for c in softmax] == [[2, 197, 208]]
    inputs = {"q": RNG.normal(0, 1, (2, 197, 16)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs, preset)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    padded = [label for name, label in labels.items() if "pad" in name]
    assert padded == ["default rule: batch matmul"], labels


def test_numpy_folding_computes_what_fold_constant_does(tmp_path):
    """A batch norm that follows no convolution (decomposed into arithmetic on its constants) and
    transposed weights: folded with numpy, then FoldConstant, the module is the one FoldConstant
    alone makes, constants and all."""
    nodes = [
        helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    weights = {
        "g": RNG.uniform(0.5, 2, 8),
        "b": RNG.normal(0, 1, 8),
        "m": RNG.normal(0, 1, 8),
        "v": RNG.uniform(0.1, 3, 8),
        "w": RNG.normal(0, 0.3, (16, 8, 3, 3)),
    }
    save(nodes, {"x": (1, 8, 8, 8)}, weights, tmp_path / "m.onnx", (1, 16, 8, 8))
    mod = relax.transform.DecomposeOpsForInference()(import_model(tmp_path / "m.onnx").mod)
    with tvm.transform.PassContext(opt_level=3):
        mod = channels_last(mod)
    folded = fold_with_numpy(mod)
    assert not folded.same_as(mod)
    kept = {b.var for b in main_bindings(mod)}
    assert all(b.var in kept for b in main_bindings(folded))  # every var kept: the fusion map needs them
    tvm.ir.assert_structural_equal(
        relax.transform.FoldConstant()(folded), relax.transform.FoldConstant()(mod)
    )


def test_numpy_folding_takes_modules_with_immediate_operands():
    """A clip's bounds and a scalar operand are immediates (FloatImm, IntImm: tvm.ir.Constant with a
    number for a value, in every int8 model): numpy folding reads them as numbers (it failed on the
    whole module, and FoldConstant built ~2,600 small functions for PP-OCR's direction classifier's
    int8 job), and computes with them what FoldConstant does."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    weight = relax.const(RNG.normal(0, 1, (4, 4)).astype(np.float32))
    with builder.function("main", [x]):
        with builder.dataflow():
            clipped = builder.emit(relax.op.clip(x, 0.0, 6.0))
            scaled = builder.emit(relax.op.multiply(weight, tvm.tirx.FloatImm("float32", 0.5)))
            transposed = builder.emit(relax.op.permute_dims(scaled, [1, 0]))
            out = builder.emit_output(relax.op.matmul(clipped, transposed))
        builder.emit_func_output(out)
    mod = builder.get()
    folded = fold_with_numpy(mod)
    values = [b.value for b in main_bindings(folded) if b.var.same_as(transposed)]
    assert isinstance(values[0], tvm.ir.GenericConst), folded  # the transposed weights: a constant
    tvm.ir.assert_structural_equal(
        relax.transform.FoldConstant()(folded), relax.transform.FoldConstant()(mod)
    )


@pytest.mark.parametrize("preset", ["x86-host", "x86-avx2"])
def test_a_softmax_over_a_row_of_no_multiple_of_16_runs_on_whole_vectors(tmp_path, preset):
    """A text recognizer's softmax over its characters (PP-OCRv6's 18,710: vectors of 2, 2.1 ms of its
    12.6): the row padded with -inf to a multiple of 16, the output sliced back, the row rule on whole
    vectors, and the result ONNX Runtime's."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Softmax", ["h"], ["y"], axis=-1),
    ]
    save(nodes, {"x": (8, 32)}, {"w": RNG.normal(0, 0.3, (32, 100))}, tmp_path / "m.onnx", (8, 100))
    target = get(preset)
    optimized = optimize(import_model(tmp_path / "m.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    (softmax,) = [name for name in labels if "softmax" in name]
    assert labels[softmax] == "default rule: row reduction", labels
    lanes = target.vector_shape()[0]
    assert f"T.vectorized(T.int64({lanes}))" in lowered[softmax].script()  # 100 alone: vectors of 4
    ours, reference, _ = run_both(
        tmp_path / "m.onnx", {"x": RNG.normal(0, 1, (8, 32)).astype(np.float32)}, preset
    )
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


def test_hard_swish_and_a_squeeze_excite_scale_fuse_into_their_convolutions(tmp_path):
    """A MobileNetV3 block as PP-OCR exports it: a hard swish written with Clip (its bounds inputs,
    which the ONNX importer makes a call_tir of topi.maximum / minimum), a squeeze-and-excite scale
    through HardSigmoid (a Relax clip). ConvertLayout has no layout for either: they were transposed
    to NCHW and back, a kernel of their own each. Now the hard swish is in its convolution's kernel,
    the scale's 1x1 conv computes the feature map's product apart from its register tiles (its
    output block at the kernel's root, not inside the conv's loops), and the result is ONNX Runtime's."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "three"], ["a3"]),
        helper.make_node("Clip", ["a3", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["a", "c"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["p"]),
        helper.make_node("Conv", ["p", "w2"], ["s"]),
        helper.make_node("HardSigmoid", ["s"], ["g"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["h", "g"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["y"]),
    ]
    weights = {
        "w1": RNG.normal(0, 0.3, (16, 8, 3, 3)),
        "three": np.array(3.0),
        "zero": np.array(0.0),
        "six": np.array(6.0),
        "w2": RNG.normal(0, 0.3, (16, 16, 1, 1)),
        "w3": RNG.normal(0, 0.3, (8, 16, 1, 1)),
    }
    save(nodes, {"x": (1, 8, 12, 24)}, weights, tmp_path / "m.onnx", (1, 8, 12, 24))
    calls = channels_last_calls(tmp_path / "m.onnx")
    transposes = [c for c in calls if c.op.name == "relax.permute_dims" and len(c.args[0].ty.shape) == 4]
    inputs = {"x": RNG.normal(0, 1, (1, 8, 12, 24)).astype(np.float32)}
    ours, reference, labels = run_both(tmp_path / "m.onnx", inputs)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)
    assert len([t for t in transposes if isinstance(t.args[0], relax.Var)]) == 2, transposes
    swish = [k for k in labels if k.startswith("fused_conv2d_") and "maximum" in k and "minimum" in k]
    assert swish and labels[swish[0]] == "default rule: conv2d NHWC", labels
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "m.onnx").mod, target, tmp_path)
    lowered, _ = schedule(optimized.fused, target)
    scaled = [
        gv for gv, f in lowered.functions_items() if "conv2d1_" in gv.name_hint and "multiply" in gv.name_hint
    ]
    assert scaled, labels
    sch = tvm.s_tir.Schedule(lowered[scaled[0]])
    conv, out = sch.get_sblock("conv2d_nhwc_update"), sch.get_child_blocks(sch.get_sblock("root"))[-1]
    assert not sch.get(sch.get_loops(out)[0]).same_as(sch.get(sch.get_loops(conv)[0])), sch.mod
