"""A real browser (Debian's chromium, driven by Playwright) walks the whole path a user walks."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from playwright.sync_api import expect

from tests.conftest import int8_instruction

# Records, in the page, each change of the status pill and of the sections shown: [{pill, sections}].
WATCH_THE_PAGE = """() => {
  window.seen = [];
  const log = () => {
    const pill = document.querySelector('#job-status');
    const sections = [...document.querySelectorAll('main section.card[id]')].map((s) => s.id);
    const state = {pill: pill ? pill.textContent.trim() : '', sections};
    const last = window.seen[window.seen.length - 1];
    if (!last || JSON.stringify(last) !== JSON.stringify(state)) window.seen.push(state);
  };
  log();
  new MutationObserver(log).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def assert_every_link_answers(page, job_url: str) -> int:
    """Every link of the result page into the job (files, JSON, share link) and every choice of its
    code picker answers 200; returns how many were fetched."""
    job_url = job_url.split("#")[0].split("?")[0]  # the page's address may carry a code view
    path = job_url.split("://", 1)[1].split("/", 1)[1]
    hrefs = page.eval_on_selector_all(
        f"a[href^='/{path}']", "links => links.map((a) => a.getAttribute('href'))"
    )
    views = page.eval_on_selector_all("#code-view option", "os => os.map((o) => o.value)")
    urls = {job_url.split("/r/")[0] + h for h in hrefs}
    urls |= {f"{job_url}/code?view={v}" for v in views} | {f"{job_url}?view={v}" for v in views}
    kernels = page.request.get(f"{job_url}.json").json()["results"].get("kernels", [])
    urls |= {f"{job_url}/code?view=tir&kernel={k['name']}" for k in kernels}
    for url in sorted(urls):
        assert page.request.get(url).status == 200, url
    return len(urls)


def code_panel_ready(page) -> None:
    """Wait until htmx has swapped in the code panel and wired up its picker (as a person would)."""
    page.wait_for_function(
        "() => { const f = document.querySelector('.code-picker');"
        " return f && f['htmx-internal-data'] && !document.querySelector('.htmx-request, .htmx-settling'); }"
    )


def test_upload_watch_stages_read_results_and_reload_by_share_link(
    page, live_server, example_files, tmp_path
):
    # A job ahead of this one in the queue (one worker): this one is seen queued, then running.
    ahead = page.request.post(live_server + "/api/jobs", multipart={"example": "mlp", "target": "x86-host"})
    ahead_url = ahead.json()["api_url"]
    deadline = time.monotonic() + 60
    while page.request.get(ahead_url).json()["status"] == "queued" and time.monotonic() < deadline:
        time.sleep(0.2)

    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(example_files / "cnn-small.onnx"))
    page.check("input[name=target][value=x86-host]")
    page.click("#submit")

    # The job page updates itself (htmx polling, no reload) and turns into the result page.
    expect(page).to_have_url(re.compile(r"/r/[A-Za-z0-9_-]{22,}$"))
    share_url = page.url
    page.evaluate(WATCH_THE_PAGE)
    expect(page.locator("#job-status")).to_have_text("done", timeout=240_000)
    page.wait_for_timeout(300)  # the last swap settles
    seen = page.evaluate("window.seen")  # still there: the page was never reloaded
    pills = [s["pill"] for i, s in enumerate(seen) if i == 0 or s["pill"] != seen[i - 1]["pill"]]
    assert pills == ["queued", "running", "done"], seen
    # The model summary is there as soon as import is done, long before the job ends; the sections
    # only ever come in (the stages after inspect may take less than a poll, so graph and benchmark
    # can arrive together).
    running = [set(s["sections"]) for s in seen if s["pill"] == "running"]
    assert any("summary" in shown and "benchmark" not in shown for shown in running), seen
    assert all(a <= b for a, b in zip(running, running[1:], strict=False)), seen
    for stage in ("import", "optimize", "build", "inspect", "benchmark"):
        expect(page.locator(f".stage[data-stage={stage}] .status")).to_have_text("done")

    # The graph, before and after fusion, drawn inline with pan/zoom controls (set up on the swapped-in
    # section).
    expect(page.locator("#graph-fused .panzoom svg g.node").first).to_be_visible()
    page.click("button.tab[data-tab=graph-imported]")
    expect(page.locator("#graph-imported .panzoom svg g.node").first).to_be_visible()
    expect(page.locator("#graph-imported .zoom-buttons")).to_have_count(1)
    drawing = page.locator("#graph-imported .panzoom svg g.graph")
    fitted = drawing.bounding_box()
    page.locator("#graph-imported .zoom-buttons button", has_text="+").click()
    expect(page.locator("#graph-imported .panzoom svg g.svg-pan-zoom_viewport")).to_have_count(1)
    width = "document.querySelector('#graph-imported .panzoom svg g.graph').getBoundingClientRect().width"
    page.wait_for_function(f"w => {width} > w", arg=fitted["width"] * 1.1)

    # Switch code views: imported Relax, a kernel's TIR, its assembly, then one without kernels.
    expect(page.locator("#code-text")).to_contain_text("R.nn.conv2d")
    code_panel_ready(page)
    page.select_option("#code-view", "tir")
    expect(page.locator(".code-title")).to_contain_text("TIR of a kernel")
    code_panel_ready(page)
    expect(page.locator("#code-text")).to_contain_text("T.prim_func")
    options = page.locator("#code-kernel option").all_inner_texts()
    kernel = next(o for o in options if o.startswith("fused_conv2d"))
    page.select_option("#code-kernel", kernel)
    expect(page.locator(".code-title code")).to_have_text(kernel)
    code_panel_ready(page)
    page.select_option("#code-view", "asm")
    expect(page.locator(".code-title")).to_contain_text("Assembly")
    code_panel_ready(page)
    expect(page.locator("#code-text")).to_contain_text(kernel)
    # the selection is in the address: a shared link opens it, Back returns to the one before
    expect(page).to_have_url(re.compile(rf"view=asm&kernel={kernel}#code$"))
    shared = page.url
    page.go_back()
    expect(page).to_have_url(re.compile(rf"view=tir&kernel={kernel}#code$"))
    expect(page.locator(".code-title")).to_contain_text("TIR of a kernel")
    other = page.context.browser.new_page()
    other.goto(shared)
    expect(other.locator("#code-view")).to_have_value("asm")
    expect(other.locator(".code-title code")).to_have_text(kernel)
    other.close()
    page.goto(shared)
    code_panel_ready(page)
    page.select_option("#code-view", "bytecode")
    expect(page.locator(".code-title")).to_have_text("VM bytecode")  # no stale kernel name
    code_panel_ready(page)
    page.select_option("#code-view", "passes")
    expect(page.locator(".code-title")).to_contain_text("IR after each pass")
    expect(page.locator("#code-pass")).to_be_visible()
    numbers = [int(o.split(".")[0]) for o in page.locator("#code-pass option").all_inner_texts()]
    assert numbers == list(range(1, len(numbers) + 1))  # 1, 2, 3..., whatever the passes' global index
    code_panel_ready(page)
    page.check("input[name=diff]")
    expect(page.locator("#code-text")).to_contain_text("+++ after")

    # Benchmark table and chart (an axis with its ticks in ms); fidelity.
    rows = page.locator("#bench-table tr")
    expect(rows).to_have_count(3)  # header, tvm, onnxruntime (an upload has no PyTorch model)
    expect(page.locator("#bench-table")).to_contain_text("onnxruntime")
    expect(page.locator("#bench-chart rect")).to_have_count(2)
    ticks = page.locator("#bench-chart .tick-label").all_text_contents()
    assert len(ticks) >= 3 and all(float(t) >= 0 for t in ticks), ticks
    values = [float(v) for v in ticks]
    assert values == sorted(values) and len(set(values)) == len(values)
    expect(page.locator("#bench-chart-axis")).to_contain_text("Median latency, ms")
    bars, labels = page.locator("#bench-chart rect"), page.locator("#bench-chart text.value")
    for i in range(bars.count()):  # each value is printed at the end of its bar
        box = bars.nth(i).bounding_box()
        assert abs(labels.nth(i).bounding_box()["x"] - (box["x"] + box["width"])) < 12
    expect(page.locator("#fidelity-table")).to_contain_text("1.000000")
    expect(page.locator("#fidelity-table")).not_to_contain_text("agreement")  # one input: not shown

    # Every link on the page answers, downloads and code views included.
    assert assert_every_link_answers(page, share_url) > 10

    # The share link shows the same result in a fresh page.
    other = page.context.browser.new_page()
    other.goto(share_url)
    expect(other.locator("#job-status")).to_have_text("done")
    expect(other.locator("#bench-table")).to_contain_text("tvm")
    other.close()


def test_form_shows_a_clear_error_for_a_file_that_is_not_a_model(page, live_server, tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("just some text")
    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(bad))
    page.click("#submit")
    expect(page.locator("#form-error")).to_contain_text("neither an ONNX model nor a PyTorch .pt2")


def test_failed_job_page_names_the_stage_and_the_reason(page, live_server, example_files, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes((example_files / "mlp.onnx").read_bytes()[:5000])
    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(cut))
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("failed", timeout=120_000)
    expect(page.locator("#job-error")).to_contain_text("Failed at the import stage")
    expect(page.locator(".stage[data-stage=import] .status")).to_have_text("failed")


def test_a_benchmark_that_cannot_run_leaves_a_done_job_with_its_reason(page, live_server, tmp_path):
    """A Slice whose starts and ends come in through an Add (random values: an end before its start):
    the job is done, the benchmark stage failed with its reason, the code and the log are there."""
    nodes = [
        helper.make_node("Add", ["starts", "zero"], ["s"]),
        helper.make_node("Add", ["ends", "zero"], ["e"]),
        helper.make_node("Slice", ["x", "s", "e", "axes"], ["sl"]),
        helper.make_node("ReduceSum", ["sl"], ["y"], keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("starts", "ends")]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("axes", 1))]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "slice.onnx"
    onnx.save(model, str(path))
    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(path))
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("done", timeout=120_000)
    expect(page.locator(".stage[data-stage=benchmark] .status")).to_have_text("failed")
    expect(page.locator("#benchmark-failed")).to_contain_text("The benchmark could not run")
    expect(page.locator("#code")).to_be_visible()
    log = page.request.get(page.url.split("?")[0].split("#")[0] + "/files/log.txt")
    assert log.ok and "Traceback" in log.text()


@pytest.mark.isa
def test_bits_sweep_of_the_digits_example_from_the_form(page, live_server):
    """One click: fp32 and every bit-width on the trained digits CNN; the page shows accuracy and
    latency against bits and the Quantization section for int8."""
    page.goto(live_server + "/")
    page.select_option("#example", "digits-cnn")
    page.select_option("#quantize", "sweep")
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    rows = page.locator("#sweep-table tr")
    expect(rows).to_have_count(1 + 1 + 4 + 3)  # header, fp32, int8..int1, int8 x 3 other calibrations
    expect(page.locator("#sweep-quality")).to_be_visible()
    expect(page.locator("#sweep-ms")).to_be_visible()
    int8 = page.locator("#sweep-table tr", has=page.locator("code", has_text=re.compile("^int8$")))
    accuracy = float(int8.locator("td").last.inner_text().rstrip("%"))
    fp32 = float(page.locator("#sweep-table tr").nth(1).locator("td").last.inner_text().rstrip("%"))
    assert fp32 > 95 and accuracy >= fp32 - 1
    expect(page.locator("#quantization")).to_contain_text("int8 integer kernels")
    expect(page.locator("#instructions")).to_contain_text(int8_instruction("x86-host"))
    expect(page.locator("#quant-layers tr")).to_have_count(1 + 3)
    # agreement on the held-out images, beside the accuracy it explains
    assert "top-1 agreement with fp32" in page.locator("#sweep-table tr").first.inner_text()
    # no broken download (the tuning database is offered only when the build used it)
    assert_every_link_answers(page, page.url)


def file_part(name: str, data: bytes) -> dict:
    """A file field of a multipart request, as Playwright sends one (its type by its name)."""
    mime = "image/png" if name.endswith(".png") else "application/octet-stream"
    return {"name": name, "mimeType": mime, "buffer": data}


def deep_onnx_model(path, blocks: int) -> None:
    """A chain of `blocks` MatMul + Add + Relu layers on a 1x8 vector: a graph of DenseNet-121's size
    (3 imported nodes, one fused kernel call a block) that builds in seconds (one kernel shape)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "input"
    for i in range(blocks):
        w, b = f"w{i}", f"b{i}"
        inits += [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, w)]
        inits += [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, b)]
        nodes += [
            helper.make_node("MatMul", [x, w], [f"m{i}"], name=f"/block{i}/fc/MatMul"),
            helper.make_node("Add", [f"m{i}", b], [f"a{i}"], name=f"/block{i}/fc/Add"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"/block{i}/act/Relu"),
        ]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "deep",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 8])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_densenet_sized_graph_fits_is_searched_and_links_a_node_to_its_assembly(
    page, live_server, tmp_path
):
    deep_onnx_model(tmp_path / "deep.onnx", 400)
    job = page.request.post(
        live_server + "/api/jobs",
        multipart={
            "model": file_part("deep.onnx", (tmp_path / "deep.onnx").read_bytes()),
            "target": "x86-host",
        },
    ).json()
    page.goto(job["url"])
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    page.reload()  # the finished page as a visitor opens it

    view = "#graph-fused"
    # the SVG is fetched and drawn after the page loads: over 5 s once with the other test worker busy
    expect(page.locator(f"{view} .panzoom svg g.node").first).to_be_attached(timeout=30_000)
    nodes = page.locator(f"{view} svg g.node").count()
    assert nodes >= 400
    # a graph this size fitted whole would draw its labels under 9 px: it opens at its top, readable
    opened = page.evaluate(f"""() => {{
        const svg = document.querySelector('{view} .panzoom svg'), g = svg.querySelector('g.graph');
        const v = svg.getBoundingClientRect(), b = g.getBoundingClientRect();
        const px = Math.min(...[...svg.querySelectorAll('g.node text')]
            .map((t) => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a));
        return [b.top >= v.top - 1 && b.top <= v.top + 40, b.height > v.height, px];
    }}""")
    assert opened[0] and opened[1] and opened[2] >= 9, opened
    expect(page.locator(f"{view} .minimap .viewport")).to_be_visible()

    # search by source layer finds the one call of block 377, and by kernel name every call
    page.fill(f"{view} .graph-search", "block377/")
    expect(page.locator(f"{view} .graph-found")).to_have_text("1 found")
    page.fill(f"{view} .graph-search", "fused_matmul")
    expect(page.locator(f"{view} .graph-found")).to_have_text(f"{400} found")
    page.fill(f"{view} .graph-search", "block377/")
    page.press(f"{view} .graph-search", "Enter")
    details = page.locator(f"{view} .node-details")
    expect(details).to_contain_text("/block377/fc/MatMul")
    selected = page.eval_on_selector(f"{view} g.node.selected", "g => g.id")
    kernel = page.locator(f"{view} .node-details a.to-code[data-view=asm]").get_attribute("data-kernel")
    assert kernel.startswith("fused_matmul")
    # the selected node is in view, at a readable size
    box = page.locator(f"{view} g.node.selected").bounding_box()
    frame = page.locator(f"{view} .panzoom").bounding_box()
    assert frame["y"] <= box["y"] and box["y"] + box["height"] <= frame["y"] + frame["height"]
    assert box["width"] > 60

    # node -> its kernel's assembly (a URL that can be shared) -> back to the node
    page.click(f"{view} .node-details a.to-code[data-view=asm]")
    # the kernel's view is rendered on its first request: on a loaded machine, seconds
    expect(page.locator(".code-title code")).to_have_text(kernel, timeout=30_000)
    assert "view=asm" in page.url and f"kernel={kernel}" in page.url and f"node={selected}" in page.url
    expect(page.locator("#code-text")).not_to_contain_text(".cfi_startproc")  # directives filtered
    expect(page.locator("#code-text .linenos").first).to_be_visible()  # numbered
    shared = page.url
    page.click("#code-back a.back-to-graph")
    expect(page.locator(f"{view} g.node.selected")).to_have_attribute("id", selected)

    # the shared link opens the same view in a fresh page, with its back link
    other = page.context.browser.new_page()
    other.goto(shared)
    expect(other.locator(".code-title code")).to_have_text(kernel)
    other.click("#code-back a.back-to-graph")
    expect(other.locator(f"{view} g.node.selected")).to_have_attribute("id", selected)
    other.close()


def run_example(page, live_server, options: dict, example: str = "cnn-small") -> str:
    """An example's job by the API, waited for; its page's address (an identical job answers at once)."""
    job = page.request.post(
        live_server + "/api/jobs", multipart={"example": example, "target": "x86-host", **options}
    ).json()
    deadline = time.monotonic() + 300
    while page.request.get(job["api_url"]).json()["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    return job["url"]


def test_the_linter_and_llvm_mca_link_their_findings_to_the_code(page, live_server):
    """The headline counts the kernel linter's findings as its table lists them (those on kernels under
    1% of a run listed, not counted); a finding opens the kernel's assembly at the marked line it
    names; a kernel's llvm-mca figures open its report."""
    # a sweep's int8 build is whole: no layer is kept in float by a timing (in one loaded full run the
    # finding this test links to was missing; a layer kept in float, so no input quantization kernel,
    # is the likeliest cause, not verified)
    page.goto(run_example(page, live_server, {"quantize": "sweep"}))
    said = page.locator("#headline-lint").inner_text()
    count = int(re.search(r"(\d+) finding", said).group(1))
    minor = int((re.search(r"(\d+) more on kernels under 1% of a run", said) or [0, 0])[1])
    # cnn-small int8: the input's quantization kernel loops without vector instructions
    assert count + minor >= 1
    expect(page.locator("#lint-table tr")).to_have_count(1 + count + minor)  # counted or not, all listed
    expect(page.locator("#lint-table tr.minor")).to_have_count(minor)
    finding = page.locator("#lint-table a[href*='line=']").first
    line = int(re.search(r"line=(\d+)", finding.get_attribute("href")).group(1))
    finding.click()
    expect(page.locator("#code-back")).to_contain_text(f"Line {line} is marked")
    marked = page.locator("#code-text .hll")
    expect(marked).to_have_count(1)
    box, mark = page.locator("#code-text").bounding_box(), marked.bounding_box()
    assert box["y"] <= mark["y"] <= box["y"] + box["height"]  # scrolled to it

    page.goto(page.url.split("?")[0])
    loop = page.locator("#kernel-table a", has_text="cycles/iter").first
    expect(page.locator("#kernel-mca")).to_contain_text("llvm-mca")
    loop.click()
    expect(page.locator(".code-title")).to_contain_text("llvm-mca")
    expect(page.locator("#code-text")).to_contain_text("Total Cycles")


@pytest.mark.isa
def test_compare_an_fp32_and_an_int8_job_of_one_model_from_the_result_page(page, live_server):
    fp32, int8 = run_example(page, live_server, {}), run_example(page, live_server, {"quantize": "int8"})
    page.goto(fp32)
    page.fill("#compare-other", int8 + "#quantization")  # a pasted link, as copied from the address bar
    page.click("#compare-with button")
    a, b = fp32.rsplit("/", 1)[1], int8.rsplit("/", 1)[1]
    expect(page).to_have_url(re.compile(rf"/compare/{a}/{b}$"))
    comparison = page.request.get(f"{live_server}/compare/{a}/{b}.json").json()
    assert comparison["a"]["headline"]["label"].startswith("TVM fp32")
    assert comparison["b"]["headline"]["label"] == "TVM int8"
    speedup = comparison["a"]["headline"]["ms"] / comparison["b"]["headline"]["ms"]
    assert comparison["speedup"] == speedup
    words = f"{speedup:.2f}× faster than" if speedup > 1.05 else f"{1 / speedup:.2f}× slower than"
    words = "about as fast as" if 1 / 1.05 <= speedup <= 1.05 else words
    expect(page.locator("#compare-speedup")).to_contain_text(f"B is {words} A")
    expect(page.locator("#compare-options tr.worst")).to_contain_text("int8")  # the option that differs
    expect(page.locator("#compare-benchmarks")).to_contain_text("int8")
    counts = {i["name"]: (i["a"], i["b"]) for i in comparison["instructions"]}
    before, after = counts[int8_instruction("x86-host")]  # the int8 build's integer products
    assert after > (before or 0), counts
    # kernels lined up by the source layers they compute: an fp32 kernel and its int8 twin, named
    # otherwise, in one row; the diff's default pair is such a row's
    twins = [r for r in comparison["kernels"] if r["layers"] and r["a"] and r["b"]]
    assert any({k["name"] for k in r["a"]} != {k["name"] for k in r["b"]} for r in twins), comparison[
        "kernels"
    ]
    row = next(
        r for r in comparison["kernels"] if comparison["diff"]["kernel_a"] in [k["name"] for k in r["a"]]
    )
    assert comparison["diff"]["kernel_b"] in [k["name"] for k in row["b"]]
    # the two fused graphs coloured by their difference: every convolution changed, in both
    for tag in ("a", "b"):
        page.wait_for_selector(f"#compare-graph-{tag} g.node[data-diff]")
        convs = page.locator(f"#compare-graph-{tag} g.node", has_text="conv2d")
        assert convs.count() == 3
        for i in range(3):
            expect(convs.nth(i)).to_have_attribute("data-diff", "changed")
        changed = comparison["graph_diff"]["counts"][tag]["changed"]
        expect(page.locator(f"#compare-graph-{tag} .diff-counts")).to_contain_text(f"{changed} changed")
    # a kernel call whose rule changed (an int8 convolution's: which ones depends on the CPU), its details
    # naming the two rules as the comparison does
    ruled = {
        i: d
        for i, d in comparison["graph_diff"]["b"].items()
        if any(w.startswith("rule: ") for w in d["why"])
    }
    assert ruled, comparison["graph_diff"]["b"]
    node, change = next(iter(ruled.items()))
    page.locator(f"#compare-graph-b g.node#{node}").click()
    expect(page.locator("#compare-graph-b .node-details")).to_contain_text(
        "; ".join(["changed", *change["why"]])
    )
    expect(page.locator("#compare-graph-a g.node.diff-match")).to_have_count(1)  # its match in A, outlined
    # by default the assembly of each one's slowest kernel, filtered as the code panel shows it
    assert comparison["diff"]["view"] == "asm" and comparison["diff"]["text"].startswith("---")
    assert ".cfi_startproc" not in comparison["diff"]["text"]
    expect(page.locator("#compare-diff")).to_contain_text(comparison["diff"]["kernel_b"])
    page.select_option("#compare-code select[name=view]", "relax-optimized")
    page.click("#compare-code button")
    expect(page.locator("#compare-diff")).to_contain_text(f"{a}: relax-optimized")
    expect(page.locator("#compare-diff")).to_contain_text("R.vm.alloc_tensor")


def wait_for_run(page, api_url: str) -> dict:
    deadline = time.monotonic() + 300
    while (run := page.request.get(api_url).json())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    return run


def test_own_inputs_on_a_result_an_npz_of_the_digits_and_a_picture_of_one(page, live_server, tmp_path):
    """The digits example's 540 held-out images as an .npz, uploaded on the result page, run on each
    build: their top-1 accuracy is the job's own accuracy figure, build by build. A picture of one
    of them (dark ink on white, 64x64) is inverted and resized as the digits data says and gets that
    image's class; a file that is no picture fails with its reason."""
    from PIL import Image

    from webapp.pipeline.datasets import load

    job_url = run_example(page, live_server, {"quantize": "int8"}, example="digits-cnn")
    job = page.request.get(job_url + ".json").json()
    _, _, images, labels = load("digits")
    np.savez(tmp_path / "held-out.npz", images=images)  # not the input's name: taken in order
    page.goto(job_url + "#own-input")
    page.set_input_files("#own-input input[type=file]", str(tmp_path / "held-out.npz"))
    page.click("#own-input button")
    expect(page.locator("#input-status")).to_contain_text("done", timeout=300_000)
    run = wait_for_run(page, page.url + ".json")
    assert run["runs"] == 540 and run["prepared"].startswith("taken in order")
    rows = {r["runtime"]: r for r in run["runtimes"]}
    assert set(rows) == {"TVM fp32", "TVM int8", "ONNX Runtime", "PyTorch"}, rows
    accuracy = {a["variant"]: a["top1"] for a in job["results"]["accuracy"] if not a["tuned"]}
    for variant in ("fp32", "int8"):
        top1 = np.array(rows[f"TVM {variant}"]["top1"])
        assert len(top1) == 540 and np.mean(top1 == labels) == accuracy[variant]
    assert rows["TVM fp32"]["against"]["top1_agree"] == 1.0  # fp32 against ONNX Runtime
    expect(page.locator("#input-outputs")).to_contain_text("TVM int8")
    expect(page.locator("#input-outputs tr", has_text="ONNX Runtime")).to_contain_text("the reference")

    ink = (255 - images[7, 0] * 255).round().astype(np.uint8)  # dark strokes on a light ground
    Image.fromarray(ink).resize((64, 64), Image.Resampling.NEAREST).save(tmp_path / "digit.png")
    api = f"{live_server}/api/jobs/{job['id']}/inputs"
    posted = page.request.post(
        api, multipart={"file": file_part("digit.png", (tmp_path / "digit.png").read_bytes())}
    )
    picture = wait_for_run(page, posted.json()["api_url"])
    assert picture["status"] == "done" and "inverted" in picture["prepared"], picture
    best = {r["runtime"]: r["top5"][0][0] for r in picture["runtimes"]}
    assert best["TVM int8"] == str(rows["TVM int8"]["top1"][7]), best

    posted = page.request.post(api, multipart={"file": file_part("not.png", b"no picture here")})
    failed = wait_for_run(page, posted.json()["api_url"])
    assert failed["status"] == "failed" and failed["error"].startswith("The image could not be read")
    page.goto(posted.json()["url"])
    expect(page.locator("#input-error")).to_contain_text("The image could not be read")
    refused = page.request.post(api, multipart={"file": file_part("model.onnx", b"x")})
    assert refused.status == 400 and "Send an .npz" in refused.json()["error"]


def test_a_model_with_repeated_blocks_shows_its_graph_folded_by_block(page, live_server, tmp_path):
    """A PyTorch model of three numbered blocks, exported as Hugging Face models are (dynamo ONNX,
    its module paths in the node metadata): the graph opens folded, one node per block, a block's
    details name its operators and kernels and unfold to its operators before fusion."""
    import torch
    from torch import nn

    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(16, 32)
            self.layers = nn.ModuleList(
                [nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3)]
            )
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            x = self.embed(x)
            for layer in self.layers:
                x = x + layer(x)
            return self.head(x)

    path = tmp_path / "blocks.onnx"
    torch.manual_seed(0)
    torch.onnx.export(Blocks().eval(), (torch.randn(1, 8, 16),), str(path), dynamo=True, external_data=False)

    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(path))
    page.check("input[name=target][value=x86-host]")
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("done", timeout=240_000)
    graph = page.request.get(page.url + "/graph-layers.json").json()
    blocks = [n["label"] for n in graph["nodes"] if n["kind"] == "layer"]
    assert blocks == ["embed", "layers.0", "layers.1", "layers.2", "head"], blocks
    result = page.request.get(page.url + ".json").json()["results"]
    assert result["graphs"]["layers"]["nodes"] == len(graph["nodes"])
    # each repeated block: its two Linear layers and GELU, in kernels of its own calls, timed
    repeated = [n for n in graph["nodes"] if n["label"].startswith("layers.")]
    assert all(n["ops"] >= 3 and n["calls"] and n["ms"] > 0 for n in repeated), repeated
    # the kernel table: a kernel the three blocks share names them as one range
    shared = [k for k in result["kernels"] if k["blocks"] == ["layers.0", "layers.1", "layers.2"]]
    assert shared and all(k["calls"] == 3 for k in shared), result["kernels"]
    expect(page.locator("#kernel-table")).to_contain_text("in layers.0–2")

    # a graph this small opens unfolded (a large one folded: test_pages.py); the folded
    # one: find a block, its details, then unfold it
    expect(page.locator("button.tab.active[data-tab=graph-fused]")).to_be_visible()
    page.click("button.tab[data-tab=graph-layers]")
    expect(page.locator("button.tab.active[data-tab=graph-layers]")).to_have_text(re.compile("By layer"))
    view = page.locator("#graph-layers")
    expect(view.locator(".panzoom svg g.node").first).to_be_visible()
    view.locator(".graph-search").fill("layers.1")
    view.locator(".graph-search").press("Enter")
    details = view.locator(".node-details")
    expect(details).to_contain_text("block of the model (folded)")
    expect(details).to_contain_text("operators")
    details.locator("a.to-node", has_text="before fusion").click()
    expect(page.locator("button.tab.active[data-tab=graph-imported]")).to_be_visible()
    expect(page.locator("#graph-imported .node-details")).to_contain_text("layers.1")


AXE = Path(__file__).parent / "vendor" / "axe-core-4.14.1.min.js"
RUN_AXE = """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
  .filter((v) => v.impact === 'serious' || v.impact === 'critical')
  .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', ')}`)"""


# wide tables whose time column must be in view without scrolling: table -> its header
TIME_COLUMNS = {
    "#bench-table": "median ms",
    "#kernel-table": "ms / run",
    "#compare-kernel-table": "B: ms / run",
}
CARDS_WIDER_THAN_THEY_ARE = """[...document.querySelectorAll('.card')]
  .filter((c) => c.scrollWidth > c.clientWidth + 1)
  .map((c) => `${c.id}: ${c.scrollWidth} in ${c.clientWidth}`)"""
COLUMN_IN_VIEW = """([table, column]) => {
  const t = document.querySelector(table);
  if (!t || !t.offsetParent) return null;
  const th = [...t.querySelectorAll('th')].find((h) => h.textContent.trim() === column);
  return th.getBoundingClientRect().right <= t.getBoundingClientRect().left + t.clientWidth + 1;
}"""
SMALLEST_TEXT_PX = """(selector) => {
  const sizes = [...document.querySelectorAll(selector)].filter((t) => t.getClientRects().length)
    .map((t) => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
  return sizes.length ? Math.min(...sizes) : null;
}"""


def test_pages_fit_every_width_follow_dark_mode_pass_axe_and_work_by_keyboard(page, live_server):
    fp32, int8 = run_example(page, live_server, {}), run_example(page, live_server, {"quantize": "int8"})
    a, b = fp32.rsplit("/", 1)[1], int8.rsplit("/", 1)[1]
    pages = {
        "index": live_server + "/",
        "result": int8,
        "code view": int8 + "?view=asm#code",
        "compare": f"{live_server}/compare/{a}/{b}",
    }
    browser = page.context.browser
    for width, scheme in ((1280, "light"), (1024, "light"), (390, "dark")):
        view = browser.new_page(viewport={"width": width, "height": 900}, color_scheme=scheme)
        for name, url in pages.items():
            fetched = []
            note = lambda r, fetched=fetched: fetched.append(r.url)  # noqa: E731
            view.on("request", note)
            view.goto(url)
            view.wait_for_load_state("networkidle")
            view.remove_listener("request", note)
            twice = sorted({u for u in fetched if fetched.count(u) > 1})
            assert not twice, f"{name}: fetched more than once: {twice}"  # each asset once (graphs' SVG too)
            # no sideways scroll of the page: wide tables and code scroll inside their card
            scroll, client = view.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert scroll <= client, f"{name} at {width} px: {scroll} px wide"
            background = view.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == ("rgb(18, 21, 28)" if scheme == "dark" else "rgb(246, 247, 249)"), (
                name,
                scheme,
            )
            # every card fits its width: a wide table scrolls inside itself, its time column in view
            assert view.evaluate(CARDS_WIDER_THAN_THEY_ARE) == [], f"{name} at {width} px"
            for table, column in TIME_COLUMNS.items():
                assert view.evaluate(COLUMN_IN_VIEW, [table, column]) is not False, (
                    name,
                    width,
                    table,
                    column,
                )
            # every chart and graph label readable: at least 9 px tall, as drawn
            smallest = view.evaluate(
                SMALLEST_TEXT_PX, "#bench-chart text, .tab-panel.active .graph-view g.node text"
            )
            assert smallest is None or smallest >= 9, f"{name} at {width} px: text {smallest:.1f} px tall"
            if scheme == "dark" and name == "result":  # the graph's canvas dark too
                canvas = view.evaluate("getComputedStyle(document.querySelector('.panzoom')).backgroundColor")
                assert canvas != "rgb(255, 255, 255)", canvas
            if width != 1024:  # axe-core, vendored: no serious or critical violation, light and dark
                view.add_script_tag(path=str(AXE))
                assert view.evaluate(RUN_AXE) == [], f"{name} at {width} px, {scheme}"
        view.close()

    # the keyboard: graph tabs by arrow keys, a node by Tab and Enter, pan and zoom by keys
    page.goto(int8)
    tab = page.locator("#graph button.tab[aria-selected=true]")
    other = page.locator("#graph button.tab[aria-selected=false]").first.get_attribute("data-tab")
    tab.focus()
    page.keyboard.press("ArrowRight")
    expect(page.locator(f"#graph button.tab[data-tab={other}]")).to_have_attribute("aria-selected", "true")
    expect(page.locator(f"#{other}")).to_be_visible()
    page.keyboard.press("ArrowLeft")
    shown = page.locator("#graph .tab-panel.active")
    graph = shown.locator(".graph-view .panzoom")
    expect(graph.locator("svg g.node").first).to_be_visible()
    # the graph is one tab stop (its current node), the arrow keys move between its nodes
    assert shown.evaluate("v => [...v.querySelectorAll('g.node')].filter((g) => g.tabIndex >= 0).length") == 1
    graph.focus()
    page.keyboard.press("Tab")
    label = page.evaluate(
        "document.activeElement.matches('g.node') && document.activeElement.getAttribute('aria-label')"
    )
    assert label and label.endswith("open its details"), label
    first = page.evaluate("document.activeElement.id")
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement.matches('g.node') && document.activeElement.id") not in (
        first,
        False,
    )
    assert shown.evaluate("v => [...v.querySelectorAll('g.node')].filter((g) => g.tabIndex >= 0).length") == 1
    page.keyboard.press("Enter")
    expect(shown.locator(".node-details h3")).to_be_visible()
    assert page.evaluate("document.activeElement.classList.contains('selected')")  # the node opened
    viewport = shown.locator("g.svg-pan-zoom_viewport")
    before = viewport.get_attribute("transform")
    graph.focus()
    label_px = "v => Math.min(...[...v.querySelectorAll('g.node text')].map((t) => t.getScreenCTM().a))"
    scale = shown.evaluate(label_px)
    page.keyboard.press("+")
    expect(viewport).not_to_have_attribute("transform", before)
    assert shown.evaluate(label_px) == pytest.approx(1.5 * scale, rel=0.02)  # a step of 1.5x
    zoomed = viewport.get_attribute("transform")
    page.keyboard.press("ArrowLeft")
    expect(viewport).not_to_have_attribute("transform", zoomed)


def test_a_finished_int8_job_bisected_from_its_page_shows_the_points_it_ran(page, live_server):
    """The bisection section of a finished job offers the bisection; its button submits the job again
    with it and opens the new job, whose section says, for fp32 and int8, that no pass left the
    reference, with the points it ran."""
    page.goto(run_example(page, live_server, {"quantize": "int8"}))
    expect(page.locator("#bisect-offer button")).to_have_text("Find the first diverging pass")
    first = page.url
    page.click("#bisect-offer button")
    expect(page).not_to_have_url(first)
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    result = page.request.get(page.url.split("#")[0] + ".json").json()
    assert result["options"]["bisect"] is True and result["options"]["quantize"] == "int8"
    found = {b["variant"]: b for b in result["results"]["bisection"]}
    assert set(found) == {"fp32", "int8"}
    assert found["fp32"]["reference"] == "onnxruntime" and found["int8"]["reference"] == "imported"
    page.reload()
    for variant, b in found.items():
        assert b["first"] is None, b["runs"]  # TVM's own passes keep to the reference
        verdict = page.locator(f"#bisect-{variant}")
        expect(verdict).to_contain_text(f"{len(b['runs'])} of its {b['points']} points built and run")
    expect(page.locator("#bisect-int8")).to_contain_text("its integer model's outputs before the passes")
    expect(page.locator("#bisect-offer")).to_have_count(0)
    # each fp32 layer against ONNX Runtime: every layer of cnn-small compared, none off, drawn on the graph
    layers = result["results"]["layer_error"]
    assert layers["compared"] == layers["of"] >= 8 and layers["first_off"] is None, layers
    expect(page.locator("#layer-error-verdict")).to_contain_text(f"{layers['compared']} of the model's")
    graph = page.locator(".graph-view:visible")
    graph.locator(".graph-first-off").click()
    expect(graph.locator(".legend")).to_contain_text("SQNR against ONNX Runtime")
    expect(graph.locator(".node-details")).to_contain_text("SQNR against ONNX Runtime")
    if any(row["sqnr_db"] is not None for row in layers["layers"]):  # Model Explorer's overlay of them
        expect(page.locator("#model-explorer")).to_contain_text("model-explorer-reference.json")
    page.locator("#bisection details summary").first.click()
    expect(page.locator("#bisection table.bisect-runs").first.locator("tr")).to_have_count(
        len(found["fp32"]["runs"]) + 1
    )


def test_a_budget_typed_in_the_form_draws_its_points_and_builds_another_point(
    page, live_server, tmp_path, one_thread
):
    """The form's accuracy budget on the digits CNN at batch 64 (activations clipped to +-3, so that int8
    misses it): the page draws the points tried with the chosen one marked and the budget, and "Build
    this point" submits the job again as the other point, which opens as a new job with its layers."""
    from tests.test_precision import digits_batch_files

    model, data = digits_batch_files(tmp_path)
    page.goto(live_server + "/")
    page.set_input_files("#model-file", str(model))
    page.check("input[name=target][value=x86-host]")
    page.select_option("#quantize", "int8")
    page.select_option("select[name=calibration]", "global")
    page.fill("input[name=global_scale]", "3")
    page.set_input_files("input[name=calibration_data]", str(data))
    page.fill("#accuracy-budget", "30 dB")
    page.click("#submit")
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    result = page.request.get(page.url.split("#")[0] + ".json").json()
    search = result["results"]["quantization"]["precision_search"]
    page.reload()
    expect(page.locator("#pareto-chart circle")).to_have_count(len(search["points"]))
    expect(page.locator("#pareto-chart circle.chosen")).to_have_count(1)
    chosen = search["points"][search["chosen"]]
    assert chosen["k"] is not None, search["points"]  # a mix: the float matmul keeps 30 dB (41 dB seen)
    expect(page.locator("#precision-chosen strong").first).to_have_text(
        f"{len(chosen['float_layers'])} layer{'s' if len(chosen['float_layers']) != 1 else ''} in float"
    )
    expect(page.locator("#precision-points tr.chosen")).to_contain_text("this build")
    first = page.url
    page.locator("#precision-points form.build-point button").first.click()
    expect(page).not_to_have_url(first)
    expect(page.locator("#job-status")).to_have_text("done", timeout=300_000)
    again = page.request.get(page.url.split("#")[0] + ".json").json()
    other = next(p for i, p in enumerate(search["points"]) if i != search["chosen"] and p["k"] is not None)
    assert sorted(again["results"]["quantization"]["skipped"]) == other["float_layers"]
