"""The default schedule rules (webapp/pipeline/rules/): every example model computes what TVM's
naive build computes, on the x86 targets (AVX-512 here, AVX2, SSE2), with its heavy kernels scheduled by
a rule; an arm64 build compiles with NEON code."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import helper

from tests.conftest import CLASSIC, run_here_or_skip
from tests.test_rewrites import RNG, run_both, save
from webapp.pipeline.stages import bench
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.quantize.scales import fit_pairs, quantize_weights
from webapp.targets import get

HEAVY = re.compile(r"conv2d|matmul")


def scheduled_and_naive(example_path, target, tmp_path):
    model = import_model(example_path)
    optimized = optimize(model.mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    naive, naive_labels = schedule(optimized.fused, target, default_rules=False)
    assert set(naive_labels.values()) == {"naive"}
    inputs = bench.make_inputs(model.inputs)
    outputs = [
        bench.flatten_outputs(bench.tvm_runner(build(m, target, None), inputs)()) for m in (lowered, naive)
    ]
    return labels, outputs


def lanes_of(target) -> int:
    """float32 lanes of the target's vectors, as the target describes them."""
    return target.vector_shape()[0]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["x86-host", "x86-avx2", "x86-generic"])
@pytest.mark.parametrize("name", CLASSIC)
def test_default_rules_compute_what_the_naive_build_computes(config, tmp_path, name, preset):
    from webapp.jobs.worker import ensure_example_files

    pt2_path, _ = ensure_example_files(config, name)
    labels, (scheduled, naive) = scheduled_and_naive(pt2_path, get(preset), tmp_path)
    for ours, reference in zip(scheduled, naive, strict=True):
        scale = float(np.abs(reference).max()) or 1.0
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5 * scale)
    heavy = {k: v for k, v in labels.items() if HEAVY.search(k)}
    assert heavy and all(v.startswith("default rule") for v in heavy.values()), heavy
    assert not any(v.startswith("naive") for v in labels.values()), labels


def test_arm64_cross_build_compiles_with_neon(example_files, tmp_path):
    target = get("rpi5")  # Cortex-A76
    model = import_model(example_files / "cnn-small.onnx")
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    assert any(v == "default rule: conv2d NHWC" for v in labels.values())
    executable = build(lowered, target, None)
    asm = executable.mod.imports[0].inspect_source("s")
    assert re.search(r"\bfmla\s+v\d+\.4s", asm)  # NEON 4-lane float FMA in the conv kernels


def test_small_kernels_run_on_one_thread_and_large_ones_in_parallel(example_files, tmp_path):
    """Kernels under SERIAL_FLOPS operations and SERIAL_ELEMENTS outputs get no parallel loop (waking
    threads costs more than they save); cnn-small's convolutions (0.9-2.4 MFLOP) keep theirs."""
    from webapp.pipeline.rules.common import small

    target = get("x86-host")
    for name, parallel_kernels in (("mlp", set()), ("cnn-small", {"conv2d", "conv2d1", "conv2d2"})):
        model = import_model(example_files / f"{name}.onnx")
        lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
        found = set()
        for gv, func in lowered.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint in labels:
                assert labels[gv.name_hint].startswith("default rule"), (gv.name_hint, labels[gv.name_hint])
                if "T.parallel" in func.script():
                    found.add(re.match(r"fused_(conv2d\d*)", gv.name_hint)[1])
                else:
                    assert small(tvm.s_tir.Schedule(func)) or "conv2d" not in gv.name_hint
        assert found == parallel_kernels, name


@pytest.mark.parametrize("preset", ["x86-avx512", "x86-avx2"])
@pytest.mark.parametrize("stride", [1, 2])
def test_nhwc_depthwise_conv_reads_its_input_in_place_and_matches_onnxruntime(tmp_path, stride, preset):
    """A 3x3 depthwise conv in NHWC (MobileNet's, stride 1 and 2): the windowed rule reads the input
    where it lies in whole vectors of channels, zero outside the border (no padded copy), and
    computes what ONNX Runtime does, the border included."""
    import onnx
    from onnx import TensorProto, helper

    channels, size = 64, 14
    weight = np.random.default_rng(0).standard_normal((channels, 1, 3, 3)).astype("float32")
    out = size // stride
    graph = helper.make_graph(
        [
            helper.make_node(
                "Conv", ["x", "w"], ["y"], group=channels, pads=[1, 1, 1, 1], strides=[stride] * 2
            ),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, channels, out, out])],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.flatten())],
    )
    path = tmp_path / "dw.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    target = get(preset)
    model = import_model(path)
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    conv = next(name for name in labels if "conv2d" in name)
    assert labels[conv] == "default rule: depthwise conv2d"
    code = lowered[conv].script()
    assert "pad_temp" not in code
    update = code[code.index('T.sblock("group_conv2d_nhwc_update")') :]
    step = "" if stride == 1 else rf" \* T.int64\({stride}\)"
    assert re.search(rf"\+ T.if_then_else\(.*, \w+\[v_nn, v_yy{step} \+ v_ry - T.int64\(1\)", update)
    lanes = lanes_of(target)  # whole vectors of channels: 16 with AVX-512, 8 with AVX2
    assert re.search(
        rf"for \w+ in T.vectorized\(T.int64\({lanes}\)\):\s+with T.sblock\(\"group_conv2d_nhwc_update", code
    )
    run_here_or_skip(preset)
    inputs = bench.make_inputs(model.inputs)
    ours = bench.flatten_outputs(bench.tvm_runner(build(lowered, target, None), inputs)())[0]
    reference = bench.onnxruntime_runner(path, inputs, 1)()[0]
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["rpi4", "rpi5"])
@pytest.mark.parametrize("name", CLASSIC)
def test_every_example_cross_builds_for_the_raspberry_pis_on_the_default_rules(
    config, tmp_path, name, preset
):
    """Built, not run (tests/test_devices.py runs them on the emulated boards): NEON code from a rule."""
    from webapp.jobs.worker import ensure_example_files

    target = get(preset)
    model = import_model(ensure_example_files(config, name)[0])
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    heavy = {k: v for k, v in labels.items() if HEAVY.search(k)}
    assert heavy and all(v.startswith("default rule") for v in heavy.values()), heavy
    assert not any(v.startswith("naive") for v in labels.values()), labels
    asm = build(lowered, target, None).mod.imports[0].inspect_source("s")
    assert re.search(r"\bfmla\s+v\d+\.4s", asm)  # NEON 4-lane float FMA


def test_grouped_conv2d_has_its_rule_and_matches_the_naive_build(tmp_path):
    import torch

    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(32, 64, 3, padding=1, groups=2)

        def forward(self, x):
            return torch.relu(self.conv(x))

    torch.manual_seed(0)
    ep = torch.export.export(Grouped().eval(), (torch.randn(1, 32, 20, 20),))
    torch.export.save(ep, tmp_path / "grouped.pt2")
    labels, (scheduled, naive) = scheduled_and_naive(tmp_path / "grouped.pt2", get("x86-host"), tmp_path)
    assert "default rule: grouped conv2d" in labels.values(), labels
    np.testing.assert_allclose(scheduled[0], naive[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("preset", ["x86-avx512", "x86-avx2"])
def test_an_image_input_transposes_to_channels_last_in_vectors_of_columns(tmp_path, preset):
    """NCHW to NHWC with 3 channels (an image model's input, before its first conv): the transpose
    reads whole vectors of columns and writes them with a stride, the 3 channels unrolled, instead of
    gathering lane by lane; it computes what the naive build does."""
    import torch

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))

    torch.manual_seed(0)
    ep = torch.export.export(Stem().eval(), (torch.randn(1, 3, 24, 32),))
    torch.export.save(ep, tmp_path / "stem.pt2")
    target = get(preset)
    model = import_model(tmp_path / "stem.pt2")
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    transpose = next(name for name in labels if "transpose" in name)
    code = lowered[transpose].script()
    lanes = lanes_of(target)
    assert re.search(rf"T.unroll\(T.int64\(3\)\):\s+for \w+ in T.vectorized\(T.int64\({lanes}\)\)", code), (
        code
    )
    run_here_or_skip(preset)
    labels, (scheduled, naive) = scheduled_and_naive(tmp_path / "stem.pt2", target, tmp_path)
    np.testing.assert_allclose(scheduled[0], naive[0], rtol=1e-5, atol=1e-5)


def test_register_tiles_are_on_the_stack_not_in_the_workspace_pool(example_files, tmp_path):
    """The rules keep their accumulators in "local" buffers, which TVM's default lowering takes from
    the runtime's workspace pool at every tile: a call in the body of each parallel loop. The
    playground's build (webapp.pipeline.passes.lowering) puts them on the stack, so no parallel loop and no
    kernel without a large buffer calls the pool, and both builds compute the same, bit for bit."""
    target = get("x86-host")
    model = import_model(example_files / "cnn-small.onnx")
    lowered, _ = schedule(optimize(model.mod, target, tmp_path).fused, target)
    ours = build(lowered, target, None)
    default = tvm.compile(lowered, target=target.tvm, relax_pipeline=None)

    def pool_users(executable) -> set[str]:
        code = executable.mod.imports[0].inspect_source("ll")
        functions = re.split(r"\n(?=define )", code)[1:]
        calls = [f for f in functions if "@__TVMBackendAllocWorkspace" in f]
        return {re.match(r'define [^@]*@"?([\w.]+)', f)[1] for f in calls}

    assert {"fused_matmul_add3_compute_", "mean_compute_"} <= pool_users(default)
    assert any("parallel_lambda" in name for name in pool_users(default))
    # what is left: each conv's padded input, one allocation of 14-74 KB a call, outside its loops
    assert pool_users(ours) == {f"fused_conv2d{i}_add{i}_relu{i}_compute_" for i in ("", "1", "2")}
    inputs = bench.make_inputs(model.inputs)
    outputs = [bench.flatten_outputs(bench.tvm_runner(exe, inputs)()) for exe in (ours, default)]
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])


def built_and_run(func, target, arrays: list[np.ndarray], out_shape, out_dtype) -> np.ndarray:
    """One scheduled PrimFunc built for `target` and run on `arrays`; its output."""
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target.tvm)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype), dev)
    lib.mod["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("preset", ["x86-avx512", "x86-avx2"])
def test_layer_norm_rms_norm_and_softmax_run_a_row_at_a_time_in_vectors(tmp_path, preset):
    """Layer norm, RMSNorm and softmax (a transformer's row reductions) are scheduled by the project's
    row rule, not dlight's: their elementwise work inlined (no row-sized buffer between blocks), each
    reduction summing a vector of partial results; they compute what the naive build does."""
    import torch

    class Norms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(64)
            self.rms = torch.nn.RMSNorm(64, eps=1e-6)

        def forward(self, x):
            h = self.rms(self.ln(x) * 3.0)
            return torch.softmax(h @ h.transpose(1, 2), dim=-1)

    torch.manual_seed(0)
    ep = torch.export.export(Norms().eval(), (torch.randn(1, 32, 64),))
    torch.export.save(ep, tmp_path / "norms.pt2")
    target = get(preset)
    model = import_model(tmp_path / "norms.pt2")
    lowered, labels = schedule(optimize(model.mod, target, tmp_path).fused, target)
    rows = [name for name, label in labels.items() if label == "default rule: row reduction"]
    assert not [label for label in labels.values() if "dlight" in label or "naive" in label], labels
    # layer norm, RMSNorm (its mean of squares) and softmax: at least one kernel each
    assert {"layer_norm", "mean", "softmax"} <= {
        p for name in rows for p in re.findall(r"layer_norm|mean|softmax", name)
    }, labels
    for name in rows:
        code = lowered[name].script()
        assert re.search(r'T.vectorized\(T.int64\(\d+\)\):\s+with T.sblock\("\w+_rf_update"\)', code), code
        sizes = [
            int(np.prod([int(d) for d in re.findall(r"int64\((\d+)\)", shape)]))
            for shape in re.findall(r"T.sblock_alloc_buffer\(\(([^)]*)\)", code)
        ]
        assert all(size <= 16 * 32 for size in sizes), code  # per-row results only, no row-sized copies
    run_here_or_skip(preset)
    labels, (scheduled, naive) = scheduled_and_naive(tmp_path / "norms.pt2", target, tmp_path)
    np.testing.assert_allclose(scheduled[0], naive[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", ["x86-avx512", "x86-avx2"])
def test_attention_heads_transpose_in_vectors_along_the_input(preset):
    """ViT's keys split into heads and transposed, (1, 197, 768) to (1, 12, 64, 197): 197 tokens have
    no vector width, so the vectors run along the heads' 64 channels, where the input is contiguous
    (the reshape-transpose chain's nested index simplified), not lane by lane over a fused index."""
    from tvm import s_tir, te, topi

    from webapp.pipeline.rules.elementwise import elementwise

    q = te.placeholder((1, 197, 768), name="q")
    heads = topi.transpose(topi.reshape(q, (1, 197, 12, 64)), (0, 2, 1, 3))
    keys = topi.reshape(topi.transpose(topi.reshape(heads, (12, 197, 64)), (0, 2, 1)), (1, 12, 64, 197))
    target = get(preset)
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([q, topi.multiply(keys, 0.125)])}))
    assert elementwise(sch, target) == "default rule: elementwise"
    code = sch.mod["main"].script()
    lanes = lanes_of(target)
    assert re.search(rf"in range\(197\):\s+for \w+ in T.vectorized\({lanes}\)", code), code
    run_here_or_skip(preset)
    x = np.random.default_rng(0).standard_normal((1, 197, 768)).astype("float32")
    out = built_and_run(sch.mod["main"], target, [x], (1, 12, 64, 197), "float32")
    np.testing.assert_array_equal(out, x.reshape(1, 197, 12, 64).transpose(0, 2, 3, 1) * np.float32(0.125))


def extreme_int8_weights(target, shape: tuple, rng) -> np.ndarray:
    """The quantizer's int8 weights for `target`, reduced along axis -2 ([K, N], HWIO), output channels
    last: 8 bits, each pair along the reduction within the target's limit; the first output channels
    at the extremes: 127 + 1, -127 - 1, 64 + 64, -64 - 64 (VNNI, no limit: -128 + -128, 127 + 127)."""
    exact = rng.uniform(-127, 127, shape)
    limit = target.int8_pair_limit()
    b = quantize_weights(exact, np.ones(1), 8)
    b = fit_pairs(b, exact, limit, len(shape) - 2) if limit else b
    extremes = [(127, 1), (-127, -1), (64, 64), (-64, -64)] if limit else [(-128, -128), (127, 127)]
    for channel, pair in enumerate(extremes):
        b[..., channel] = np.tile(pair, shape[-2] // 2)
    return b


X86_INT8_FORMS = ["x86-avx512-vnni", "x86-avxvnni", "x86-avx512", "x86-avx2"]


@pytest.mark.parametrize("preset", X86_INT8_FORMS)
@pytest.mark.parametrize("transposed", [False, True])
def test_int8_matmul_pads_odd_shapes_and_reads_weights_either_way_round(transposed, preset):
    """The int8 matmul rule takes what an LM head is: a vocabulary that no vector divides (50 words
    here, GPT-2's 50,257), rows that no register tile divides (7), the weight stored [N, K] (a tied
    embedding) or [K, N]; on each x86 form (VNNI's vpdpbusd; AVX-512BW's and AVX2's vpmaddubsw and
    vpmaddwd, with the pairs of weights the quantizer leaves within their int16 sums' range) it is
    bit-exact against numpy, the extremes included (255 x every pair's sum at its largest)."""
    from tvm import s_tir, te

    from webapp.pipeline.rules.int8 import matmul_int8

    m, k, n = 7, 64, 50
    a = te.placeholder((1, m, k), "uint8", name="a")
    w = te.placeholder((n, k) if transposed else (k, n), "int8", name="w")
    r = te.reduce_axis((0, k), name="r")
    weight = (lambda j, kk: w[j, kk]) if transposed else (lambda j, kk: w[kk, j])  # noqa: E731
    out = te.compute(
        (1, m, n),
        lambda b, i, j: te.sum(a[b, i, r].astype("int32") * weight(j, r).astype("int32"), axis=r),
        name="matmul",
    )
    target = get(preset)
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, w, out])}))
    assert matmul_int8(sch, target) == f"default rule: int8 matmul ({target.dot_instruction()})"
    run_here_or_skip(preset)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, m, k), dtype=np.uint8)
    x[0, 0] = 255
    b = extreme_int8_weights(target, (k, n), rng)
    y = np.ascontiguousarray(b.T) if transposed else b
    got = built_and_run(sch.mod["main"], target, [x, y], (1, m, n), "int32")
    np.testing.assert_array_equal(got, (x.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


@pytest.mark.parametrize("preset", X86_INT8_FORMS)
def test_int8_conv_on_each_x86_form_multiplies_with_its_instruction_bit_exact(preset):
    """An 8-bit NHWC conv (uint8 activations x int8 HWIO weights) on each x86 form of the int8 rule:
    AVX-512 VNNI's vpdpbusd on zmm, AVX-VNNI's {vex} vpdpbusd on ymm (Alder Lake), vpmaddubsw +
    vpmaddwd on zmm (AVX-512BW) and on ymm (AVX2); the rule's label names the form, the assembly has its
    instruction, and the output is numpy's, at the extremes of the weights the quantizer gives that
    target (every activation 255 in one corner; pairs of weights summing to +-128 without VNNI)."""
    from tvm import s_tir, te, topi

    from webapp.pipeline.rules.int8 import conv2d_nhwc_int8

    d = te.placeholder((1, 9, 9, 32), "uint8", name="d")
    w = te.placeholder((3, 3, 32, 32), "int8", name="w")
    out = topi.nn.conv2d_nhwc(d, w, 1, 0, 1, out_dtype="int32")
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([d, w, out])}))
    target = get(preset)
    assert conv2d_nhwc_int8(sch, target) == f"default rule: int8 conv2d NHWC ({target.dot_instruction()})"
    lib = tvm.compile(sch.mod, target=target.tvm)
    asm = lib.mod.inspect_source("asm")
    wide = preset in ("x86-avx512-vnni", "x86-avx512")
    assert asm.count(target.int8_mnemonic()) >= 16 and ("zmm" in asm) == wide
    assert bool(re.search(r"\{vex\}\s+vpdpbusd", asm)) == (preset == "x86-avxvnni")
    run_here_or_skip(preset)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 9, 9, 32), dtype=np.uint8)
    x[0, :3, :3] = 255
    b = extreme_int8_weights(target, (3, 3, 32, 32), rng)
    got = built_and_run(sch.mod["main"], target, [x, b], (1, 7, 7, 32), "int32")
    windows = np.lib.stride_tricks.sliding_window_view(x[0].astype(np.int64), (3, 3), axis=(0, 1))
    expected = np.einsum("hwcij,ijco->hwo", windows, b.astype(np.int64))
    np.testing.assert_array_equal(got[0], expected)


def test_a_single_tokens_layer_norm_is_one_row_on_the_row_rule():
    """A decoded token's layer norm, (1, 1, 768): one row, no row axis to run in parallel; on the row
    rule (dlight's took 1.1 ms a call on it), in vectors, computing numpy's layer norm."""
    from tvm import s_tir, te, topi

    from webapp.pipeline.rules.reductions import rows

    x, g, b = te.placeholder((1, 1, 768)), te.placeholder((768,)), te.placeholder((768,))
    target = get("x86-host")
    func = te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[-1], epsilon=1e-5)])
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    assert rows(sch, target) == "default rule: row reduction"
    assert "_rf_update" in sch.mod["main"].script()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype("float32") for s in ((1, 1, 768), (768,), (768,))]
    out = built_and_run(sch.mod["main"], target, arrays, (1, 1, 768), "float32")
    a = arrays[0]
    expected = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * arrays[
        1
    ] + arrays[2]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_a_convolution_along_rows_tiles_rows_in_registers(tmp_path):
    """A 1-D convolution over a (length, 1) image (Keras exports: Magika's) in NHWC: its register tile
    is rows x channel vectors, not one column (each weight vector loaded for one FMA: Magika's
    conv at 122 GFLOP/s, 5.5 of its 7.0 ms)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[5, 1])]
    weights = {"w": RNG.normal(0, 0.2, (64, 64, 5, 1))}
    save(nodes, {"x": (1, 64, 100, 1)}, weights, tmp_path / "m.onnx", (1, 64, 96, 1))
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "m.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    assert labels["conv2d"] == "default rule: conv2d NHWC", labels
    unrolled = [int(n) for n in re.findall(r"T\.unroll\(T\.int64\((\d+)\)\)", lowered["conv2d"].script())]
    # rows x vectors: 4 x 4 accumulators in AVX-512's 32 registers, 2 x 4 in AVX2's 16
    assert unrolled[0] > 1 and unrolled[0] * unrolled[1] >= 8, unrolled
    ours, reference, _ = run_both(
        tmp_path / "m.onnx", {"x": RNG.normal(0, 1, (1, 64, 100, 1)).astype(np.float32)}
    )
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)


def test_a_reduction_over_a_sequence_computes_its_elementwise_inputs_as_it_reads_them(tmp_path):
    """A max over a sequence of elementwise work through transposes (Magika's GELU, then a max over
    508 positions, 0.96 ms): the elementwise blocks inlined into the reduction (nothing the size of the
    input kept), its one row of outputs in vectors across threads, and the result ONNX Runtime's."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Tanh", ["t"], ["h"]),
        helper.make_node("Transpose", ["h"], ["u"], perm=[0, 2, 1]),
        helper.make_node("Mul", ["a", "u"], ["m"]),
        helper.make_node("ReduceMax", ["m"], ["y"], axes=[1], keepdims=0),
    ]
    save(nodes, {"x": (1, 200, 64)}, {"b": RNG.normal(0, 1, (64,))}, tmp_path / "m.onnx", (1, 64))
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "m.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    (name,) = labels
    assert labels[name] == "default rule: reduction", labels
    code = lowered[name].script()
    assert code.count("alloc_buffer") == 1, code  # the accumulators only
    lanes = target.vector_shape()[0]  # float32 lanes: 16 with AVX-512, 8 with AVX2
    assert f"T.parallel(T.int64({64 // lanes}))" in code, code  # 64 outputs: that many vectors, in parallel
    ours, reference, _ = run_both(
        tmp_path / "m.onnx", {"x": RNG.normal(0, 1, (1, 200, 64)).astype(np.float32)}
    )
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


def test_a_softmax_over_an_axis_not_the_last_reduces_a_vector_of_columns_at_a_time(tmp_path):
    """YOLOv8's box distribution (a softmax over 16 bins on axis 1 of 1 x 16 x 4 x anchors, then an
    epilogue): the reductions keep a vector of neighbouring columns each, the 16 bins a loop around
    it, each reduction computed once per vector (dlight's rule recomputed them for every bin: NudeNet's
    took 1.66 ms a call); the result ONNX Runtime's."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=1),
        helper.make_node("Mul", ["s", "k"], ["y"]),
    ]
    shape = (1, 16, 4, 300)
    save(nodes, {"x": shape}, {"k": np.array([3.0])}, tmp_path / "m.onnx", shape)
    target = get("x86-host")
    optimized = optimize(import_model(tmp_path / "m.onnx").mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    (name,) = [name for name in labels if "softmax" in name]
    assert labels[name] == "default rule: column reduction", labels
    code = lowered[name].script()
    # each reduction: the 16 bins around a vector of columns, once per parallel iteration
    updates = re.findall(
        r"for \w+ in range\(T.int64\(16\)\):\s+for \w+ in T.vectorized\(T.int64\((\d+)\)\):"
        r'\s+with T.sblock\("\w+_update"\)',
        code,
    )
    assert len(updates) == 2 and all(int(w) >= 4 for w in updates), code
    ours, reference, _ = run_both(tmp_path / "m.onnx", {"x": RNG.normal(0, 3, shape).astype(np.float32)})
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
