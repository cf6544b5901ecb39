"""The device pool, for real: Raspberry Pi targets cross-compiled here, run on emulated boards (the
arm64 root file system under qemu-aarch64, jailed) that TVM's own tracker hands out; a stock TVM
rpc_server registered the way the README tells a real Pi to; boards killed mid-job; no tracker."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.servers import free_port, wait_until
from webapp.cli import compile_locally
from webapp.config import Config
from webapp.devices.pool import start_pool, stop_processes, tracker_command
from webapp.devices.rootfs import LIBRARY_PATH, ensure_rootfs
from webapp.devices.status import read_status
from webapp.devices.tracker import Tracker, TrackerError, pool_of, tracker_summary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    """Built once per run (12 s here, with the packages installed); PLAYGROUND_TEST_ROOTFS reuses one."""
    cached = os.environ.get("PLAYGROUND_TEST_ROOTFS")
    return ensure_rootfs(Path(cached) if cached else tmp_path_factory.mktemp("arm64") / "rootfs")


@pytest.fixture(scope="module")
def pool(tmp_path_factory, rootfs):
    """`tvm-playground pool` on a port of its own: the tracker and an emulated rpi4 and rpi5."""
    config = Config(
        data_dir=tmp_path_factory.mktemp("pool-data"),
        bench_budget_s=0.3,
        bench_threads=2,
        wall_limit_s=600,
        shipped_tuning_records=False,
        reuse_results=False,  # its tests submit the same small jobs, each expecting its own run
        tracker=f"127.0.0.1:{free_port()}",
        rootfs=rootfs,
        board_wait_s=120,
    )
    proc = start_pool(config, timeout=180)
    yield config
    stop_processes(proc)


def boards_of(tracker: str) -> dict:
    try:
        return pool_of(tracker_summary(tracker))
    except TrackerError:
        return {}  # not up yet


def run_job(config: Config, out: Path, example: str, **form) -> tuple[dict | None, dict, dict]:
    error = compile_locally(config, example, form, out)
    result = json.loads((out / "result.json").read_text())
    progress = json.loads((out / "progress.json").read_text())
    return error, result, {s["name"]: s for s in progress["stages"]}


def test_pool_registers_one_emulated_board_per_arm_target(pool):
    status = read_status(pool)
    assert [b["key"] for b in status["boards"]] == ["rpi4", "rpi5", "graviton3"]
    assert all(b["state"] == "running" for b in status["boards"])
    keys = pool_of(tracker_summary(pool.tracker))
    assert all(keys[key]["boards"] == 1 for key in ("rpi4", "rpi5", "graviton3"))


def test_fp32_job_on_rpi4_runs_on_its_emulated_board_and_matches_the_host(pool, tmp_path):
    error, result, stages = run_job(pool, tmp_path / "job", "cnn-small", target="rpi4", quantize="none")
    assert error is None, error
    assert stages["remote"]["status"] == "done"
    assert result["device"]["name"] == "rpi4 (emulated: QEMU cortex-a72)" and result["device"]["emulated"]
    (row,) = result["benchmarks"]
    assert row["device"] == "rpi4 (emulated: QEMU cortex-a72)" and row["median_ms"] > 0
    by_reference = {f["reference"]: f for f in result["fidelity"]}
    assert set(by_reference) == {"onnxruntime", "pytorch"}
    assert all(f["max_abs_err"] < 1e-4 and f["cosine"] > 0.9999 for f in by_reference.values())
    assert result["instructions"].get("fmla", 0) > 0  # NEON float code
    # the emulated board's QEMU runs on this machine's cores: its runs held the machine's timing slot
    assert [h["phase"] for h in result["timing_slot"]["holds"]] == ["board"]
    library = (tmp_path / "job" / "files" / "model.so").read_bytes()
    assert library[:4] == b"\x7fELF" and int.from_bytes(library[18:20], "little") == 0xB7  # aarch64


def exported(model, path: Path) -> Path:
    """A crafted model of 16x16 RGB images as an .onnx file (TorchScript's exporter) at `path`."""
    import torch

    torch.manual_seed(0)
    torch.onnx.export(model.eval(), (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, input_names=["x"])
    return path


def stride_1_cnn(path: Path) -> Path:
    """An RGB image through two 3x3 convolutions, the second 16 -> 16 channels at stride 1 (an i8mm
    conv: 8 input channels an instruction, output pixels in pairs), pooled into a linear layer."""
    from torch import nn

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    return exported(model, path)


def depthwise_cnn(path: Path) -> Path:
    """MobileNet's block in small: a 3x3 conv to 16 channels, a 3x3 depthwise conv over them (8-bit
    inputs: vectors of 8 channels, int8 x int8 into int16 with smull, added into int32), a 1x1 conv."""
    from torch import nn

    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU6(), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU6(),
        nn.Conv2d(16, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    return exported(model, path)


CRAFTED = {"stride-1 cnn": stride_1_cnn, "depthwise cnn": depthwise_cnn}  # beside the examples


@pytest.mark.parametrize(
    "board, example, rule, mnemonic",
    [
        ("rpi5", "mlp", "int8 matmul (sdot)", "sdot"),
        ("rpi5", "depthwise cnn", "depthwise conv2d", "sdot"),
        ("rpi4", "mlp", "int8 matmul (NEON)", "smull"),
        ("rpi4", "cnn-small", "int8 conv2d NHWC (NEON)", "smull"),
        ("graviton3", "mlp", "int8 matmul (i8mm)", "smmla"),
        ("graviton3", "stride-1 cnn", "int8 conv2d NHWC (i8mm)", "smmla"),
    ],
)
def test_int8_job_on_a_board_runs_its_int8_rule_bit_exact_with_the_host(
    pool, tmp_path, board, example, rule, mnemonic
):
    """The Pi 5's int8 kernels on sdot, the Pi 4's (no dot product) on smull + smlal + sadalp, the
    i8mm core's on smmla: on the emulated board, both builds timed there, the int8 output the same
    integers as on this server."""
    if example in CRAFTED:
        example = str(CRAFTED[example](tmp_path / "cnn.onnx"))
    error, result, _ = run_job(pool, tmp_path / "job", example, target=board, quantize="int8")
    assert error is None, error
    assert result["instructions"][mnemonic] > 0
    rules = [k["schedule"] for k in result["kernels"]]
    assert f"default rule: {rule}" in rules and not any("naive" in r for r in rules)
    rows = {(b["variant"], b["tuned"]): b for b in result["benchmarks"]}
    assert set(rows) == {("fp32", False), ("int8", False)}  # both, same board, same session
    core = {"rpi4": "cortex-a72", "rpi5": "cortex-a76", "graviton3": "max"}[board]
    assert {b["device"] for b in rows.values()} == {f"{board} (emulated: QEMU {core})"}
    exact = next(f for f in result["fidelity"] if f["reference"] == "int8 on this server")
    assert exact["variant"] == "int8" and exact["max_abs_err"] == 0.0
    # each quantized layer's kernel timed against its float kernel on the board, alone
    speed = result["quantization"]["layer_speed"]
    assert "error" not in speed, speed["error"]
    assert speed["device"] == f"{board} (emulated: QEMU {core})" and speed["method"] == "alone"
    assert speed["timed"] == speed["quantized_layers"] == len(speed["layers"]) > 0
    assert all(r["fp32_ms"] > 0 and r["quant_ms"] > 0 for r in speed["layers"])
    assert any(r["quant_schedule"] == f"default rule: {rule}" for r in speed["layers"])
    assert speed["slower"] == [r for r in speed["layers"] if r["ratio"] > speed["slower_by"]]
    if speed["slower"] and len(speed["slower"]) < speed["timed"]:  # named, not rebuilt in float
        assert speed["not_tried"] == "board"


def test_a_budget_on_a_board_chooses_by_llvm_mcas_estimate_and_the_board_times_the_choice(pool, tmp_path):
    """The digits CNN at batch 64 on rpi5 with a budget its int8 build misses (activations clipped to
    +-3): each point built for the board, its kernels estimated by llvm-mca on the Cortex-A76, its
    integer model compared with fp32 here; the chosen point keeps the budget, is estimated faster than
    fp32, becomes the job's int8 build, and the board runs and times it bit-exact with this server."""
    from tests.test_precision import digits_batch_files

    model, _ = digits_batch_files(tmp_path)
    clipped = {"quantize": "int8", "calibration": "global", "global_scale": "3"}
    error, result, _ = run_job(
        pool, tmp_path / "job", str(model), target="rpi5", accuracy_budget="30 dB", **clipped
    )
    assert error is None, error
    q = result["quantization"]
    search = q["precision_search"]
    assert "error" not in search, search["error"]
    assert search["timed_by"] == "llvm-mca" and "cortex-a76" in search["device"]
    points, chosen = search["points"], search["points"][search["chosen"]]
    assert points[0]["k"] == 0 and not points[0]["keeps"] and points[0]["sqnr_db"] < 30, points
    assert chosen["keeps"] and chosen["k"] is not None and chosen["sqnr_db"] >= 30, points
    assert chosen["speedup_vs_fp32"] > 1.0 and chosen["pareto"], points
    assert all(0.9 < p["analysed_flop_share"] <= 1.0 for p in points), points  # conv and matmul loops
    assert sorted(q["skipped"]) == chosen["float_layers"]
    rows = {(b["variant"], b["tuned"]): b for b in result["benchmarks"]}
    assert set(rows) == {("fp32", False), ("int8", False)}
    assert {b["device"] for b in rows.values()} == {"rpi5 (emulated: QEMU cortex-a76)"}
    exact = next(f for f in result["fidelity"] if f["reference"] == "int8 on this server")
    assert exact["max_abs_err"] == 0.0  # the board ran the point chosen, as this server runs it


def test_a_language_model_on_rpi5_decodes_on_the_board_in_float_int8_and_int4_beside_llvm_mcas_estimate(
    pool, tmp_path, tiny_lm, app
):
    """An uploaded causal LM with a KV cache, target rpi5: the generate stage builds its decode step for
    the board in float and with int8 and int4 weights, each estimated by llvm-mca on the Cortex-A76's
    model; the remote stage times each on the emulated board and checks its logits."""
    from tests.test_pages import write_job

    error, result, stages = run_job(pool, tmp_path / "job", str(tiny_lm), target="rpi5", quantize="none")
    assert error is None, error
    assert stages["generate"]["status"] == "done" and stages["remote"]["status"] == "done"
    g = result["generation"]
    assert g["board"] == "rpi5" and "error" not in g, g.get("error")
    assert g["variants"] == ["fp32", "int8-g128", "int4-g32", "int4-g128"]
    rows = {r["variant"]: r for r in g["rows"]}
    assert set(rows) == set(g["variants"])
    assert {r["device"] for r in rows.values()} == {g["device"]} == {"rpi5 (emulated: QEMU cortex-a76)"}
    assert all(r["past"] == 128 and r["median_ms"] > 0 for r in rows.values())
    assert all(r["tokens_per_s"] == round(1e3 / r["median_ms"], 2) for r in rows.values())
    assert rows["fp32"]["logits_sqnr_db"] > 60, rows  # the board's float logits = ONNX Runtime's here
    assert all(10 < rows[v]["logits_sqnr_db"] < 60 for v in g["variants"][1:]), rows  # against its fp32
    for v in g["variants"]:
        library = (tmp_path / "job" / "remote" / f"generate-{v}.so").read_bytes()
        assert library[:4] == b"\x7fELF" and int.from_bytes(library[18:20], "little") == 0xB7  # aarch64
    (point,) = g["points"]
    mca = {v: point["variants"][v]["mca"] for v in g["variants"]}
    assert all(m["cpu"] == "cortex-a76" and m["clock_ghz"] == 2.4 and m["threads"] == 4 for m in mca.values())
    assert all(0 < m["analysed"] <= m["kernels"] and m["predicted_ms"] > 0 for m in mca.values())
    assert any(k["name"].startswith("weight_only_4b") for k in mca["int4-g32"]["top"])  # its own kernels
    assert point["variants"]["int4-g32"]["streamed_bytes"] < point["variants"]["fp32"]["streamed_bytes"] / 4
    # the page: the board's table, its emulation said, each build's time and estimate
    job_id = write_job(
        app, result, options={"model_file": "model.onnx", "target": "rpi5", "quantize": "none"}
    )
    page = app.test_client().get(f"/r/{job_id}").get_data(as_text=True)
    assert "Generation on the board" in page and 'id="generation-emulated"' in page
    table = page[page.index('id="generation-board"') :]
    for v in g["variants"]:
        assert (
            f"{rows[v]['tokens_per_s']:,.2f}" in table and f"{mca[v]['predicted_tokens_per_s']:,.1f}" in table
        )


def test_floor_to_int_on_arm_is_one_fcvtms_and_equals_numpy_floor_at_the_extremes(pool, tmp_path):
    """A quantized layer's last rounding, int32(floor(x)), in one fcvtms on Arm (passes/lowering.py),
    scalar and in vectors of 8: on the emulated board, the same integers as numpy's floor, saturated at
    the int32 bounds (infinities too), NaN as 0, as frintm + fcvtzs gave."""
    import tvm
    from tvm import rpc
    from tvm.script import tirx as T

    from webapp.pipeline.passes import lowering
    from webapp.targets import get

    @T.prim_func
    def floor_to_int(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
        for i in range(64):
            B[i] = T.Cast("int32", T.floor(A[i]))
        for o in range(8):
            for i in T.vectorized(8):
                C[o * 8 + i] = T.Cast("int32", T.floor(A[o * 8 + i]))

    target = get("rpi5")
    lib = tvm.tirx.build(tvm.IRModule({"main": floor_to_int}), target=target.tvm, pipeline=lowering.PIPELINE)
    asm = lib.inspect_source("asm")
    assert "fcvtms" in asm and "frintm" not in asm and "fcvtzs" not in asm
    target.export_library(lib, str(tmp_path / "floor.so"))

    edges = [-3e9, 3e9, np.nan, np.inf, -np.inf, -2.5, -2.0, -0.5, -0.0, 0.5, 2.5, 1e-30, -1e-30, 7.99999]
    spread = np.random.default_rng(0).standard_normal(64 - len(edges)) * 1000
    values = np.array(edges + list(spread), "float32")

    def on_the_board() -> list[np.ndarray]:
        host, port, matchkey = Tracker(pool.tracker).request("rpi5", 60)
        session = rpc.connect(host, port, matchkey)
        session.upload(str(tmp_path / "floor.so"))
        dev = session.cpu()
        args = [tvm.runtime.tensor(a, dev) for a in (values, np.zeros(64, "int32"), np.zeros(64, "int32"))]
        session.load_module("floor.so")["main"](*args)
        return [a.numpy() for a in args[1:]]

    scalar, vector = on_the_board()
    gc.collect()  # the session ends with its last remote object: the board is free for the next test
    expected = np.clip(np.floor(np.nan_to_num(values.astype("float64"), nan=0.0)), -(2**31), 2**31 - 1)
    expected = expected.astype("int32")
    assert (scalar == expected).all() and (vector == expected).all()


def test_a_board_killed_mid_job_fails_it_and_the_next_job_runs_on_the_restarted_board(pool, tmp_path):
    board = next(b for b in read_status(pool)["boards"] if b["key"] == "rpi4")
    slow = replace(pool, bench_budget_s=30.0)  # ~0.3 s a run on the emulated board: timing lasts 15 s
    outcome = {}
    form = {"target": "rpi4", "quantize": "none"}
    job = threading.Thread(
        target=lambda: outcome.update(
            error=compile_locally(slow, "transformer-block", form, tmp_path / "killed")
        )
    )
    job.start()
    progress = tmp_path / "killed" / "progress.json"

    def on_the_board():
        stages = json.loads(progress.read_text())["stages"] if progress.is_file() else []
        remote = next((s for s in stages if s["name"] == "remote"), {})
        return remote.get("status") == "running" and "board" in (remote.get("detail") or {})

    wait_until(on_the_board, 240, "the job reaching the board")
    time.sleep(4.0)
    os.kill(board["pid"], signal.SIGKILL)  # the board's jail (bwrap); --die-with-parent takes the rest
    job.join(timeout=120)
    assert not job.is_alive(), "the job did not end after its board was killed"
    assert outcome["error"]["stage"] == "remote"
    assert "stopped while running the fp32 build" in outcome["error"]["message"], outcome["error"]

    def restarted():
        boards = {b["key"]: b for b in read_status(pool)["boards"]}
        return boards["rpi4"]["restarts"] >= 1 and boards["rpi4"]["state"] == "running"

    wait_until(restarted, 120, "the board's restart")
    error, result, _ = run_job(pool, tmp_path / "next", "mlp", target="rpi4", quantize="none")
    assert error is None, error
    assert result["device"]["key"] == "rpi4"


def test_tracker_down_fails_the_job_at_remote_with_a_plain_message(pool, tmp_path):
    nowhere = replace(pool, tracker=f"127.0.0.1:{free_port()}")
    error, _, stages = run_job(nowhere, tmp_path / "job", "mlp", target="rpi5", quantize="none")
    assert error["stage"] == "remote" and stages["build"]["status"] == "done"
    assert f"tracker at {nowhere.tracker} is not answering" in error["message"]
    assert "Traceback" not in error["message"]


def test_no_free_board_in_time_fails_at_remote_and_says_what_the_pool_has(pool, tmp_path):
    busy = replace(pool, board_wait_s=3)
    from tvm import rpc

    host, port, matchkey = Tracker(pool.tracker).request("rpi5", 10)
    session = rpc.connect(host, port, matchkey)  # holds the pool's only rpi5 board
    error, _, _ = run_job(busy, tmp_path / "job", "mlp", target="rpi5", quantize="none")
    del session
    assert error["stage"] == "remote"
    assert "No 'rpi5' board became free within 3 s" in error["message"]
    assert "rpi5: 1 board(s), 0 free" in error["message"]


def test_x86_job_is_unaffected_when_no_tracker_runs(pool, tmp_path):
    nowhere = replace(pool, tracker=f"127.0.0.1:{free_port()}")
    error, result, stages = run_job(nowhere, tmp_path / "job", "mlp", target="x86-host", quantize="none")
    assert error is None, error
    assert stages["remote"]["status"] == "skipped" and "device" not in result
    assert {b["runtime"] for b in result["benchmarks"]} == {"tvm", "pytorch", "onnxruntime"}


# ---------------------------------------------------------------- a board joined as a real Pi would

BINFMT = Path("/proc/sys/fs/binfmt_misc")


@pytest.fixture()
def aarch64_binfmt():
    """TVM's stock rpc_server runs each session in a new Python process (exec): under user-mode QEMU
    that needs the kernel to hand aarch64 programs to qemu (binfmt_misc), where a real Pi needs
    nothing. Registered for the test when this machine allows (and removed after); skips otherwise."""
    entry = BINFMT / "qemu-aarch64"
    if entry.exists():
        yield
        return
    try:
        if not (BINFMT / "register").exists():
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
        (BINFMT / "register").write_text(Path("/usr/lib/binfmt.d/qemu-aarch64.conf").read_text())
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(
            f"the stock TVM rpc_server needs binfmt_misc under QEMU, which cannot be set up here: {exc}"
        )
    yield
    entry.write_text("-1")  # unregister what this test registered


def test_a_stock_rpc_server_registered_as_the_readme_says_serves_a_job(rootfs, aarch64_binfmt, tmp_path):
    port = free_port()
    tracker = subprocess.Popen(tracker_command("127.0.0.1", port), start_new_session=True)
    # The README's command for a real Pi, run in the arm64 root file system (no pool, no board.py)
    env = {"QEMU_LD_PREFIX": str(rootfs), "QEMU_CPU": "cortex-a76", "TVM_USE_RUNTIME_LIB": "1"}
    env |= {"LD_LIBRARY_PATH": LIBRARY_PATH, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    server_port = free_port()
    server = subprocess.Popen(
        [str(rootfs / "usr/bin/python3.11"), "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
         "--key", "rpi5", "--host", "127.0.0.1", "--port", str(server_port),
         "--port-end", str(server_port + 1)],
        env=env, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: boards_of(f"127.0.0.1:{port}").get("rpi5"), 120, "registration")
        config = Config(
            data_dir=tmp_path / "data", bench_budget_s=0.3, bench_threads=2, wall_limit_s=600,
            shipped_tuning_records=False, tracker=f"127.0.0.1:{port}", board_wait_s=60,
        )  # fmt: skip
        error, result, _ = run_job(config, tmp_path / "job", "mlp", target="rpi5", quantize="none")
        assert error is None, error
        assert result["device"].pop("threads") >= 1  # asked of the board's TVM runtime
        assert result["device"] == {
            "name": f"rpi5 (real board at 127.0.0.1:{server_port})",
            "key": "rpi5",
            "emulated": False,
            "address": f"127.0.0.1:{server_port}",
        }
        assert all(f["max_abs_err"] < 1e-4 for f in result["fidelity"])
    finally:
        stop_processes(server, tracker)


def test_code_for_a_core_the_board_lacks_dies_of_sigill_and_the_board_serves_on(pool, tmp_path):
    """rpi5's int8 build (sdot) sent to an rpi4 board (Cortex-A72, no dot product): the emulated core
    dies of SIGILL, the job fails at remote with a plain message, and the board serves the next job."""
    from webapp.jobs.worker import close_progress, run_remote_stage

    error, result, _ = run_job(pool, tmp_path / "job", "mlp", target="rpi5", quantize="int8")
    assert error is None and result["instructions"]["sdot"] > 0, error
    outcome = run_remote_stage(pool, tmp_path / "job", "rpi4")  # the wrong board for this code
    error = close_progress(tmp_path / "job", outcome.returncode, outcome.limit)
    assert error["stage"] == "remote"
    assert "stopped while running the int8 build" in error["message"] and "SIGILL" in error["message"]
    board_log = (pool.devices_dir / "boards" / "rpi4.log").read_text()
    assert "uncaught target signal 4 (Illegal instruction)" in board_log  # what the emulated core did
    error, result, _ = run_job(pool, tmp_path / "next", "mlp", target="rpi4", quantize="none")
    assert error is None and result["device"]["key"] == "rpi4", error


def test_a_pi_job_from_the_browser_shows_its_emulated_board(pool, tmp_path):
    """The form in chromium: rpi5, int8, an example; the result page's Device section and benchmark say
    emulated, and the index shows the pool's status line."""
    from conftest import CHROMIUM_ARGS
    from playwright.sync_api import expect, sync_playwright
    from werkzeug.serving import make_server

    from webapp import create_app
    from webapp.jobs.queue import JobQueue

    server = make_server("127.0.0.1", 0, create_app(pool), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    consumer = JobQueue(pool).consumer(workers=1)
    consumer.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_port}/")
            expect(page.get_by_text("rpi5: 1 board")).to_be_visible()
            page.select_option("select[name=example]", "mlp")
            page.check("input[name=target][value=rpi5]")
            page.select_option("select[name=quantize]", "int8")
            page.click("#submit")
            expect(page.locator("#job-status")).to_have_text("done", timeout=240_000)
            device = page.locator("#device")
            expect(device).to_contain_text("rpi5 (emulated: QEMU cortex-a76)")
            expect(device.locator("#device-kind")).to_have_text("emulated")
            expect(device).to_contain_text("bit-exact")
            expect(page.locator("#benchmark")).to_contain_text("emulated")
            # llvm-mca's per-kernel figures on the board's core, which QEMU's times are not
            mca = page.locator("#kernel-mca")
            expect(mca).to_contain_text("cortex-a76")
            expect(mca).to_contain_text("2.40 GHz (the board's nominal clock)")
            expect(mca).to_contain_text("emulated by QEMU, whose times are not a real board's")
            expect(page.locator("#kernel-table")).to_contain_text("cycles/iter")
            browser.close()
    finally:
        consumer.stop(graceful=True)
        server.shutdown()


PROBE = """
import json, os, socket, struct, sys
port, tracker_port = int(sys.argv[1]), int(sys.argv[2])
out = {"uid": os.getuid()}
try:
    socket.create_connection(("127.0.0.1", tracker_port), timeout=3)
    out["tcp"] = "connected"
except OSError as e:
    out["tcp"] = type(e).__name__
for path in ("/rootfs/x", "/usr/x", "/sockets/x", "/board/x"):
    try:
        open(path, "w").write("x")
        out[path] = "written"
    except OSError as e:
        out[path] = type(e).__name__
s = socket.socket(socket.AF_UNIX)
s.connect("/sockets/tracker.sock")
s.sendall(struct.pack("<i", 0x2F271))
s.recv(4)
fake = json.dumps([3, "rpi4", [port, "rpi4:0.5"], "10.0.0.66"]).encode()  # another key, another host
s.sendall(struct.pack("<i", len(fake)) + fake)
out["fake registration"] = "answered" if s.recv(4) else "connection closed"
print(json.dumps(out))
"""


def test_the_board_jail_has_no_network_no_writes_outside_its_folder_and_no_say_in_other_boards(
    pool, tmp_path
):
    """Python in the board's own jail (the command the pool runs, with a probe for a script): no TCP
    even to the tracker on loopback, the system and the pool's sockets read-only, its own user, and
    a registration under another key or address is refused by the pool's relay to the tracker."""
    from webapp.devices.pool import (
        BOARD_UID,
        Board,
        board_command,
        board_registration_only,
        relay,
        unix_listener,
    )

    board = Board("probe", "rpi5", "cortex-a76", uid=BOARD_UID + 9, port=free_port())
    sockets, folder = tmp_path / "s", tmp_path / "board"
    sockets.mkdir()
    (folder / "tmp").mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(folder, board.uid, board.uid)
    host, port = pool.tracker.rsplit(":", 1)
    connect = lambda: socket.create_connection((host, int(port)))  # noqa: E731
    relay(unix_listener(sockets / "tracker.sock"), connect, upstream=board_registration_only(board))
    args = ["-c", PROBE, str(board.port), port]
    r = subprocess.run(
        board_command(pool, board, pool.rootfs, folder, sockets, script_args=args),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tcp"] != "connected"
    assert all(out[p] != "written" for p in ("/rootfs/x", "/usr/x", "/sockets/x")), out
    assert out["/board/x"] == "written" and (folder / "x").read_text() == "x"
    assert out["fake registration"] == "connection closed"
    assert "10.0.0.66" not in json.dumps(tracker_summary(pool.tracker))
    if os.geteuid() == 0:
        assert out["uid"] == board.uid


def test_the_remote_stage_trusts_nothing_the_pipeline_wrote_but_libraries_and_arrays(pool, tmp_path):
    """A module planted in the job folder is not imported by the remote stage (it runs there, with
    network), and a plan naming a file outside remote/ is refused."""
    from webapp.jobs.worker import close_progress, run_remote_stage

    error, _, _ = run_job(pool, tmp_path / "job", "mlp", target="rpi5", quantize="none")
    assert error is None, error
    job = tmp_path / "job"
    (job / "numpy.py").write_text("open(__file__ + '.imported', 'w').close()\nraise SystemExit(7)\n")
    outcome = run_remote_stage(pool, job, "rpi5")
    assert close_progress(job, outcome.returncode, outcome.limit) is None
    assert not (job / "numpy.py.imported").exists()
    plan = json.loads((job / "remote" / "plan.json").read_text())
    plan["builds"][0]["file"] = "../../../etc/passwd"
    (job / "remote" / "plan.json").write_text(json.dumps(plan))
    outcome = run_remote_stage(pool, job, "rpi5")
    error = close_progress(job, outcome.returncode, outcome.limit)
    assert error["stage"] == "remote" and "names a library outside remote/" in error["message"]
