"""The shared tuning database files: merging a job's records back, seeding from shipped records."""

from __future__ import annotations

import json
from dataclasses import replace

from webapp.jobs import tuning_db
from webapp.jobs.tuning_db import RECORDS, WORKLOADS, copy_in, merge_back, shared_dir


def record(workload: int, secs: float) -> str:
    return json.dumps(
        [workload, [[["trace"], []], [secs], {"kind": "llvm"}, [["TENSOR", "float32", [1], 1]]]]
    )


def write(folder, workloads, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WORKLOADS).write_text("".join(w + "\n" for w in workloads))
    (folder / RECORDS).write_text("".join(r + "\n" for r in records))


def test_merge_renumbers_new_workloads_and_drops_malformed_lines(config, tmp_path):
    cfg = replace(config, data_dir=tmp_path / "data")
    a, b = json.dumps(["1", "workload-a"]), json.dumps(["2", "workload-b"])
    write(shared_dir(cfg, "x86-generic"), [a], [record(0, 0.5)])
    job = tmp_path / "job" / "tuning"
    assert copy_in(cfg, "x86-generic", job) == 1
    # the job appends workload b and two records, plus lines a hostile job might write
    write(
        job,
        [a, b, "not json", json.dumps({"x": 1})],
        [record(0, 0.5), record(1, 0.25), record(0, 0.1), "garbage", json.dumps([7, []]), record(9, 0.1)],
    )
    assert merge_back(cfg, "x86-generic", job) == 2
    shared = shared_dir(cfg, "x86-generic")
    assert (shared / WORKLOADS).read_text().splitlines() == [a, b]
    merged = [json.loads(line) for line in (shared / RECORDS).read_text().splitlines()]
    assert sorted((w, r[1][0]) for w, r in merged) == [(0, 0.1), (0, 0.5), (1, 0.25)]
    assert merge_back(cfg, "x86-generic", job) == 0  # merging twice adds nothing


def test_a_new_data_folder_starts_from_the_shipped_records(config, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    write(shipped / "x86-generic", [json.dumps(["1", "w"])], [record(0, 0.1)])
    monkeypatch.setattr(tuning_db, "SHIPPED_DIR", shipped)
    job = tmp_path / "job"
    assert (
        copy_in(replace(config, data_dir=tmp_path / "fresh", shipped_tuning_records=True), "x86-generic", job)
        == 1
    )
    assert (
        copy_in(
            replace(config, data_dir=tmp_path / "plain", shipped_tuning_records=False),
            "x86-generic",
            tmp_path / "job2",
        )
        == 0
    )


def test_host_records_are_keyed_by_vector_isa():
    key = tuning_db.database_key("x86-host")
    assert key.startswith("x86-host-") and key != "x86-host-"
    assert tuning_db.database_key("x86-generic") == "x86-generic"
