"""A kernel's reproducer (webapp/exports/repro.py): downloaded from a finished job, unpacked into an empty
folder and run by its own script with TVM and numpy alone (the project's package cannot be imported),
it builds the kernel as the job scheduled it, matches the unscheduled kernel, and gives the same
output as the job's own library."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import zipfile

import numpy as np
import tvm

from tests.conftest import wait_for_job
from tests.test_api import submit
from webapp.targets import get

# run.py as __main__ with `webapp` made unimportable: the reproducer needs nothing of the project
RUN = (
    "import sys; sys.modules['webapp'] = None; sys.argv = ['run.py', *sys.argv[1:]]; "
    "exec(compile(open('run.py').read(), 'run.py', 'exec'), {'__name__': '__main__', '__file__': 'run.py'})"
)


def unpacked(client, job_id: str, kernel: str, folder):
    resp = client.get(f"/r/{job_id}/repro/{kernel}.zip")
    assert resp.status_code == 200 and resp.mimetype == "application/zip"
    with zipfile.ZipFile(io.BytesIO(resp.data)) as z:
        z.extractall(folder)
        (top,) = {name.split("/")[0] for name in z.namelist()}
    return folder / top


def test_a_kernel_reproducer_runs_alone_and_gives_the_jobs_output(client, tmp_path):
    job_id = submit(client, {"example": "cnn-small", "quantize": "int8"}).get_json()["id"]
    job = wait_for_job(client, job_id)
    assert job["status"] == "done", job["error"]
    kernel = next(k["name"] for k in job["results"]["kernels"] if k["name"].startswith("fused_conv2d"))
    page = client.get(f"/r/{job_id}?view=asm&kernel={kernel}").get_data(as_text=True)
    assert f'id="repro-link" href="/r/{job_id}/repro/{kernel}.zip"' in page
    folder = unpacked(client, job_id, kernel, tmp_path)
    names = {p.name for p in folder.iterdir()}
    assert {"kernel.py", "reference.py", "target.json", "run.py", "README.txt"} <= names
    assert "prepack.py" in names  # an int8 convolution reads its weights repacked for its dot product
    # where the int8 kernels sum pairs of products in int16, run.py draws weights within the job's pair limit
    limit = get("x86-host").int8_pair_limit()
    assert json.loads((folder / "run.json").read_text()).get("int8_pair_limit") == limit

    run = subprocess.run(
        [sys.executable, "-I", "-c", RUN, "--runs", "3", "--out", "out.npz"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "matches the unscheduled kernel" in run.stdout
    warm = re.search(r"([\d.]+) ms a call, the median of 3 runs.*in the caches", run.stdout)
    cold = re.search(r"([\d.]+) ms a call cold: each call on other copies .*\((\d+) copies", run.stdout)
    assert warm and cold, run.stdout
    assert float(warm.group(1)) > 0 and int(cold.group(2)) >= 2

    # the same kernel in the job's library, on the same arrays, gives the same output bit for bit
    sys.path.insert(0, str(folder))
    try:
        import run as script  # the reproducer's own script, for its seeded inputs
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("run", None)
    ours = np.load(folder / "out.npz")
    ours = [ours[f"arr_{i}"] for i in range(len(ours.files))]
    job_dir = client.application.extensions["playground"]["store"].job_dir(job_id)
    library = tvm.runtime.load_module(str(job_dir / "files" / "model.so"))
    function = library.imports[0].get_function(kernel)
    args = [tvm.runtime.tensor(a) for a in ours[:-1]] + [tvm.runtime.tensor(np.zeros_like(ours[-1]))]
    function(*args)
    np.testing.assert_array_equal(args[-1].numpy(), ours[-1])
    assert callable(script.random_args)


def test_a_requantizing_kernel_reproducer_runs_on_the_models_own_scales_and_clip_bounds(client, tmp_path):
    """An int8 matmul that requantizes its output clips it between two bounds the model passes in: on
    random values the lower bound could lie above the upper one and the cast to uint8 leave its range
    (run.py then found outputs 255 apart); the reproducer carries the model's small constants."""
    job_id = submit(client, {"example": "mlp", "quantize": "int8"}).get_json()["id"]
    job = wait_for_job(client, job_id)
    assert job["status"] == "done", job["error"]
    kernel = next(
        k["name"] for k in job["results"]["kernels"] if re.match(r"fused_matmul.*minimum.*cast", k["name"])
    )
    folder = unpacked(client, job_id, kernel, tmp_path)
    with np.load(folder / "constants.npz") as given:
        assert len(given.files) >= 4  # scales, zero point, the two clip bounds
    run = subprocess.run(
        [sys.executable, "-I", "-c", RUN, "--runs", "3"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "matches the unscheduled kernel" in run.stdout


def test_no_reproducer_for_an_unknown_kernel(client):
    job_id = submit(client, {"example": "mlp"}).get_json()["id"]
    wait_for_job(client, job_id)
    assert client.get(f"/r/{job_id}/repro/no_such_kernel.zip").status_code == 404


def test_a_kernel_name_from_the_pipeline_cannot_lead_the_zip_out_of_its_folder():
    from webapp.exports.repro import archive_name

    for name in ("../../etc/cron.d/x", 'a"; filename="b', "..", "fused_conv2d_add"):
        safe = archive_name(name)
        assert safe.startswith("repro-") and "/" not in safe and '"' not in safe and ".." not in safe[6:8]
    assert archive_name("fused_conv2d_add") == "repro-fused_conv2d_add"
