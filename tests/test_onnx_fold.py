"""Shape arithmetic and constant branches folded before TVM's import (webapp/pipeline/stages/onnx_fold.py),
and inputs given a value: on small graphs of the forms production exporters write."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from onnx import TensorProto, external_data_helper, helper, numpy_helper
from tvm import relax

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.bench import make_inputs
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.onnx_fold import branch_inputs, fold_onnx


def const(name: str, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def save(path, nodes, inputs, outputs, inits, opset=13, **save_options):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.save(model, path, **save_options)


def paddle_flatten(path, width: int = 4, **save_options) -> None:
    """Paddle2ONNX's flatten before a classifier's matmul: the batch size read with Shape, cast to
    int32 and back, sliced and concatenated with -1 into Reshape's target. TVM's importer refuses
    it: "Reshape requires the input new shape to be Shape ... relax.TensorType"."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]),
        helper.make_node("Shape", ["p"], ["s0"]),
        helper.make_node("Cast", ["s0"], ["s1"], to=TensorProto.INT32),
        helper.make_node("Cast", ["s1"], ["s"], to=TensorProto.INT64),
        helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["p", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"], name="classifier"),
    ]
    inits = [const("zero", [0]), const("one", [1]), const("minus1", [-1])]
    inits.append(const("w", np.random.default_rng(0).normal(size=(8, width)), np.float32))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])
    save(path, nodes, [x], [y], inits, **save_options)


def run_both(path, shapes=None, values=None) -> tuple[list, list, object]:
    model = import_model(path, shapes, values)
    feeds = make_inputs(model.inputs)
    vm = relax.VirtualMachine(tvm.compile(model.mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in model.mod["main"].params])
    ours = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return ours, session.run(None, feeds), model


def test_shape_arithmetic_tvm_refuses_is_folded_and_computes_what_onnx_runtime_does(tmp_path):
    paddle_flatten(tmp_path / "m.onnx")
    ours, reference, model = run_both(tmp_path / "m.onnx", {"x": [2, 8, 6, 6]})
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5, atol=1e-5)
    folded = model.folded
    assert folded["tool"].startswith("onnxslim") and folded["nodes_before"] == 8
    assert folded["removed"] == {"Cast": 2, "Concat": 1, "Shape": 1, "Slice": 1}
    assert model.to_json()["folded"] == folded
    assert "classifier" in model.layers.values()  # the layers keep their names


def test_the_fold_neither_reads_nor_copies_the_weights_which_are_read_after_it(tmp_path):
    """A 2 GB model's fold copied its weights several times (13.7 GB) and took a minute: the weights
    (1 MiB and more) are shown to onnxslim as inputs of their shape, and read from their file only
    once the model is folded."""
    path = tmp_path / "m.onnx"
    paddle_flatten(path, 40_000, save_as_external_data=True, location="m.data")
    ours, reference, model = run_both(path, {"x": [2, 8, 6, 6]})
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-4)
    assert model.folded["removed"] == {"Cast": 2, "Concat": 1, "Shape": 1, "Slice": 1}
    # folded with its weight file gone: the weight was never read, and comes back still in its file
    unread = onnx.load(str(path), load_external_data=False)
    (tmp_path / "m.data").unlink()
    weight = next(t for t in unread.graph.initializer if t.name == "w")
    folded, about = fold_onnx(unread, {"x": [2, 8, 6, 6]}, {})
    assert about["removed"] == model.folded["removed"], about
    assert [i.name for i in folded.graph.input] == ["x"]
    kept = next(t for t in folded.graph.initializer if t.name == "w")
    assert external_data_helper.uses_external_data(kept) and kept == weight and list(kept.dims) == [8, 40_000]
    assert {t.name for t in folded.graph.initializer} == {"w", "shape"}  # Reshape's target a constant


def if_on_sample_rate(path) -> None:
    """Silero VAD's form: one input picks the branch (sr == 16000 ? x * 2 : x + 1)."""
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", 1, [1, 4])],
    )
    other = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", 1, [1, 4])],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other),
    ]
    inits = [const("rate", 16000), const("two", 2.0, np.float32), const("one", 1.0, np.float32)]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, []),
    ]
    save(
        path, nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits, opset=16
    )


@pytest.mark.parametrize("rate", [16000, 8000])
def test_an_if_on_a_given_input_is_folded_into_its_branch(tmp_path, rate):
    if_on_sample_rate(tmp_path / "m.onnx")
    ours, reference, model = run_both(tmp_path / "m.onnx", values={"sr": rate})
    np.testing.assert_allclose(ours[0], reference[0])
    x = make_inputs(model.inputs)["x"]
    np.testing.assert_allclose(ours[0], x * 2 if rate == 16000 else x + 1)
    assert model.folded["removed"]["If"] == 1 and model.folded["given"] == ["sr"]
    sr = next(s for s in model.inputs if s.name == "sr")  # still an input: every runtime gets it
    assert sr.values.given == rate and "built with this value" in sr.values.why
    assert not any(isinstance(b.value, relax.If) for b in model.mod["main"].body.blocks[0].bindings)


def test_an_if_on_an_input_without_a_value_imports_as_relax_control_flow(tmp_path):
    if_on_sample_rate(tmp_path / "m.onnx")
    model = import_model(tmp_path / "m.onnx")
    assert "If" not in model.folded["removed"]
    assert "R.If" in model.mod.script() or "if " in model.mod.script()
    assert branch_inputs(onnx.load(tmp_path / "m.onnx")) == ["sr"]
    vm = relax.VirtualMachine(tvm.compile(model.mod, target="llvm"), tvm.cpu())
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for rate, expected in ((16000, x * 2), (8000, x + 1)):
        out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(rate, np.int64)))
        np.testing.assert_allclose(out.numpy(), expected)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nope": 1}, "names \\['nope'\\], which the model does not have"),
        ({"sr": [1, 2]}, "input_values gives 'sr' the shape \\[2\\], but the model declares \\[\\]"),
        ({"sr": "fast"}, "input_values gives 'sr' a value not of its type int64"),
    ],
)
def test_a_given_value_that_does_not_fit_the_input_is_named(tmp_path, values, message):
    if_on_sample_rate(tmp_path / "m.onnx")
    with pytest.raises(StageError, match=message):
        import_model(tmp_path / "m.onnx", input_values=values)
