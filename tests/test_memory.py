"""A build's memory (webapp/pipeline/reports/memory.py), read from its lowered module: a 1x1
convolution's weights are its parameters, byte for byte; a padded 3x3 convolution's padding buffer is
its workspace; the example job's JSON has a row per build with its library's size."""

from __future__ import annotations

from tests.conftest import wait_for_job
from tests.test_api import submit
from tests.test_mca import conv_model
from webapp.pipeline.reports.memory import footprint
from webapp.pipeline.stages.build import schedule
from webapp.pipeline.stages.optimize import optimize
from webapp.targets import get


def lowered(mod, tmp_path):
    target = get("x86-host")
    return schedule(optimize(mod, target, tmp_path).fused, target, None)[0]


def test_parameters_activations_and_workspace_of_two_convolutions(tmp_path):
    one = footprint(lowered(conv_model(kernel=1, size=28), tmp_path))
    assert one["params_bytes"] == 64 * 64 * 4 and one["params"] == 1
    tensor = 28 * 28 * 64 * 4  # the input, the convolution's output and the output are this size
    assert tensor <= one["activations_bytes"] <= 3 * tensor and one["storages"] >= 1
    three = footprint(lowered(conv_model(), tmp_path))
    assert three["params_bytes"] >= 64 * 64 * 9 * 4  # its weights (repacked: at least as many)
    # the padded input, 58 x 58 x 64 floats, is the convolution's own buffer
    assert three["workspace_bytes"] >= 58 * 58 * 64 * 4 and "conv2d" in three["workspace_kernel"]


def test_the_job_has_a_memory_row_per_build(client):
    job = wait_for_job(client, submit(client, {"example": "cnn-small", "quantize": "int8"}).get_json()["id"])
    assert job["status"] == "done", job["error"]
    results = job["results"]
    rows = {m["variant"]: m for m in results["memory"]}
    assert set(rows) == {"fp32", "int8"}
    assert rows["int8"]["library_bytes"] == results["library"]["bytes"]  # model.so is the int8 build
    assert rows["int8"]["params_bytes"] < rows["fp32"]["params_bytes"]  # 8-bit weights against 32
    page = client.get(f"/r/{job['id']}").get_data(as_text=True)
    assert 'id="memory"' in page and "largest workspace" in page


EXPORT_SCRIPT = """
import resource, sys
import numpy as np, tvm
from tvm import relax
from tvm.script import relax as R
from webapp.targets import get
target = get(sys.argv[2])
bb = relax.BlockBuilder()
x = relax.Var("x", R.Tensor((1, 10240), "float32"))
w = np.random.default_rng(0).standard_normal((10240, 10240), dtype=np.float32)  # 400 MiB
with bb.function("main", [x]):
    bb.emit_func_output(bb.emit(relax.op.matmul(x, relax.const(w))))
executable = tvm.compile(bb.get(), target=target.tvm)
del w
import gc; gc.collect()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
target.export_library(executable, sys.argv[1])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10)
"""


def test_exporting_a_library_holds_no_extra_copy_of_its_weights(tmp_path):
    """A library's weights go into it through a file the assembler includes (targets.base.pack_imports),
    not through LLVM, whose constant and object file held two more copies of them in memory: exporting
    400 MiB of weights raises the process's peak by one copy, the serialized module (412 MiB measured;
    TVM's own packing: 1,213 MiB), natively and cross-compiled for a board, and the library computes."""
    import subprocess
    import sys

    import numpy as np
    import tvm

    for preset in ("x86-host", "rpi5"):
        out = tmp_path / f"{preset}.so"
        done = subprocess.run(
            [sys.executable, "-c", EXPORT_SCRIPT, str(out), preset], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert int(done.stdout.split()[-1]) < 600, done.stdout  # MiB above the peak before the export
        assert out.stat().st_size > 400 << 20
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "x86-host.so")), tvm.cpu())
    x = np.random.default_rng(1).standard_normal((1, 10240), dtype=np.float32)
    w = np.random.default_rng(0).standard_normal((10240, 10240), dtype=np.float32)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x @ w, rtol=1e-3, atol=1e-2)


def test_the_optimize_trace_and_the_profile_hook_let_go_of_the_model(tmp_path):
    """TVM keeps a pass instrument, and a VM's instrument hook, alive after their use (references from
    TVM's objects, which Python's collector cannot see): the optimize stage's pass captures and fusion
    trace and the profile's hooked runs, still alive, hold no module and no VM. Before, they held a 2 GB
    model's weights three times over into the generate stage."""
    import gc

    import numpy as np

    from webapp.pipeline.stages.build import build
    from webapp.pipeline.stages.optimize import CaptureTopLevelPasses, FusionTrace
    from webapp.pipeline.stages.profile import HookedRuns, profile_kernels

    kinds = (FusionTrace, CaptureTopLevelPasses)
    before = {id(o) for o in gc.get_objects() if isinstance(o, kinds)}  # other tests' (a failed optimize's)
    target = get("x86-host")
    fused = optimize(conv_model(kernel=1, size=28), target, tmp_path).fused
    executable = build(schedule(fused, target, None)[0], target, None)
    profile = profile_kernels(executable, {"x": np.ones((1, 64, 28, 28), "float32")}, runs=2)
    assert profile["kernels"] and profile["runs"] >= 2
    gc.collect()
    alive = {
        kind: [o for o in gc.get_objects() if isinstance(o, kind) and id(o) not in before] for kind in kinds
    }
    # TVM 0.27 keeps the instruments alive (were it not to, their clean-up would be moot: say so, drop it)
    assert all(alive.values()), {k: len(v) for k, v in alive.items()}
    assert all(t.imported is None and t.before is None and t.after is None for t in alive[FusionTrace])
    assert all(not c.snapshots for c in alive[CaptureTopLevelPasses])
    # the hooked runs and their VM form a cycle through TVM until close() breaks it: they are gone
    assert not [o for o in gc.get_objects() if isinstance(o, HookedRuns)]


MAPPED_SCRIPT = """
import sys
import numpy as np
from webapp.pipeline import memory
if sys.argv[1] == "mapped":
    memory.map_large_allocations()
def address_mb():
    return int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) >> 10
np.ones(1 << 21, "float32")  # one freed: glibc's own threshold rises past the tensors' size
before = address_mb()
weights = [np.ones(1 << 20, "float32") for _ in range(400)]  # 1.6 GB in tensors of 4 MB, as weights come
del weights[::2]  # half of them freed, the rest kept: holes in the heap
kept = [np.ones(1 << 19, "float32") for _ in range(10)]
del weights
memory.let_go()
print(address_mb() - before)
"""


def test_the_pipeline_hands_the_address_space_of_freed_weights_back():
    """glibc serves tensors of a few MB from its heap and keeps their address space once freed, which the
    sandbox limits (a 2 GB model's generate stage failed so at 16 GB with 3.5 GB resident): the pipeline's
    process maps them on their own (memory.map_large_allocations), and freed they leave it."""
    import subprocess
    import sys

    grown = {}
    for mode in ("mapped", "heap"):
        done = subprocess.run([sys.executable, "-c", MAPPED_SCRIPT, mode], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        grown[mode] = int(done.stdout.split()[-1])
    assert grown["mapped"] < 200 < grown["heap"], grown  # MB of address space left after the weights went
