"""Hostile input, kept contained: each class is refused (at submit, or by the sandboxed import) with a
plain message, nothing outside the job is touched, and the server goes on serving.

Classes: a pickled payload inside a .pt2; zip bombs (.pt2, calibration .npz); ONNX external data
pointing outside the upload; absurd tensor shapes; HTML/JS in node, input and file names (checked in a
real browser too); path tricks in URLs and file names; malformed form fields."""

from __future__ import annotations

import io
import json
import pickle
import time
import urllib.request
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import wait_for_job
from webapp import create_app

XSS_INPUT = '<img src=x onerror="alert(1)">'
XSS_NODE = "<script>alert(2)</script>"
XSS_FILE = "<script>alert(3)</script>.onnx"


def submit(client, fields: dict, file: tuple[bytes, str] | None = None, **files):
    data = {"target": "x86-host", **fields}
    if file is not None:
        data["model"] = (io.BytesIO(file[0]), file[1])
    for name, (content, filename) in files.items():
        data[name] = (io.BytesIO(content), filename)
    return client.post("/api/jobs", data=data, content_type="multipart/form-data")


def failed_at_import(client, content: bytes, name: str, **fields) -> dict:
    resp = submit(client, fields, (content, name))
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "failed" and job["error"]["stage"] == "import", job
    assert "Traceback" not in job["error"]["message"]
    return job


def relu_model(input_name: str = "x", node_name: str = "relu", shape=(1, 8), initializer=None) -> bytes:
    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    nodes = [helper.make_node("Relu", [input_name], ["r"], name=node_name)]
    inits = []
    if initializer is not None:
        nodes.append(helper.make_node("Add", ["r", initializer.name], ["y"], name=f"{node_name} add"))
        inits.append(initializer)
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"], name=f"{node_name} out"))
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


# ---------------------------------------------------------------- pickles in a .pt2


class Payload:
    """Unpickled, it would write a file into the job folder (the sandbox's only writable place)."""

    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('the pickle ran')",))


def pt2_with_payload(pt2: bytes) -> bytes:
    """The example's .pt2 with its sample inputs (a torch.save archive) pickling the payload."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(pt2)) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("sample_inputs/model.pt"):
                inner_out = io.BytesIO()
                with zipfile.ZipFile(io.BytesIO(data)) as inner, zipfile.ZipFile(inner_out, "w") as rewritten:
                    for name in inner.namelist():
                        rewritten.writestr(
                            name, pickle.dumps(Payload()) if name.endswith("data.pkl") else inner.read(name)
                        )
                data = inner_out.getvalue()
            zout.writestr(item, data)
    return out.getvalue()


def test_a_pickled_payload_in_a_pt2_is_refused_and_never_runs(client, config, example_files):
    evil = pt2_with_payload((example_files / "mlp.pt2").read_bytes())
    job = failed_at_import(client, evil, "evil.pt2")
    assert "pickled Python objects other than tensors" in job["error"]["message"]
    assert "(Unsupported operand" in job["error"]["message"]  # the safe unpickler's reason
    assert not (config.jobs_dir / job["id"] / "PWNED").exists()


# ---------------------------------------------------------------- zip bombs


def zip_bomb(megabytes: int, name: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z, z.open(name, "w", force_zip64=True) as f:
        for _ in range(megabytes):
            f.write(bytes(1 << 20))
    return out.getvalue()


def test_zip_bombs_are_refused_at_submit(config, tmp_path):
    client = create_app(replace(config, data_dir=tmp_path, max_unzipped_mb=20)).test_client()
    bomb = zip_bomb(64, "archive/data/weights/weight_0")
    assert len(bomb) < 200_000  # 64 MB of zeros in a small file
    resp = submit(client, {}, (bomb, "bomb.pt2"))
    assert resp.status_code == 400
    assert "would expand to 67 MB in 1 entries" in resp.get_json()["error"]
    assert "limit of 20 MB" in resp.get_json()["error"]
    npz = zip_bomb(64, "input.npy")
    resp = submit(client, {"example": "mlp", "quantize": "int8"}, calibration_data=(npz, "calib.npz"))
    assert resp.status_code == 400 and "calibration_data would expand to 67 MB" in resp.get_json()["error"]
    assert not any((tmp_path / "jobs").iterdir())  # nothing kept of a refused upload


# ---------------------------------------------------------------- ONNX external data


@pytest.mark.parametrize("location", ["../../../../../../etc/passwd", "/etc/passwd", "weights.bin"])
def test_onnx_external_data_is_refused_outside_its_folder_or_where_it_did_not_come_with_it(client, location):
    """Data files come with the model in one .zip (tests/test_external_data.py), inside its folder."""
    bias = TensorProto(name="bias", data_type=TensorProto.FLOAT, dims=[1, 8])
    bias.data_location = TensorProto.EXTERNAL
    bias.external_data.add(key="location", value=location)
    bias.external_data.add(key="length", value="32")
    job = failed_at_import(client, relu_model(initializer=bias), "external.onnx")
    message = job["error"]["message"]
    if location == "weights.bin":
        assert "'weights.bin', which did not come with it" in message and "one .zip archive" in message
    else:
        assert f"an external data file outside its folder: {location!r}" in message
    assert "root:" not in client.get(f"/r/{job['id']}").get_data(as_text=True)


# ---------------------------------------------------------------- absurd shapes


def test_absurd_shapes_are_refused(client):
    resp = submit(client, {"example": "mlp", "input_shapes": '{"x": [100000, 100000, 100]}'})
    assert resp.status_code == 400 and "1,000,000,000,000 elements" in resp.get_json()["error"]
    job = failed_at_import(client, relu_model(shape=(1, 100000, 100000, 100)), "huge.onnx")
    assert "has the shape [1, 100000, 100000, 100] (1,000,000,000,000 elements)" in job["error"]["message"]


# ---------------------------------------------------------------- HTML and script in names


@pytest.fixture(scope="module")
def xss_job(live_server, example_files):
    """A job whose input, node and file names are HTML with script, run to the end."""
    model = relu_model(input_name=XSS_INPUT, node_name=XSS_NODE)
    boundary = "xss"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="target"\r\n\r\nx86-host\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="{XSS_FILE}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + model
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        live_server + "/api/jobs",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    job_id = json.loads(urllib.request.urlopen(request, timeout=30).read())["id"]
    for _ in range(600):
        job = json.loads(urllib.request.urlopen(f"{live_server}/api/jobs/{job_id}", timeout=30).read())
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.5)
    raise AssertionError(job)


def test_html_in_names_is_shown_as_text_never_run(xss_job, live_server, page):
    assert xss_job["status"] == "done", xss_job["error"]
    assert xss_job["options"]["filename"] == XSS_FILE
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    url = f"{live_server}/r/{xss_job['id']}"
    for view in ("", "?view=relax-imported", "?view=tir", "?view=asm"):
        page.goto(url + view)
        page.wait_for_load_state("load")
    page.goto(url)
    assert XSS_FILE in page.locator("h1").inner_text()  # the name, as text
    html = page.content()
    assert "<script>alert" not in html and 'onerror="' not in html.replace('&lt;img src=x onerror="', "")
    for svg in (f for f in xss_job["results"]["files"] if f.endswith(".svg")):
        page.goto(f"{url}/files/{svg}")  # served under a CSP sandbox; graphviz escapes the labels
    assert dialogs == []


# ---------------------------------------------------------------- path tricks


@pytest.mark.parametrize(
    "path",
    [
        "/r/{id}/files/..%2Fjob.json",
        "/r/{id}/files/..%2F..%2F..%2Fjobs.db",
        "/r/{id}/files/%2Fetc%2Fpasswd",
        "/r/..%2F..%2Fetc%2Fpasswd",
        "/r/{id}/../../jobs.db",
        "/api/examples/..%2F..%2Fjobs.db.onnx",
        "/api/jobs/..%2F{id}",
    ],
)
def test_path_tricks_in_urls_reach_nothing(client, example_files, path):
    job_id = submit(client, {"example": "mlp"}).get_json()["id"]
    resp = client.get(path.format(id=job_id))
    assert resp.status_code in (400, 404), (path, resp.status_code)
    assert b"root:" not in resp.data and b"SQLite" not in resp.data


def test_path_tricks_in_views_and_file_names_stay_inside_the_job(client, config, example_files):
    answer = submit(client, {}, ((example_files / "mlp.onnx").read_bytes(), "../../../../tmp/evil.onnx"))
    job = wait_for_job(client, answer.get_json()["id"])
    assert job["status"] == "done", job["error"]
    assert job["options"]["model_file"] == "model.onnx"  # stored under its own name, in the job
    assert (config.jobs_dir / job["id"] / "input" / "model.onnx").is_file()
    for query in ("view=asm&kernel=../../../../etc/passwd", "view=../../result&kernel=x", "view=ir&pass=-1"):
        resp = client.get(f"/r/{job['id']}?{query}")
        assert resp.status_code in (200, 400, 404) and b"root:x:0:0" not in resp.data


# ---------------------------------------------------------------- malformed form fields


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tune_trials": "1e99"}, "tune_trials must be a whole number"),
        ({"tune_trials": "-5"}, "tune_trials must be between 0 and"),
        ({"quantize": "<script>"}, "Unknown quantize"),
        (
            {"global_scale": "nan", "quantize": "int8", "calibration": "global"},
            "global_scale must be above 0",
        ),
        ({"input_shapes": '{"x": [1, -3]}'}, "list of positive integers"),
        ({"input_shapes": '{"x": [' + "1," * 100000 + "1]}"}, "100001 dimensions"),
        ({"input_shapes": "[" * 100000}, "input_shapes must be JSON"),
        ({"target": "../../etc/passwd"}, "Unknown target"),
        ({"example": "../mlp"}, "Unknown example"),
    ],
)
def test_malformed_fields_are_refused_with_a_message(client, fields, message):
    resp = submit(client, {"example": "mlp", **fields})
    assert resp.status_code == 400 and message in resp.get_json()["error"], resp.get_json()
    assert client.get("/api/targets").status_code == 200  # and the server goes on


def test_calibration_npz_with_a_pickle_fails_plainly(client, config):
    """np.load(allow_pickle=False): an object array in the calibration data is refused, not run."""
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([Payload()], dtype=object))
    resp = submit(
        client, {"example": "mlp", "quantize": "int8"}, calibration_data=(buffer.getvalue(), "c.npz")
    )
    job = wait_for_job(client, resp.get_json()["id"])
    assert job["status"] == "failed" and job["error"]["stage"] == "quantize", job
    assert "Traceback" not in job["error"]["message"]
    assert not (config.jobs_dir / job["id"] / "PWNED").exists()
