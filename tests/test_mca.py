"""llvm-mca's static analysis of each kernel's hot loop (webapp/pipeline/reports/mca.py), on real
builds: an x86 convolution whose predicted time is set against its measured one, and the same
convolution cross-compiled for the Raspberry Pi 5 (Cortex-A76), which only the emulated board runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

from webapp.catalog import code_file
from webapp.pipeline.reports import mca
from webapp.pipeline.stages.build import build, kernel_seconds, schedule
from webapp.pipeline.stages.inspect import inspect_build
from webapp.pipeline.stages.optimize import optimize
from webapp.targets import get
from webapp.targets.x86 import DIALECT as X86

pytestmark = pytest.mark.skipif(mca.tool() is None, reason="llvm-mca is not installed (make setup-test)")


def conv_model(kernel: int = 3, size: int = 56) -> tvm.IRModule:
    """One convolution, 64 -> 64 channels over size x size (by default a ResNet layer's 3x3 over 56 x 56,
    padded to keep its size), with its ReLU."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 64, size, size), "float32"))
    w = relax.const(rng.normal(0, 0.1, (64, 64, kernel, kernel)).astype("float32"))
    pad = [kernel // 2] * 2
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x, w, padding=pad)))))
        bb.emit_func_output(out)
    return bb.get()


def built(preset: str, job_dir):
    target = get(preset)
    mod = conv_model()
    fused = optimize(mod, target, job_dir).fused
    lowered, labels = schedule(fused, target, None)
    executable = build(lowered, target, None)
    found = inspect_build(mod, fused, lowered, executable, job_dir, labels, target)
    conv = next(k for k in found["kernels"] if "conv2d" in k["name"] and k["calls"])
    return found, conv, executable, lowered, target


def test_an_x86_kernel_is_analysed_and_its_predicted_time_is_of_the_order_measured(tmp_path):
    found, conv, executable, lowered, target = built("x86-host", tmp_path)
    assert found["mca"]["tool"].startswith("llvm-mca") and found["mca"]["cpu"] == target.tvm.attrs["mcpu"]
    assert found["mca"]["clock_ghz"] > 0 and found["mca"]["analysed"] >= 1
    figures = conv["mca"]
    # the loop analysed is the convolution's: float FMAs, counted by their vector width
    start, end = figures["lines"]
    asm = (tmp_path / code_file("asm", conv["name"])).read_text()
    from webapp.asm import filter_asm

    loop = "\n".join(filter_asm(asm).splitlines()[start - 1 : end])
    fmas = len([line for line in loop.splitlines() if "vfmadd" in line])
    assert fmas and figures["ops_per_iteration"] >= 2 * 4 * fmas  # at least 4 lanes of 2 operations each
    assert figures["cycles_per_iteration"] > 0 and figures["limit"] and figures["bottleneck"]
    # the report is the kernel's "mca" code view, with its timeline
    report = (tmp_path / code_file("mca", conv["name"])).read_text()
    assert f"lines {start}-{end}" in report and "Timeline view" in report and "Total Cycles" in report

    seconds = kernel_seconds(executable, lowered, target.device(), {conv["name"]})[conv["name"]]
    measured_ms = seconds * 1e3 * conv["calls"]
    ratio = figures["predicted_ms"] / measured_ms
    assert 0.1 < ratio < 10, (figures["predicted_ms"], measured_ms)
    json.dumps(found["mca"])  # what result.json stores


def test_a_pi5_kernel_is_analysed_on_the_cortex_a76_model(tmp_path):
    found, conv, *_ = built("rpi5", tmp_path)
    assert found["mca"]["cpu"] == "cortex-a76" and found["mca"]["clock_ghz"] == 2.4
    assert found["mca"]["clock_source"] == "the board's nominal clock"
    figures = conv["mca"]
    report = (tmp_path / code_file("mca", conv["name"])).read_text()
    assert "-mcpu=cortex-a76" in report and "fmla" in report
    assert figures["ops_per_iteration"] > 0 and figures["cycles_per_iteration"] > 0
    assert figures["predicted_ms"] > 0


def test_a_kernel_without_a_loop_says_why():
    figures, why = mca.analyse("f:\n\tmovl\t$1, %eax\n\tretq\n", X86, "x86_64-linux-gnu", "znver4")
    assert figures is None and "no loop with vector instructions" in why
