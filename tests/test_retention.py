"""Storage stays bounded: uploads kept once by content hash, the retention policy (age, total size)
expires old artifacts while the page and JSON stay readable and say what expired, and the submitter's
delete link deletes (a wrong token does not). An app and data folder of its own; jobs run by run_job."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from dataclasses import replace

import pytest

from webapp import create_app
from webapp.jobs.storage import collect_garbage, file_digest
from webapp.jobs.store import job_store
from webapp.jobs.worker import run_job


@pytest.fixture()
def own(config, tmp_path):
    own = replace(config, data_dir=tmp_path / "data")
    return own, create_app(own).test_client()


def post(client, model: bytes, **fields):
    data = {"target": "x86-host", "model": (io.BytesIO(model), "net.onnx"), **fields}
    return client.post("/api/jobs", data=data, content_type="multipart/form-data")


@pytest.mark.slow
def test_uploads_once_expiry_keeps_the_page_and_the_delete_link(own, example_files):
    config, client = own
    store = job_store(config)
    model = (example_files / "mlp.onnx").read_bytes()
    first = post(client, model).get_json()
    second = post(client, model, rerun="1").get_json()  # the same bytes, a fresh job
    blob = config.data_dir / "uploads" / file_digest(example_files / "mlp.onnx")
    inputs = [store.job_dir(j["id"]) / "input" / "model.onnx" for j in (first, second)]
    assert blob.stat().st_nlink == 3  # stored once: the blob and a link in each job
    assert all(os.path.samefile(blob, path) for path in inputs)
    assert second["delete_url"].endswith(f"/r/{second['id']}/delete?token={second['delete_token']}")

    run_job(config, first["id"])
    done = client.get(f"/api/jobs/{first['id']}").get_json()
    assert done["status"] == "done", done["error"]
    assert done["expired"] is None and client.get(f"/r/{first['id']}/files/model.so").status_code == 200

    # 2 days on, a policy of 1 day: the finished job expires, the queued one is never touched
    report = collect_garbage(replace(config, keep_days=1), now=time.time() + 2 * 86400)
    assert report["expired"] == [first["id"]] and report["freed_bytes"] > 0
    job = client.get(f"/r/{first['id']}.json").get_json()
    assert job["expired"]["reason"] == "older than 1 day"
    assert "model.so" in job["expired"]["files"] and "graph-fused.svg" not in job["expired"]["files"]
    assert job["results"]["benchmarks"]  # the figures remain
    assert not inputs[0].exists() and blob.stat().st_nlink == 2  # the second job still has it
    page = " ".join(client.get(f"/r/{first['id']}").get_data(as_text=True).split())
    assert "retention policy (older than 1 day) removed this job's uploaded model" in page
    assert f"/r/{first['id']}/files/model.so" not in page  # no link to what is gone
    assert client.get(f"/r/{first['id']}/files/model.so").status_code == 404
    assert client.get(f"/r/{first['id']}/files/graph-fused.svg").status_code == 200
    assert client.get(f"/r/{first['id']}?view=tir").status_code == 200
    again = post(client, model).get_json()  # an expired result is not reused
    assert again["id"] not in (first["id"], second["id"]) and again["reused"] is False

    # the delete link: a wrong token is refused, the right one deletes
    assert client.delete(f"/api/jobs/{second['id']}?token=wrong").status_code == 403
    assert client.delete(f"/api/jobs/{second['id']}").status_code == 403
    answer = client.delete(f"/api/jobs/{second['id']}?token={second['delete_token']}")
    assert answer.status_code == 200 and answer.get_json() == {"id": second["id"], "deleted": True}
    assert client.get(f"/r/{second['id']}").status_code == 410
    gone = client.get(f"/api/jobs/{second['id']}")
    assert gone.status_code == 410 and "deleted by the person who submitted it" in gone.get_json()["error"]
    assert not store.job_dir(second["id"]).exists()
    client.delete(f"/api/jobs/{again['id']}?token={again['delete_token']}")
    collect_garbage(config)
    assert not blob.exists()  # no job uses those bytes any more


def test_the_browser_that_submitted_sees_the_delete_link_and_deletes_after_confirming(own, example_files):
    config, client = own
    model = (example_files / "mlp.onnx").read_bytes()
    form = client.post("/jobs", data={"target": "x86-host", "model": (io.BytesIO(model), "net.onnx")})
    job_url = form.headers["Location"]
    page = client.get(job_url).get_data(as_text=True)
    assert 'id="delete-link"' in page
    link = page.split('id="delete-link">', 1)[1].split("<", 1)[0]
    assert 'id="delete-link"' not in create_app(config).test_client().get(job_url).get_data(as_text=True)
    confirm = client.get(link.replace("&amp;", "&"))
    assert confirm.status_code == 200 and "Delete the result of net.onnx?" in confirm.get_data(as_text=True)
    token = link.rsplit("token=", 1)[1]
    assert client.post(f"{job_url}/delete", data={"token": token + "x"}).status_code == 403
    assert client.post(f"{job_url}/delete", data={"token": token}).status_code == 303
    assert client.get(job_url).status_code == 410


def test_a_size_cap_expires_the_oldest_first(own, example_files):
    """Three finished jobs (a folder each, made here) and a cap that only the newest two fit under."""
    config, _ = own
    store = job_store(config)
    ids = []
    for i in range(3):
        job_id = f"retention-test-job-{i:04d}-xxxx"
        folder = store.job_dir(job_id)
        (folder / "files").mkdir(parents=True)
        (folder / "files" / "model.so").write_bytes(os.urandom(400_000))
        (folder / "result.json").write_text(json.dumps({"files": ["model.so"]}))
        store.create(job_id, {"target": "x86-host"})
        store.claim(job_id, "test:0")
        store.mark_finished(job_id, None, "test:0")
        ids.append(job_id)
        time.sleep(0.01)
    report = collect_garbage(replace(config, keep_days=0, keep_gb=900_000 / (1 << 30)))
    assert report["expired"] == ids[:1] and report["freed_bytes"] == 400_000
    assert [bool(store.get(j)["expired"]) for j in ids] == [True, False, False]
    assert store.get(ids[0])["expired"]["reason"] == f"the data passed {900_000 / (1 << 30):g} GB"
    shutil.rmtree(store.job_dir(ids[1]) / "files")  # nothing else changes without a policy
    assert collect_garbage(replace(config, keep_days=0, keep_gb=0))["expired"] == []
