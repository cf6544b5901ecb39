"""The pipeline's stages on small real models: import ONNX and .pt2, build, run, compare to the frameworks."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from tests.conftest import CLASSIC
from webapp.pipeline.errors import StageError
from webapp.pipeline.reports.graphs import relax_graph
from webapp.pipeline.stages import bench, timing
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.inspect import inspect_build
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.profile import profile_kernels, timed_kernels
from webapp.pipeline.stages.quantize.annotate import bindings
from webapp.targets import get

SMALL = ["mlp", "cnn-small", "transformer-block"]


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_imported_model_builds_and_matches_its_framework(example_files, tmp_path, name, fmt):
    model = import_model(example_files / f"{name}.{fmt}")
    target = get("x86-host")
    lowered, _ = schedule(optimize(model.mod, target, tmp_path).fused, target)
    executable = build(lowered, target, tmp_path / "files" / "model.so")
    inputs = bench.make_inputs(model.inputs)
    ours = bench.flatten_outputs(bench.tvm_runner(executable, inputs)())
    if fmt == "onnx":
        reference = bench.flatten_outputs(
            bench.onnxruntime_runner(example_files / f"{name}.onnx", inputs, 1)()
        )
    else:
        reference = bench.torch_outputs(bench.pytorch_runner(example_files / f"{name}.pt2", inputs, 1)())
    assert ours[0].shape == reference[0].shape
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-4)
    assert (tmp_path / "files" / "model.so").stat().st_size > 0


def test_optimize_keeps_ir_after_each_pass_and_fuses(example_files, tmp_path):
    model = import_model(example_files / "cnn-small.onnx")
    optimized = optimize(model.mod, get("x86-host"), tmp_path)
    names = [p.name for p in optimized.passes]
    assert {"LegalizeOps", "FuseOps", "FuseTIR", "StaticPlanBlockMemory"} <= set(names)
    changed = [p for p in optimized.passes if p.changed]
    assert changed and all((tmp_path / p.file).read_text() for p in changed)
    kernels = [n["label"] for n in relax_graph(optimized.fused)["nodes"] if n["kind"] == "kernel"]
    assert any(k.startswith("fused_conv2d") for k in kernels)


def test_inspect_writes_graphs_kernels_and_generated_code(example_files, tmp_path):
    model = import_model(example_files / "cnn-small.onnx")
    target = get("x86-host")
    optimized = optimize(model.mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    executable = build(lowered, target, tmp_path / "files" / "model.so")
    info = inspect_build(model.mod, optimized.fused, lowered, executable, tmp_path, labels, target)
    assert info["graphs"]["fused"]["nodes"] < info["graphs"]["imported"]["nodes"]
    svg = (tmp_path / "files" / "graph-fused.svg").read_text()
    assert "<svg" in svg and "1×32×32×16" in svg  # shapes on the edges (channels last, as built)
    conv = next(k["name"] for k in info["kernels"] if k["name"].startswith("fused_conv2d"))
    assert "T.prim_func" in (tmp_path / "views" / "kernels" / f"{conv}.tir.py").read_text()
    assert "define" in (tmp_path / "views" / "kernels" / f"{conv}.ll").read_text()
    assert conv in (tmp_path / "views" / "kernels" / f"{conv}.s").read_text()
    assert (tmp_path / "files" / "ir.zip").stat().st_size > 0
    kinds = {k["name"]: k["schedule"] for k in info["kernels"]}
    assert kinds[conv] == "default rule: conv2d NHWC"
    assert all(k["calls"] >= 1 for k in info["kernels"] if k["schedule"] != "naive")
    assert 5e6 < info["model_flop"] < 7e6  # cnn-small: 5.67 MFLOP, counted on the scheduled kernels


def test_x86_generic_target_builds_portable_code(example_files, tmp_path):
    target = get("x86-generic")
    assert target.tvm.attrs["mcpu"] == "x86-64"
    model = import_model(example_files / "mlp.onnx")
    executable = build(optimize(model.mod, target, tmp_path).lowered, target, tmp_path / "m.so")
    out = bench.flatten_outputs(bench.tvm_runner(executable, bench.make_inputs(model.inputs))())
    assert out[0].shape == (1, 10)


def test_onnx_weights_listed_as_inputs_are_not_graph_inputs(tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.ones(12, np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[w],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = import_model(path)
    assert [i.name for i in model.inputs] == ["x"]
    assert model.param_count == 12


def test_dynamic_dimension_needs_input_shapes(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(StageError, match=r"'x' has a dynamic dimension .*input_shapes"):
        import_model(path)
    model = import_model(path, {"x": [3, 8]})
    assert model.inputs[0].shape == [3, 8]


def test_fidelity_metrics():
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    same = bench.fidelity([a], [a], classifier=True)
    assert same["max_abs_err"] == 0 and same["cosine"] == pytest.approx(1.0) and same["top1_agree"] == 1.0
    other = bench.fidelity([a], [np.array([[3.0, 2.0, 1.0]], np.float32)], classifier=True)
    assert other["top1_agree"] == 0.0 and other["max_abs_err"] == 2.0
    assert other["sqnr_db"] == pytest.approx(10 * np.log10(14 / 8))
    assert "degenerate" not in same and "degenerate" not in other


def test_fidelity_names_a_constant_or_all_zero_output_instead_of_a_bare_cosine():
    """A model whose output is one value everywhere (weights made constant, a pre-quantized model
    read wrong) had cosine 0.000000 and no SQNR, as if the build were broken."""
    zeros, ones = np.zeros((1, 8), np.float32), np.full((1, 8), 0.125, np.float32)
    row = bench.fidelity([ones], [zeros], classifier=False)
    assert row["cosine"] is None and row["sqnr_db"] is None
    assert row["degenerate"] == "the reference's output is all zeros; TVM's output is 0.125 everywhere"
    same = bench.fidelity([ones], [ones], classifier=False)
    assert same["cosine"] == pytest.approx(1.0) and "0.125 everywhere" in same["degenerate"]


def test_a_row_is_the_median_of_its_fastest_round_and_keeps_every_round():
    """A slow spell (here: the first 0.3 s, calls 3x as long) slows a round and never speeds one: the
    row's median is its fastest round's, its rounds and spread show the spell, min/p90/runs are of all
    its calls."""
    start = time.perf_counter()

    def spell():
        time.sleep(0.006 if time.perf_counter() - start < 0.3 else 0.002)

    spell()
    row = timing.measure_interleaved({"a": spell}, budget_s=1.2, rounds=4)["a"]
    rounds = row["rounds_ms"]
    assert len(rounds) == 4 and rounds[0] > 2.5 * min(rounds[1:])
    assert row["median_ms"] == min(rounds) < 3.0
    assert row["spread"] == round((max(rounds) - min(rounds)) / min(rounds), 4) > 1.0
    assert row["min_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert row["runs"] > 4


def test_pt2_with_a_dynamic_batch_is_bound_to_the_given_shape(tmp_path):
    import torch

    from webapp.pipeline.examples import build_example

    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(build_example("mlp"), (torch.randn(2, 784),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, tmp_path / "dyn.pt2")
    with pytest.raises(StageError, match="dynamic dimension"):
        import_model(tmp_path / "dyn.pt2")
    model = import_model(tmp_path / "dyn.pt2", {"x": [3, 784]})
    assert model.inputs[0].shape == [3, 784] and model.outputs[0].shape == [3, 10]
    target = get("x86-host")
    executable = build(optimize(model.mod, target, tmp_path).lowered, target, tmp_path / "m.so")
    inputs = bench.make_inputs(model.inputs)
    ours = bench.flatten_outputs(bench.tvm_runner(executable, inputs)())
    reference = bench.torch_outputs(bench.pytorch_runner(tmp_path / "dyn.pt2", inputs, 1)())
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
# digits-cnn is trained when its files are first written: no records are shipped for it
@pytest.mark.parametrize("name", [name for name in CLASSIC if name != "digits-cnn"])
def test_shipped_records_compute_what_the_naive_build_computes(config, tmp_path, name):
    """Every kernel the shipped records schedule gives the same outputs as TVM's naive build."""
    from webapp.jobs.tuning_db import RECORDS, SHIPPED_DIR, WORKLOADS, database_key
    from webapp.jobs.worker import ensure_example_files

    shipped = SHIPPED_DIR / database_key("x86-host")
    if not (shipped / RECORDS).is_file():
        pytest.skip(f"no records are shipped for {database_key('x86-host')}")
    (tmp_path / "tuning").mkdir()
    for file in (WORKLOADS, RECORDS):
        (tmp_path / "tuning" / file).write_bytes((shipped / file).read_bytes())
    _, onnx_path = ensure_example_files(config, name)
    model = import_model(onnx_path)
    target = get("x86-host")
    optimized = optimize(model.mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target, tmp_path / "tuning", default_rules=False)
    if "tuned" not in labels.values():
        pytest.skip(f"the shipped records cover no kernel of {name}")
    inputs = bench.make_inputs(model.inputs)
    naive = bench.flatten_outputs(bench.tvm_runner(build(optimized.lowered, target, None), inputs)())
    scheduled = bench.flatten_outputs(bench.tvm_runner(build(lowered, target, None), inputs)())
    np.testing.assert_allclose(scheduled[0], naive[0], rtol=1e-4, atol=1e-4)


def test_every_kernel_of_resnet50_lists_its_source_layers(config, example_files, tmp_path):
    """Each binding of the imported IR knows its ONNX node; FuseOps' shared functions (one per shape
    of block) are followed call by call: every kernel lists layers, every conv is in one kernel, and
    each call of a shared kernel has the layers of its own place in the model."""
    from webapp.jobs.worker import ensure_example_files

    ensure_example_files(config, "resnet50")
    model = import_model(example_files / "resnet50.onnx")
    onnx_nodes = {n.name: n.op_type for n in onnx.load(str(example_files / "resnet50.onnx")).graph.node}
    assert set(model.layers.values()) <= set(onnx_nodes)
    optimized = optimize(model.mod, get("x86-host"), tmp_path, layer_of=model.layers)
    layers = optimized.fusion.layers()
    kernels = [
        gv.name_hint for gv, f in optimized.fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
    ]
    # Every kernel but the transpose of the input to channels last (webapp.pipeline.passes.rewrites), which
    # is no layer of the model's, lists its layers.
    unlisted = [k for k in kernels if not layers.get(k)]
    assert kernels and unlisted == ["transpose"], unlisted
    convs = [name for name, op in onnx_nodes.items() if op == "Conv"]
    assert len(convs) == 53
    for conv in convs:
        # (its bias reshape, computed from constants alone, is a weight of the kernel, not a binding)
        vars_ = [v for v, layer in model.layers.items() if layer == conv and v in optimized.fusion.kernel_of]
        assert vars_ and len({optimized.fusion.kernel_of[v] for v in vars_}) == 1, conv
    # a kernel shared by several blocks: each call site has its own block's layers
    graph = relax_graph(optimized.fused)
    calls = [n for n in graph["nodes"] if n["label"].startswith("fused_conv2d") and n["kind"] == "kernel"]
    by_kernel: dict[str, list[list[str]]] = {}
    for n in calls:
        by_kernel.setdefault(n["label"], []).append(optimized.fusion.site_layers(n["binding"]))
    shared = next(sites for sites in by_kernel.values() if len(sites) > 1)
    assert all(site for site in shared) and len({tuple(site) for site in shared}) == len(shared)


def test_pytorch_layers_are_module_paths_and_survive_batch_norm_folding(example_files, tmp_path):
    model = import_model(example_files / "cnn-small.pt2")
    optimized = optimize(model.mod, get("x86-host"), tmp_path, layer_of=model.layers)
    first = optimized.fusion.layers()["fused_conv2d_add_relu"]
    # the convolution, the batch norm folded into it and the ReLU: one kernel
    assert [layer.split(" ")[0] for layer in first] == ["features.0.0", "features.0.1", "features.0.2"]


@pytest.mark.isa
@pytest.mark.parametrize("name", ["cnn-small", "transformer-block"])
def test_kernel_profile_counts_every_kernel_call_of_a_run(config, example_files, tmp_path, name):
    """The VM's hook sees every call of every compiled kernel: each kernel's calls per run are its call
    sites in the model's main function, and every call the VM makes is counted (the call instructions of
    its main: no branch here), the rest being its own work, measured apart with its kernels skipped; the
    shares are of the kernels' and the VM's work together (they add up to 1). How the parts add up
    against a run timed without the hook is a measurement, printed by benchmarks/kernel_times.py, not
    asserted here."""
    from webapp.jobs.worker import ensure_example_files

    ensure_example_files(config, name)
    model = import_model(example_files / f"{name}.onnx")
    target = get("x86-host")
    lowered, _ = schedule(optimize(model.mod, target, tmp_path).fused, target)
    executable = build(lowered, target, None)
    profile = profile_kernels(executable, bench.make_inputs(model.inputs), runs=3)
    sites: dict[str, int] = {}
    for b in bindings(lowered["main"]):
        callee = b.value.op if isinstance(b.value, relax.Call) else None  # lowered: kernel(args, out)
        if isinstance(callee, tvm.ir.GlobalVar) and isinstance(lowered[callee], tvm.tirx.PrimFunc):
            sites[callee.name_hint] = sites.get(callee.name_hint, 0) + 1
    assert {k: v["calls"] for k, v in profile["kernels"].items()} == sites
    main = executable.as_text().split("@main:")[1].split("\n\n")[0]
    assert profile["calls"] == len(re.findall(r"^\s+call\s", main, re.M))
    assert profile["vm_calls"] == profile["calls"] - sum(sites.values())
    assert profile["vm_ms"] is not None and profile["hook_us"] >= 0
    shares = sum(k["share"] for k in profile["kernels"].values()) + profile["vm_share"]
    assert shares == pytest.approx(1.0)
    assert profile["kernels_ms"] == pytest.approx(sum(k["ms"] for k in profile["kernels"].values()))
    assert all(0 <= k["ms"] <= k["measured_ms"] for k in profile["kernels"].values())


def test_the_kernel_table_counts_calls_as_the_run_made_them():
    """A repacking of an activation (attention's values, a matmul's second operand computed by the
    model), split into a kernel of its own, runs at each call though the fused graph has no call of
    it: the table takes its calls from the profile. A weight's repacking, done at build time, is
    never called."""
    kernels = [
        {"name": "matmul", "calls": 4},
        {"name": "matmul_weight_prepack", "calls": 0},
        {"name": "dense_weight_prepack", "calls": 0},
    ]
    times = {
        "matmul": {"calls": 4, "ms": 3.0, "share": 0.75},
        "matmul_weight_prepack": {"calls": 4, "ms": 1.0, "share": 0.25},
    }
    rows = timed_kernels(kernels, [{"shown": True, "kernels": times, "benchmark_ms": 8.0}])
    # each kernel's own measured ms, not a share of the benchmark's median scaled up to it
    assert [(k["name"], k["calls"], k["ms"]) for k in rows] == [
        ("matmul", 4, 3.0),
        ("matmul_weight_prepack", 4, 1.0),
        ("dense_weight_prepack", 0, None),
    ]


def test_densenet121_convolutions_each_land_in_one_kernel_that_lists_them(tmp_path):
    """DenseNet-121's graph from the onnx package's test data (weights made by ConstantOfShape): its
    batch norms come as tuples taken apart again, which the fusion is followed through; each of the
    121 Conv nodes is in exactly one kernel, and that kernel lists it."""
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_densenet121.onnx"
    model = import_model(path)
    optimized = optimize(model.mod, get("x86-host"), tmp_path, layer_of=model.layers)
    layers, kernel_of = optimized.fusion.layers(), optimized.fusion.kernel_of
    convs = [n.name or n.output[0] for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"]
    assert len(convs) == 121
    for conv in convs:
        kernels = {kernel_of[v] for v, layer in model.layers.items() if layer == conv and v in kernel_of}
        assert len(kernels) == 1, (conv, kernels)
        assert conv in layers[kernels.pop()]
