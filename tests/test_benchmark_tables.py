"""docs/benchmarks.md's results tables are written by benchmarks/tables.py from benchmarks/results/*.json:
the doc agrees with the recorded runs, and the renderer's medians and stale-block check are right."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    """A benchmarks/ module by its path (benchmarks/ is no package; these two import nothing heavy)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = load("tables")
record = load("record")


def cpu_run(commit: str, ratio: float, records_ms: float | None = None) -> dict:
    """A cpu_models.py run of one model whose TVM default / ONNX Runtime is `ratio`."""
    row = {
        "model": "resnet18",
        "pytorch_ms": 30.0,
        "onnxruntime_ms": 20.0,
        "tvm_default_ms": 20.0 * ratio,
        "tvm_records_ms": records_ms,
        "kernels_with_records": 0 if records_ms is None else 5,
        "tvm_default_peak_pct": 100 * ratio,
    }
    return {"date": "2026-11-25", "commit": commit, "cpu": "Test CPU", "threads": 2, "rows": [row]}


def test_docs_agree_with_the_recorded_runs():
    r = subprocess.run(
        [sys.executable, "benchmarks/tables.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_medians_across_runs_and_per_run_ratios():
    runs = [cpu_run("aaaaaaa", 0.7), *(cpu_run("bbbbbbb", r, 0.9 * 20 * r) for r in (0.9, 0.6, 0.8))]
    text = tables.render("cpu_models", runs)
    # The table is from the newest commit's 3 runs; the older commit is a line of its own below it.
    assert "3 runs (2026-11-25) at bbbbbbb on Test CPU, 2 threads" in text
    line = next(x for x in text.splitlines() if x.startswith("| resnet18 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    # PyTorch, ORT, TVM default (median of 18, 12, 16 ms), TVM + records (0.9 of each)
    assert cells[1:5] == ["30.0", "20.0", "16.0", "14.4"]
    assert cells[5:7] == ["0.90, 0.90, 0.90", "0.90×"]  # records / default, per run and median
    assert cells[7:9] == ["0.90, 0.60, 0.80", "0.80×"]  # default / ORT, per run and median
    assert cells[9] == "80%"
    earlier = text.split("Earlier commits")[1]
    assert "| aaaaaaa | 2026-11-25 | 1 | Test CPU, 2 | 0.70× |" in earlier


def test_decoding_steps_in_tokens_per_second_and_ratios_per_run():
    def run(tvm_ms: float) -> dict:
        row = {"model": "gpt2", "tvm_ms": tvm_ms, "onnxruntime_ms": 10.0, "pytorch_ms": 20.0}
        row |= {f"{k}_tokens_per_s": 1e3 / row[f"{k}_ms"] for k in ("tvm", "onnxruntime", "pytorch")}
        return {
            "commit": "ccccccc",
            "cpu": "Test CPU",
            "threads": 2,
            "date": "2026-11-25",
            "past": 128,
            "rows": [row],
        }

    text = tables.render("decode", [run(8.0), run(5.0), run(6.0)])
    assert "3 runs (2026-11-25) at ccccccc on Test CPU, 2 threads; one new token after 128 cached" in text
    assert "| gpt2 | 6.00 (167) | 10.0 (100) | 20.0 (50) | 0.80, 0.50, 0.60 | 0.60× | 0.30× |" in text


def test_missing_results_name_the_command(tmp_path):
    bodies = tables.blocks(tmp_path)
    names = {"cpu_models", "quantized", "decode", "pi", "job_time", "contention", "repeat", "llm"}
    assert set(bodies) == names
    assert bodies["quantized"] == (
        "No run recorded yet: `PYTHONPATH=. .venv/bin/python benchmarks/quantized.py --record`"
    )


def test_recorded_runs_rewrite_the_doc_and_check_finds_a_stale_block(tmp_path, capsys):
    results = tmp_path / "results"
    for ratio in (0.9, 0.6, 0.8):
        data = {"rows": cpu_run("x", ratio)["rows"], "sgemm_peak_gflops": 200.0, "target": "x86-host"}
        record.record_run("cpu_models", 2, data, results)
    job = {"model": "resnet50", "wall_s": 30.0, "error": None, "stages": {"import": 0.5, "build": 11.0}}
    record.record_run("job_time", 2, {"target": "x86-host", "jobs": [job, job | {"wall_s": 34.0}]}, results)
    runs = json.loads((results / "cpu_models.json").read_text())
    assert len(runs) == 3 and {"date", "commit", "cpu", "threads", "rows"} <= set(runs[0])

    doc = tmp_path / "benchmarks.md"
    blocks = (f"## {n}\n\n<!-- results:{n} -->\n<!-- /results:{n} -->\n\nAfter.\n\n" for n in tables.RENDER)
    doc.write_text("# Benchmarks\n\nIntro.\n\n" + "".join(blocks))
    args = ["--doc", str(doc), "--results", str(results)]
    assert tables.main([*args, "--check"]) == 1  # the blocks are empty
    assert tables.main(args) == 0
    text = doc.read_text()
    assert "| 0.90, 0.60, 0.80 | 0.80× |" in text
    assert "| resnet50 | 2 | 32.0 | 0.5 | 11.0 |" in text  # the median of 30 and 34 s
    assert "No run recorded yet: `.venv/bin/python benchmarks/pi.py --record`" in text
    assert text.startswith("# Benchmarks\n\nIntro.\n\n") and text.count("After.") == len(tables.RENDER)
    capsys.readouterr()
    assert tables.main([*args, "--check"]) == 0

    doc.write_text(text.replace("0.80×", "0.75×"))
    assert tables.main([*args, "--check"]) == 1
    out = capsys.readouterr().out
    assert "results:cpu_models is stale" in out
    assert "job_time" not in out
    assert tables.main(args) == 0 and doc.read_text() == text


def test_a_doc_without_a_block_fails_the_check(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- results:cpu_models -->\n<!-- /results:cpu_models -->\n")
    assert tables.main(["--doc", str(doc), "--results", str(tmp_path), "--check"]) == 1
    assert "no block <!-- results:pi -->" in capsys.readouterr().out
