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

from webapp.jobs.lab import create_lab, lab_dir, lab_view, run_lab

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


def lab_settled(page) -> str:
    """The lab page's status once its newest build has ended ("built ..." or "failed ...")."""
    page.wait_for_function(
        "/^(built|failed)/.test(document.getElementById('lab-status').textContent)", timeout=120_000
    )
    return page.inner_text("#lab-status")


def replace_code(page, code: str) -> str:
    """Selects the editor's text and pastes `code` over it, as a user would; returns the page's address
    before, so that the next build's can be told from it."""
    before = page.url
    page.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(code)
    return before


def test_a_resnet18_kernel_opened_in_the_lab_edited_broken_and_reopened_by_its_link(
    page, live_server, client
):
    """From a ResNet-18 job's code view to the lab; a schedule typed in, then its split factor changed:
    new assembly and a new time, each build a new short link; an error marked on its line; a build's
    short link opened in another browser context shows its code and its assembly."""

    from tests.conftest import wait_for_job

    answer = client.post("/api/jobs", data={"example": "resnet18", "target": "x86-host"})
    job = wait_for_job(client, answer.get_json()["id"], timeout=600)
    assert job["status"] == "done", job["error"]
    job_id, kernels = job["id"], job["results"]["kernels"]
    # the stem's 7x7 convolution: a direct one (its block conv2d_nhwc), never Winograd's
    kernel = next(
        k["name"] for k in kernels if "/stem/stem.0/stem.0.0/Conv" in k["layers"] and k["reproducer"]
    )
    page.goto(f"{live_server}/r/{job_id}?view=asm&kernel={kernel}#code")
    page.locator("#open-in-lab").click()
    assert lab_settled(page).startswith("built")
    assert "matches the unscheduled kernel" in page.inner_text("#lab-check")
    first = page.request.get(live_server + "/api/lab/" + page.url.rsplit("/", 1)[1]).json()
    assert first["target"] == "x86-host" and kernel in first["code"]

    schedule = """def schedule(sch):
    block = sch.get_sblock("conv2d_nhwc")
    loops = sch.get_loops(block)
    outer, inner = sch.split(loops[3], [None, 16])
    sch.reorder(*loops[:3], outer, *loops[4:], inner)
    sch.vectorize(inner)
"""
    code = first["code"][: first["code"].index("def schedule(sch):")] + schedule
    asm, times = [], []
    for factor in ("16", "8"):
        before = replace_code(page, code.replace("[None, 16]", f"[None, {factor}]"))
        page.wait_for_url(lambda url, before=before: url != before, timeout=30_000)
        assert lab_settled(page).startswith("built"), page.inner_text("#lab-error")
        assert "matches the unscheduled kernel" in page.inner_text("#lab-check")
        asm.append(page.inner_text("#lab-text"))
        times.append(page.inner_text("#lab-time"))
        assert "measured" in times[-1] and page.locator("#lab-text .hot").count() > 0
    assert asm[0] != asm[1] and "zmm" in asm[0] + asm[1]  # 16 lanes, then 8: other registers, other code
    assert times[0] != times[1]
    link = page.url

    broken = code.replace("[None, 16]", "[None, 8]").replace("sch.split(loops[3]", "sch.split(loopz[3]")
    line = broken.splitlines().index("    outer, inner = sch.split(loopz[3], [None, 8])") + 1
    replace_code(page, broken)
    assert lab_settled(page).startswith("failed at schedule")
    assert page.inner_text("#lab-error").startswith(f"line {line}: NameError")
    marked = page.locator(".cm-lintRange-error")
    assert marked.count() == 1 and "loopz" in marked.inner_text()

    other = page.context.browser.new_context().new_page()  # a fresh context: no state of this one
    other.goto(link)
    assert lab_settled(other).startswith("built")
    other.locator(".cm-content").click()
    other.keyboard.press("Control+End")  # the editor draws the lines in view: its end, the schedule
    assert "[None, 8]" in other.locator(".cm-content").inner_text()
    assert other.inner_text("#lab-text") == asm[1]
    other.context.close()


def test_the_lab_from_the_shell_prints_the_hot_loop_the_check_and_the_time_or_the_line_at_fault(tmp_path):
    from tests.test_cli import cli

    starter = cli("lab", "--starter", "matmul", cwd=tmp_path, data=tmp_path / "data")
    assert starter.returncode == 0 and "def schedule(sch):" in starter.stdout
    (tmp_path / "k.py").write_text(MATMUL)
    built = cli("lab", tmp_path / "k.py", cwd=tmp_path, data=tmp_path / "data")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "check: matches" in built.stdout and "(measured, median of" in built.stdout
    assert any(line.startswith("> ") and "vfmadd" in line for line in built.stdout.splitlines())
    (tmp_path / "bad.py").write_text(MATMUL.replace("sch.vectorize(ji)", "sch.vectorize(k)"))
    failed = cli("lab", tmp_path / "bad.py", "--target", "rpi5", cwd=tmp_path, data=tmp_path / "data")
    assert failed.returncode == 1 and failed.stdout.startswith("failed at the schedule stage, line 21:")


def test_an_edit_stops_the_build_it_was_made_on_while_that_one_still_runs(client):
    """The page shows only the newest build: an edit sent with its parent stops the parent's build where
    it is still queued or running (its JSON says so), and the edit's own build runs to its end."""
    first = client.post("/api/lab", json={"code": MATMUL, "target": "x86-host"}).get_json()["id"]
    edited = MATMUL.replace("[None, 16]", "[None, 8]")
    second = client.post("/api/lab", json={"code": edited, "target": "x86-host", "parent": first}).get_json()
    deadline = time.monotonic() + 120
    while (view := client.get(f"/api/lab/{second['id']}").get_json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline, view
        time.sleep(0.3)
    assert view["status"] == "done" and view["result"]["check"]["matches"] is True
    stopped = client.get(f"/api/lab/{first}").get_json()
    assert stopped["status"] == "stopped" and "later edit" in stopped["error"], stopped


def test_what_a_build_leaves_in_its_folder_is_read_as_plain_bounded_files_or_not_at_all(config, tmp_path):
    """The sandbox owns a build's folder while the web process polls it and the worker reads its log: a
    link put in place of a text is not followed, a FIFO is not waited on, a result.json of wrong types or
    numbers JSON has and Python cannot use gives fields of None, not an error."""
    import json
    import os

    from webapp.machine.sandbox import tail_text

    lab_id = create_lab(config, MATMUL, "x86-host")
    folder = lab_dir(config, lab_id)
    secret = tmp_path / "secret.txt"
    secret.write_text("the web process's own file")
    (folder / "kernel.s").symlink_to(secret)
    os.mkfifo(folder / "kernel.ll")
    os.mkfifo(folder / "log.txt")
    hostile = {"status": "done", "hot_loop": ["a", []], "line": 1e999}
    hostile["time"] = {"ms": 10**400, "by": "measured"}
    hostile["check"] = {"matches": "yes", "largest_difference": float("nan"), "wrong": 7}
    (folder / "result.json").write_text(json.dumps(hostile))
    view = lab_view(config, lab_id)
    assert view is not None and view["texts"]["asm"] is None and view["texts"]["llvm"] is None
    r = view["result"]
    assert r["hot_loop"] is None and r["line"] is None and r["time"]["ms"] is None
    assert r["check"] == {"matches": None, "largest_difference": None, "wrong": [], "why": None}
    assert tail_text(folder / "log.txt") == ""  # answered at once
