"""Shared fixtures: a data folder per test session, the app, a real queue consumer, a real HTTP server."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from webapp import create_app
from webapp.catalog import EXAMPLES
from webapp.config import Config
from webapp.jobs.queue import JobQueue

ROOT = Path(__file__).resolve().parent.parent
# The examples written in plain PyTorch, and the 4-layer Hugging Face transformers (test_transformers.py:
# each is 120-270 MB and takes tens of seconds a build, so the tests over every example take the others;
# the full-size ones (smollm2-135m, 538 MB; qwen2.5-0.5b, 1.98 GB) are measured by benchmarks/llm.py)
FULL_SIZE = [name for name, e in EXAMPLES.items() if e.full_size]
TRANSFORMERS = [name for name, e in EXAMPLES.items() if e.transformers and name not in FULL_SIZE]
CLASSIC = [name for name, e in EXAMPLES.items() if not e.transformers]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


# The files that take longest, run first: make test's two processes take a file at a time, and a long
# file started last keeps one process busy after the other has run out of files (pytest --durations).
FIRST = [
    "test_tuning.py",
    "test_conformance.py",
    "test_schedules.py",
    "test_browser.py",
    "test_gpu.py",
    "test_corpus.py",
    "test_never_worse.py",
    "test_prequantized.py",
    "test_devices.py",
    "test_quantize.py",
    "test_supervision.py",
    "test_hostile.py",
]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: in-file order kept


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def config(data_dir) -> Config:
    # A short timing budget keeps the benchmark stage fast; the figures are still real.
    # Without the shipped tuning records: jobs here start untuned unless a test tunes.
    return Config(
        data_dir=data_dir,
        bench_budget_s=0.3,
        bench_threads=2,
        wall_limit_s=600,
        shipped_tuning_records=False,
        # Tests submit the same small jobs again and again, each expecting its own run; reuse of
        # identical jobs is tested on an app of its own (tests/test_reuse.py).
        reuse_results=False,
        # Tests submit many jobs from one address; admission control has tests of its own
        # (tests/test_admission.py).
        submit_rate="",
        lab_rate="",
        max_queued_per_client=0,
        max_queued=0,
        # The timing slot of this session's jobs alone: make test runs the suite in two processes
        # (pytest-xdist), whose benchmarks would otherwise stop each other's jobs; the slot's own
        # behaviour between jobs is tested with its own lock (tests/test_sandbox.py).
        timing_lock=data_dir / "timing.lock",
        # Timed once, however busy the other test process keeps the machine: waiting for it to be quiet
        # and timing again is tested where a test sets it (tests/test_api.py, the busy loop)
        quiet_wait_s=0.0,
    )


@pytest.fixture(scope="session", autouse=True)
def server_environment(config) -> None:
    """The servers, workers and CLI commands tests start as processes of their own (Config.from_env)
    time as this session's jobs do: a short budget, timed once, in this session's timing slot (not the
    machine's, which the other test process's servers would share)."""
    os.environ["PLAYGROUND_BENCH_BUDGET_S"] = str(config.bench_budget_s)
    os.environ["PLAYGROUND_QUIET_WAIT_S"] = str(config.quiet_wait_s)
    os.environ["PLAYGROUND_TIMING_LOCK"] = str(config.timing_lock)


@pytest.fixture()
def one_thread(config) -> Iterator[None]:
    """Jobs submitted in the test time on one thread: for tests that assert on a choice made by timing
    (a precision search, the layers kept in float). make test's other process shares the two cores, and a
    two-thread kernel then waits at each barrier for the thread it holds, so a model of more kernels (int8
    with its quantize steps) measures slower than it runs: the digits CNN's int8 build at batch 256 timed
    1.0x fp32 beside another test's job, 1.9x alone."""
    threads = config.bench_threads
    object.__setattr__(config, "bench_threads", 1)  # the session's Config is frozen: set for this test only
    yield
    object.__setattr__(config, "bench_threads", threads)


@pytest.fixture(scope="session")
def example_files(config) -> Path:
    """The small examples' .onnx and .pt2 files, written once."""
    from webapp.jobs.worker import ensure_example_files

    for name in ("mlp", "cnn-small", "transformer-block"):
        ensure_example_files(config, name)
    return config.examples_dir


@pytest.fixture(scope="session")
def app(config):
    return create_app(config)


@pytest.fixture(scope="session")
def worker(config):
    """A real huey consumer running queued jobs in a thread, as `tvm-playground worker` does."""
    consumer = JobQueue(config).consumer(workers=1)
    consumer.start()
    yield consumer
    consumer.stop(graceful=True)


@pytest.fixture()
def client(app, worker):
    return app.test_client()


@pytest.fixture(scope="session")
def live_server(app, worker):
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def wait_for_job(client, job_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").get_json()
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s: {job}")


@pytest.fixture(scope="module")
def page():
    """A real browser page: Debian's chromium, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        yield page
        browser.close()


def int8_instruction(preset: str) -> str:
    """The instruction a preset's int8 kernels multiply with, from the target's own description
    (vpdpbusd with VNNI; x86-host is this CPU, or PLAYGROUND_HOST_PRESET's stand-in)."""
    from webapp.targets import get

    return get(preset).int8_mnemonic()


def run_here_or_skip(preset: str) -> None:
    """Called after a test has checked a preset's code: the rest runs it, where this CPU can."""
    from webapp.targets import get

    if not get(preset).can_run_here:
        pytest.skip(f"{preset}'s code built and checked; not run: {get(preset).runs_on}")


def tiny_llama():
    """A 2-layer Llama with grouped-query attention (4 query, 2 key-value heads), random weights."""
    import torch
    import transformers as hf

    torch.manual_seed(0)
    config = hf.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    return hf.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """tiny_llama() as Hugging Face's exporters write a generating model (its cache as inputs and outputs)."""
    from webapp.pipeline.examples import write_generator_file

    return write_generator_file(tiny_llama(), tmp_path_factory.mktemp("lm") / "tiny-llama.onnx")


@pytest.fixture(scope="session")
def tiny_lm_pt2(tmp_path_factory):
    """tiny_llama() as a .pt2 generator: examples.GeneratorStep exported with its lengths dynamic, its cache
    a list of tensors (the form docs/architecture.md#generation shows)."""
    import torch

    from webapp.pipeline.examples import GeneratorStep, cache_shape

    model = tiny_llama()
    seq, past = 3, 5  # torch.export takes sizes of 2 and more as dynamic
    cache = [torch.randn(*cache_shape(model, past)) for _ in range(2 * model.config.num_hidden_layers)]
    args = (
        torch.randint(0, 256, (1, seq)),
        torch.ones(1, past + seq, dtype=torch.int64),
        torch.arange(past, past + seq)[None],
        cache,
    )
    tokens, cached = torch.export.Dim("seq", max=8192), torch.export.Dim("past", max=8192)
    dynamic = ({1: tokens}, {1: torch.export.Dim.DYNAMIC}, {1: tokens}, [{2: cached}] * len(cache))
    with torch.no_grad():
        ep = torch.export.export(GeneratorStep(model).eval(), args, dynamic_shapes=dynamic)
    out = tmp_path_factory.mktemp("lm-pt2") / "tiny-llama.pt2"
    torch.export.save(ep, out)
    return out
