"""The kernel lab (webapp/jobs/lab.py, webapp/pipeline/lab.py): a kernel's TVMScript and a schedule
typed by a user, built in the sandbox for a CPU preset, shown as scheduled TIR, LLVM IR, assembly with
its hot loop, llvm-mca's report, checked against the unscheduled kernel and timed; hostile code ends
with a clear message and changes nothing outside its folder."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest

from webapp.jobs.lab import create_lab, lab_view, run_lab

MATMUL = """from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def main(
    A: T.Buffer((256, 256), "float32"), B: T.Buffer((256, 256), "float32"), C: T.Buffer((256, 256), "float32")
):
    for i, j, k in T.grid(256, 256, 256):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


def schedule(sch):
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    io, ii = sch.split(i, [None, 4])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(io, jo, k, ii, ji)
    sch.vectorize(ji)
    sch.parallel(io)
"""


def lab(client, code: str, target: str = "x86-host", timeout: float = 120) -> dict:
    answer = client.post("/api/lab", json={"code": code, "target": target})
    assert answer.status_code == 202, answer.get_json()
    url = answer.get_json()["api_url"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(url).get_json()
        if view["status"] in ("done", "failed"):
            return view
        time.sleep(0.3)
    raise AssertionError(f"the lab run did not end in {timeout} s: {view}")


def test_a_schedule_is_built_shown_checked_and_timed_and_another_split_changes_the_code(client):
    first = lab(client, MATMUL)
    assert first["status"] == "done", first
    r = first["result"]
    assert r["check"]["matches"] is True and r["check"]["largest_difference"] < 1e-2
    assert r["time"]["by"] == "measured" and r["time"]["ms"] > 0 and r["time"]["threads"] == 2
    texts = first["texts"]
    assert "T.vectorized(16)" in texts["tir"] and "T.parallel(64)" in texts["tir"]
    start, end = r["hot_loop"]
    hot = "\n".join(texts["asm"].splitlines()[start - 1 : end])
    assert "vfmadd" in hot or "vmulps" in hot, hot  # the vectorized loop's multiply-adds are in it
    assert "define" in texts["llvm"] and "Iterations:" in texts["mca"]
    assert r["mca"]["cycles_per_iteration"] > 0

    other = lab(client, MATMUL.replace("[None, 16]", "[None, 8]"))
    assert other["status"] == "done" and other["result"]["check"]["matches"] is True, other
    assert "T.vectorized(8)" in other["texts"]["tir"] and other["texts"]["asm"] != texts["asm"]
    assert other["result"]["time"]["ms"] > 0


def test_a_board_gets_llvm_mcas_estimate_and_no_run(client):
    view = lab(client, MATMUL, "rpi5")
    assert view["status"] == "done", view
    r = view["result"]
    assert r["time"]["by"] == "llvm-mca" and r["time"]["ms"] > 0 and r["check"]["matches"] is None
    assert "rpi5" in r["check"]["why"] and "fmla" in view["texts"]["asm"]


@pytest.mark.parametrize(
    ("change", "stage", "line", "words"),
    [
        (("[i, j, k])", "[i, j, q])"), "parse", 10, "Undefined variable: q"),
        (("sch.vectorize(ji)", "sch.vectorize(k)"), "schedule", 21, "vectorize"),
        (("def schedule(sch):", "def schedule(sch)"), "parse", 16, "SyntaxError"),
    ],
)
def test_an_error_says_its_stage_and_the_line_of_the_code(client, change, stage, line, words):
    view = lab(client, MATMUL.replace(*change))
    assert view["status"] == "failed" and view["stage"] == stage and view["line"] == line, view
    assert words in view["error"]


def test_code_and_targets_the_lab_cannot_take_are_refused_at_once(client):
    for body, words in [
        ({"code": "", "target": "x86-host"}, "Send the kernel's code"),
        ({"code": MATMUL, "target": "cuda"}, "Choose a CPU target"),
        ({"code": "x" * 70_000}, "the lab takes 64,000 at most"),
    ]:
        answer = client.post("/api/lab", json=body)
        assert answer.status_code == 400 and words in answer.get_json()["error"], answer.get_json()
    assert client.get("/api/lab/nothere").status_code == 404


HOSTILE = {
    "an endless loop": ("while True:\n    pass\n", "Wall-clock limit reached"),
    "a fork bomb": ("import os\nwhile True:\n    os.fork()\n", "Wall-clock limit reached"),
    "reading outside its folder": ("open({secret!r}).read()\n", "FileNotFoundError"),
    "opening a socket": (
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
        "ConnectionRefusedError",  # a network of its own: nothing listens there
    ),
    "filling the disk": (
        "with open('fill', 'wb') as f:\n    while True:\n        f.write(bytes(1 << 20))\n",
        "File too large",
    ),
    "a huge output": ("while True:\n    print('x' * 100000)\n", "File too large"),
    "ctypes calling system": (
        "import ctypes\nctypes.CDLL(None).system(b'touch {marker}')\n",
        "defines no PrimFunc named main",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_ends_with_a_clear_message_and_changes_nothing_outside_its_folder(
    config, tmp_path, name
):
    """Each run under tighter limits than the lab's own (the same limits, sooner)."""
    secret, marker = tmp_path / "secret.txt", tmp_path / "touched"
    secret.write_text("not the sandbox's to read")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    reached = []

    def accept() -> None:
        for _ in range(200):
            try:
                reached.append(listener.accept())
                return
            except TimeoutError:
                continue
            except OSError:  # closed: the run has ended
                return

    threading.Thread(target=accept, daemon=True).start()
    code, words = HOSTILE[name]
    code = code.format(secret=str(secret), port=listener.getsockname()[1], marker=str(marker))
    tight = dataclasses.replace(config, wall_limit_s=20, output_limit_mb=16)
    lab_id = create_lab(tight, code, "x86-host")
    made = {tight.timing_lock_path.name}  # the worker's, made where it times
    before = sorted(p.name for p in tight.data_dir.iterdir() if p.name not in made)
    run_lab(tight, lab_id)
    view = lab_view(tight, lab_id)
    listener.close()
    assert view is not None and view["status"] == "failed" and words in (view.get("error") or ""), view
    assert not marker.exists() and not reached and secret.read_text() == "not the sandbox's to read"
    assert sorted(p.name for p in tight.data_dir.iterdir() if p.name not in made) == before


@pytest.mark.parametrize("name", ["matmul", "conv2d_nhwc", "depthwise_conv2d", "softmax", "layer_norm"])
def test_each_starter_builds_matches_its_unscheduled_kernel_and_is_timed(client, name):
    from webapp.jobs.lab import starters

    view = lab(client, starters()[name])
    assert view["status"] == "done", view
    assert view["result"]["check"]["matches"] is True and view["result"]["time"]["ms"] > 0, view["result"]


@pytest.mark.isa
@pytest.mark.parametrize(("target", "instruction"), [("x86-host", None), ("rpi5", "sdot")])
def test_the_int8_starter_runs_on_the_targets_dot_product_instruction(client, target, instruction):
    """On this server's CPU its instruction where it has one (vpdpbusd with VNNI), else vectorized loops
    (AVX2); on the Pi 5 sdot, in the hot loop llvm-mca analyses."""
    from webapp.jobs.lab import starters

    view = lab(client, starters()["int8_matmul_dot"], target)
    assert view["status"] == "done", view
    r, asm = view["result"], view["texts"]["asm"]
    hot = "\n".join(asm.splitlines()[r["hot_loop"][0] - 1 : r["hot_loop"][1]])
    if target != "x86-host":
        assert instruction in hot, hot
        return
    from webapp.targets import get

    assert r["check"]["matches"] is True
    kind = get("x86-host").dot_instruction() or ""  # this CPU's (in make test's isa pass, AVX2's: none)
    if "VNNI" in kind:
        assert "vpdpbusd" in hot, hot
    else:  # its int8 form is a pair of instructions, which the starter leaves to LLVM's vectorizer
        assert "vpdpbusd" not in asm
