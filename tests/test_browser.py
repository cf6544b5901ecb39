"""A real browser (Debian's chromium, driven by Playwright) walks the whole path a user walks."""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

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

    # The graph picture, before and after fusion, with pan/zoom controls (set up on the swapped-in section).
    graph = page.locator("#graph-fused .panzoom img")
    expect(graph).to_be_visible()
    assert page.evaluate("document.querySelector('#graph-fused .panzoom img').naturalWidth") > 0
    page.click("button.tab[data-tab=graph-imported]")
    expect(page.locator("#graph-imported .panzoom img")).to_be_visible()
    expect(page.locator("#graph-imported .zoom-buttons")).to_have_count(1)
    page.locator("#graph-imported .zoom-buttons button", has_text="+").click()
    assert "scale(" in page.locator("#graph-imported .panzoom img").get_attribute("style")

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
    expect(page.locator("#bench-chart")).to_contain_text("median latency, ms")
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
    expect(page.locator("#instructions")).to_contain_text("vpdpbusd")
    expect(page.locator("#quant-layers tr")).to_have_count(1 + 3)
    # agreement on the held-out images, beside the accuracy it explains
    assert "top-1 agreement with fp32" in page.locator("#sweep-table tr").first.inner_text()
    # no broken download (the tuning database is offered only when the build used it)
    assert_every_link_answers(page, page.url)
