"""Admission control: caps on jobs queued or running (per client address and in all) and
flask-limiter's rate limit on submissions answer 429 with Retry-After and a message, in the API and
on the form; other addresses are still served. Apps of their own, with no worker: jobs stay queued."""

from __future__ import annotations

from dataclasses import replace

import pytest

from webapp import create_app


def app_with(config, tmp_path, **overrides):
    return create_app(replace(config, data_dir=tmp_path, **overrides)).test_client()


def submit(client, address: str, path: str = "/api/jobs"):
    return client.post(path, data={"example": "mlp"}, environ_base={"REMOTE_ADDR": address})


def test_queued_jobs_are_capped_per_address_and_in_all(config, tmp_path):
    client = app_with(config, tmp_path, max_queued_per_client=2, max_queued=3)
    assert [submit(client, "10.0.0.1").status_code for _ in range(2)] == [202, 202]

    refused = submit(client, "10.0.0.1")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "30"
    assert "You have 2 jobs queued or running" in refused.get_json()["error"]
    page = submit(client, "10.0.0.1", "/jobs")  # the form: the page again, with the message
    assert page.status_code == 429 and "You have 2 jobs queued or running" in page.get_data(as_text=True)

    assert submit(client, "10.0.0.2").status_code == 202  # another address: its own cap
    full = submit(client, "10.0.0.3")  # 3 queued in all: the server's cap
    assert full.status_code == 429
    assert full.headers["Retry-After"] == "120"
    assert "This server has 3 jobs queued or running" in full.get_json()["error"]
    assert client.get("/").status_code == 200  # pages are still served


@pytest.mark.parametrize("path", ["/api/jobs", "/jobs"])
def test_submissions_are_rate_limited_per_address(config, tmp_path, path):
    client = app_with(config, tmp_path, submit_rate="2 per minute")
    assert [submit(client, "10.0.0.1", path).status_code for _ in range(2)] in ([202, 202], [303, 303])

    refused = submit(client, "10.0.0.1", path)
    assert refused.status_code == 429
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    text = refused.get_json()["error"] if path == "/api/jobs" else refused.get_data(as_text=True)
    assert "Too many submissions from your address (at most 2 per 1 minute)" in text
    assert submit(client, "10.0.0.2", path).status_code in (202, 303)
    assert client.get("/api/targets").status_code == 200  # only submissions are limited
