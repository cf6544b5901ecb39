"""The kernel linter (webapp/pipeline/reports/lint.py): a real kernel with each hazard the build shows,
compiled for this machine, gives that finding with its evidence and line; the default rule's kernel
gives none; the rate, register-spill and rule hazards on kernel-table rows."""

from __future__ import annotations

import pytest
import tvm
from tvm.script import tirx as T

from tests.test_mca import conv_model
from webapp.asm import filter_asm
from webapp.pipeline.reports import lint
from webapp.pipeline.stages.build import build, schedule
from webapp.pipeline.stages.inspect import inspect_build
from webapp.pipeline.stages.optimize import optimize
from webapp.targets import get


@T.prim_func
def alloc_in_parallel(A: T.Buffer((64, 4096), "float32"), B: T.Buffer((64, 4096), "float32")):
    for i in T.parallel(64):
        tmp = T.decl_buffer((4096,), "float32")  # 16 KB: from the workspace pool, in each chunk
        for j in range(4096):
            tmp[j] = A[i, j] * T.float32(2)
        for j in range(4096):
            B[i, j] = tmp[4095 - j]


@T.prim_func
def log_loop(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32")):
    for j in range(4096):
        B[j] = T.log(A[j])


@T.prim_func
def recurrence(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32")):
    for j in range(1, 4096):  # each value needs the one before: no vectors
        B[j] = B[j - 1] * A[j] + T.float32(1)


@T.prim_func
def int8_matmul(
    A: T.Buffer((64, 64), "uint8"), W: T.Buffer((64, 64), "int8"), C: T.Buffer((64, 64), "int32")
):
    for i, j in T.grid(64, 64):
        C[i, j] = 0
        for k in range(64):
            C[i, j] = C[i, j] + T.Cast("int32", A[i, k]) * T.Cast("int32", W[k, j])


def findings_of(func, name: str, schedule_label: str = "default rule: crafted", preset: str = "x86-host"):
    target = get(preset)
    executable = tvm.compile(tvm.IRModule({"main": func}), target=target.tvm)
    asm = filter_asm(executable.mod.inspect_source("s"))
    row = {"name": name, "schedule": schedule_label, "flop": 1e6, "calls": 1}
    return lint.static_findings(row, func.script(), asm, target), asm


def hazards(found: list[dict]) -> list[str]:
    return [f["hazard"] for f in found]


def test_an_allocation_inside_a_parallel_loop_is_found_at_its_line():
    found, asm = findings_of(alloc_in_parallel, "fused_copy")
    alloc = next(f for f in found if f["hazard"] == "allocation in a parallel loop")
    assert "TVMBackendAllocWorkspace" in asm.splitlines()[alloc["line"] - 1]
    assert alloc["view"] == "asm" and "parallel lambda" in alloc["evidence"]


def test_a_libm_call_inside_a_loop_is_found():
    found, asm = findings_of(log_loop, "fused_log")
    call = next(f for f in found if f["hazard"] == "call in a loop")
    assert "logf" in call["evidence"] and "logf" in asm.splitlines()[call["line"] - 1]


def test_a_naive_kernel_with_a_scalar_loop_is_found_twice():
    found, asm = findings_of(recurrence, "fused_scan", "naive")
    assert hazards(found) == ["naive", "scalar loop"], found
    scalar = found[1]
    assert asm.splitlines()[scalar["line"] - 1].startswith(".L")  # the loop's label


def test_int8_without_the_targets_multiply_instruction_is_found():
    found, _ = findings_of(int8_matmul, "fused_matmul_int8", "naive")
    target = get("x86-host")
    if target.int8_mnemonic() is None:
        pytest.skip("this CPU has no int8 multiply form the x86-host target uses")
    assert "int8 without the dot product" in hazards(found)
    assert target.int8_mnemonic() in next(f["evidence"] for f in found if "int8" in f["hazard"])


def test_the_default_rules_convolution_has_no_findings(tmp_path):
    target = get("x86-host")
    mod = conv_model(kernel=1, size=28)
    fused = optimize(mod, target, tmp_path).fused
    lowered, labels = schedule(fused, target, None)
    found = inspect_build(mod, fused, lowered, build(lowered, target, None), tmp_path, labels, target)
    conv = next(k for k in found["kernels"] if "conv2d" in k["name"])
    assert conv["schedule"].startswith("default rule") and conv["lint"] == []


def test_rule_spill_and_rate_findings_on_kernel_rows():
    target = get("x86-host")
    matmul = {"name": "fused_matmul", "schedule": "default rule: reduction", "flop": 1e6, "calls": 1}
    assert hazards(lint.static_findings(matmul, "", "", target)) == ["matmul on the reduction rule"]
    spilled = {
        "name": "fused_conv2d",
        "schedule": "default rule: conv",
        "flop": 1e6,
        "gpu": {"spill_bytes": 96},
    }
    assert hazards(lint.static_findings(spilled, "", "", target)) == ["register spills"]
    sgemm = {"gflops": 200.0, "threads": 2}
    slow = {"name": "fused_conv2d", "ms": 10.0, "flop": 1e8, "calls": 1, "share": 0.3}  # 10 GFLOP/s
    fast = slow | {"ms": 0.5}  # 200 GFLOP/s
    small = slow | {"share": 0.01}
    assert hazards(lint.rate_findings(slow, sgemm)) == ["far below sgemm"]
    assert "5% of this machine's sgemm reference" in lint.rate_findings(slow, sgemm)[0]["evidence"]
    assert (
        lint.rate_findings(fast, sgemm)
        == lint.rate_findings(small, sgemm)
        == lint.rate_findings(slow, None)
        == []
    )
    summary = lint.summary(
        {"kernels": [slow | {"lint": []}, matmul | {"lint": [lint.finding("naive", "x")]}], "sgemm": sgemm}
    )
    assert summary["count"] == 2 and summary["kernels"] == 2 and summary["checked"] == 2
    # a finding on a kernel under 1% of a run is listed after the rest and not counted in the headline
    tiny = matmul | {"name": "fused_matmul_tiny", "share": 0.005, "lint": [lint.finding("naive", "y")]}
    summary = lint.summary({"kernels": [tiny, slow | {"lint": []}, matmul | {"lint": []}], "sgemm": sgemm})
    assert (summary["count"], summary["kernels"], summary["minor"], summary["checked"]) == (1, 1, 1, 3)
    assert summary["by_hazard"] == [("far below the sgemm reference for its flops", 1)]
    assert [(f["kernel"], f["counted"]) for f in summary["findings"]] == [
        ("fused_conv2d", True),
        ("fused_matmul_tiny", False),
    ]


def test_a_gpu_kernel_is_linted_without_its_host_code():
    """A GPU build's assembly is the host side's (kernel launches): only the rule, naive and spill
    hazards apply, and int8 GPU kernels are not asked for a CPU's instruction."""
    target = get("cuda-sm80")
    row = {"name": "fused_conv2d_int8", "schedule": "default rule: gpu", "flop": 1e6}
    row["gpu"] = {"spill_bytes": 8}
    host = "\tcallq\texpf@PLT\n.LBB0_1:\n\tmovl\t$1, %eax\n\tjne\t.LBB0_1\n"
    assert hazards(lint.static_findings(row, '"int8"', host, target)) == ["register spills"]
