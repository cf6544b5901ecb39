"""The ONNX operators the project converts itself (webapp/pipeline/stages/onnx_ops.py): LSTM and GRU in
each direction, layout and option, against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from webapp.pipeline.errors import StageError
from webapp.pipeline.stages.importers import import_model

RNG = np.random.default_rng(3)
SEQ, BATCH, FEATURES, HIDDEN = 5, 2, 6, 4


def recurrent_model(path, op: str, directions: int, states: bool = True, **attrs):
    gates = {"LSTM": 4, "GRU": 3}[op]
    weights = {
        "W": RNG.normal(0, 0.5, (directions, gates * HIDDEN, FEATURES)),
        "R": RNG.normal(0, 0.5, (directions, gates * HIDDEN, HIDDEN)),
        "B": RNG.normal(0, 0.5, (directions, 2 * gates * HIDDEN)),
    }
    x_shape, state_shape = [SEQ, BATCH, FEATURES], [directions, BATCH, HIDDEN]
    inputs = {"x": x_shape} | ({"h0": state_shape} if states else {})
    names = ["x", "W", "R", "B", "", "h0" if states else ""]
    outputs = ["y", "y_h"]
    if op == "LSTM":
        inputs |= {"c0": state_shape} if states else {}
        names += ["c0" if states else ""]
        if attrs.pop("peepholes", False):
            weights["P"] = RNG.normal(0, 0.5, (directions, 3 * HIDDEN))
            names += ["P"]
        outputs += ["y_c"]
    node = helper.make_node(op, names, outputs, hidden_size=HIDDEN, **attrs)
    y_shape = [SEQ, directions, BATCH, HIDDEN]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, state_shape) for n in outputs[1:]],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in weights.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), path)
    return {n: RNG.normal(0, 1, s).astype(np.float32) for n, s in inputs.items()}


def batch_first(path, batch_path) -> None:
    """The same model with layout=1 (batch first), which ONNX Runtime does not run: its inputs and
    outputs batch first, the time-major model the reference."""
    model = onnx.load(path)
    model.graph.node[0].attribute.append(helper.make_attribute("layout", 1))
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        order = [2, 0, 1, 3] if len(dims) == 4 else [1, 0, 2]
        sizes = [dims[i].dim_value for i in order]
        for d, size in zip(dims, sizes, strict=True):
            d.dim_value = size
    onnx.save(model, batch_path)


def tvm_and_onnxruntime(path, feeds: dict, layout: int = 0) -> tuple[list, list]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = session.run(None, feeds)
    if layout:
        batch_first(path, path.with_suffix(".batch.onnx"))
        path = path.with_suffix(".batch.onnx")
        feeds = {n: v.transpose(1, 0, 2) for n, v in feeds.items()}
        reference = [r.transpose(2, 0, 1, 3) if r.ndim == 4 else r.transpose(1, 0, 2) for r in reference]
    mod = import_model(path).mod
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in mod["main"].params])
    return [o.numpy() for o in ([out] if hasattr(out, "numpy") else out)], reference


CASES = [
    ("LSTM", 1, 0, {}),
    ("LSTM", 1, 0, {"direction": "reverse"}),
    ("LSTM", 2, 0, {"direction": "bidirectional"}),
    ("LSTM", 2, 1, {"direction": "bidirectional"}),
    ("LSTM", 1, 0, {"peepholes": True, "clip": 2.0}),
    ("LSTM", 1, 0, {"activations": ["Sigmoid", "Relu", "Tanh"]}),
    ("GRU", 1, 0, {}),
    ("GRU", 2, 0, {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", 1, 1, {"direction": "reverse"}),
]


@pytest.mark.parametrize(("op", "directions", "layout", "attrs"), CASES)
def test_recurrent_layers_compute_what_onnx_runtime_does(tmp_path, op, directions, layout, attrs):
    feeds = recurrent_model(tmp_path / "m.onnx", op, directions, **attrs)
    ours, reference = tvm_and_onnxruntime(tmp_path / "m.onnx", feeds, layout)
    assert len(ours) == len(reference) == (3 if op == "LSTM" else 2)
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_recurrent_layer_without_initial_state_starts_from_zeros(tmp_path):
    feeds = recurrent_model(tmp_path / "m.onnx", "LSTM", 1, states=False)
    ours, reference = tvm_and_onnxruntime(tmp_path / "m.onnx", feeds)
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_an_unsupported_activation_is_named(tmp_path):
    recurrent_model(tmp_path / "m.onnx", "LSTM", 1, activations=["Sigmoid", "Softsign", "Tanh"])
    with pytest.raises(StageError, match="LSTM with the activation Softsign"):
        import_model(tmp_path / "m.onnx")


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
def test_variadic_elementwise_ops_are_chains_of_binary_ops(tmp_path, op):
    """Sum, Max, Min and Mean of three inputs (broadcast, as ONNX allows) import as binary ops that
    fuse with their neighbours, not as a stack reduced in a kernel of its own (ShuffleNet's Sum), and
    compute what ONNX Runtime does."""
    shapes = {"a": [2, 3, 4], "b": [3, 4], "c": [2, 1, 4]}
    graph = helper.make_graph(
        [helper.make_node(op, list(shapes), ["y"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
        tmp_path / "m.onnx",
    )
    feeds = {n: RNG.normal(0, 1, s).astype(np.float32) for n, s in shapes.items()}
    ours, reference = tvm_and_onnxruntime(tmp_path / "m.onnx", feeds)
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-6, atol=1e-6)
    script = import_model(tmp_path / "m.onnx").mod["main"].script()
    assert "R.stack" not in script and ("R.add" in script or op != "Sum"), script


def test_a_recurrent_layers_steps_run_on_the_matmul_rule(tmp_path):
    """Each step's recurrent matmul, whose epilogue adds the step's slice of the input projection, is
    on the matmul rule (it fell to the row-reduction rule: ddddocr's recognizer took 185 ms, ONNX
    Runtime 26), and the input projection is one matmul of every step's rows; the layer built with the
    project's rules computes what ONNX Runtime does."""
    from webapp.pipeline.stages.build import build, schedule
    from webapp.pipeline.stages.optimize import optimize
    from webapp.targets import get

    feeds = recurrent_model(tmp_path / "m.onnx", "LSTM", 2, direction="bidirectional")
    target = get("x86-host")
    model = import_model(tmp_path / "m.onnx")
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    matmuls = {k: v for k, v in labels.items() if "matmul" in k}
    assert matmuls and all(v == "default rule: matmul" for v in matmuls.values()), matmuls
    vm = relax.VirtualMachine(build(lowered, target, None), tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(feeds[p.name]) for p in model.mod["main"].params])
    _, reference = tvm_and_onnxruntime(tmp_path / "m.onnx", feeds)
    for a, b in zip([o.numpy() for o in ours], reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
