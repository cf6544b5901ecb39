"""Never worse than TVM: ONNX's own operator tests, and the patterns that decide the default rules.

1. ONNX's backend node tests (their definitions ship in the onnx wheel; onnx's own generator writes
   the models and data here) for the operators of common CNNs and transformers, run through the
   project's import -> optimize -> build and through plain `tvm.compile` with TVM's default
   pipeline: every case plain TVM passes, the project passes too. TVM's ONNX importer wants axes,
   shapes, pads, sizes... as constants, and most cases give them as graph inputs, so each case with
   integer inputs besides its first also runs with those as initializers ("[constant inputs]"); the
   operators whose extra outputs are optional statistics, masks or indices also run with their
   first output only ("[first output]"), as models use them. The counts per operator are printed
   and written to conformance.json in the test's temporary folder.
2. Small models of the patterns the main rules are for, checked against ONNX Runtime, with the rule
   each one must be scheduled by; int8 conv and dense through the quantize stage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tests.conftest import run_here_or_skip
from tests.test_quantize import int8_rule
from webapp.options import JobOptions
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.rules import schedules
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.quantize import quantize
from webapp.targets import get

OPERATORS = {
    # convolution, pooling, normalization, image
    *("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"),
    *("BatchNormalization", "InstanceNormalization", "GroupNormalization", "LayerNormalization"),
    *("RMSNormalization", "Pad", "Resize", "DepthToSpace", "SpaceToDepth"),
    # dense layers and attention arithmetic
    *("Gemm", "MatMul", "Einsum", "MatMulInteger", "Softmax", "LogSoftmax"),
    # elementwise arithmetic and comparisons
    *("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Neg", "Abs", "Floor"),
    *("Ceil", "Round", "Min", "Max", "Sum", "Mean", "Equal", "Less", "Greater", "Where", "Not", "And"),
    *("Or", "Cast", "QuantizeLinear", "DequantizeLinear"),
    # activations
    *("Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh"),
    *("Softplus", "Mish", "Erf", "Gelu", "Clip"),
    # reductions
    *("ReduceMean", "ReduceSum", "ReduceMax", "ArgMax", "TopK", "CumSum"),
    # shapes and indexing
    *("Reshape", "Transpose", "Concat", "Slice", "Split", "SplitToSequence", "Gather", "Flatten"),
    *("Squeeze", "Unsqueeze", "Expand", "Tile", "Shape", "ConstantOfShape", "Range", "Trilu"),
    *("Identity", "Dropout"),
}
FIRST_OUTPUT_ONLY = {"LayerNormalization", "BatchNormalization", "Dropout", "MaxPool"}
RTOL, ATOL = 1e-3, 1e-5


def node_cases() -> list:
    """The selected backend node test cases (not the `_expanded` ones, which test other operators
    through function bodies): a single node of one of OPERATORS, tensor inputs only."""
    import onnx.backend.test.case.node as node_test

    def selected(case) -> bool:
        graph = case.model.graph
        return (
            "_expanded" not in case.name
            and len(graph.node) == 1
            and graph.node[0].op_type in OPERATORS
            and all(v.type.WhichOneof("value") == "tensor_type" for v in graph.input)
            and all(v.type.WhichOneof("value") in ("tensor_type", "sequence_type") for v in graph.output)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the cases' own overflows and divisions by 0
        return [case for case in node_test.collect_testcases() if selected(case)]


def generate(cases: list, out: Path) -> Path:
    """onnx's own generator (onnx.backend.test.cmd_tools) writes the cases' models and data."""
    import onnx.backend.test.case.model as model_test
    from onnx.backend.test import cmd_tools

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the cases' own overflows and divisions by 0
        patch.setattr(model_test, "collect_testcases", lambda: cases)  # the node cases only
        cmd_tools.generate_data(argparse.Namespace(output=str(out)))
    return out / "node"


def read_value(path: Path, value_info) -> list[np.ndarray]:
    """A test data file as arrays: one for a tensor, one per element for a sequence."""
    if value_info.type.WhichOneof("value") == "sequence_type":
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(path.read_bytes())
        return list(numpy_helper.to_list(sequence))
    return [numpy_helper.to_array(onnx.load_tensor(str(path)))]


def variants(case_dir: Path) -> list[tuple[str, onnx.ModelProto, dict, list]]:
    """(name, model, inputs, expected outputs) for a generated case and its variants."""
    model = onnx.load(str(case_dir / "model.onnx"))
    data = case_dir / "test_data_set_0"
    graph = model.graph
    inputs = {v.name: read_value(data / f"input_{i}.pb", v)[0] for i, v in enumerate(graph.input)}
    expected = [read_value(data / f"output_{i}.pb", v) for i, v in enumerate(graph.output)]
    out = [(case_dir.name, model, inputs, [a for arrays in expected for a in arrays])]

    frozen = [v.name for v in graph.input[1:] if inputs[v.name].dtype.kind in "iu"]
    if frozen:
        constant = onnx.ModelProto()
        constant.CopyFrom(model)
        kept = [v for v in constant.graph.input if v.name not in frozen]
        del constant.graph.input[:]
        constant.graph.input.extend(kept)
        constant.graph.initializer.extend(numpy_helper.from_array(inputs[n], n) for n in frozen)
        rest = {k: v for k, v in inputs.items() if k not in frozen}
        out.append((f"{case_dir.name}[constant inputs]", constant, rest, out[0][3]))

    if graph.node[0].op_type in FIRST_OUTPUT_ONLY and len(graph.output) > 1:
        first = onnx.ModelProto()
        first.CopyFrom(model)
        del first.graph.output[1:]
        out.append((f"{case_dir.name}[first output]", first, inputs, expected[0]))
    return out


def flatten(out) -> list[np.ndarray]:
    if isinstance(out, tvm_ffi.Shape):  # the Shape operator's result
        return [np.array(out, dtype="int64")]
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for o in out for a in flatten(o)]


def run(executable, inputs: dict) -> list[np.ndarray]:
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    return flatten(vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs.values()]))


def check(ours: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(ours) == len(expected), f"{len(ours)} outputs, {len(expected)} expected"
    for got, want in zip(ours, expected, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape)
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(got, want)


def plain_tvm(model, inputs: dict, target) -> list[np.ndarray]:
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(
        model,
        shape_dict={k: v.shape for k, v in inputs.items()},
        dtype_dict={k: str(v.dtype) for k, v in inputs.items()},
        keep_params_in_input=False,
    )
    executable = tvm.compile(mod, target=target.tvm, relax_pipeline=relax.get_default_pipeline(target.tvm))
    return run(executable, inputs)


def project(path: Path, inputs: dict, target, rule_failures: dict) -> list[np.ndarray]:
    """The project's import -> optimize -> build; the labels of kernels where a rule failed go to
    `rule_failures`."""
    optimized = optimize(import_model(path).mod, target, path.parent)
    lowered, labels = schedule(optimized.fused, target)
    rule_failures.update({k: v for k, v in labels.items() if "rule failed" in v})
    return run(build(lowered, target, None), inputs)


def outcome(expected: list, path_fn, *args) -> str:
    """ "pass" when path_fn(*args) computes the expected outputs, else the first line of what went
    wrong."""
    try:
        check(path_fn(*args), expected)
    except Exception as e:  # an importer, compiler or runtime error is this case's result
        lines = str(e).strip().splitlines()
        return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"
    return "pass"


@pytest.fixture(scope="module")
def conformance(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("conformance")
    target = get("x86-host")
    started = time.perf_counter()
    results = {}
    for case_dir in sorted(generate(node_cases(), root / "data").iterdir()):
        for name, model, inputs, expected in variants(case_dir):
            work = root / "runs" / name.replace("[", "-").replace("]", "").replace(" ", "-")
            work.mkdir(parents=True)
            onnx.save(model, str(work / "model.onnx"))
            failures: dict = {}
            results[name] = {
                "op": model.graph.node[0].op_type,
                "plain_tvm": outcome(expected, plain_tvm, model, inputs, target),
                "project": outcome(expected, project, work / "model.onnx", inputs, target, failures),
                "rule_failures": failures,
            }
    per_op = defaultdict(lambda: {"cases": 0, "plain_tvm": 0, "project": 0})
    for r in results.values():
        counts = per_op[r["op"]]
        counts["cases"] += 1
        counts["plain_tvm"] += r["plain_tvm"] == "pass"
        counts["project"] += r["project"] == "pass"
    summary = {
        "seconds": round(time.perf_counter() - started, 1),
        "cases": len(results),
        "plain_tvm": sum(c["plain_tvm"] for c in per_op.values()),
        "project": sum(c["project"] for c in per_op.values()),
        "per_operator": dict(sorted(per_op.items())),
        "rule_failures": {name: r["rule_failures"] for name, r in results.items() if r["rule_failures"]},
        "results": results,
    }
    (root / "conformance.json").write_text(json.dumps(summary, indent=1))
    print(
        f"\nONNX node tests: {summary['cases']} cases in {summary['seconds']} s, plain TVM passes "
        f"{summary['plain_tvm']}, the project {summary['project']}; a rule failed on a kernel in "
        f"{len(summary['rule_failures'])} cases ({root / 'conformance.json'})"
    )
    for op, c in summary["per_operator"].items():
        print(f"  {op:24} {c['cases']:4} cases  plain TVM {c['plain_tvm']:4}  project {c['project']:4}")
    return summary


@pytest.mark.slow
def test_project_passes_every_onnx_node_test_that_plain_tvm_passes(conformance):
    worse = {
        name: r["project"]
        for name, r in conformance["results"].items()
        if r["plain_tvm"] == "pass" and r["project"] != "pass"
    }
    assert not worse, json.dumps(worse, indent=1)


@pytest.mark.slow
def test_every_selected_operator_has_a_case_plain_tvm_passes(conformance):
    """Keeps the comparison meaningful: an operator whose every case fails both ways proves nothing.
    TVM fails every ConstantOfShape case (legalizing the reshape after it asserts); the project folds
    it first and passes them."""
    per_op = conformance["per_operator"]
    assert set(per_op) == OPERATORS
    untested = sorted(op for op, c in per_op.items() if c["plain_tvm"] == 0)
    assert untested == ["ConstantOfShape"] and per_op["ConstantOfShape"]["project"] > 0, untested


def builds_plain(model, inputs: dict, target) -> None:
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(
        model,
        shape_dict={k: v.shape for k, v in inputs.items()},
        dtype_dict={k: str(v.dtype) for k, v in inputs.items()},
        keep_params_in_input=False,
    )
    tvm.compile(mod, target=target.tvm, relax_pipeline=relax.get_default_pipeline(target.tvm))


def builds_project(path: Path, target) -> None:
    optimized = optimize(import_model(path).mod, target, path.parent)
    lowered, labels = schedule(optimized.fused, target)
    naive = [k for k, v in labels.items() if v.startswith("naive")]
    assert not naive, f"unscheduled for the GPU: {naive}"
    build(lowered, target, None)


def build_outcome(path_fn, *args) -> str:
    try:
        path_fn(*args)
    except Exception as e:  # an importer or compiler error is this case's result
        lines = str(e).strip().splitlines()
        return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"
    return "pass"


@pytest.mark.slow
def test_every_onnx_node_test_plain_tvm_builds_for_cuda_the_project_builds(tmp_path):
    """Never worse than TVM on a GPU either: every node case TVM's default CUDA pipeline (dlight's
    rules) compiles, the project's GPU rules compile, no kernel left unbound. Compiled only: no GPU
    is needed, and none runs the code here."""
    target = get("cuda-sm90")
    worse, plain_passes = {}, 0
    for case_dir in sorted(generate(node_cases(), tmp_path / "data").iterdir()):
        for name, model, inputs, _ in variants(case_dir):
            work = tmp_path / "runs" / name.replace("[", "-").replace("]", "").replace(" ", "-")
            work.mkdir(parents=True)
            onnx.save(model, str(work / "model.onnx"))
            if build_outcome(builds_plain, model, inputs, target) != "pass":
                continue
            plain_passes += 1
            ours = build_outcome(builds_project, work / "model.onnx", target)
            if ours != "pass":
                worse[name] = ours
    print(
        f"\nONNX node tests for cuda-sm90: plain TVM builds {plain_passes}, the project all but {len(worse)}"
    )
    assert plain_passes > 600 and not worse, json.dumps(worse, indent=1)


# ---------------------------------------------------------------- the patterns the main rules are for

RNG = np.random.default_rng(0)
HEAVY = ("conv2d", "matmul")


def onnx_model(nodes: list, inputs: dict[str, tuple], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A float model whose output is the last node's."""
    graph = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype("float32"), n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)  # the output's shape


def conv(name: str, x: str, out_channels: int, in_channels: int, groups: int = 1, bias: bool = False):
    """A 3x3 conv node (padding 1) and its weights."""
    weights = {f"{name}_w": RNG.normal(0, 0.2, (out_channels, in_channels // groups, 3, 3))}
    if bias:
        weights[f"{name}_b"] = RNG.normal(0, 0.5, (out_channels,))
    node = helper.make_node("Conv", [x, *weights], [name], pads=[1, 1, 1, 1], group=groups)
    return node, weights


def rule_case(kind: str) -> tuple[onnx.ModelProto, dict[str, tuple]]:
    if kind in ("conv2d", "grouped conv2d", "depthwise conv2d"):
        channels, groups = {"conv2d": (8, 1), "grouped conv2d": (32, 2), "depthwise conv2d": (32, 32)}[kind]
        out_channels = channels if kind == "depthwise conv2d" else 32 if groups == 1 else 64
        node, weights = conv("y", "x", out_channels, channels, groups)
        return onnx_model([node], {"x": (1, channels, 14, 14)}, weights), {"x": (1, channels, 14, 14)}
    if kind in ("conv2d + bias + residual + relu", "Winograd conv2d + bias + residual + relu"):
        # 32 channels on 14x14 are enough for Winograd (webapp.pipeline.passes.winograd), 16 on 12x12 are not
        shape = (1, 32, 14, 14) if kind.startswith("Winograd") else (1, 16, 12, 12)
        node, weights = conv("c", "x", shape[1], shape[1], bias=True)
        nodes = [node, helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        return onnx_model(nodes, {"x": shape}, weights), {"x": shape}
    if kind == "conv2d + batch norm + relu":
        node, weights = conv("c", "x", 32, 16)
        stats = {"scale": RNG.uniform(0.5, 2, 32), "shift": RNG.normal(0, 1, 32)}
        stats |= {"mean": RNG.normal(0, 1, 32), "var": RNG.uniform(0.5, 2, 32)}
        norm = helper.make_node("BatchNormalization", ["c", *stats], ["n"])
        nodes = [node, norm, helper.make_node("Relu", ["n"], ["y"])]
        return onnx_model(nodes, {"x": (1, 16, 10, 10)}, weights | stats), {"x": (1, 16, 10, 10)}
    if kind == "dense with bias (Gemm)":
        weights = {"w": RNG.normal(0, 0.2, (32, 64)), "b": RNG.normal(0, 0.5, (32,))}
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
        return onnx_model([node], {"x": (4, 64)}, weights), {"x": (4, 64)}
    if kind == "dense with bias (MatMul + Add)":
        weights = {"w": RNG.normal(0, 0.2, (64, 48)), "b": RNG.normal(0, 0.5, (48,))}
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
        return onnx_model(nodes, {"x": (2, 8, 64)}, weights), {"x": (2, 8, 64)}
    assert kind == "batch matmul"
    shapes = {"a": (2, 4, 8, 16), "b": (2, 4, 16, 32)}
    return onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"])], shapes, {}), shapes


def kernel_names(mod: tvm.IRModule) -> set[str]:
    return {gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


RULE_CASES = {
    "conv2d": "default rule: conv2d NHWC",  # float convolutions are built channels last
    "grouped conv2d": "default rule: grouped conv2d",
    "depthwise conv2d": "default rule: depthwise conv2d",
    "conv2d + bias + residual + relu": "default rule: conv2d NHWC",
    "Winograd conv2d + bias + residual + relu": "default rule: Winograd conv2d",
    "conv2d + batch norm + relu": "default rule: conv2d NHWC",
    "dense with bias (Gemm)": "default rule: matmul",
    "dense with bias (MatMul + Add)": "default rule: matmul",
    "batch matmul": "default rule: batch matmul",
}


@pytest.mark.parametrize("kind", list(RULE_CASES))
def test_main_rule_schedules_its_pattern_and_matches_onnxruntime(tmp_path, kind):
    model, shapes = rule_case(kind)
    onnx.save(model, str(tmp_path / "model.onnx"))
    inputs = {name: RNG.standard_normal(shape).astype("float32") for name, shape in shapes.items()}
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "model.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    ours = run(build(lowered, target, None), inputs)
    np.testing.assert_allclose(ours[0], onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
    main = {name: labels[name] for name in kernel_names(optimized.fused) if any(h in name for h in HEAVY)}
    assert set(main.values()) == {RULE_CASES[kind]}, labels
    if "relu" in kind:  # the epilogue is computed in the kernel, from its registers
        assert all("relu" in name for name in main), main
    if kind.startswith("Winograd"):  # its flops are the direct convolution's: 2 x 3x3 x 32 per output
        from webapp.pipeline.stages.inspect import kernel_flop

        assert [kernel_flop(optimized.fused[name]) for name in main] == [2 * 9 * 32 * (14 * 14 * 32)]
        # the input transform stays a block of its own, computed once: inlined into the 16 GEMMs (as
        # inline_epilogue once did) it is computed again for every output channel, 4x the time
        from webapp.pipeline.passes.winograd import NAMES

        assert all(f'T.sblock("{NAMES[0]}"' in lowered[name].script() for name in main), NAMES


def test_a_rule_that_fails_leaves_the_kernel_to_the_next_rule_and_says_so(tmp_path, monkeypatch):
    def conv2d_nhwc(sch, target):
        raise KeyError("broken")

    broken = tuple(conv2d_nhwc if r.__name__ == "conv2d_nhwc" else r for r in schedules.FAMILIES["cpu"])
    monkeypatch.setitem(schedules.FAMILIES, "cpu", broken)
    model, shapes = rule_case("conv2d + bias + residual + relu")
    onnx.save(model, str(tmp_path / "model.onnx"))
    inputs = {"x": RNG.standard_normal(shapes["x"]).astype("float32")}
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "model.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    ours = run(build(lowered, target, None), inputs)
    np.testing.assert_allclose(ours[0], onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
    (label,) = [label for name, label in labels.items() if "conv2d" in name]
    assert label == "default rule: conv2d (conv2d_nhwc rule failed: KeyError: 'broken')", label


def int8_case(kind: str) -> tuple[onnx.ModelProto, tuple]:
    """Two layers, the first with bias and ReLU, so that the pair stays in 8 bits between them."""
    if kind == "conv2d":
        first, w1 = conv("h", "x", 32, 16, bias=True)
        second, w2 = conv("y", "r", 16, 32)
        nodes = [first, helper.make_node("Relu", ["h"], ["r"]), second]
        return onnx_model(nodes, {"x": (1, 16, 12, 12)}, w1 | w2), (1, 16, 12, 12)
    weights = {"w1": RNG.normal(0, 0.2, (48, 64)), "b1": RNG.normal(0, 0.5, (48,))}
    weights["w2"] = RNG.normal(0, 0.2, (48, 32))
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    return onnx_model(nodes, {"x": (8, 64)}, weights), (8, 64)


def sqnr_db(ours: np.ndarray, reference: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((ours - reference) ** 2)))


@pytest.mark.isa
@pytest.mark.parametrize("preset", ["x86-host", "x86-avx512-vnni", "x86-avx2"])
@pytest.mark.parametrize("kind, layout", [("conv2d", "NHWC"), ("matmul", None)])
def test_int8_rule_runs_the_quantized_model_and_matches_onnxruntime(
    tmp_path, kind, layout, preset, monkeypatch
):
    """Quantized by the quantize stage (8 random calibration inputs), against ONNX Runtime's float
    output: within int8's error, on the target's own int8 rule (its dot-product instruction's where it
    has one: VNNI); run where this CPU can. The same weights and inputs for every preset, whichever
    tests ran before (make test's second pass runs this one without the others)."""
    monkeypatch.setattr(sys.modules[__name__], "RNG", np.random.default_rng(0))
    model, shape = int8_case(kind)
    onnx.save(model, str(tmp_path / "model.onnx"))
    target = get(preset)
    samples = [{"x": RNG.standard_normal(shape).astype("float32")} for _ in range(8)]
    quantized = quantize(
        import_model(tmp_path / "model.onnx").mod, target, JobOptions(quantize="int8"), samples
    )
    assert len(quantized.layers) == 2
    lowered, labels = schedule(fuse(quantized.mod, target), target)
    assert int8_rule(kind, layout, target) in labels.values(), labels
    run_here_or_skip(preset)
    x = {"x": RNG.standard_normal(shape).astype("float32")}
    ours, reference = run(build(lowered, target, None), x)[0], onnxruntime_outputs(model, x)[0]
    assert sqnr_db(ours, reference) > 30, sqnr_db(ours, reference)


# ---------------------------------------------------------------- one kernel name everywhere


@pytest.mark.parametrize("name", ["cnn-small", "transformer-block"])
def test_built_kernels_keep_the_names_of_the_fused_graph(example_files, tmp_path, name):
    """The graph and tuning table (the fused module) and the kernel list and code picker (the built
    module) name a kernel alike, its weights repacked or not; the only other kernels are what is left
    of a repacking that runs at every call (its operand not a constant), named after its kernel."""
    target = get("x86-host")
    optimized = optimize(import_model(example_files / f"{name}.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    fused, built = kernel_names(optimized.fused), kernel_names(lowered)
    repacking = {k for k in built if k.endswith("_weight_prepack")}
    assert built - repacking <= fused, sorted(built - fused)
    assert {k.removesuffix("_weight_prepack") for k in repacking} <= fused
    assert set(labels) == built
