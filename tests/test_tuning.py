"""The tune stage through the API: records written to the shared database, reused by the next job,
cancellation that keeps what was tuned. Uses the x86-generic target so that other tests' x86-host
jobs stay untuned."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import wait_for_job
from tests.test_api import submit
from webapp.jobs.tuning_db import RECORDS, shared_dir
from webapp.pipeline.stages.bench import MODEL_CHECK_GAIN


def assert_records_used_where_faster(results: dict) -> None:
    """The build timed every tuned kernel against its default rule, then the whole model with the
    faster records against the default rules alone, and used the faster records only if the model was
    faster with them; the kernel table and the benchmark say so."""
    choice = results["record_choice"]
    assert choice and all(c["tuned_us"] > 0 and c["default_us"] > 0 for c in choice)
    assert all(c["faster"] == (c["tuned_us"] < c["default_us"]) for c in choice)
    checks = {m["variant"]: m for m in results.get("record_check", [])}
    for variant in {c["variant"] for c in choice}:
        faster = [c for c in choice if c["variant"] == variant and c["faster"]]
        check = checks.get(variant)  # timed wherever some record was faster (the inputs have fixed shapes)
        assert (check is not None) == bool(faster)
        if check:
            assert check["tuned_ms"] > 0 and check["default_ms"] > 0
            assert check["kept"] == (check["tuned_ms"] < check["default_ms"] * (1 - MODEL_CHECK_GAIN))
        for c in choice:
            if c["variant"] == variant:
                assert c["used"] == (c["faster"] and check["kept"])
    shown = next(p["variant"] for p in results["profiles"] if p["shown"])  # the build the kernels are of
    used = {c["kernel"] for c in choice if c["used"] and c["variant"] == shown}
    assert {k["name"] for k in results["kernels"] if k["schedule"] == "tuned"} == used
    for variant in {c["variant"] for c in choice}:
        rows = {b["tuned"] for b in results["benchmarks"] if (b["runtime"], b["variant"]) == ("tvm", variant)}
        assert False in rows and (True in rows) == any(c["used"] for c in choice if c["variant"] == variant)


def test_tuning_writes_records_and_the_next_job_starts_tuned(client, config):
    job = wait_for_job(
        client,
        submit(client, {"example": "mlp", "target": "x86-generic", "tune_trials": "5"}).get_json()["id"],
    )
    assert job["status"] == "done", job["error"]
    tuning = job["results"]["tuning"]
    # exactly the budget: MetaSchedule alone sends whole batches (2 here) and would measure 6
    assert tuning["trials"] == tuning["budget"] == 5 and not tuning["cancelled"]
    assert (shared_dir(config, "x86-generic") / RECORDS).read_text().strip()
    assert_records_used_where_faster(job["results"])
    assert all(f["max_abs_err"] < 1e-4 for f in job["results"]["fidelity"])
    # each measured kernel's search: its best time by trial, improving only, within the job's trials
    curves = [t["curve"] for t in tuning["tasks"] if t["curve"]]
    assert curves and all(1 <= c[0]["trials"] and c[-1]["trials"] <= 5 for c in curves)
    steps = [(a, b) for c in curves for a, b in zip(c, c[1:], strict=False)]
    assert all(a["trials"] < b["trials"] and a["us"] > b["us"] for a, b in steps)
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    charted = sum(1 for t in tuning["tasks"] if t["curve"] and t["latency_us"])
    assert charted and page.count('<svg class="spark"') == charted
    tuned_before = sum(1 for t in tuning["tasks"] if t["latency_us"] is not None)

    again = wait_for_job(client, submit(client, {"example": "mlp", "target": "x86-generic"}).get_json()["id"])
    assert again["status"] == "done", again["error"]
    assert again["results"]["tuning"]["trials"] == 0
    assert again["results"]["tuning"]["pretuned"] == tuned_before > 0
    page = client.get(f"/r/{again['id']}").get_data(as_text=True)
    assert f"{tuned_before} of {again['results']['tuning']['kernels']} kernels already tuned" in page
    assert "This job ran no trials" in page
    # the table lists the kernels that have a record, and no row of dashes for the others
    table = re.search(r'id="tuning-table">.*?</table>', page, re.S).group(0)
    assert len(re.findall(r"<tr><td><code>", table)) == tuned_before and "–" not in table


def test_cancel_stops_tuning_and_builds_with_what_it_found(client):
    """The MLP's three kernels: MetaSchedule reports its first measurements once each kernel has had its
    first batch (cnn-small's seven took 100 s before one was reported)."""
    fields = {"example": "mlp", "target": "x86-generic", "tune_trials": "400"}
    job_id = submit(client, fields).get_json()["id"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").get_json()
        tune = next(s for s in job["stages"] if s["name"] == "tune")
        if tune["status"] == "running" and (tune.get("detail") or {}).get("trials", 0) >= 1:
            break
        assert job["status"] in ("queued", "running"), job["error"]
        time.sleep(0.5)
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
    job = wait_for_job(client, job_id)
    assert job["status"] == "done", job["error"]
    assert job["results"]["tuning"]["cancelled"] is True
    assert 1 <= job["results"]["tuning"]["trials"] < 400
    assert_records_used_where_faster(job["results"])


def test_a_job_warm_starts_from_uploaded_records(client, config, tmp_path):
    """Records downloaded from one server's result page, uploaded with a job to a fresh data folder."""
    import io
    from dataclasses import replace

    from webapp.jobs.store import JobStore
    from webapp.jobs.worker import run_job

    first = wait_for_job(
        client,
        submit(client, {"example": "mlp", "target": "x86-generic", "tune_trials": "2"}).get_json()["id"],
    )
    assert first["status"] == "done", first["error"]
    files = {
        f: client.get(f"/r/{first['id']}/files/{name}").data
        for f, name in (
            ("tuning_workloads", "database_workload.json"),
            ("tuning_records", "database_tuning_record.json"),
        )
    }
    assert all(files.values())

    fresh = replace(config, data_dir=tmp_path / "fresh")
    from webapp import create_app

    other = create_app(fresh).test_client()
    data = {
        "example": "mlp",
        "target": "x86-generic",
        **{f: (io.BytesIO(content), f"{f}.json") for f, content in files.items()},
    }
    resp = other.post("/api/jobs", data=data, content_type="multipart/form-data")
    assert resp.status_code == 202, resp.get_json()
    run_job(fresh, resp.get_json()["id"])  # this server's worker, run here
    job = other.get(f"/api/jobs/{resp.get_json()['id']}").get_json()
    assert job["status"] == "done", job["error"]
    assert job["results"]["tuning"]["pretuned"] > 0
    assert JobStore(fresh.data_dir).get(job["id"])["options"]["tuning_upload"] is True

    # A record whose trace names a block its workload lacks makes TVM's JSONDatabase refuse the whole
    # database: the job drops it from its copy and goes on, and what it merges back into the shared
    # database lacks it: the next job starts from a clean database.
    good = files["tuning_records"].decode().splitlines()[0]
    block = re.search(r'\["GetSBlock",\[\],\["([^"]+)"', good).group(1)
    poisoned = good.replace(f'["GetSBlock",[],["{block}"', '["GetSBlock",[],["no_such_block"', 1)
    files["tuning_records"] += (poisoned + "\n").encode()
    data = {
        "example": "mlp",
        "target": "x86-generic",
        "rerun": "1",
        **{f: (io.BytesIO(content), f"{f}.json") for f, content in files.items()},
    }
    for upload in (True, False):
        resp = other.post("/api/jobs", data=data if upload else {"example": "mlp", "target": "x86-generic"})
        run_job(fresh, resp.get_json()["id"])
        job = other.get(f"/api/jobs/{resp.get_json()['id']}").get_json()
        assert job["status"] == "done", job["error"]
        assert job["results"]["tuning"]["unreadable_records"] == (1 if upload else 0)
        assert job["results"]["tuning"]["pretuned"] > 0
    assert "no_such_block" not in (shared_dir(fresh, "x86-generic") / RECORDS).read_text()


def test_refuses_half_a_tuning_database(client):
    import io

    resp = client.post(
        "/api/jobs",
        data={
            "example": "mlp",
            "target": "x86-generic",
            "tuning_records": (io.BytesIO(b"[0, []]\n"), "r.json"),
        },
        content_type="multipart/form-data",
    )
    assert resp.status_code == 400 and "two files" in resp.get_json()["error"]


@pytest.mark.parametrize("preset", ["x86-avx512-vnni", "x86-avx2"])
def test_tuning_covers_int8_kernels_on_the_dot_product_rules(config, tmp_path, preset):
    """An int8 job's budget goes to its int8 kernels too, searched in the design spaces of the
    project's own int8 rules (schedules.SPACES), on VNNI's vpdpbusd and on AVX2's vpmaddubsw pairs; the
    build uses an int8 record only where it beats its default rule, and the tuned int8 build computes
    exactly what the untuned one does. For presets that tuning measures on this CPU, in a data folder
    of their own."""
    from dataclasses import replace

    from webapp import create_app
    from webapp.jobs.worker import run_job
    from webapp.targets import get

    target = get(preset)
    if not target.can_run_here:
        pytest.skip(f"tuning measures on this CPU, and {preset} runs {target.runs_on}")
    fresh = replace(config, data_dir=tmp_path / "int8")
    client = create_app(fresh).test_client()
    data = {"example": "cnn-small", "target": preset, "quantize": "int8", "tune_trials": "24"}
    resp = client.post("/api/jobs", data=data)
    assert resp.status_code == 202, resp.get_json()
    run_job(fresh, resp.get_json()["id"])
    job = client.get(f"/api/jobs/{resp.get_json()['id']}").get_json()
    assert job["status"] == "done", job["error"]
    results = job["results"]
    tasks = results["tuning"]["tasks"]
    int8 = [t for t in tasks if t["variant"] == "int8" and t["latency_us"] is not None]
    # the three int8 convolutions were measured, each as the int8 rule's design space writes it
    assert len([t for t in int8 if "conv2d" in t["name"]]) == 3
    records = client.get(f"/r/{job['id']}/files/database_tuning_record.json").get_data(as_text=True)
    lanes = 16 if preset == "x86-avx512-vnni" else 8
    assert records.count(f'"playground_dot_{lanes}x4_{target.dot_instruction()}"') >= 3
    assert any(c["variant"] == "int8" for c in results["record_choice"])
    assert_records_used_where_faster(results)
    # tuned or not, the int8 build's output is the same integers
    outputs = {
        f["tuned"]: (f["max_abs_err"], f["cosine"])
        for f in results["fidelity"]
        if f["variant"] == "int8" and f["reference"] == "tvm fp32"
    }
    if True in outputs:
        assert outputs[True] == outputs[False]
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    table = re.search(r'id="tuning-table">.*?</table>', page, re.S).group(0)
    assert '<th rowspan="2">build</th>' in table and "<td>int8</td>" in table
