"""The tvmc-style verbs (compile -o, run, tune, submit), run as a user runs them: the console script in
a subprocess, the pipeline in the real sandbox."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import tvm
from tvm import relax

CLI = [sys.executable, "-m", "webapp.cli"]


def cli(*args, cwd, data, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLAYGROUND_DATA": str(data)}
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_tune_compile_to_a_package_and_run_it_with_the_runtime_alone(example_files, tmp_path):
    model, data = example_files / "cnn-small.onnx", tmp_path / "data"

    tuned = cli("tune", model, "--trials", 4, "--output", tmp_path / "records", cwd=tmp_path, data=data)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    records = (tmp_path / "records" / "database_tuning_record.json").read_text().splitlines()
    assert records and "Tuning records:" in tuned.stdout

    made = cli(
        "compile", model, "--tuning-records", tmp_path / "records", "--out", tmp_path / "job",
        "-o", tmp_path / "model.tar", cwd=tmp_path, data=data,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["tuning"]["pretuned"] > 0  # it started from the records
    # the page's headline, as the result JSON says it
    assert f"* {result['headline']['speed']['text']}\n" in made.stdout
    assert f"* Look next: {result['headline']['look_next']['text']}" in made.stdout
    lint = result["lint"]
    counted = f"{lint['count']} findings in {lint['kernels']} of {lint['checked']} kernels"
    assert f"* Kernel linter: {counted}" in made.stdout
    assert all(f"  {f['kernel']}: {f['title']}: {f['evidence']}" in made.stdout for f in lint["findings"])
    with tarfile.open(tmp_path / "model.tar") as tar:
        assert sorted(tar.getnames()) == ["README.txt", "metadata.json", "model.so", "run.py"]
        meta = json.loads(tar.extractfile("metadata.json").read())
    assert meta["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]

    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=x)
    ran = cli(
        "run", tmp_path / "model.tar", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "out.npz",
        "--print-time", "--repeat", 3, "--profile", cwd=tmp_path, data=data,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Execution time (3 runs): median" in ran.stdout and "fused_conv2d" in ran.stdout
    out = np.load(tmp_path / "out.npz")["output"]
    # the job's own library on the same input gives the same outputs
    vm = relax.VirtualMachine(
        tvm.runtime.load_module(str(tmp_path / "job" / "files" / "model.so")), tvm.cpu()
    )
    np.testing.assert_array_equal(out, vm["main"](tvm.runtime.tensor(x)).numpy())

    # the package's own run.py: numpy and tvm.runtime only, run from the unpacked folder
    unpacked = tmp_path / "unpacked"
    with tarfile.open(tmp_path / "model.tar") as tar:
        tar.extractall(unpacked, filter="data")
    tree = ast.parse((unpacked / "run.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {
        "__future__",
        "argparse",
        "json",
        "sys",
        "time",
        "pathlib",
        "typing",
        "numpy",
        "tvm.runtime",
        "tvm.runtime.vm",
    }
    alone = subprocess.run(
        [sys.executable, "run.py", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "alone.npz"],
        cwd=unpacked, capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "alone.npz")["output"], out)


def test_compile_asks_where_to_write_and_run_refuses_what_is_not_a_package(tmp_path):
    nowhere = cli("compile", "cnn-small", cwd=tmp_path, data=tmp_path / "data")
    assert nowhere.returncode == 2 and "give --out DIR" in nowhere.stderr
    (tmp_path / "junk.tar").write_bytes(b"not a tar file")
    junk = cli("run", tmp_path / "junk.tar", cwd=tmp_path, data=tmp_path / "data")
    assert junk.returncode == 2 and "error:" in junk.stderr and "Traceback" not in junk.stderr


def test_submit_sends_a_job_to_a_running_playground_and_prints_its_link(live_server, example_files, tmp_path):
    sent = cli(
        "submit", example_files / "cnn-small.onnx", "--server", live_server, "--wait",
        cwd=tmp_path, data=tmp_path / "data",
    )  # fmt: skip
    assert sent.returncode == 0, sent.stdout + sent.stderr
    link = sent.stdout.splitlines()[0].split()[0]
    assert link.startswith(f"{live_server}/r/") and sent.stdout.rstrip().endswith("done")
    down = cli("submit", "cnn-small", "--server", "http://127.0.0.1:9", cwd=tmp_path, data=tmp_path / "data")
    assert down.returncode == 2 and "cannot reach" in down.stderr
