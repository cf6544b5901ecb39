"""The transformer examples (Hugging Face BERT, ViT, GPT-2, Llama from their configs): every matmul on
the matmul rule, for every kind of CPU and a GPU, and outputs that match ONNX Runtime and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tests.conftest import TRANSFORMERS
from webapp.catalog import EXAMPLES
from webapp.pipeline.stages import bench
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.optimize import optimize
from webapp.targets import get


def kernels_writing(fused: tvm.IRModule, last_dim: int) -> set[str]:
    """The kernels the model's main function calls for a result whose last axis is `last_dim` (the
    LM head's logits over the vocabulary)."""
    names = set()

    @relax.expr_functor.visitor
    class Calls(relax.PyExprVisitor):
        def visit_call_(self, call):
            if call.op.same_as(tvm.ir.Op.get("relax.call_tir")):
                shape = getattr(call.ty_args[0], "shape", None)
                if shape is not None and len(shape) and int(shape[-1]) == last_dim:
                    names.add(call.args[0].name_hint)
            super().visit_call_(call)

    Calls().visit_expr(fused["main"])
    return names


def build_example(config, name: str, preset: str, fmt: str, tmp_path):
    from webapp.jobs.worker import ensure_example_files

    pt2, onnx_path = ensure_example_files(config, name)
    path = onnx_path if fmt == "onnx" else pt2
    model = import_model(path)
    target = get(preset)
    optimized = optimize(model.mod, target, tmp_path)
    lowered, labels = schedule(optimized.fused, target)
    return model, optimized, lowered, labels, path


def assert_matmuls_on_their_rule(labels: dict, rule: str) -> None:
    matmuls = {k: v for k, v in labels.items() if "matmul" in k}
    assert matmuls and all(v.startswith(rule) for v in matmuls.values()), matmuls
    assert not any(v.startswith("naive") for v in labels.values()), labels


@pytest.mark.slow
@pytest.mark.parametrize(
    "fmt,preset", [("onnx", "x86-host"), ("pt2", "x86-host"), ("onnx", "x86-avx2"), ("onnx", "rpi5")]
)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_every_matmul_of_a_transformer_is_on_the_matmul_rule_and_its_outputs_match(
    config, tmp_path, name, fmt, preset
):
    """Both exports (dynamo ONNX, torch.export) build; the matmuls, the LM head's over a 32k-50k
    vocabulary among them, are on the matmul rule (never the reduction rule); where the code runs
    here, it computes what ONNX Runtime (the .onnx) or PyTorch (the .pt2) computes."""
    model, optimized, lowered, labels, path = build_example(config, name, preset, fmt, tmp_path)
    assert_matmuls_on_their_rule(labels, "default rule: ")
    assert not any("reduction" in v for k, v in labels.items() if "matmul" in k), labels
    rows = {k: v for k, v in labels.items() if "layer_norm" in k or "softmax" in k}
    assert rows and set(rows.values()) == {"default rule: row reduction"}, rows
    vocabulary = EXAMPLES[name].vocabulary
    if name in ("gpt2", "llama"):  # the LM head
        heads = {k for k in kernels_writing(optimized.fused, vocabulary) if "matmul" in k}
        assert heads and {labels[k] for k in heads} == {"default rule: matmul"}, heads
    executable = build(lowered, get(preset), None)
    if not get(preset).can_run_here:
        return
    inputs = bench.make_inputs(model.inputs)
    ours = bench.flatten_outputs(bench.tvm_runner(executable, inputs)())
    if fmt == "onnx":
        reference = bench.onnxruntime_runner(path, inputs, 2)()
    else:
        reference = bench.torch_outputs(bench.pytorch_runner(path, inputs, 2)())
    for out, ref in zip(ours, reference, strict=True):
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4 * scale)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["x86-avx512-vnni", "rpi5"])
def test_a_quantized_lm_head_is_on_the_int8_rule_and_the_row_reductions_on_theirs(config, tmp_path, preset):
    """GPT-2 quantized: every integer matmul, its LM head among them (50,257 words, no multiple of a
    vector, the tied embedding read transposed), is on the target's dot-product rule, not the float
    rule's widened products; layer norms and softmax on the row rule (a quantized layer norm inlines
    its rounding); where the code runs here, the int8 logits follow ONNX Runtime's float ones."""
    from webapp.options import JobOptions
    from webapp.pipeline.passes.legalize import fuse
    from webapp.pipeline.stages.build import compile_relax
    from webapp.pipeline.stages.quantize import quantize

    model, _, _, _, path = build_example(config, "gpt2", preset, "onnx", tmp_path)
    target = get(preset)
    samples = [bench.make_inputs(model.inputs, seed=1 + i) for i in range(2)]
    q = quantize(model.mod, target, JobOptions(quantize="int8"), samples)
    executable, labels = compile_relax(q.mod, target)
    rule = f"default rule: int8 matmul ({target.dot_instruction()})"
    integer = {k: v for k, v in labels.items() if "matmul" in k and "cast" in k}
    assert integer and set(integer.values()) == {rule}, labels
    heads = {k for k in kernels_writing(fuse(q.mod, target), EXAMPLES["gpt2"].vocabulary) if "matmul" in k}
    assert heads and {labels[k] for k in heads} == {rule}, heads
    rows = {k: v for k, v in labels.items() if "layer_norm" in k or "softmax" in k}
    assert rows and set(rows.values()) == {"default rule: row reduction"}, rows
    if not target.can_run_here:
        return
    inputs = bench.make_inputs(model.inputs)
    ours = bench.flatten_outputs(bench.tvm_runner(executable, inputs)())
    reference = bench.onnxruntime_runner(path, inputs, 2)()
    assert bench.fidelity(ours, reference, classifier=False)["sqnr_db"] > 15
