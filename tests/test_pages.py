"""The result page and its JSON twin on crafted results (no worker, no TVM): what the page states is
what webapp.pipeline.reports.facts derived, sections appear as the results grow, errors are styled pages or
JSON, and every link on the page answers."""

from __future__ import annotations

import copy
import gzip
import io
import json
import re
from html import unescape
from html.parser import HTMLParser

import pytest

from webapp.catalog import CALIBRATION_MODES, QUANTIZE_MODES, STAGES, WEIGHT_GRANULARITY, WEIGHT_SCALE_MODES
from webapp.jobs.store import new_job_id
from webapp.naming import natural_key
from webapp.pipeline.reports.facts import derive, worst_layer
from webapp.web.chart import bench_chart

STAGES_DONE = [  # every stage but the remote one (a board's), done
    {"name": s, "status": "done", "seconds": 1.0, "progress": 1.0} for s in STAGES if s != "remote"
]


def layer(name: str) -> dict:
    return {
        "layer": name,
        "kind": "conv2d",
        "input_scale": 0.02,
        "input_zero_point": 0,
        "input_levels": 256,
        "weight_scale_min": 0.01,
        "weight_scale_max": 0.03,
        "weight_scales": 8,
        "output_scale": 0.05,
        "requantize": "float32 multiply",
        "power2": False,
    }


def crafted_results() -> dict:
    """A finished int8 job's result.json, shaped as the pipeline writes it, before derive()."""
    kernels = [
        "fused_conv2d10_add_relu",
        "fused_conv2d1_add_relu",
        "fused_conv2d2_add_relu",
        "fused_matmul_add",
    ]
    return {
        "model": {
            "framework": "onnx",
            "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "dtype": "float32"}],
            "outputs": [{"name": "output", "shape": [1, 10], "dtype": "float32"}],
            "param_count": 1234,
        },
        "target": {
            "preset": "x86-host",
            "title": "x86-64, this server's CPU",
            "description": "LLVM for the CPU of the machine that runs the job.",
            "tvm": {"kind": "llvm"},
        },
        "passes": [
            {
                "index": 0,
                "name": "ConvertToDataflow",
                "seconds": 0.001,
                "changed": True,
                "file": "views/passes/00.py",
            },
            *[
                {"index": i, "name": f"Unchanged{i}", "seconds": 0.001, "changed": False, "file": None}
                for i in range(1, 272)
            ],
            {
                "index": 272,
                "name": "FuseTIR",
                "seconds": 0.01,
                "changed": True,
                "file": "views/passes/272.py",
            },
        ],
        "quantization": {
            "options": {
                "quantize": "int8",
                "calibration": "max",
                "weight_scale": "max",
                "weight_granularity": "channel",
                "global_scale": 8.0,
                "skip_first": False,
                "skip_last": False,
                "bits": 8,
            },
            "variant": "int8",
            "mode": "int8 integer kernels (uint8 x int8, int32 accumulation)",
            "calibration": {"source": "digits training images", "samples": 64},
            "weights": {"packed_bytes": 1000, "float32_bytes": 4000},
            "layers": [layer("conv1"), layer("conv2"), layer("fc")],
            # the SQNR rises at conv2 and falls at fc: fc is where the error grows the most
            "layer_errors": [
                {"layer": "conv1", "sqnr_db": 30.0, "cosine": 0.9995},
                {"layer": "conv2", "sqnr_db": 30.9, "cosine": 0.9996},
                {"layer": "fc", "sqnr_db": 24.5, "cosine": 0.998},
            ],
            "skipped": [],
        },
        "tuning": {
            "kernels": 4,
            "pretuned": 2,
            "trials": 8,
            "budget": 8,
            "cancelled": False,
            "seconds": 40.0,
            "tasks": [
                {
                    "name": "fused_conv2d10_add_relu",
                    "weight": 1,
                    "flop": 2e6,
                    "latency_us": 22.8,
                    "gflops": 87.7,
                    "pretuned": True,
                },
                {
                    "name": "fused_conv2d1_add_relu",
                    "weight": 1,
                    "flop": 2e6,
                    "latency_us": 30.0,
                    "gflops": 66.0,
                    "pretuned": True,
                },
                {
                    "name": "fused_conv2d2_add_relu",
                    "weight": 1,
                    "flop": 2e6,
                    "latency_us": None,
                    "gflops": None,
                    "pretuned": False,
                },
                {
                    "name": "fused_matmul_add",
                    "weight": 1,
                    "flop": 1e4,
                    "latency_us": None,
                    "gflops": None,
                    "pretuned": False,
                },
            ],
            "curve": [{"trials": 4, "ms": 0.2}, {"trials": 8, "ms": 0.1}],
        },
        "record_choice": [
            {
                "kernel": "fused_conv2d10_add_relu",
                "tuned_us": 164.5,
                "default_us": 80.0,
                "faster": False,
                "used": False,
            },
            {
                "kernel": "fused_conv2d1_add_relu",
                "tuned_us": 25.0,
                "default_us": 40.0,
                "faster": True,
                "used": True,
            },
        ],
        "record_check": [
            {"variant": "fp32", "tuned_ms": 0.0931, "default_ms": 0.1042, "min_gain": 0.02, "kept": True}
        ],
        "library": {"file": "model.so", "bytes": 4096},
        "graphs": {
            "imported": {"nodes": 9, "edges": 8, "svg": "graph-imported.svg", "ops": {"R.nn.conv2d": 2}},
            "fused": {"nodes": 6, "edges": 5, "svg": "graph-fused.svg", "ops": {k: 1 for k in kernels}},
        },
        "kernels": [
            {
                "name": k,
                "schedule": "tuned" if k == "fused_conv2d1_add_relu" else "default rule: conv2d",
                "calls": 1,
                "flop": 1.0,
                "dtypes": "",
                "asm_lines": 10,
            }
            for k in kernels
        ],
        "instructions": {"vpdpbusd": 12},
        "dtype_census": {"kernels": {"uint8 x int8 -> int32": 3}, "tensors": {}},
        "benchmarks": [
            {
                "runtime": "tvm",
                "variant": "fp32",
                "tuned": False,
                "device": "x86_64 CPU",
                "threads": 2,
                "median_ms": 0.059,
                "p90_ms": 0.07,
                "min_ms": 0.05,
                "runs": 50,
            },
            {
                "runtime": "tvm",
                "variant": "int8",
                "tuned": False,
                "device": "x86_64 CPU",
                "threads": 2,
                "median_ms": 0.05,
                "p90_ms": 0.06,
                "min_ms": 0.045,
                "runs": 50,
            },
            {
                "runtime": "pytorch",
                "variant": "fp32",
                "tuned": False,
                "device": "x86_64 CPU",
                "threads": 2,
                "median_ms": 0.295,
                "p90_ms": 0.4,
                "min_ms": 0.28,
                "runs": 50,
            },
            {
                "runtime": "onnxruntime",
                "variant": "fp32",
                "tuned": False,
                "device": "x86_64 CPU",
                "threads": 2,
                "median_ms": 0.012,
                "p90_ms": 0.02,
                "min_ms": 0.011,
                "runs": 50,
            },
        ],
        "fidelity": [
            {
                "variant": "int8",
                "tuned": False,
                "reference": "tvm fp32",
                "max_abs_err": 0.1,
                "cosine": 0.999,
                "sqnr_db": 25.0,
                "top1_agree": 1.0,
                "top1_inputs": 1,
            },
            {
                "variant": "fp32",
                "tuned": False,
                "reference": "pytorch",
                "max_abs_err": 1e-6,
                "cosine": 1.0,
                "sqnr_db": None,
                "top1_agree": 1.0,
                "top1_inputs": 1,
            },
        ],
        "accuracy": [
            {
                "variant": "fp32",
                "tuned": False,
                "dataset": "digits (held-out 540 images)",
                "images": 540,
                "top1": 0.97,
                "agree_fp32": None,
            },
            {
                "variant": "int8",
                "tuned": False,
                "dataset": "digits (held-out 540 images)",
                "images": 540,
                "top1": 0.29,
                "agree_fp32": 0.3,
            },
        ],
        "threads": 2,
        "unavailable_runtimes": [],
        "files": [
            "graph-fused.svg",
            "graph-imported.svg",
            "ir.zip",
            "model-fp32.so",
            "model.so",
            "module.ll",
            "module.s",
            "weights-int8.npz",
        ],
    }


def write_job(app, results: dict | None, status: str = "done", stages=None, options=None) -> str:
    """A job record and folder as the worker leaves them; result.json as given (None: none yet)."""
    store = app.extensions["playground"]["store"]
    job_id = new_job_id()
    job_dir = store.job_dir(job_id)
    (job_dir / "files").mkdir(parents=True)
    (job_dir / "views" / "passes").mkdir(parents=True)
    store.create(job_id, options or {"example": "digits-cnn", "target": "x86-host", "quantize": "int8"})
    update_job(app, job_id, results, status, stages)
    for name in (results or {}).get("files", []):
        (job_dir / "files" / name).write_text(
            "<svg xmlns='http://www.w3.org/2000/svg'/>" if name.endswith(".svg") else name
        )
    for rel in ("views/imported.py", "views/passes/00.py", "views/passes/272.py", "views/bytecode.txt"):
        (job_dir / rel).write_text(f"# {rel}\n")
    return job_id


def update_job(app, job_id: str, results: dict | None, status: str, stages=None) -> None:
    store = app.extensions["playground"]["store"]
    job_dir = store.job_dir(job_id)
    if results is not None:
        (job_dir / "result.json").write_text(json.dumps(results))
    (job_dir / "progress.json").write_text(json.dumps({"stages": stages or STAGES_DONE, "error": None}))
    if status in ("running", "done", "failed"):
        store.claim(job_id, "test:0")
    if status in ("done", "failed"):
        error = None if status == "done" else {"stage": "build", "message": "boom"}
        store.mark_finished(job_id, error, "test:0")


def with_facts(results: dict) -> dict:
    return {**results, **derive(results)}


EMULATED_RPI5 = "rpi5 (emulated: QEMU cortex-a76)"


def board_results(emulated: bool = True) -> dict:
    """crafted_results() as a job for rpi5 leaves it after the remote stage: TVM fp32 and int8 timed on
    a board of the device pool, and the board's outputs checked against each reference."""
    results = crafted_results()
    name = EMULATED_RPI5 if emulated else "rpi5 (real board at 10.0.0.7:9090)"
    results["target"] = {"preset": "rpi5", "tvm": {"kind": "llvm", "mcpu": "cortex-a76"}}
    results["device"] = {"name": name, "key": "rpi5", "emulated": emulated, "address": "127.0.0.1:42969"}
    if emulated:
        results["device"] |= {"cores": 2, "threads": 2}
    results["benchmarks"] = [
        dict(b, device=name, median_ms=ms, p90_ms=ms * 1.1, min_ms=ms * 0.9)
        for b, ms in zip(results["benchmarks"][:2], (20.0, 4.0), strict=True)
    ]
    board = {"variant": "int8", "tuned": False, "top1_agree": 1.0, "top1_inputs": 1}
    results["fidelity"] = [
        {**board, "reference": "int8 on this server", "max_abs_err": 0.0, "cosine": 1.0, "sqnr_db": None},
        {**board, "reference": "TVM fp32 on rpi5", "max_abs_err": 7e-4, "cosine": 0.99999, "sqnr_db": 50.1},
    ]
    del results["accuracy"]
    return results


@pytest.fixture()
def web(app):
    return app.test_client()


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids, self.options = [], [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if a.get("id"):
            self.ids.append(a["id"])


def section(html: str, section_id: str) -> str:
    """The HTML of one <section id=...> of the page ('' if absent)."""
    m = re.search(rf'<section class="card" id="{section_id}">.*?</section>', html, re.S)
    return m.group(0) if m else ""


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# ---------------------------------------------------------------- facts.derive


def test_derive_on_partial_results_states_only_what_is_measured():
    assert derive({}) == {}
    results = crafted_results()
    only_import = {"model": results["model"], "target": results["target"]}
    # the headline names the target from the start, and nothing it has not measured
    named = {k: results["target"][k] for k in ("preset", "title", "description")} | {"mcpu": None}
    nothing_yet = {"target": named, "speed": None, "quantized": None}
    assert derive(only_import) == {"headline": nothing_yet | {"look_next": None}}
    after_quantize = {**only_import, "quantization": results["quantization"]}
    facts = derive(after_quantize)
    assert set(facts) == {"quantization_summary", "headline"}
    assert facts["quantization_summary"]["speedup"] is None  # nothing timed yet
    assert facts["quantization_summary"]["worst_layer"]["layer"] == "fc"
    assert set(derive(results)) == {
        "benchmark_summary",
        "quantization_summary",
        "tuning_summary",
        "kernel_summary",
        "lint",
        "headline",
    }
    assert derive(with_facts(results)) == derive(results)  # derive reads none of its own keys


def test_worst_layer_is_where_the_sqnr_falls_most_never_where_it_rises():
    rises = [
        {"layer": "a", "sqnr_db": 20.0},
        {"layer": "b", "sqnr_db": 20.9},
        {"layer": "c", "sqnr_db": 21.0},
    ]
    assert worst_layer(rises) is None
    falls = [
        {"layer": "a", "sqnr_db": 30.0},
        {"layer": "b", "sqnr_db": 30.9},
        {"layer": "c", "sqnr_db": 24.5},
    ]
    assert worst_layer(falls) == {"layer": "c", "from_db": 30.9, "to_db": 24.5, "drop_db": pytest.approx(6.4)}
    # an exact layer (infinite SQNR, null) is compared with nothing
    exact = [{"layer": "a", "sqnr_db": None}, {"layer": "b", "sqnr_db": 10.0}, {"layer": "c", "sqnr_db": 9.0}]
    assert worst_layer(exact)["layer"] == "c"


def test_quantization_summary_speedup_accuracy_and_why_no_speedup():
    results = crafted_results()
    qs = derive(results)["quantization_summary"]
    assert qs["speedup"] == pytest.approx(0.059 / 0.05)
    assert qs["fp32_top1"] == 0.97 and qs["quant_top1"] == 0.29
    assert qs["top1_change_points"] == pytest.approx(-68.0)
    assert qs["why_no_speedup"] is None  # 1.18x is a speedup
    slow = copy.deepcopy(results)
    slow["benchmarks"][1]["median_ms"] = 0.058
    why = derive(slow)["quantization_summary"]["why_no_speedup"]
    assert (
        why.startswith("int8 took 0.058 ms against fp32's 0.059 ms, about as long.")
        and "model is small" in why
    )
    slow["benchmarks"][1]["median_ms"] = 0.159  # an AVX2 machine's int8: widened products, 2.7x slower
    slow["instructions"] = {"vpmaddwd": 120, "vfmadd": 40}
    why = derive(slow)["quantization_summary"]["why_no_speedup"]
    assert why.startswith("int8 took 0.159 ms against fp32's 0.059 ms, 2.69× as long.")
    assert "no integer dot-product instruction" in why and "120 vpmaddwd / vpmaddubsw" in why
    slow["instructions"] = {"vpmaddubsw": 96, "vpmaddwd": 96, "vfmadd": 40}  # the AVX2 int8 rules
    why = derive(slow)["quantization_summary"]["why_no_speedup"]
    assert "vpmaddubsw (96 in the assembly)" in why and "16-bit sum" in why
    slow["instructions"] = {"smull": 64, "sadalp": 32, "fmla": 40}  # the Pi 4's int8 rules
    why = derive(slow)["quantization_summary"]["why_no_speedup"]
    assert "no dot product (sdot)" in why and "smull (64 in the assembly)" in why


def test_benchmark_summary_is_relative_to_the_fastest():
    bs = derive(crafted_results())["benchmark_summary"]
    assert bs["fastest"]["runtime"] == "onnxruntime"
    assert [round(r["vs_fastest"], 2) for r in bs["rows"]] == [4.92, 4.17, 24.58, 1.0]
    assert bs["tuned_speedup"] is None  # no tuned TVM row


def test_device_summary_states_the_board_its_speedup_and_that_emulated_times_are_no_prediction():
    assert "device_summary" not in derive(crafted_results())  # a job on this server has no board
    ds = derive(board_results())["device_summary"]
    assert (ds["name"], ds["key"], ds["emulated"], ds["threads"]) == (EMULATED_RPI5, "rpi5", True, 2)
    assert (ds["fp32_ms"], ds["variant"], ds["quant_ms"]) == (20.0, "int8", 4.0)
    assert ds["speedup"] == pytest.approx(5.0)
    assert [(f["reference"], f["bit_exact"]) for f in ds["fidelity"]] == [
        ("int8 on this server", True),
        ("TVM fp32 on rpi5", False),
    ]
    assert "QEMU" in ds["note"] and "not predictions of a real Raspberry Pi" in ds["note"]
    real = derive(board_results(emulated=False))["device_summary"]
    assert not real["emulated"] and real["note"] is None and real["threads"] is None


def test_headline_puts_tvm_against_the_fastest_other_runtime_on_its_device_and_says_what_to_look_at():
    h = derive(crafted_results())["headline"]
    assert h["target"]["title"] == "x86-64, this server's CPU"
    # TVM's fastest build (int8, 0.05 ms) against ONNX Runtime fp32 (0.012 ms), the fastest other one
    speed = h["speed"]
    assert (speed["tvm"], speed["peer"], speed["peer_over_tvm"]) == ("TVM int8", "ONNX Runtime fp32", 0.24)
    assert speed["text"].startswith("TVM int8 4.17× slower than ONNX Runtime fp32")
    assert h["quantized"]["speedup"] == pytest.approx(1.18) and h["quantized"]["sqnr_db"] == 25.0
    assert h["quantized"]["text"].startswith("int8 1.18× faster than TVM fp32, top-1 accuracy -68.0 points")
    # int8 lost 68 points: the reader is sent to the layer where its error grows the most
    assert (h["look_next"]["section"], h["look_next"]["layer"]) == ("quantization", "fc")

    # accurate int8, ONNX Runtime slower: TVM is the faster one, and the slowest kernel comes next
    results = crafted_results()
    results["accuracy"][1]["top1"] = 0.97
    results["fidelity"][0]["sqnr_db"] = 41.0
    results["benchmarks"][3]["median_ms"] = 0.08
    results["kernels"][2] |= {"ms": 0.03, "share": 0.6}
    results["kernels"][0] |= {"ms": 0.02, "share": 0.4}
    h = derive(results)["headline"]
    assert h["speed"]["text"].startswith("TVM int8 1.60× faster than ONNX Runtime fp32")
    assert (
        h["look_next"]["kernel"] == "fused_conv2d2_add_relu"
        and "60% of a run, 0.03 ms a run" in h["look_next"]["text"]
    )
    results["benchmarks"][3]["median_ms"] = 0.051
    assert derive(results)["headline"]["speed"]["text"].startswith(
        "TVM int8 about as fast as ONNX Runtime fp32"
    )

    # on a board the other runtimes are not timed: no ratio, and the headline says why
    board = derive(board_results())["headline"]
    assert board["speed"]["peer"] is None and board["speed"]["peer_over_tvm"] is None
    assert "not timed on a board" in board["speed"]["text"] and board["quantized"]["speedup"] == 5.0
    assert board["target"]["mcpu"] == "cortex-a76"


def test_cli_table_of_a_board_job_says_emulated_and_bit_exact():
    from webapp.result_text import benchmark_table

    table = benchmark_table(with_facts(board_results()))
    assert table.splitlines()[0] == f"Benchmark (2 threads, {EMULATED_RPI5}):"
    assert f"Device: {EMULATED_RPI5}, key rpi5, emulated board at 127.0.0.1:42969" in table
    assert re.search(r"20\.000 +4\.000 +5\.00x", table) and "not predictions of a real Raspberry Pi" in table
    assert "vs int8 on this server: max abs err 0 (bit-exact)" in table
    assert "Device:" not in benchmark_table(with_facts(crafted_results()))


def test_sweep_rows_take_agreement_from_the_held_out_images_only():
    results = crafted_results()
    results["sweep"] = {
        "variants": [
            {
                "variant": "int8",
                "bits": 8,
                "calibration": "max",
                "mode": "int8",
                "status": "done",
                "weights_bytes": 10,
            }
        ],
        "failed": [{"variant": "int1", "stage": "build", "message": "no"}],
    }
    sweep = derive(results)["sweep_summary"]
    rows = {r["variant"]: r for r in sweep["rows"]}
    assert list(rows) == ["fp32", "int8", "int1"]
    assert rows["int8"]["top1_agree"] == 0.3 and rows["int8"]["agree_inputs"] == 540
    assert rows["int8"]["speedup"] == pytest.approx(0.059 / 0.05)
    assert rows["int1"]["status"] == "failed" and rows["int1"]["ms"] is None
    assert sweep["quality"] == "top-1 accuracy %"
    assert [p["label"] for p in sweep["points"]] == ["fp32", "8"]
    del results["accuracy"]  # no dataset: agreement on the one benchmark input is not a fact to show
    sweep = derive(results)["sweep_summary"]
    assert not sweep["has_agreement"] and sweep["quality"] == "SQNR vs fp32, dB"


def test_tuning_summary_lists_only_kernels_with_records_in_natural_order():
    ts = derive(crafted_results())["tuning_summary"]
    assert [r["name"] for r in ts["rows"]] == ["fused_conv2d1_add_relu", "fused_conv2d10_add_relu"]
    assert ts["with_record"] == 2 and ts["without_record"] == 2
    assert ts["records_used"] == 1 and ts["records_timed"] == 2
    row = ts["rows"][1]
    assert (row["search_us"], row["build_record_us"], row["build_default_us"], row["used"]) == (
        22.8,
        164.5,
        80.0,
        False,
    )


def test_natural_key_orders_numbered_kernels():
    names = ["fused_conv2d10_add", "fused_conv2d1_add", "fused_conv2d2_add", "fused_conv2d_add"]
    assert sorted(names, key=natural_key) == [
        "fused_conv2d_add",
        "fused_conv2d1_add",
        "fused_conv2d2_add",
        "fused_conv2d10_add",
    ]


# ---------------------------------------------------------------- the page states the facts


def test_the_page_opens_on_its_headline_and_contents_with_benchmark_before_code(app, web):
    results = with_facts(crafted_results())
    html = web.get(f"/r/{write_job(app, results)}").get_data(as_text=True)
    assert "<title>digits-cnn int8 on x86-host · TVM Playground</title>" in html
    head = re.search(r'<section class="job-head" id="headline">.*?</section>', html, re.S).group(0)
    said = unescape(text(head))
    assert "x86-64, this server's CPU" in said and '{"kind"' not in head  # no raw JSON up here
    assert said.count(results["headline"]["speed"]["text"]) == 1
    assert results["headline"]["quantized"]["text"] in said
    assert '<a href="#quantization">layer fc, where the int8 error grows the most' in head
    contents = re.findall(
        r'<a href="#(\w+)">', re.search(r'<nav class="contents".*?</nav>', head, re.S).group(0)
    )
    assert contents[:3] == ["benchmark", "fidelity", "quantization"] and contents[-2:] == [
        "code",
        "downloads",
    ]
    # each entry is a section of the page, in the page's order
    positions = [html.index(f'<section class="card" id="{name}"') for name in contents]
    assert positions == sorted(positions) and html.index('id="headline"') < positions[0]
    # the TVM target's JSON is still on the page, in the model's summary
    assert '<code id="tvm-target">{"kind": "llvm"}</code>' in section(html, "summary")
    # a float input with no values given says nothing of values (Jinja's t['values'] was the dict's method)
    assert "input-values" not in section(html, "summary") and "given :" not in text(section(html, "summary"))
    fp32 = write_job(
        app, results, options={"example": "digits-cnn", "target": "x86-avx2", "quantize": "none"}
    )
    assert "<title>digits-cnn fp32 on x86-avx2 · TVM Playground</title>" in web.get(f"/r/{fp32}").get_data(
        as_text=True
    )


def test_quantization_section_names_the_layer_where_the_error_grows(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    html = web.get(f"/r/{job_id}").get_data(as_text=True)
    quant = section(html, "quantization")
    said = text(re.search(r'<p id="worst-layer">.*?</p>', quant, re.S).group(0))
    assert "falls the most at fc" in said and "from 30.9 dB to 24.5 dB, 6.4 dB lower" in said
    assert "-" not in re.findall(r"[-\d.]+ dB lower", said)[0]
    worst_rows = re.findall(r'<tr class="worst"><td><code>([^<]+)</code>', quant)
    assert worst_rows == ["fc"]


def test_quantization_section_says_nothing_of_a_worst_layer_when_the_sqnr_only_rises(app, web):
    results = crafted_results()
    results["quantization"]["layer_errors"][2]["sqnr_db"] = 31.5
    html = web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True)
    quant = section(html, "quantization")
    assert 'class="worst"' not in quant and "falls" not in text(quant).replace("does not fall", "")
    assert "does not fall from any layer to the next (2 steps compared)" in text(quant)


def layer_speed(kept: bool | None) -> dict:
    """quantization.layer_speed as stages.fallback writes it: conv2 (depthwise) slower in int8; with
    `kept` not None, the build with it in float was timed too (and with `kept`, the rows are of that
    build: conv2's only among the slower)."""
    rows = [
        {"layer": "conv1", "form": "conv2d", "fp32_ms": 0.2, "quant_ms": 0.1, "ratio": 0.5},
        {"layer": "conv2", "form": "depthwise conv2d", "fp32_ms": 0.02, "quant_ms": 0.035, "ratio": 1.75},
        {"layer": "fc", "form": "matmul", "fp32_ms": 0.1, "quant_ms": 0.03, "ratio": 0.3},
    ]
    for row in rows:
        row |= {
            "fp32_schedule": "default rule: conv2d NHWC",
            "quant_schedule": "default rule: depthwise conv2d",
        }
    speed = {"device": "x86_64 CPU (haswell)", "slower_by": 1.1, "quantized_layers": 3, "timed": 3}
    speed |= {"layers": [rows[0], rows[2]] if kept else rows, "slower": [rows[1]]}
    if kept is not None:
        speed["fallback"] = {"layers": ["conv2"], "quant_ms": 2.6, "mixed_ms": 2.4 if kept else 2.59}
        speed["fallback"] |= {"min_gain": 0.02, "kept": kept}
    return speed


@pytest.mark.parametrize("kept", [True, False])
def test_quantization_section_lists_the_layers_int8_made_slower_by_how_much_why_and_what_was_kept(
    app, web, kept
):
    results = crafted_results()
    results["quantization"]["layer_speed"] = layer_speed(kept)
    if kept:  # the build keeps conv2 in float
        results["quantization"]["layers"] = [layer("conv1"), layer("fc")]
        results["quantization"]["skipped"] = ["conv2"]
    facts = with_facts(results)["quantization_summary"]["layer_speed"]
    assert [s["layer"] for s in facts["slower"]] == ["conv2"] and facts["kept_float"] == kept
    html = web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True)
    said = text(section(html, "quantization"))
    assert "1 of the 3 quantized layers took longer in int8 than in float" in said
    assert "conv2 (depthwise conv2d): 35.0 µs in int8 against 20.0 µs in float, 1.75× as long." in said
    assert "Why: a depthwise conv2d sums its products within a channel" in said
    if kept:
        assert "keeps them in float : with them in float the model took 2.400 ms against 2.600 ms" in said
    else:
        assert (
            "2.590 ms against 2.600 ms with every layer in int8, not faster by more than 2%: they stay"
            in said
        )
    # the per-layer table has both times of each layer left in int8
    assert re.search(r"conv1\b.*?200\.0\s+100\.0", said, re.S)


def test_quantization_section_says_when_every_layer_was_faster_in_int8(app, web):
    results = crafted_results()
    results["quantization"]["layer_speed"] = layer_speed(None) | {"slower": []}
    said = text(
        section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "quantization")
    )
    assert "Each of the 3 quantized layers took less time in int8 than in float" in said
    assert "took longer" not in said


def test_quantization_section_says_why_slower_layers_stay_and_when_timing_them_failed(app, web):
    results = crafted_results()
    results["quantization"]["layer_speed"] = layer_speed(None) | {"not_tried": "sweep", "timed": 2}
    said = text(
        section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "quantization")
    )
    assert "1 of the 2 quantized layers timed (of 3: the others could not be followed" in said
    assert "They stay in int8: a sweep compares each bit-width whole" in said
    results["quantization"]["layer_speed"] = {"error": "RuntimeError: the requantization broke"}
    said = text(
        section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "quantization")
    )
    assert "Timing the layers against float stopped: RuntimeError: the requantization broke" in said
    assert "took less time" not in said and "took longer" not in said


def test_quantization_section_says_a_board_timed_each_kernel_alone_and_names_its_slower_layers(app, web):
    """A job timed on a board (remote.time_layers): the layers' kernels timed alone there; the slower
    ones named, not rebuilt in float, since the build was made before the board was reached."""
    results = crafted_results()
    speed = layer_speed(None) | {"device": "rpi4 (emulated: QEMU cortex-a72)", "method": "alone"}
    results["quantization"]["layer_speed"] = speed | {"not_tried": "board"}
    said = text(
        section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "quantization")
    )
    assert (
        "1 of the 3 quantized layers took longer in int8 than in float, each layer's kernel timed alone, "
        "on random inputs of its shapes (time_evaluator), in both builds on rpi4 (emulated: QEMU cortex-a72)"
    ) in said
    assert "conv2 (depthwise conv2d): 35.0 µs in int8 against 20.0 µs in float, 1.75× as long." in said
    assert "They stay in int8: the build is made before the board is reached" in said


def test_device_section_shows_the_board_emulated_its_times_and_bit_exact_outputs(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(board_results()))}").get_data(as_text=True)
    device = section(html, "device")
    heading = text(re.search(r"<h2>.*?</h2>", device, re.S).group(0))
    assert (
        EMULATED_RPI5 in heading and '<span class="badge emulated" id="device-kind">emulated</span>' in device
    )
    said = text(device)
    assert "key rpi5" in said and "127.0.0.1:42969" in said and "2 threads" in said
    assert "20.000 ms" in said and "4.000 ms" in said and "5.00×" in said
    assert "not predictions of a real Raspberry Pi" in said
    rows = re.findall(r"<tr><td>(.*?)</tr>", section(html, "device"), re.S)
    assert "int8 on this server" in rows[0] and "bit-exact" in rows[0]
    assert "TVM fp32 on rpi5" in rows[1] and "bit-exact" not in rows[1] and "0.0007" in rows[1]
    # a real board: no emulated badge, no note
    real = section(
        web.get(f"/r/{write_job(app, with_facts(board_results(False)))}").get_data(as_text=True), "device"
    )
    assert "real board" in real and "emulated" not in real and "not predictions" not in real
    # a job on this server has no device section
    assert not section(
        web.get(f"/r/{write_job(app, with_facts(crafted_results()))}").get_data(as_text=True), "device"
    )


def test_board_times_say_emulated_wherever_they_appear(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(board_results()))}").get_data(as_text=True)
    bench = section(html, "benchmark")
    assert f"Benchmark on {EMULATED_RPI5}" in text(re.search(r"<h2>.*?</h2>", bench, re.S).group(0))
    assert f"Median latency on {EMULATED_RPI5}, ms" in bench  # the chart's axis
    quant = section(html, "quantization")
    assert EMULATED_RPI5 in text(re.search(r'<td id="quant-device">.*?</td>', quant, re.S).group(0))
    assert "speedup (emulated)" in text(quant) and "5.00×" in text(quant)


def test_remote_stage_shows_the_wait_for_a_board_then_the_board(app, web):
    remote = {"name": "remote", "status": "running", "seconds": None, "progress": 0.0}
    waiting = {**remote, "detail": {"waiting": "for a free 'rpi5' board (up to 900 s)"}}
    job_id = write_job(app, None, "running", [*STAGES_DONE, waiting])
    detail = re.search(
        r'<span class="detail" id="remote-detail">(.*?)</span>',
        web.get(f"/r/{job_id}/stages").get_data(as_text=True),
    )
    assert detail.group(1) == "waiting for a free &#39;rpi5&#39; board (up to 900 s)"
    update_job(app, job_id, None, "running", [*STAGES_DONE, {**remote, "detail": {"board": EMULATED_RPI5}}])
    assert f"on {EMULATED_RPI5}</span>" in web.get(f"/r/{job_id}/stages").get_data(as_text=True)


def test_fidelity_hides_agreement_measured_on_one_input_and_shows_it_on_the_dataset(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(crafted_results()))}").get_data(as_text=True)
    fidelity = section(html, "fidelity")
    table = re.search(r'<table class="grid" id="fidelity-table">.*?</table>', fidelity, re.S).group(0)
    assert "agreement" not in table and "100%" not in table
    accuracy = re.search(r'<table class="grid" id="accuracy-table">.*?</table>', fidelity, re.S).group(0)
    assert "29.00%" in accuracy and "30.0%" in accuracy  # int8: its accuracy and its agreement


def test_tuning_section_labels_the_search_and_the_build_figures(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(crafted_results()))}").get_data(as_text=True)
    tuning = section(html, "tuning")
    assert "2 of 4 kernels already tuned" in text(tuning)
    assert "8 trials of its budget of 8" in text(tuning)
    assert "1 of 2 records faster" in text(tuning) and "1 of 2 records used" in text(tuning)
    assert "whole model took 0.0931 ms against 0.104 ms on the default rules alone" in text(tuning)
    # the record that lost: the build's own times, and the search's figure in its own labelled column
    assert "164 µs with the record vs 80 µs" in text(tuning)
    row = re.search(r"<tr><td><code>fused_conv2d10_add_relu</code>.*?</tr>", tuning, re.S).group(0)
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[2:6] == ["22.8", "87.7", "164", "80"]
    assert "search: best record" in tuning and "this build, timed here" in tuning
    names = re.findall(
        r"<tr><td><code>([^<]+)</code>", re.search(r'id="tuning-table">.*?</table>', tuning, re.S).group(0)
    )
    assert names == ["fused_conv2d1_add_relu", "fused_conv2d10_add_relu"]


def test_tuning_section_says_when_the_faster_records_made_the_whole_model_slower(app, web):
    results = crafted_results()
    results["record_choice"][1]["used"] = False
    results["record_check"][0].update(tuned_ms=0.1125, kept=False)
    tuning = section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "tuning")
    assert "1 of 2 records faster" in text(tuning) and "0 of 2 records used" in text(tuning)
    assert "took 0.113 ms against 0.104 ms" in text(tuning) and "so the build uses none of them" in text(
        tuning
    )
    row = re.search(r"<tr><td><code>fused_conv2d1_add_relu</code>.*?</tr>", tuning, re.S).group(0)
    assert "no: the whole model was not faster with the records" in row
    row = re.search(r"<tr><td><code>fused_conv2d10_add_relu</code>.*?</tr>", tuning, re.S).group(0)
    assert "no: the default rule was faster" in row


def test_tuning_section_at_0_trials_has_no_table_of_dashes(app, web):
    results = crafted_results()
    results["tuning"].update(trials=0, budget=0, pretuned=0, curve=[])
    for task in results["tuning"]["tasks"]:
        task.update(latency_us=None, gflops=None, pretuned=False)
    del results["record_choice"], results["record_check"]
    tuning = section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "tuning")
    assert "tuning-table" not in tuning and "–" not in tuning
    assert "No kernel of this model has a record" in text(tuning) and "ran no trials" in text(tuning)
    # pre-tuned records only: they are listed, and nothing pretends the job tuned
    results["tuning"]["pretuned"] = 1
    results["tuning"]["tasks"][0].update(latency_us=22.8, gflops=87.7, pretuned=True)
    tuning = section(web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "tuning")
    assert "1 of 4 kernels already tuned" in text(tuning) and "This job ran no trials" in text(tuning)
    assert len(re.findall(r"<tr><td><code>", tuning)) == 1


def test_kernel_table_and_picker_sort_numbered_kernels_naturally(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    code = section(web.get(f"/r/{job_id}?view=tir").get_data(as_text=True), "code")
    table = re.search(r'id="kernel-table">.*?</table>', code, re.S).group(0)
    expected = [
        "fused_conv2d_add_relu",
        "fused_conv2d1_add_relu",
        "fused_conv2d2_add_relu",
        "fused_conv2d10_add_relu",
    ]
    listed = [n for n in re.findall(r"<code>([^<]+)</code>", table) if n != "fused_matmul_add"]
    assert listed == [n for n in expected if n in listed] and len(listed) == 3
    options = re.findall(r'<option value="(fused_[^"]+)"', code)
    assert (
        options.index("fused_conv2d1_add_relu")
        < options.index("fused_conv2d2_add_relu")
        < options.index("fused_conv2d10_add_relu")
    )
    assert "1 tuned" in text(code) and "3 default rule" in text(code)


def test_code_title_names_a_kernel_only_in_kernel_views(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    tir = web.get(f"/r/{job_id}/code?view=tir&kernel=fused_conv2d1_add_relu").get_data(as_text=True)
    assert re.search(r'class="code-title">TIR of a kernel: <code>fused_conv2d1_add_relu</code>', tir)
    # switching views submits the whole picker, the kernel select included
    bytecode = web.get(f"/r/{job_id}/code?view=bytecode&kernel=fused_conv2d1_add_relu").get_data(as_text=True)
    title = re.search(r'<h3 class="code-title">(.*?)</h3>', bytecode, re.S).group(1)
    assert title == "VM bytecode"


def test_pass_picker_numbers_the_changed_passes_one_after_the_other(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    html = web.get(f"/r/{job_id}/code?view=passes").get_data(as_text=True)
    options = [text(o).strip() for o in re.findall(r'<option value="\d+"[^>]*>(.*?)</option>', html)]
    assert options == ["1. ConvertToDataflow", "2. FuseTIR (after 271 unchanged passes)"]
    assert "2 of the 273 passes changed the Relax IR" in text(html)
    assert re.search(
        r'<option value="272"\s+selected',
        web.get(f"/r/{job_id}/code?view=passes&pass=272").get_data(as_text=True),
    )


def test_pygments_styles_load_before_the_sites_own(web):
    html = web.get("/").get_data(as_text=True)
    assert html.index("/pygments.css") < html.index("/static/style.css")
    css = web.get("/static/style.css").get_data(as_text=True)
    assert ".code .err { border: none; }" in css  # overrides Pygments' red box, being later


def test_form_option_lists_come_from_the_catalog(web):
    html = web.get("/").get_data(as_text=True)
    for name, values in (
        ("quantize", QUANTIZE_MODES),
        ("calibration", CALIBRATION_MODES),
        ("weight_scale", WEIGHT_SCALE_MODES),
        ("weight_granularity", WEIGHT_GRANULARITY),
    ):
        select = re.search(rf'<select name="{name}".*?</select>', html, re.S).group(0)
        assert re.findall(r'<option value="([^"]+)"', select) == list(values)


def test_target_picker_groups_targets_by_where_they_run(web):
    html = web.get("/").get_data(as_text=True)
    groups = dict(re.findall(r'<legend class="group">([^<]+)</legend>(.*?)</fieldset>', html, re.S))
    pool = groups["Run on a board of the device pool (TVM RPC)"]
    assert re.findall(r'name="target" value="([^"]+)"', pool) == ["rpi4", "rpi5", "graviton3"]
    assert "runs on a &#39;rpi5&#39; board of the device pool" in pool and 'id="pool-status"' in pool
    here = groups["Run on this server"]  # this server is x86-64
    assert (
        "x86-generic" in re.findall(r'name="target" value="([^"]+)"', here) and "runs on this server" in here
    )


def test_form_options_follow_a_change_in_the_catalog(app, web, monkeypatch):
    import webapp.web.pages as pages

    monkeypatch.setattr(pages, "CALIBRATION_MODES", ("max", "mse"))
    select = re.search(r'<select name="calibration".*?</select>', web.get("/").get_data(as_text=True), re.S)
    assert re.findall(r'<option value="([^"]+)"', select.group(0)) == ["max", "mse"]


# ---------------------------------------------------------------- downloads and links


def test_download_links_only_for_files_the_job_has(app, web):
    results = crafted_results()  # tuned, but its records lost: no tuning database in files/
    html = web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True)
    downloads = section(html, "downloads")
    assert "database_tuning_record.json" not in downloads
    assert "weights-int8.npz" in downloads and "model-fp32.so" in downloads
    results["files"] = [*results["files"], "database_tuning_record.json", "database_workload.json"]
    downloads = section(
        web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True), "downloads"
    )
    assert "/files/database_tuning_record.json" in downloads and "/files/database_workload.json" in downloads


def test_every_link_on_a_result_page_answers(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    for view in ("relax-imported", "tir", "passes", "bytecode"):
        page = Links()
        page.feed(web.get(f"/r/{job_id}?view={view}").get_data(as_text=True))
        links = {h for h in page.hrefs if h.startswith(f"/r/{job_id}")}
        assert f"/r/{job_id}/files/model.so" in links
        for href in links:
            assert web.get(href).status_code == 200, href


# ---------------------------------------------------------------- errors


def test_unknown_result_is_a_styled_404_page(web):
    resp = web.get("/r/AAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    assert resp.status_code == 404 and resp.mimetype == "text/html"
    html = resp.get_data(as_text=True)
    assert "/static/style.css" in html and 'id="error-page"' in html and "404" in html


@pytest.mark.parametrize(
    "url",
    [
        "/r/AAAAAAAAAAAAAAAAAAAAAAAAAAAA.json",
        "/r/nope.json",
        "/api/jobs/AAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "/api/nothing-here",
        "/r/AAAAAAAAAAAAAAAAAAAAAAAAAAAA/files/result.json",
    ],
)
def test_json_urls_answer_json_errors(web, url):
    resp = web.get(url)
    assert resp.status_code == 404 and resp.is_json and resp.get_json() == {"error": "Not found."}


def test_wrong_method_is_a_styled_page_or_json(web):
    resp = web.get("/jobs")
    assert resp.status_code == 405 and 'id="error-page"' in resp.get_data(as_text=True)
    resp = web.put("/api/jobs/AAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    assert resp.status_code == 405 and resp.is_json


def test_a_server_error_is_a_styled_page_and_json_on_json_urls(app, web, monkeypatch):
    import webapp.web.pages as pages

    job_id = write_job(app, with_facts(crafted_results()))

    def broken(*args):
        raise RuntimeError("broken")

    monkeypatch.setattr(pages, "bench_chart", broken)
    resp = web.get(f"/r/{job_id}")
    assert resp.status_code == 500 and 'id="error-page"' in resp.get_data(as_text=True)
    import webapp.web.cache as cache

    monkeypatch.setattr(cache, "view_or_404", broken)
    resp = web.get(f"/r/{job_id}.json")
    assert resp.status_code == 500 and resp.is_json and "error" in resp.get_json()


# ---------------------------------------------------------------- live updates


def part_versions(html: str) -> dict[str, str]:
    return dict(re.findall(r'name="(v-[a-z]+)" value="([0-9a-f]+)"', html))


def test_live_fragment_sends_the_sections_that_changed_then_stops_polling(app, web):
    results = crafted_results()
    running = [{**s, "status": "done"} for s in STAGES_DONE[:2]] + [
        {**s, "status": "pending", "progress": None, "seconds": None} for s in STAGES_DONE[2:]
    ]
    job_id = write_job(app, None, "queued")
    page = web.get(f"/r/{job_id}").get_data(as_text=True)
    assert 'hx-trigger="every 1s"' in page and 'id="job-status">queued<' in page
    versions = part_versions(page)
    assert set(versions) == {
        f"v-{p}"
        for p in (
            "head",
            "summary",
            "graph",
            "sweep",
            "quantization",
            "tuning",
            "code",
            "benchmark",
            "generation",
            "device",
            "fidelity",
            "bisection",
            "downloads",
        )
    }

    # the job starts: the pill changes, nothing else
    update_job(app, job_id, None, "running", running)
    live = web.get(f"/r/{job_id}/live", query_string=versions)
    assert live.status_code == 200
    swapped = re.findall(
        r'<div id="part-([a-z]+)" class="part" hx-swap-oob="true">', live.get_data(as_text=True)
    )
    assert swapped == ["head"] and 'id="job-status">running<' in live.get_data(as_text=True)
    versions.update(part_versions(live.get_data(as_text=True)))

    # import and optimize are done: the summary appears while the job runs
    partial = {k: results[k] for k in ("model", "target", "passes")}
    update_job(app, job_id, with_facts(partial), "running", running)
    live = web.get(f"/r/{job_id}/live", query_string=versions).get_data(as_text=True)
    swapped = re.findall(r'<div id="part-([a-z]+)" class="part" hx-swap-oob="true">', live)
    # the head now shows the TVM target too, and the code section the IR of the stages done so far
    assert swapped == ["head", "summary", "code"] and 'id="code-so-far"' in live
    assert 'id="summary"' in live and 'id="param-count">1,234<' in live
    versions.update(part_versions(live))
    again = web.get(f"/r/{job_id}/live", query_string=versions).get_data(as_text=True)
    assert "hx-swap-oob" not in again  # nothing changed, nothing resent

    # the job ends: every section it measured, and 286 (htmx stops polling)
    update_job(app, job_id, with_facts(results), "done")
    live = web.get(f"/r/{job_id}/live", query_string=versions)
    assert live.status_code == 286
    swapped = set(
        re.findall(r'<div id="part-([a-z]+)" class="part" hx-swap-oob="true">', live.get_data(as_text=True))
    )
    assert {
        "head",
        "graph",
        "quantization",
        "tuning",
        "code",
        "benchmark",
        "fidelity",
        "downloads",
    } <= swapped
    final = web.get(f"/r/{job_id}").get_data(as_text=True)
    assert "hx-trigger" not in final.split('id="stages-card"')[1].split("</section>")[0]


def test_a_finished_page_needs_no_javascript(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(crafted_results()))}").get_data(as_text=True)
    for section_id in (
        "summary",
        "graph",
        "quantization",
        "tuning",
        "code",
        "benchmark",
        "fidelity",
        "downloads",
    ):
        assert section(html, section_id), section_id
    assert "every 1s" not in html and "http-equiv" not in html
    running = write_job(app, None, "running")
    assert '<noscript><meta http-equiv="refresh"' in web.get(f"/r/{running}").get_data(as_text=True)


# ---------------------------------------------------------------- the benchmark chart


def test_chart_axis_has_round_ticks_and_bars_end_at_their_value():
    results = crafted_results()
    chart = bench_chart(results)
    assert chart["log"]  # 0.012 ms to 0.4 ms: more than 20x apart
    labels = [t["label"] for t in chart["ticks"]]
    assert labels[0] == "0.005" and labels[-1] == "0.5" and "0.1" in labels  # a step below 0.012
    x = {t["label"]: t["x"] for t in chart["ticks"]}
    ort = next(b for b in chart["bars"] if b["runtime"] == "onnxruntime")
    pytorch = next(b for b in chart["bars"] if b["runtime"] == "pytorch")
    assert x["0.01"] < ort["median_x"] < x["0.02"] and x["0.2"] < pytorch["median_x"] < x["0.5"]
    assert all(b["p90_x"] >= b["median_x"] for b in chart["bars"])
    close = {
        "benchmarks": [
            dict(b, median_ms=m, p90_ms=m * 1.1)
            for b, m in zip(results["benchmarks"], (1.0, 2.0, 5.9, 3.0), strict=True)
        ]
    }
    chart = bench_chart(close)
    assert not chart["log"]  # 5.9x apart: a linear axis, so the bars compare by length
    bars = {b["runtime"]: b for b in chart["bars"]}
    tvm = next(b for b in chart["bars"] if b["label"] == "tvm fp32 default rules")
    assert bars["pytorch"]["median_x"] / tvm["median_x"] == pytest.approx(5.9, rel=0.01)
    assert [t["label"] for t in chart["ticks"]] == ["0", "2", "4", "6", "8"]


def test_chart_on_the_page_has_tick_labels_and_values_at_the_bar_ends(app, web):
    html = web.get(f"/r/{write_job(app, with_facts(crafted_results()))}").get_data(as_text=True)
    svg = re.search(r'<svg class="chart" id="bench-chart".*?</svg>', html, re.S).group(0)
    ticks = re.findall(r'class="axis tick-label"[^>]*>([^<]+)<', svg)
    assert len(ticks) >= 4 and "0.1" in ticks and "Median latency, ms (log scale)" in html
    ends = re.findall(
        r'<rect x="0" y="\d+" width="([\d.]+)".*?<text x="([\d.]+)" y="\d+" class="value">', svg, re.S
    )
    assert len(ends) == len(re.findall(r"<rect ", svg))
    for width, value_x in ends:
        assert float(value_x) == pytest.approx(4 + float(width))


def test_compare_takes_a_pasted_link_and_answers_for_two_results(app, web):
    a, b = (write_job(app, with_facts(crafted_results())) for _ in range(2))
    fp32 = write_job(
        app, with_facts(crafted_results()), options={"example": "digits-cnn", "target": "x86-host"}
    )
    title = "<title>digits-cnn int8 on x86-host vs digits-cnn fp32 on x86-host · TVM Playground</title>"
    assert title in web.get(f"/compare/{a}/{fp32}").get_data(as_text=True)
    resp = web.get(f"/compare?a={a}&b=https://example.org/r/{b}?view=asm%23code")
    assert resp.status_code == 302 and resp.headers["Location"].endswith(f"/compare/{a}/{b}")
    assert web.get(f"/compare?a={a}&b={b}").headers["Location"].endswith(f"/compare/{a}/{b}")
    bad = web.get(f"/compare?a={a}&b=not a result")
    assert bad.status_code == 400 and "Paste the link of another result" in bad.get_data(as_text=True)
    html = web.get(f"/compare/{a}/{b}").get_data(as_text=True)
    assert "Two results side by side" in html and "compare-kernels" in html
    comparison = web.get(f"/compare/{a}/{b}.json").get_json()
    assert comparison["speedup"] == pytest.approx(1.0)  # the same results: as fast
    assert all(o["same"] for o in comparison["options"])
    missing = web.get(f"/compare/{a}/nosuchjob0000000000000")
    assert missing.status_code == 404
    assert (
        "There is no result &#39;nosuchjob0000000000000&#39; on this server (the compare page&#39;s B)"
        in (missing.get_data(as_text=True))
    )
    # options as the form says them: its labels and choices, yes / no, not "None" or "False"
    html = web.get(f"/compare/{a}/{fp32}").get_data(as_text=True)
    options = section(html, "compare-options")
    assert "<td>precision</td><td>int8 (integer kernels" in options and "<td>none: float32</td>" in options
    assert "None" not in options and "False" not in options


def test_compare_lines_up_kernels_by_the_source_layers_they_compute():
    from webapp.web.compare import matched_kernels

    a = [
        {"name": "fused_conv2d_add_relu", "layers": ["conv1", "relu1"], "ms": 2.0},
        {"name": "fused_matmul_add", "layers": ["fc"], "ms": 1.0},
        {"name": "transpose", "layers": [], "ms": 0.1},
    ]
    b = [  # int8: conv1's kernel is named otherwise, relu1 fused into another one, fc kept in float
        {"name": "fused_conv2d_add_cast_multiply", "layers": ["conv1"], "ms": 0.5},
        {"name": "fused_relu_cast", "layers": ["relu1"], "ms": 0.2},
        {"name": "fused_matmul_add", "layers": ["fc"], "ms": 1.0},
        {"name": "transpose", "ms": 0.1},
        {"name": "fused_quantize", "layers": ["quantize_input"], "ms": 0.3},
    ]
    rows = matched_kernels(a, b)
    assert [(r["layers"], [k["name"] for k in r["a"]], [k["name"] for k in r["b"]]) for r in rows] == [
        (
            ["conv1", "relu1"],
            ["fused_conv2d_add_relu"],
            ["fused_conv2d_add_cast_multiply", "fused_relu_cast"],
        ),
        (["fc"], ["fused_matmul_add"], ["fused_matmul_add"]),
        ([], ["transpose"], ["transpose"]),  # no layer: by name
        (["quantize_input"], [], ["fused_quantize"]),  # only in B
    ]
    assert rows[0]["b_ms"] == pytest.approx(0.7) and rows[0]["ratio"] == pytest.approx(2.0 / 0.7)
    assert rows[3]["a_ms"] is None and rows[3]["ratio"] is None


def test_the_graph_diff_marks_each_kernel_call_changed_removed_added_or_the_same(app, web):
    from webapp.web.compare import graph_diff

    def graph(*calls):
        nodes = [{"id": "n0", "kind": "input", "label": "x"}]
        for i, (label, layers, ms) in enumerate(calls, 1):
            nodes.append({"id": f"n{i}", "kind": "kernel", "label": label, "layers": layers, "ms": ms})
        return {"nodes": nodes, "edges": []}

    a = graph(
        ("transpose", [], 0.1),
        ("fused_conv2d_add_relu", ["conv1", "relu1"], 2.0),
        ("fused_conv2d1_add1", ["conv2"], 1.0),
        ("fused_matmul_add", ["fc"], 1.0),
        ("mean", ["pool"], 0.2),
    )
    b = graph(  # int8 conv1, conv2 on the same rule but slower, fc the same, a new input quantization
        ("fused_quantize", ["quantize_input"], 0.3),
        ("fused_conv2d_add_cast", ["conv1", "relu1"], 0.5),
        ("fused_conv2d2_add2", ["conv2"], 1.3),  # 1.3x: its time changed; the numbering is not a change
        ("fused_matmul_add", ["fc"], 1.1),  # 1.1x: the same
        ("mean", ["pool"], 0.2),
    )
    rules = {"fused_conv2d_add_relu": "conv2d", "fused_conv2d_add_cast": "int8 conv2d"}
    kernels = [
        [{"name": n["label"], "schedule": rules.get(n["label"], "x")} for n in g["nodes"][1:]] for g in (a, b)
    ]
    diff = graph_diff(a, b, *kernels)
    states = [[diff[tag][f"n{i}"]["state"] for i in range(1, 6)] for tag in ("a", "b")]
    assert states == [
        ["removed", "changed", "changed", "same", "same"],
        ["added", "changed", "changed", "same", "same"],
    ]
    assert "n0" not in diff["a"]  # inputs and outputs are no kernel calls
    assert diff["a"]["n2"]["why"][0] == "rule: conv2d → int8 conv2d"
    assert diff["a"]["n2"]["why"][1] == "kernels: fused_conv2d_add_relu → fused_conv2d_add_cast"
    assert diff["a"]["n2"]["why"][2].endswith("(B 4.00× faster)") and diff["b"]["n2"]["match"] == [
        "fused_conv2d_add_relu"
    ]
    assert diff["b"]["n3"]["why"] == ["time: 1.0000 → 1.3000 ms a call (B 1.30× slower)"]
    assert diff["counts"]["a"] == {"same": 2, "changed": 2, "removed": 1, "added": 0}
    # on the page: a graph per side (one written malformed by its sandbox: no diff, the page answers)
    results = with_facts(crafted_results())
    results["graphs"] = {
        "fused": {"nodes": 6, "edges": 0, "svg": "graph-fused.svg", "json": "graph-fused.json"}
    }
    results["files"] = [*results.get("files", []), "graph-fused.svg"]
    ids = [write_job(app, results) for _ in range(2)]
    store = app.extensions["playground"]["store"]
    for job_id, g in zip(ids, (a, b), strict=True):
        (store.job_dir(job_id) / "views" / "graph-fused.json").write_text(json.dumps(g))
    html = web.get(f"/compare/{ids[0]}/{ids[1]}").get_data(as_text=True)
    assert html.count('class="graph-view"') == 2 and html.count('class="diff-data"') == 2
    assert web.get(f"/compare/{ids[0]}/{ids[1]}.json").get_json()["graph_diff"]["counts"]["b"]["added"] == 1
    (store.job_dir(ids[1]) / "views" / "graph-fused.json").write_text('{"nodes": [{"id": 1}]')
    resp = web.get(f"/compare/{ids[0]}/{ids[1]}")
    assert resp.status_code == 200 and "compare-graphs" not in resp.get_data(as_text=True)


def test_the_compare_picker_lists_this_browsers_results_first_then_recent_examples(app, web):
    store = app.extensions["playground"]["store"]
    upload = write_job(
        app, with_facts(crafted_results()), options={"filename": "mine.onnx", "target": "x86-host"}
    )
    other = write_job(
        app, with_facts(crafted_results()), options={"filename": "theirs.onnx", "target": "x86-host"}
    )
    example = write_job(app, with_facts(crafted_results()))
    web.set_cookie("mine", f"{upload}.nosuchjob0000000000000")
    picker = web.get(f"/compare/picker?a={example}").get_data(as_text=True)
    yours, recent = picker.split('<optgroup label="Recent built-in examples">')
    assert f'<option value="{upload}">mine.onnx fp32 on x86-host</option>' in yours
    assert other not in picker  # someone else's upload is never listed
    assert example not in picker  # nor the result being compared
    assert all(j["id"] in recent for j in store.recent_examples(5) if j["id"] != example)
    picked = web.get(f"/compare?a={example}&b=&pick={upload}")
    assert picked.status_code == 302 and picked.headers["Location"].endswith(f"/compare/{example}/{upload}")


def test_a_large_graph_opens_folded_by_block_and_a_small_one_whole():
    """The bert example's graphs (7 blocks, 66 kernel calls) open folded; a small CNN's (13) whole;
    a kernel's blocks read as ranges."""
    from webapp.web.pages import blocks_text, shown_graph

    bert = {"layers": {"nodes": 7}, "imported": {"nodes": 153}, "fused": {"nodes": 66}}
    assert shown_graph(bert) == "layers"
    assert shown_graph({"layers": {"nodes": 5}, "imported": {"nodes": 20}, "fused": {"nodes": 13}}) == "fused"
    assert shown_graph({"imported": {"nodes": 153}, "fused": {"nodes": 66}}) == "fused"
    assert shown_graph({"imported": {"nodes": 3}}) == "imported"
    chain = {"layers": {"nodes": 202}, "imported": {"nodes": 602}, "fused": {"nodes": 202}}
    assert shown_graph(chain) == "fused"  # one kernel a block: folding shortens nothing
    blocks = ["m.embeddings", "m.encoder.layer.0", "m.encoder.layer.1", "m.encoder.layer.2", "m.lm_head"]
    assert blocks_text(blocks) == "m.embeddings, m.encoder.layer.0–2, m.lm_head"
    assert blocks_text(["layers.0", "layers.2"]) == "layers.0, layers.2"


def test_a_graph_dot_lays_out_slowly_is_drawn_with_the_quick_layout(tmp_path, monkeypatch):
    """dot's own layout of an LSTM recognizer's 282 fused kernels took 164 s (both of ddddocr's graphs
    went undrawn after 90 s each, three of the job's four minutes): past FULL_LAYOUT_S the graph is
    laid out again with one network-simplex pass and straight edges (here: the full layout given no
    time at all)."""
    from webapp.pipeline.reports import graphs

    monkeypatch.setattr(graphs, "FULL_LAYOUT_S", 0.001)
    nodes = [{"id": f"n{i}", "label": "op", "kind": "op"} for i in range(40)]
    edges = [
        {"src": f"n{i}", "dst": f"n{j}", "type": {"kind": "other", "text": ""}}
        for i, j in [(0, 1), (1, 2), (0, 2)]
    ]
    assert graphs.render_svg({"nodes": nodes, "edges": edges}, "slow", tmp_path / "g.svg") is None
    assert "<svg" in (tmp_path / "g.svg").read_text()


def test_a_graph_too_large_to_lay_out_is_not_drawn_and_the_page_says_why(app, web, tmp_path):
    """Graphviz takes minutes on a graph of 2,000 nodes (ddddocr's unrolled LSTM): such a graph is not
    given to it, and its tab says why and links the graph's JSON."""
    from webapp.pipeline.reports.graphs import MAX_DRAWN_NODES, render_svg

    nodes = [{"id": f"n{i}", "label": "op", "kind": "op"} for i in range(MAX_DRAWN_NODES + 1)]
    why = render_svg({"nodes": nodes, "edges": []}, "big", tmp_path / "big.svg")
    assert why.startswith(f"{MAX_DRAWN_NODES + 1:,} nodes") and not (tmp_path / "big.svg").exists()
    assert render_svg({"nodes": nodes[:2], "edges": []}, "small", tmp_path / "small.svg") is None
    results = crafted_results()
    results["graphs"]["imported"] |= {"svg": None, "not_drawn": why, "json": "graph-imported.json"}
    page = web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True)
    assert why in page and "graph as JSON</a> holds every node" in page


# ---------------------------------------------------------------- a finished result is rendered once


def test_a_finished_result_is_rendered_once_and_answered_by_its_etag_compressed(app, web):
    results = with_facts(crafted_results())
    job_id = write_job(app, results)
    store = app.extensions["playground"]["store"]
    for url, mimetype in ((f"/r/{job_id}", "text/html"), (f"/r/{job_id}.json", "application/json"),
                          (f"/r/{job_id}/code?view=tir", "text/html")):  # fmt: skip
        first = web.get(url)
        etag = first.headers["ETag"].strip('"')
        assert first.status_code == 200 and first.mimetype == mimetype
        assert first.headers["Cache-Control"] == "public, max-age=3600"
        # the page was written once, beside the job, and is what the next request gets
        assert (store.job_dir(job_id) / "rendered" / f"{etag}.html").read_text() == first.get_data(
            as_text=True
        )
        again = web.get(url, headers={"If-None-Match": f'"{etag}"'})
        assert again.status_code == 304 and not again.get_data()
        # as the compression marked it (what a browser sends back): the same answer
        assert web.get(url, headers={"If-None-Match": f'"{etag}:br"'}).status_code == 304
        packed = web.get(url, headers={"Accept-Encoding": "gzip"})
        assert packed.headers["Content-Encoding"] == "gzip" and packed.headers["Vary"] == "Accept-Encoding"
        assert len(packed.get_data()) < len(first.get_data()) / 2
        # compressed once too, kept beside it, with an ETag of its own
        kept = store.job_dir(job_id) / "rendered" / f"{etag}.html.gzip"
        assert kept.read_bytes() == packed.get_data() and packed.headers["ETag"] == f'"{etag}:gzip"'
        assert gzip.decompress(packed.get_data()) == first.get_data()
    # another view is another page; a result that changes (a rewritten result.json) is another page
    assert web.get(f"/r/{job_id}?view=asm").headers["ETag"] != web.get(f"/r/{job_id}").headers["ETag"]
    before = web.get(f"/r/{job_id}").headers["ETag"]
    update_job(app, job_id, {**results, "threads": 4}, "done")
    assert web.get(f"/r/{job_id}", headers={"If-None-Match": before}).status_code == 200
    # files of a finished job, static files (their hash in the URL) and the code colours: a year
    page = web.get(f"/r/{job_id}").get_data(as_text=True)
    for asset in re.findall(r'(?:href|src)="(/(?:static/[^"]+|pygments\.css[^"]*))"', page):
        assert "?v=" in asset, asset
        assert web.get(unescape(asset)).headers["Cache-Control"] == "public, max-age=31536000, immutable"
    svg = web.get(f"/r/{job_id}/files/graph-fused.svg")
    assert svg.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    favicon = web.get("/favicon.ico")
    assert favicon.status_code == 301 and favicon.headers["Location"].startswith("/static/favicon.svg")


def test_a_running_job_and_the_submitters_own_page_are_not_kept_by_shared_caches(app, web):
    store = app.extensions["playground"]["store"]
    running = write_job(app, None, "running")
    page = web.get(f"/r/{running}")
    assert page.status_code == 200 and "ETag" not in page.headers and "Cache-Control" not in page.headers
    assert not (store.job_dir(running) / "rendered").exists()
    # the browser that submitted it has the delete link on its page: private, a page of its own
    job_id = new_job_id()
    (store.job_dir(job_id) / "files").mkdir(parents=True)
    store.create(job_id, {"example": "digits-cnn", "target": "x86-host"}, token="the-token")
    update_job(app, job_id, with_facts(crafted_results()), "done")
    public = web.get(f"/r/{job_id}")
    web.set_cookie(f"delete-{job_id}", "the-token", path=f"/r/{job_id}")
    own = web.get(f"/r/{job_id}")
    assert own.headers["Cache-Control"] == "private, max-age=3600" and 'id="delete-link"' in own.get_data(
        as_text=True
    )
    assert public.headers["Cache-Control"] == "public, max-age=3600"
    assert (
        'id="delete-link"' not in public.get_data(as_text=True)
        and own.headers["ETag"] != public.headers["ETag"]
    )
    # deleted: the page the delete answers with is one no browser has kept, and it says 410
    gone = web.post(f"/r/{job_id}/delete", data={"token": "the-token"})
    assert gone.status_code == 303 and web.get(gone.headers["Location"]).status_code == 410


# ---------------------------------------------------------------- progress is never silent


def test_a_queued_job_says_its_place_and_when_it_should_start():
    from webapp.jobs.store import queue_estimate

    # 3 ahead, shared by 2 busy workers at 40 s a job, the running ones half done: 1.5 + 0.5 jobs
    assert queue_estimate({"place": 4, "running": 2, "median_s": 40.0, "recent": 9})["start_in_s"] == 80.0
    assert queue_estimate({"place": 1, "running": 0, "median_s": 40.0, "recent": 9})["start_in_s"] == 0.0
    assert queue_estimate({"place": 2, "running": 0, "median_s": None, "recent": 0})["start_in_s"] is None


def test_queue_place_starting_and_skipped_stages_are_said_on_the_page(app, web):
    store = app.extensions["playground"]["store"]
    first, second = write_job(app, None, "queued"), write_job(app, None, "queued")
    place = store.queue_place(second, store.get(second)["created"])
    assert place["place"] == store.queue_place(first, store.get(first)["created"])["place"] + 1
    said = text(web.get(f"/r/{second}").get_data(as_text=True))
    assert f"In the queue: place {place['place']} ({place['place'] - 1} job" in said
    view = web.get(f"/api/jobs/{second}").get_json()["queue"]
    assert view["place"] == place["place"] and "start_in_s" in view
    # a worker took it, and no stage has begun: the page says what is happening
    pending = [{**s, "status": "pending", "progress": None, "seconds": None} for s in STAGES_DONE]
    update_job(app, second, None, "running", pending)
    page = web.get(f"/r/{second}").get_data(as_text=True)
    assert 'id="starting"' in page and "opening its sandbox" in page and "In the queue" not in page
    # a skipped stage says why
    stages = [dict(s) for s in STAGES_DONE]
    stages[3] = {**stages[3], "status": "skipped", "why": "no tuning trials asked"}
    update_job(app, second, with_facts(crafted_results()), "done", stages)
    page = web.get(f"/r/{second}").get_data(as_text=True)
    assert (
        'id="starting"' not in page and '<span class="detail skip-why">no tuning trials asked</span>' in page
    )


def test_the_benchmark_names_the_cpu_and_says_how_busy_the_machine_was(app, web):
    results = with_facts(crafted_results())
    results["machine"] = {"cpu": "AMD EPYC 9B14", "instruction_sets": ["AVX2", "AVX-512", "AVX-512 VNNI"],
                          "cores": 2, "governor": None}  # fmt: skip
    first = {"quiet": False, "others_cores": 0.97, "steal_share": 0.0, "seconds": 1.2, "spread": 0.31,
             "what": "other processes used 0.97 cores on average", "waited_s": 0.0}  # fmt: skip
    first["disturbed"] = f"{first['what']}; its rounds' medians lay 31% apart"
    second = {"quiet": True, "others_cores": 0.04, "steal_share": 0.0, "seconds": 1.1, "spread": 0.03,
              "what": "quiet", "waited_s": 3.2, "disturbed": None}  # fmt: skip
    # timed again once the machine was quiet (stages/timing.py): the headline states its figures plainly
    results["conditions"] = second | {"kept": 2, "timings": [first, second]}
    results |= derive(results)
    assert (
        results["headline"]["speed"]["uncertain"] is None
        and "Uncertain" not in results["headline"]["speed"]["text"]
    )
    page = web.get(f"/r/{write_job(app, results)}").get_data(as_text=True)
    line = unescape(
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page.split('id="bench-conditions">')[1].split("</p>")[0]))
    )
    assert line == (
        "Measured on AMD EPYC 9B14 (AVX2, AVX-512, AVX-512 VNNI), 2 cores. While it timed: quiet (other "
        "processes used 0.04 cores on average). Timed 2 times, waiting 3.2 s in all for the machine to be "
        "quiet: 1. other processes used 0.97 cores on average; its rounds' medians lay 31% apart; "
        "2. undisturbed. The table shows timing 2."
    )
    assert "bench-disturbed" not in page and 'class="faster uncertain"' not in page
    # a core busy with other processes when it began: every runtime left it (timing.free_cores)
    results["fewer_threads"] = {"threads": 1, "of": 2, "busy_cores": 1}
    page = web.get(f"/r/{write_job(app, results)}").get_data(as_text=True)
    line = re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", "", page.split('id="bench-conditions">')[1].split("</p>")[0])
    )
    assert line.endswith(
        "The table shows timing 2. Other processes kept 1 of the 2 cores busy when it "
        "began: every runtime ran on 1 thread instead of 2, leaving them."
    )


def test_an_own_input_run_whose_worker_stopped_says_so_and_a_board_result_refuses_one(app, web):
    import time as clock

    from webapp.jobs.own_input import run_dir, status_file

    config = app.extensions["playground"]["config"]
    job_id = write_job(app, with_facts(crafted_results()))
    folder = run_dir(config, job_id, "a" * 12)
    folder.mkdir(parents=True)
    started = clock.time() - 3 * config.wall_limit_s
    status = {"status": "running", "filename": "in.npz", "created": started, "started": started}
    status_file(folder).write_text(json.dumps(status))
    folder.with_name("a" * 12 + ".claimed").touch()
    run = web.get(f"/r/{job_id}/inputs/{'a' * 12}.json").get_json()
    assert run["status"] == "failed" and "interrupted" in run["error"]
    assert web.get(f"/r/{job_id}/inputs/{'b' * 12}.json").status_code == 404
    # what a sandbox wrote, of any shape: the page and the JSON answer with what is of the right type
    odd = {"runtimes": [{"runtime": "TVM", "top5": [["x", "y"], ["3", 0.5]], "outputs": {"shape": 5}}]}
    for result in (odd, {"runtimes": {}, "inputs": 5, "runs": "many"}, [1, 2]):
        (folder / "result.json").write_text(json.dumps(result))
        status_file(folder).write_text(json.dumps(status | {"status": "done"}))
        assert web.get(f"/r/{job_id}/inputs/{'a' * 12}").status_code == 200
        run = web.get(f"/r/{job_id}/inputs/{'a' * 12}.json").get_json()
        assert run["status"] == "done"
    assert "runtimes" not in run  # the last, a list: nothing of it shown
    (folder / "result.json").write_text(json.dumps(odd))
    assert web.get(f"/r/{job_id}/inputs/{'a' * 12}.json").get_json()["runtimes"][0]["top5"] == [["3", 0.5]]
    # a worker's start queues again every run no worker has claimed (this one was claimed: running)
    from webapp.jobs.own_input import waiting_runs

    assert waiting_runs(config) == []
    folder.with_name("a" * 12 + ".claimed").unlink(missing_ok=True)
    assert waiting_runs(config) == [(job_id, "a" * 12)]
    board = write_job(app, with_facts(crafted_results()), options={"example": "cnn-small", "target": "rpi5"})
    resp = web.post(f"/api/jobs/{board}/inputs", data={"file": (io.BytesIO(b"x"), "in.npz")})
    assert resp.status_code == 400 and "this server's CPU" in resp.get_json()["error"]


def test_compare_warns_when_the_two_results_are_of_different_models(app, web, tmp_path):
    """Two results of one model compare builds; of two models, the page says so and what differs (the
    example, the uploaded file's bytes, the inputs) above the speed ratio."""
    from webapp.jobs.storage import store_once

    config = app.extensions["playground"]["config"]
    store = app.extensions["playground"]["store"]

    def upload(name: str, data: bytes, shape=(1, 1, 8, 8)) -> str:
        results = with_facts(crafted_results())
        results["model"]["inputs"][0]["shape"] = list(shape)
        options = {"filename": name, "model_file": "model.onnx", "target": "x86-host", "quantize": "int8"}
        job_id = write_job(app, results, options=options)
        (store.job_dir(job_id) / "input").mkdir()
        (store.job_dir(job_id) / "input" / "model.onnx").write_bytes(data)
        store_once(config, store.job_dir(job_id) / "input" / "model.onnx")  # as a submit keeps it
        return job_id

    def differences(a: str, b: str) -> list[str]:
        said = web.get(f"/compare/{a}/{b}.json").get_json()["differences"]
        html = web.get(f"/compare/{a}/{b}").get_data(as_text=True)
        assert ('id="compare-different-models"' in html) == bool(said)
        return said

    digits, other = (
        write_job(app, with_facts(crafted_results())),
        write_job(app, with_facts(crafted_results())),
    )
    assert differences(digits, other) == []
    resnet = write_job(
        app,
        with_facts(crafted_results()),
        options={"example": "resnet18", "target": "x86-host", "quantize": "int8"},
    )
    assert differences(digits, resnet) == ["the model: digits-cnn against resnet18"]
    one, again = upload("mine.onnx", b"\x08\x07 one"), upload("renamed.onnx", b"\x08\x07 one")
    assert differences(one, again) == []  # the same bytes under another name: the same model
    changed = upload("mine.onnx", b"\x08\x07 two")
    assert differences(one, changed) == ["the model file's contents (both named mine.onnx)"]
    wider = upload("mine.onnx", b"\x08\x07 one", shape=(4, 1, 8, 8))
    assert differences(one, wider) == ["the inputs: input 1x1x8x8 float32 against input 4x1x8x8 float32"]
    assert "These are two different models" in web.get(f"/compare/{one}/{wider}").get_data(as_text=True)


def test_a_bad_own_input_file_says_why_and_leads_back_to_the_result(app, web):
    job_id = write_job(app, with_facts(crafted_results()))
    resp = web.post(f"/r/{job_id}/inputs", data={"file": (io.BytesIO(b"hello"), "notes.txt")})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 400 and "This file cannot be run" in html
    assert "Send an .npz of the model&#39;s inputs, or an image" in html
    assert f'<a href="/r/{job_id}#own-input" id="error-back">Back to the result' in html
    # the API still answers in JSON
    api = web.post(f"/api/jobs/{job_id}/inputs", data={"file": (io.BytesIO(b"hello"), "notes.txt")})
    assert api.status_code == 400 and "Send an .npz" in api.get_json()["error"]


def test_the_linter_headline_counts_findings_on_kernels_of_at_least_1_percent_of_a_run(app, web):
    results = crafted_results()
    for k, share in zip(results["kernels"], (0.6, 0.3, 0.004, 0.096), strict=True):
        k.update(ms=share, share=share)
    results["kernels"][0]["lint"] = [{"hazard": "naive", "title": "the naive schedule", "evidence": "big"}]
    results["kernels"][2]["lint"] = [{"hazard": "naive", "title": "the naive schedule", "evidence": "tiny"}]
    html = web.get(f"/r/{write_job(app, with_facts(results))}").get_data(as_text=True)
    head = unescape(text(re.search(r'<li id="headline-lint">.*?</li>', html, re.S).group(0)))
    assert (
        "1 finding in 1 of its 4 kernels (the naive schedule: 1); 1 more on kernels under 1% of a run" in head
    )
    table = re.search(r'<table class="grid" id="lint-table">.*?</table>', html, re.S).group(0)
    rows = re.findall(
        r"<tr( class=\"minor\")?><td><code>(\w+)</code></td><td class=\"num\">([^<]*)</td>", table
    )
    assert rows == [
        ("", "fused_conv2d10_add_relu", "60.0"),
        (' class="minor"', "fused_conv2d2_add_relu", "0.4 (not counted)"),
    ]


def test_an_examples_random_weights_are_said_on_its_page_and_its_own_input_runs(app, web):
    from webapp.catalog import EXAMPLES
    from webapp.jobs.own_input import run_dir, status_file

    config = app.extensions["playground"]["config"]
    results = crafted_results()
    results["model"]["weights"] = EXAMPLES["cnn-small"].weights
    job_id = write_job(app, with_facts(results), options={"example": "cnn-small", "target": "x86-host"})
    said = EXAMPLES["cnn-small"].weights["text"]
    assert said in section(web.get(f"/r/{job_id}").get_data(as_text=True), "summary")
    folder = run_dir(config, job_id, "c" * 12)
    folder.mkdir(parents=True)
    status_file(folder).write_text(json.dumps({"status": "done", "filename": "in.npz", "created": 1.0}))
    (folder / "result.json").write_text(json.dumps({"runtimes": [], "inputs": []}))
    assert web.get(f"/r/{job_id}/inputs/{'c' * 12}.json").get_json()["weights"]["trained"] is False
    page = web.get(f"/r/{job_id}/inputs/{'c' * 12}").get_data(as_text=True)
    assert 'id="input-weights"' in page and said in page
    trained = crafted_results()
    trained["model"]["weights"] = EXAMPLES["digits-cnn"].weights
    digits = write_job(app, with_facts(trained))
    assert EXAMPLES["digits-cnn"].weights["text"] in web.get(f"/r/{digits}").get_data(as_text=True)
