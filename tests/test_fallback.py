"""Never silently slower (webapp.pipeline.stages.fallback): each quantized layer timed against the float
build's, and the layers int8 made slower kept in float when the whole model is then faster. Real
builds for x86-avx2 (the pair-multiply form), timed where this CPU runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import run_here_or_skip
from webapp.catalog import code_file
from webapp.options import JobOptions
from webapp.pipeline.stages import bench, fallback
from webapp.pipeline.stages.build import build_job
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.optimize import optimize
from webapp.pipeline.stages.quantize.variants import quantize_job
from webapp.targets import get

pytestmark = pytest.mark.slow


def inverted_residual(path) -> None:
    """A MobileNetV2 block and a classifier: its depthwise conv is the layer int8 speeds up least
    (no dot product sums within a channel). The TorchScript exporter writes its ReLU6 as a Clip with
    bounds from Constant nodes, which TVM's ONNX importer makes PrimFuncs beside main: quantization
    keeps them (it failed with "no definition of GlobalVar maximum" before quantize.with_main)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 192, 1),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(192, 192, 3, padding=1, groups=192),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(192, 32, 1),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 14 * 14, 10),
    ).eval()
    torch.onnx.export(model, (torch.randn(1, 3, 14, 14),), str(path), dynamo=False, input_names=["x"])


def quantized_build(tmp_path):
    target = get("x86-avx2")
    inverted_residual(tmp_path / "block.onnx")
    model = import_model(tmp_path / "block.onnx")
    optimized = optimize(model.mod, target, tmp_path)
    quantized = quantize_job(model, target, JobOptions(quantize="int8"), tmp_path, None, None, lambda f: None)
    first = quantized.variants[0]
    built = build_job(
        optimized.fused, quantized, target, None, tmp_path, lambda f: None, model.layers, optimized.fusion
    )
    return model, quantized, first, built


def outputs(built, model, variant: str) -> np.ndarray:
    run = bench.tvm_runner(
        built.executables[(variant, False)], bench.make_inputs(model.inputs), get("x86-avx2").device()
    )
    return bench.flatten_outputs(run())[0]


def test_every_quantized_layer_is_timed_against_its_float_kernel_and_the_slower_ones_named(tmp_path):
    run_here_or_skip("x86-avx2")
    model, quantized, first, built = quantized_build(tmp_path)
    speed = quantized.variants[0].layer_speed
    check = speed.get("fallback") or {}
    # the rows of the build kept, and the slower layers' rows as measured (in "layers" too unless kept)
    rows = {row["layer"]: row for row in speed["layers"] + (speed["slower"] if check.get("kept") else [])}
    assert set(rows) == {r.layer.name for r in first.layers}  # all five, as first quantized
    assert speed["timed"] == speed["quantized_layers"] == 5
    assert rows["02 conv2d 192x1x3x3"]["form"] == "depthwise conv2d"
    assert rows["04 matmul 6272x10"]["form"] == "matmul"
    for row in rows.values():
        assert row["fp32_ms"] > 0 and row["quant_ms"] > 0
        assert row["ratio"] == pytest.approx(row["quant_ms"] / row["fp32_ms"])
        assert row["fp32_kernel"] != row["quant_kernel"]
    assert rows["01 conv2d 192x32x1x1"]["quant_schedule"] == "default rule: int8 conv2d NHWC (AVX2)"
    assert all(row["ratio"] > fallback.SLOWER_BY for row in speed["slower"])
    if not check.get("kept"):
        slower = {row["layer"] for row in speed["slower"]}
        assert all(row["ratio"] <= fallback.SLOWER_BY for name, row in rows.items() if name not in slower)
    if check:  # some layer was slower: the build with it in float was timed against this one
        assert check["layers"] == [row["layer"] for row in speed["slower"]]
        assert check["kept"] == (check["mixed_ms"] < check["quant_ms"] * (1 - check["min_gain"]))
    assert "layer_speed" in quantized.to_json()["quantization"]


def two_slower(monkeypatch) -> list[str]:
    """The layers' real times, with the ratio of the depthwise conv and the matmul set above the bar
    and the others' below it (the decision's inputs forced, not its steps): the two layers it names."""
    original = fallback.layer_times

    def forced(layers, float_build, quant_build, profiles):
        rows = original(layers, float_build, quant_build, profiles)
        for row in rows:
            row["ratio"] = 2.0 if row["form"] in ("depthwise conv2d", "matmul") else 0.5
        return rows

    monkeypatch.setattr(fallback, "layer_times", forced)
    return ["02 conv2d 192x1x3x3", "04 matmul 6272x10"]


def integer_layers(tmp_path) -> tuple[list[str], int]:
    """The layers in the saved int8 weights, and the integer layers of the quantized Relax code."""
    saved = np.load(tmp_path / "files" / "weights-int8.npz")
    script = (tmp_path / code_file("relax-quantized")).read_text()
    return sorted(saved.files), script.count('out_dtype="int32"')


def test_layers_kept_in_float_leave_the_int8_weights_and_the_build_computes_the_same_model(
    tmp_path, monkeypatch
):
    """Two layers slower and any gain kept: the variant is quantized and built again with them in
    float; the page's build (model.so) is that one, with its own per-layer errors, and it still
    computes the float model's outputs."""
    run_here_or_skip("x86-avx2")
    slower = two_slower(monkeypatch)
    monkeypatch.setattr(fallback, "MODEL_CHECK_GAIN", -1e9)  # the build without them always kept
    model, quantized, first, built = quantized_build(tmp_path)
    q = quantized.variants[0]
    assert q is not first and q.variant == "int8"
    assert q.layer_speed["fallback"]["layers"] == slower and q.layer_speed["fallback"]["kept"]
    assert [row["layer"] for row in q.layer_speed["slower"]] == slower
    assert [layer.name for layer in q.skipped] == slower
    int8 = ["00 conv2d 32x3x3x3", "01 conv2d 192x32x1x1", "03 conv2d 32x192x1x1"]
    assert [r.layer.name for r in q.layers] == int8
    assert [row["layer"] for row in q.layer_speed["layers"]] == int8  # the kept build, timed again
    assert [row["layer"] for row in q.errors] == int8  # its per-layer errors, computed once kept
    assert integer_layers(tmp_path) == (int8, 3)
    assert built.executable is built.executables[("int8", False)]
    fp32, int8_out = outputs(built, model, "fp32"), outputs(built, model, "int8")
    assert bench.fidelity([int8_out], [fp32], classifier=False)["sqnr_db"] > 25


def test_layers_stay_quantized_when_the_build_without_them_is_no_faster(tmp_path, monkeypatch):
    run_here_or_skip("x86-avx2")
    two_slower(monkeypatch)
    monkeypatch.setattr(fallback, "MODEL_CHECK_GAIN", 1.0)  # no build is twice as fast: never kept
    model, quantized, first, built = quantized_build(tmp_path)
    q = quantized.variants[0]
    assert q is first and not q.skipped and len(q.layers) == 5
    check = q.layer_speed["fallback"]
    assert not check["kept"] and check["mixed_ms"] > 0 and check["quant_ms"] > 0
    assert integer_layers(tmp_path) == (sorted(r.layer.name for r in q.layers), 5)


def test_a_fallback_that_fails_keeps_the_variant_as_built_and_says_why(tmp_path, monkeypatch):
    from webapp.pipeline.stages.quantize.variants import QuantizedJob

    run_here_or_skip("x86-avx2")
    two_slower(monkeypatch)

    def fails(self, q, layers, errors=True):
        raise RuntimeError("the requantization broke")

    monkeypatch.setattr(QuantizedJob, "without", fails)
    model, quantized, first, built = quantized_build(tmp_path)
    q = quantized.variants[0]
    assert q is first and not quantized.failed and len(q.layers) == 5
    assert "the requantization broke" in q.layer_speed["error"]
    assert len(q.layer_speed["slower"]) == 2 and "fallback" not in q.layer_speed
    assert ("int8", False) in built.executables
