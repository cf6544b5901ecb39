"""Targets as units: every preset answers the pipeline's questions through its kind, the Arm kind
cross-compiles, and the web process lists targets without loading TVM or the pipeline."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import tvm
from tvm.script import relax as R

from webapp import targets
from webapp.options import JobOptions, SubmitError
from webapp.targets.arm import Arm
from webapp.targets.x86 import X86

# A Cortex-A76 (Raspberry Pi 5) as an Arm preset would describe it.
A76 = Arm(
    "test-a76",
    "Cortex-A76",
    "test only",
    {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"},
)


def test_api_lists_every_preset_with_its_kind_and_where_it_runs(client):
    listed = {t["name"]: t for t in client.get("/api/targets").get_json()}
    assert set(listed) == set(targets.TARGETS)
    for name, t in listed.items():
        kind = targets.get(name).kind
        assert t["kind"] == kind and t["runs_on"]
        assert t["tvm_target"]["kind"] == (kind if targets.get(name).gpu else "llvm")
    assert listed["x86-generic"]["can_run_here"] and listed["x86-generic"]["runs_on"] == "this server"


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_each_preset_makes_a_tvm_target_of_its_own_kind(name):
    preset = targets.get(name)
    tvm_target = preset.tvm
    assert tvm_target.kind.name == (preset.runtime if preset.gpu else "llvm")
    cpu = tvm_target.host if preset.gpu else tvm_target  # a GPU build's host code runs on this CPU
    assert int(cpu.attrs["num-cores"]) >= 1
    assert preset.arch in preset.device_name()


def test_kinds_answer_vector_shape_and_activation_dtype():
    assert targets.get("x86-avx2").vector_shape() == (8, 16)
    assert targets.get("x86-generic").vector_shape() == (4, 16)
    assert isinstance(A76, Arm) and A76.vector_shape() == (4, 32)
    assert X86.activation_dtype == "uint8" and Arm.activation_dtype == "int8"
    assert not A76.can_run_here and "not run" in A76.runs_on


def test_database_key_of_the_host_preset_names_its_vector_isa():
    assert targets.get("x86-host").database_key().startswith("x86-host-")
    assert targets.get("x86-avx2").database_key() == "x86-avx2"


HOST_AS = """
import json
from webapp import targets
from webapp.pipeline.rules.common import simd
host = targets.get("x86-host")
print(json.dumps({"mcpu": str(host.tvm.attrs["mcpu"]), "key": host.database_key(),
                  "lanes": simd(host)[0], "dot": host.dot_instruction(), "title": host.title}))
"""


@pytest.mark.parametrize(
    "preset, mcpu, key, lanes, dot",
    [
        ("x86-avx2", "haswell", "x86-host-avx2", 8, "AVX2"),  # vpmaddubsw + vpmaddwd
        ("x86-avx512", "skylake-avx512", "x86-host-avx512", 16, "AVX512BW"),
        ("x86-avx512-vnni", "cascadelake", "x86-host-avx512", 16, "VNNI"),
    ],
)
def test_playground_host_preset_makes_x86_host_build_another_presets_code(preset, mcpu, key, lanes, dot):
    """PLAYGROUND_HOST_PRESET: the whole process (and the sandboxes it starts: webapp/machine/sandbox.py
    passes it on) builds x86-host as that preset, its vectors and dot product with it, its records apart."""
    env = {"PATH": "/usr/bin:/bin", "PLAYGROUND_HOST_PRESET": preset}
    out = subprocess.run([sys.executable, "-c", HOST_AS], env=env, capture_output=True, text=True, check=True)
    host = json.loads(out.stdout)
    assert (host["mcpu"], host["key"], host["lanes"], host["dot"]) == (mcpu, key, lanes, dot)
    assert host["title"].endswith(f"as {preset}")
    from webapp.machine.sandbox import PASSED_THROUGH

    assert "PLAYGROUND_HOST_PRESET" in PASSED_THROUGH


def test_an_unknown_host_preset_is_refused_with_the_names_it_takes():
    env = {"PATH": "/usr/bin:/bin", "PLAYGROUND_HOST_PRESET": "x86-avx9"}
    out = subprocess.run(
        [sys.executable, "-c", "import webapp.targets"], env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "PLAYGROUND_HOST_PRESET=x86-avx9: not one of x86-avx2, x86-avx512" in out.stderr


def test_an_x86_preset_whose_instructions_this_cpu_lacks_is_built_not_timed(monkeypatch):
    """A preset needing a CPU flag this machine does not have (a made-up one here, as AVX-512 VNNI is
    on an AVX2 machine): built, never run; the benchmark stage says why, tuning is refused."""
    from webapp.pipeline.stages.bench import benchmark_job

    future = X86(
        "x86-future",
        "future",
        "test only",
        {"kind": "llvm", "mcpu": "cascadelake"},
        needs=("sse2", "avx99_made_up"),  # SSE2: every x86-64 has it
    )
    assert not future.can_run_here
    assert future.runs_on == "nowhere here: this server's CPU lacks avx99_made_up (built, not run)"
    assert targets.get("x86-generic").can_run_here  # SSE2 needs nothing beyond x86-64
    measured = benchmark_job({}, None, None, future, lambda f: None)
    assert measured["benchmarks"] == [] and measured["not_timed"] == (
        "compiled for x86-future; this server's CPU lacks avx99_made_up (built, not run), "
        "so nothing was timed"
    )
    monkeypatch.setitem(targets.TARGETS, "x86-future", future)
    assert JobOptions.parse({"target": "x86-future"}).target == "x86-future"
    with pytest.raises(SubmitError, match="Tuning measures the code where it runs: nowhere here"):
        JobOptions.parse({"target": "x86-future", "tune_trials": "8"})


@R.function
def add_relu(x: R.Tensor((4, 64), "float32"), y: R.Tensor((4, 64), "float32")):
    with R.dataflow():
        out = R.nn.relu(R.add(x, y))
        R.output(out)
    return out


def test_arm_kind_cross_compiles_an_aarch64_library(tmp_path):
    from webapp.pipeline.passes.legalize import fuse
    from webapp.pipeline.stages.build import build, schedule

    lowered, labels = schedule(fuse(tvm.IRModule({"main": add_relu}), A76), A76)
    build(lowered, A76, tmp_path / "model.so")
    header = (tmp_path / "model.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 0xB7  # EM_AARCH64


def test_web_process_loads_neither_tvm_nor_the_pipeline(tmp_path):
    code = (
        "import sys, pathlib; from webapp import create_app; from webapp.config import Config; "
        f"app = create_app(Config(data_dir=pathlib.Path({str(tmp_path)!r}), unsandboxed=True)); "
        "c = app.test_client(); assert c.get('/').status_code == 200; "
        "assert c.get('/api/targets').status_code == 200; "
        "assert c.get('/api/devices').status_code == 200; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'torch', 'onnx') "
        "or m.startswith('webapp.pipeline')); print(bad); assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_job_options_parse_with_one_default_and_one_name_each():
    assert JobOptions.parse({}) == JobOptions()
    parsed = JobOptions.parse({"quantize": "int4", "weight_granularity": "tensor", "global_scale": "4"})
    assert (parsed.bits, parsed.per_channel, parsed.global_scale) == (4, False, 4.0)
    assert JobOptions.from_json(parsed.to_json() | {"filename": "x.onnx"}) == parsed
    with pytest.raises(SubmitError, match="Unknown target"):
        JobOptions.parse({"target": "arm-nonsense"})
    with pytest.raises(SubmitError, match="tune_trials"):
        JobOptions.parse({"tune_trials": "-1"})


def test_arm_board_presets_name_their_board_core_and_features():
    """The Pis, and an i8mm server core that QEMU 7.2 emulates only as its `max` core."""
    listed = {t.name: t.to_json() for t in targets.TARGETS.values()}
    for name, core, qemu, dotprod, i8mm in (
        ("rpi4", "cortex-a72", "cortex-a72", False, False),
        ("rpi5", "cortex-a76", "cortex-a76", True, False),
        ("graviton3", "neoverse-v1", "max", True, True),
    ):
        preset = targets.get(name)
        assert preset.board == name and preset.core == qemu and not preset.can_run_here
        assert listed[name]["board"] == name and "device pool" in listed[name]["runs_on"]
        tvm_target = preset.tvm_target()
        assert int(tvm_target.attrs["num-cores"]) == 4 and tvm_target.attrs["mcpu"] == core
        assert bool(tvm_target.attrs["feature.has_dotprod"]) is dotprod
        assert bool(tvm_target.attrs["feature.has_matmul_i8"]) is i8mm
        assert preset.int8_mnemonic() == ("smmla" if i8mm else "sdot" if dotprod else "smull")
    with pytest.raises(SubmitError, match="board of the device pool"):
        JobOptions.parse({"target": "rpi5", "tune_trials": "8"})


def test_riscv64_is_a_kind_of_its_own_built_shown_and_analysed_by_llvm_mca_not_timed(client, tmp_path):
    """The RISC-V kind (webapp/targets/riscv.py, its module alone): a job builds RVV code for the X280,
    says where it runs and why it is not timed, refuses tuning and int8 with the reason, and llvm-mca
    reads its hot loops in its dialect."""
    from tests.conftest import wait_for_job
    from tests.test_api import submit

    preset = targets.get("riscv64")
    assert preset.kind == "riscv" and not preset.can_run_here and preset.timed_on_board is None
    refused = submit(client, {"example": "mlp", "target": "riscv64", "tune_trials": "8"})
    assert (
        refused.status_code == 400 and "Tuning measures the code where it runs" in refused.get_json()["error"]
    )
    refused = submit(client, {"example": "mlp", "target": "riscv64", "quantize": "int8"})
    assert refused.status_code == 400 and "int8 kernels for RISC-V" in refused.get_json()["error"]

    job = wait_for_job(client, submit(client, {"example": "mlp", "target": "riscv64"}).get_json()["id"])
    assert job["status"] == "done", job["error"]
    r = job["results"]
    assert r["benchmarks"] == [] and r["not_timed"] == (
        f"compiled for riscv64; this server is {platform.machine()}, the code is riscv64 (built, not run), "
        "so nothing was timed"
    )
    assert r["mca"]["cpu"] == "sifive-x280" and r["mca"]["clock_ghz"] is None and r["mca"]["threads"] == 8
    matmuls = [k for k in r["kernels"] if "matmul" in k["name"]]
    assert matmuls and r["mca"]["analysed"] >= len(matmuls)
    for k in matmuls:  # the loop llvm-mca read: float multiply-adds on 512-bit vectors
        assert k["hot_loop"]["by"] == "mca" and k["mca"]["ops_per_iteration"] >= 2 * 16
        assert k["mca"]["cycles_per_iteration"] > 0 and k["mca"]["predicted_ms"] is None
    base = f"/r/{job['id']}"
    asm = client.get(f"{base}/code?view=asm&kernel={matmuls[0]['name']}").get_data(as_text=True)
    assert "vfmacc.v" in asm and 'id="hot-loop-link"' in asm
    report = client.get(f"{base}/code?view=mca&kernel={matmuls[0]['name']}").get_data(as_text=True)
    assert "-mcpu=sifive-x280" in report
    page = client.get(base).get_data(as_text=True)
    assert "nothing was timed" in page and "the X280 comes at several clocks" in page
    with open(
        client.application.extensions["playground"]["store"].job_dir(job["id"]) / "files" / "model.so", "rb"
    ) as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 0xF3  # EM_RISCV
    # its kernel's reproducer builds it and says where it runs, not running another CPU's code here
    from tests.test_repro import RUN, unpacked

    folder = unpacked(client, job["id"], matmuls[0]["name"], tmp_path)
    run = subprocess.run(
        [sys.executable, "-I", "-c", RUN], cwd=folder, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"it runs on riscv64, not this {platform.machine()} machine" in run.stdout
