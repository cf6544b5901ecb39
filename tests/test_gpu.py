"""GPU targets: every kernel bound to GPU threads by the default rules, the device code (and for CUDA
its PTX and SASS, made by NVIDIA's tools without a GPU) shown per kernel and whole, and the job done
with one plain line where the server has no such GPU. The tests that run code on a CUDA GPU run only
where there is one."""

from __future__ import annotations

import io
import re
import zipfile

import pytest
import tvm
from playwright.sync_api import expect
from tvm import s_tir, te, topi

from tests.conftest import FULL_SIZE, wait_for_job
from tests.test_browser import assert_every_link_answers, code_panel_ready
from webapp import targets
from webapp.catalog import EXAMPLES
from webapp.pipeline.passes.legalize import fuse
from webapp.pipeline.reports import device_code
from webapp.pipeline.rules import gpu as gpu_rules
from webapp.pipeline.rules import schedules
from webapp.pipeline.stages import build
from webapp.pipeline.stages.importers import import_model
from webapp.pipeline.stages.inspect import COUNTED_SASS, SASS_MNEMONIC, host_code_module, instruction_counts
from webapp.pipeline.stages.optimize import canonical
from webapp.targets.gpu import cuda_devices

ENTRY_POINT = {"cuda": "__global__", "opencl": "__kernel", "metal": "kernel void", "webgpu": "@compute"}
SMALL = ("mlp", "cnn-small", "transformer-block")
NO_GPU = "compiled for cuda-sm90; this server has no CUDA GPU, so nothing was timed"
needs_cuda_gpu = pytest.mark.skipif(
    cuda_devices() == 0, reason="needs a CUDA GPU and driver; this server has none"
)


def build_example(config, example: str, target_name: str):
    """(labels, device source, kernels) of an example built for a GPU preset on the default rules."""
    from webapp.jobs.worker import ensure_example_files

    ensure_example_files(config, example)
    target = targets.get(target_name)
    model = import_model(config.examples_dir / f"{example}.onnx")
    lowered, labels = build.schedule(fuse(canonical(model.mod), target), target)
    executable = build.build(lowered, target, None)
    source = target.device_module(host_code_module(executable)).inspect_source()
    return labels, source, sorted(labels)


def assert_every_kernel_scheduled_and_launched(labels: dict, funcs: dict) -> None:
    naive = {k: v for k, v in labels.items() if v.startswith("naive")}
    assert not naive, naive  # an unscheduled kernel would not have compiled at all
    for kernel in labels:
        assert device_code.of_kernel(kernel, funcs), f"no device function for {kernel}: {sorted(funcs)}"


@pytest.mark.slow
@pytest.mark.parametrize("example", [name for name in EXAMPLES if name not in FULL_SIZE])
def test_every_example_compiles_for_cuda_sm90_with_ptx_and_sass(config, example):
    labels, source, _ = build_example(config, example, "cuda-sm90")
    funcs = device_code.functions(source)
    assert "__global__" in source
    assert_every_kernel_scheduled_and_launched(labels, funcs)
    ptx, sass, report = device_code.cuda_binaries(source, "sm_90")
    resources = device_code.ptxas_resources(report)
    sass_funcs = device_code.sass_functions(sass)
    assert re.search(r"\.target\s+sm_90", ptx) and re.search(r"\.target\s+sm_90", sass)
    for name in funcs:  # every device function is in the PTX and the SASS, with its resources
        assert f".entry {name}(" in ptx and name in sass_funcs and sass_funcs[name].count(";") > 3
        assert resources[name]["registers"] > 0 and resources[name]["spill_stores"] >= 0
    assert sum(instruction_counts(sass, COUNTED_SASS, SASS_MNEMONIC).values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["cuda-sm80", "cuda-sm89", "opencl", "metal", "webgpu"])
def test_small_examples_compile_for_every_gpu_target(config, target_name):
    kind = targets.get(target_name).kind
    for example in SMALL:
        labels, source, _ = build_example(config, example, target_name)
        assert ENTRY_POINT[kind] in source, example
        assert_every_kernel_scheduled_and_launched(labels, device_code.functions(source))
    assert any("dlight rule: matmul" in label for label in labels.values())  # the transformer's matmuls


def int8_conv_nhwc():
    """An int8 NHWC conv2d with bias, relu and requantizing cast: the quantizer's kind of kernel."""
    data = te.placeholder((1, 16, 16, 16), "int8", name="data")
    weight = te.placeholder((3, 3, 16, 32), "int8", name="weight")
    bias = te.placeholder((32,), "int32", name="bias")
    conv = topi.nn.conv2d_nhwc(data, weight, 1, 1, 1, out_dtype="int32")
    out = topi.cast(topi.clip(topi.nn.relu(conv + bias), 0, 127), "int8")
    return te.create_prim_func([data, weight, bias, out])


def test_int8_conv_for_cuda_uses_dp4a_down_to_the_sass():
    target = targets.get("cuda-sm90")
    scheduled = schedules.schedule_kernel(int8_conv_nhwc(), target)
    assert str(scheduled.attrs[schedules.SCHEDULE_ATTR]) == "default rule: int8 dot product (dp4a)"
    executable = tvm.compile(tvm.IRModule({"main": scheduled}), target=target.tvm)
    source = executable.mod.imports[0].inspect_source()
    assert "__dp4a(" in source
    _, sass, _ = device_code.cuda_binaries(source, "sm_90")
    assert instruction_counts(sass, COUNTED_SASS, SASS_MNEMONIC).get("IDP.4A", 0) > 0


def test_the_dp4a_rule_leaves_other_targets_and_float_kernels_to_the_next_rule():
    conv = int8_conv_nhwc()
    assert gpu_rules.int8_dp4a(s_tir.Schedule(conv), targets.get("opencl")) is None
    scheduled = schedules.schedule_kernel(conv, targets.get("opencl"))
    assert "dp4a" not in str(scheduled.attrs[schedules.SCHEDULE_ATTR])


def test_device_source_is_split_per_function_for_each_language():
    cuda = (
        'extern "C" __global__ void __launch_bounds__(64) a_kernel(float* x);\n'
        'extern "C" __global__ void __launch_bounds__(64) a_kernel(float* x) {\n  x[0] = 1;\n}\n\n'
        'extern "C" __global__ void b_kernel_1(float* x) {\n  x[1] = 2;\n}\n'
    )
    funcs = device_code.functions(cuda)
    assert sorted(funcs) == ["a_kernel", "b_kernel_1"] and "x[0] = 1" in funcs["a_kernel"]
    assert device_code.of_kernel("b", funcs) == ["b_kernel_1"] and device_code.of_kernel("a_k", funcs) == []
    wgsl = (
        "// Function: f_kernel\n//" + "-" * 40 + "\n@compute @workgroup_size(64, 1, 1)\nfn f_kernel() {\n}\n"
    )
    assert device_code.functions(wgsl)["f_kernel"].startswith("@compute")
    report = (
        "ptxas info    : Compiling entry function 'f_kernel' for 'sm_90'\n"
        "ptxas info    : Function properties for f_kernel\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n"
    )
    resources = device_code.ptxas_resources(report)
    assert resources["f_kernel"] == {
        "stack_bytes": 8,
        "spill_stores": 4,
        "spill_loads": 4,
        "registers": 40,
        "shared_bytes": 2048,
    }
    assert device_code.kernel_resources("f", resources)["spill_bytes"] == 8


# ---------------------------------------------------------------- as a user


def submit(client, **data):
    return client.post("/api/jobs", data=data, content_type="multipart/form-data")


def test_api_lists_the_gpu_targets_and_refuses_what_they_cannot_do(client):
    listed = {t["name"]: t for t in client.get("/api/targets").get_json()}
    for name, kind in [("cuda-sm80", "cuda"), ("cuda-sm89", "cuda"), ("cuda-sm90", "cuda")]:
        assert listed[name]["kind"] == kind and listed[name]["tvm_target"]["arch"] == name[-4:].replace(
            "sm", "sm_"
        )
        assert listed[name]["can_run_here"] == (cuda_devices() > 0)
    for name in ("opencl", "metal", "webgpu"):
        assert listed[name]["kind"] == name and listed[name]["can_run_here"] is False
    resp = submit(client, example="cnn-small", target="webgpu", quantize="int8")
    assert resp.status_code == 400 and "no 64-bit integers" in resp.get_json()["error"]
    if cuda_devices() == 0:
        resp = submit(client, example="cnn-small", target="cuda-sm90", tune_trials="8")
        assert resp.status_code == 400
        assert "this server has none" in resp.get_json()["error"]


@pytest.mark.slow
def test_int8_cuda_job_is_done_with_device_code_ptx_sass_and_the_no_gpu_line(client):
    resp = submit(client, example="cnn-small", target="cuda-sm90", quantize="int8")
    assert resp.status_code == 202
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job["error"]
    r = job["results"]
    if cuda_devices() == 0:
        assert r["not_timed"] == NO_GPU and r["benchmarks"] == []
        benchmark = next(s for s in job["stages"] if s["name"] == "benchmark")
        assert benchmark["status"] == "skipped" and benchmark["why"] == NO_GPU  # not "done 0.0 s"
    code = r["device_code"]
    assert (
        code["language"] == "CUDA C" and code["sm"] == "sm_90" and code["views"] == ["device", "ptx", "sass"]
    )
    assert {"device.cu", "device.ptx", "device.sass", "ptxas.txt"} <= set(r["files"])
    assert r["instructions"]["IDP.4A"] > 0
    convs = [k for k in r["kernels"] if k["name"].startswith("fused_conv2d")]
    assert convs and all(k["schedule"] == "default rule: int8 dot product (dp4a)" for k in convs)
    assert all(k["gpu"]["registers"] > 0 and k["device_functions"] for k in r["kernels"])
    base = f"/r/{job['id']}"
    page = client.get(base).get_data(as_text=True)
    assert NO_GPU in page or cuda_devices() > 0
    assert "IDP.4A" in page  # the instruction counts of the Quantization section, from the SASS
    with zipfile.ZipFile(io.BytesIO(client.get(f"{base}/files/ir.zip").data)) as z:
        assert {"device.cu", "device.ptx", "device.sass"} <= set(z.namelist())
        assert any(n.endswith(".sass") and n.startswith("kernels/") for n in z.namelist())
    kernel = convs[0]["name"]
    for view, expected in [("device", "__dp4a"), ("ptx", "dp4a.s32.s32"), ("sass", "IDP.4A")]:
        html = client.get(f"{base}/code?view={view}&kernel={kernel}").get_data(as_text=True)
        assert expected in re.sub(r"<[^>]+>", "", html), view
    whole = client.get(f"{base}/code?view=ptx&kernel=__module__").get_data(as_text=True)
    assert "whole module" in whole and ".entry" in re.sub(r"<[^>]+>", "", whole)


@pytest.mark.slow
def test_cuda_job_from_the_form_shows_ptx_sass_registers_and_the_no_gpu_line(page, live_server):
    page.goto(live_server + "/")
    expect(page.locator(".target-group legend", has_text="GPU code")).to_be_visible()
    page.select_option("#example", "mobilenet-v2")
    page.check("input[name=target][value=cuda-sm90]")
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    if cuda_devices() == 0:
        expect(page.locator("#not-timed")).to_contain_text(NO_GPU)
    # the kernel table: each kernel's rule, registers and shared memory from ptxas
    table = page.locator("#kernel-table")
    expect(table).to_contain_text("default rule: depthwise conv2d (GPU, a thread per output)")
    expect(table).to_contain_text("dlight rule: implicit GEMM (shared-memory tiles)")
    expect(table.locator("th", has_text="registers")).to_have_count(1)
    code_panel_ready(page)
    page.select_option("#code-view", "device")
    expect(page.locator(".code-title")).to_contain_text("Device code (CUDA C)")
    code_panel_ready(page)
    expect(page.locator("#code-text")).to_contain_text("__global__")
    page.select_option("#code-view", "sass")
    expect(page.locator(".code-title")).to_contain_text("SASS (sm_90")
    code_panel_ready(page)
    expect(page.locator("#code-text")).to_contain_text("EXIT")
    page.select_option("#code-kernel", "__module__")
    code_panel_ready(page)
    expect(page.locator("#code-text")).to_contain_text(re.compile(r"\.target\s+sm_90"))
    page.select_option("#code-view", "llvm")  # the host side, which launches the kernels
    expect(page.locator(".code-title")).to_contain_text("host side")
    expect(page.locator("#downloads")).to_contain_text("device.ptx")
    assert_every_link_answers(page, page.url)


# ---------------------------------------------------------------- on a CUDA GPU


@needs_cuda_gpu
def test_cuda_build_runs_on_the_gpu_and_matches_the_cpu_reference(client):
    resp = submit(client, example="cnn-small", target="cuda-sm90")
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "done", job["error"]
    r = job["results"]
    tvm_rows = [b for b in r["benchmarks"] if b["runtime"] == "tvm"]
    assert tvm_rows and "CUDA GPU" in tvm_rows[0]["device"] and "not_timed" not in r
    cpu = [f for f in r["fidelity"] if f["reference"].endswith("on the CPU")]
    assert cpu and all(f["max_abs_err"] < 1e-3 for f in cpu)
