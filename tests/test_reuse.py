"""Identical work is not redone: a job with the same project version, options and input bytes as an
earlier one that is done (or under way) answers with that job at once; `rerun=1` forces a fresh run,
and anything that changes the result (a byte of the model, an option) makes a new job."""

from __future__ import annotations

import io
import time
from dataclasses import replace

import pytest

from tests.conftest import wait_for_job
from webapp import create_app


@pytest.fixture(scope="module")
def reusing(config, worker):
    """An app on the tests' data folder and queue that reuses identical jobs (as served by default)."""
    return create_app(replace(config, reuse_results=True)).test_client()


# Other tests of the session upload the same example bytes (under apps that do not reuse, but their
# jobs are in the same store): an option no other test gives keeps these jobs this module's own.
OWN = {"target": "x86-host", "input_shapes": '{"input": [1, 784]}'}


def post(client, data: dict, model: bytes | None = None):
    if model is not None:
        data = {**data, "model": (io.BytesIO(model), "net.onnx")}
    return client.post("/api/jobs", data={**OWN, **data}, content_type="multipart/form-data")


@pytest.mark.slow
def test_an_identical_job_answers_from_the_earlier_result_and_rerun_forces_a_fresh_one(
    reusing, example_files
):
    model = (example_files / "mlp.onnx").read_bytes()
    first = post(reusing, {}, model)
    assert first.status_code == 202 and first.get_json()["reused"] is False
    job = wait_for_job(reusing, first.get_json()["id"])
    assert job["status"] == "done", job["error"]

    started = time.monotonic()
    again = post(reusing, {}, model)  # the same bytes under the same options: answered at once
    page = reusing.get(f"/r/{again.get_json()['id']}")
    seconds = time.monotonic() - started
    earlier = {k: first.get_json()[k] for k in ("id", "url", "api_url")}
    assert again.status_code == 200 and again.get_json() == {**earlier, "reused": True}  # no delete link
    assert page.status_code == 200 and seconds < 2.0, seconds

    form = reusing.post("/jobs", data={**OWN, "model": (io.BytesIO(model), "other-name.onnx")})
    assert form.status_code == 303 and form.headers["Location"].endswith(f"{first.get_json()['id']}?reused=1")
    notice = reusing.get(form.headers["Location"]).get_data(as_text=True)
    assert "An identical job" in notice

    fresh = post(reusing, {"rerun": "1"}, model)
    assert fresh.status_code == 202 and fresh.get_json()["id"] != first.get_json()["id"]
    other_option = post(reusing, {"target": "x86-generic"}, model)
    assert other_option.status_code == 202 and other_option.get_json()["id"] != first.get_json()["id"]
    one_byte = post(reusing, {}, model + b"\0")  # a different upload (trailing bytes), a new job
    assert one_byte.get_json()["id"] != first.get_json()["id"]
    for answer in (fresh, other_option):
        assert wait_for_job(reusing, answer.get_json()["id"])["status"] == "done"
    wait_for_job(reusing, one_byte.get_json()["id"])


def test_a_failed_job_is_not_reused(reusing):
    broken = b"\x08\x07" + b"\x00" * 64  # looks like ONNX by its first bytes, fails at import
    first = post(reusing, {}, broken)
    assert wait_for_job(reusing, first.get_json()["id"])["status"] == "failed"
    again = post(reusing, {}, broken)
    assert again.status_code == 202 and again.get_json()["id"] != first.get_json()["id"]
    wait_for_job(reusing, again.get_json()["id"])
