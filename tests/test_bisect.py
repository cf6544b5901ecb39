"""Pass bisection (webapp/pipeline/stages/bisect.py): the first step of a job's way from the imported
model to its library whose outputs leave the reference, and the bindings that step changed with their
source layers; in-process with a pass broken on purpose, and through the API on a job that asks for it."""

from __future__ import annotations

import tvm
from tvm import relax


@relax.expr_functor.mutator
class FlipFirstKernel(relax.PyExprMutator):
    """The first call of a kernel whose name has `contains`, negated: a sign flipped in one fused kernel's
    output (an unsigned integer one, as a quantized kernel's, mirrored: its largest value less it)."""

    def __init__(self, mod, contains: str):
        super().__init__(mod)
        self.contains, self.flipped = contains, None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if (
            self.flipped is None
            and call.op.same_as(tvm.ir.Op.get("relax.call_tir"))
            and self.contains in call.args[0].name_hint
        ):
            self.flipped = call.args[0].name_hint
            unflipped = self.builder_.emit(call, "unflipped")
            dtype = str(unflipped.ty.dtype)
            if dtype.startswith("uint"):
                return relax.op.subtract(relax.const((1 << int(dtype[4:])) - 1, dtype), unflipped)
            return relax.op.negative(unflipped)
        return call


def broken_pass(contains: str) -> tvm.transform.Pass:
    """A pass named BrokenSign that flips the first kernel call whose name has `contains` (benchmarks/
    bisect.py times the bisection of a model with it)."""

    @tvm.transform.module_pass(opt_level=0, name="BrokenSign")
    def broken_sign(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        flip = FlipFirstKernel(mod, contains)
        out = mod.clone()
        out.update_func(out.get_global_var("main"), flip.visit_expr(mod["main"]))
        assert flip.flipped is not None
        return out

    return broken_sign


broken_sign = broken_pass("conv2d")


def test_a_pass_broken_on_purpose_is_named_with_the_kernel_and_layer_it_broke(example_files, tmp_path):
    from webapp.pipeline.passes.legalize import legalize_passes
    from webapp.pipeline.stages import bench
    from webapp.pipeline.stages.bisect import bisect, run_module, source_layers
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.optimize import canonical, optimize
    from webapp.targets import get, host

    path = example_files / "cnn-small.onnx"
    model, target = import_model(path), get("x86-host")
    fusion = optimize(model.mod, target, tmp_path, layer_of=model.layers).fusion  # the job's, unbroken
    legalize = legalize_passes(target)
    after_fusion = 1 + next(i for i, p in enumerate(legalize) if p.info.name == "FuseTIR")
    broken = legalize[:after_fusion] + [broken_sign] + legalize[after_fusion:] + target.lower_passes()
    inputs = bench.make_inputs(model.inputs, seed=0)
    reference = bench.flatten_outputs(bench.onnxruntime_runner(path, inputs, 1)())

    def library():  # the job's library as the broken pipeline would build it
        with target.tvm:
            lowered = tvm.transform.Sequential(broken)(canonical(model.mod))
        return run_module(lowered, inputs, host())  # TVM's default pipeline: nothing left for it to do

    found = bisect(
        model.mod, target, inputs, ("onnxruntime", reference), library,
        source_layers(fusion, model.layers), 60.0, passes=broken,
    )  # fmt: skip
    first, runs = found["first"], found["runs"]
    assert first["name"] == "BrokenSign" and first["off"] and first["sqnr_db"] < 20, first
    assert found["points"] >= len(broken) + 3  # imported, canonical, each pass (nested too), the library
    assert all(not r["off"] for r in runs if r["index"] < first["index"] and "off" in r)
    assert len(runs) <= 10  # a bisection of 40-odd points, not each of them
    # the first binding it changed: the convolution's output, its sign flipped, in the model's first layer
    changed = found["changed"][0]
    convolutions = [layer for layer in dict.fromkeys(model.layers.values()) if layer.endswith("Conv")]
    assert changed["kernel"].startswith("fused_conv2d") and changed["cosine"] < -0.999, changed
    assert changed["layers"][0] == convolutions[0], (changed, convolutions)
    assert found["changed_count"] >= 2  # and what it feeds
    assert found["compared_with"] == first["index"] - 1


def test_a_broken_pass_is_found_in_a_quantized_build_against_its_integer_model(example_files):
    """A quantized build's way starts from its integer model (no canonical form: it is built as it is),
    and its reference is that model's own outputs: the pass broken on purpose is named there too."""
    from webapp.options import JobOptions
    from webapp.pipeline.passes.legalize import legalize_passes
    from webapp.pipeline.stages import bench
    from webapp.pipeline.stages.bisect import bisect, run_module
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.quantize import quantize
    from webapp.targets import get, host

    model, target = import_model(example_files / "cnn-small.onnx"), get("x86-host")
    samples = [bench.make_inputs(model.inputs, seed=s) for s in range(4)]
    q = quantize(model.mod, target, JobOptions(quantize="int8"), samples)
    legalize = legalize_passes(target)
    after_fusion = 1 + next(i for i, p in enumerate(legalize) if p.info.name == "FuseTIR")
    broken = legalize[:after_fusion] + [broken_sign] + legalize[after_fusion:] + target.lower_passes()
    inputs = samples[0]

    def library():
        with target.tvm:
            return run_module(tvm.transform.Sequential(broken)(q.mod), inputs, host())

    found = bisect(
        q.mod, target, inputs, ("", None), library, lambda *_: [], 40.0, passes=broken, quantized=True
    )
    assert found["reference"] == "imported" and found["runs"][0]["name"] == "imported"
    assert "canonical form" not in [r["name"] for r in found["runs"]]
    assert found["first"]["name"] == "BrokenSign", found["runs"]
    assert found["changed"] and found["changed"][0]["kernel"].startswith("fused_conv2d")


def test_a_finished_job_bisected_through_the_api_is_a_new_job_with_its_bisection(client):
    """POST /api/jobs/<id>/bisect: the job again, same model and options, with the bisection; its result
    says where each build's outputs would leave the reference (here nowhere), as the CLI prints it."""
    from tests.conftest import wait_for_job
    from webapp.result_text import bisection_lines

    first = client.post("/api/jobs", data={"example": "mlp", "target": "x86-host"}).get_json()
    done = wait_for_job(client, first["id"])
    assert done["status"] == "done" and done["results"]["bisect_offered"] is True
    stages = {s["name"]: s for s in done["stages"]}
    assert stages["bisect"]["status"] == "skipped" and "not asked" in stages["bisect"]["why"]
    assert client.post("/api/jobs/no-such-job/bisect").status_code == 404

    answer = client.post(f"/api/jobs/{first['id']}/bisect")
    assert answer.status_code == 202, answer.get_data(as_text=True)
    again = wait_for_job(client, answer.get_json()["id"])
    assert again["status"] == "done", again["error"]
    assert again["options"]["bisect"] is True and again["options"]["example"] == "mlp"
    (b,) = again["results"]["bisection"]
    assert b["variant"] == "fp32" and b["reference"] == "onnxruntime" and b["first"] is None
    ran = [r for r in b["runs"] if "off" in r]
    assert [r["index"] for r in ran][:2] == [0, 1] and ran[-1]["index"] == b["points"] - 1
    assert all(r["sqnr_db"] is None or r["sqnr_db"] > 60 for r in ran), ran
    assert "fp32: no step left onnxruntime by over 60 dB" in bisection_lines(again["results"])


def test_the_page_names_the_first_off_pass_its_diff_and_the_bindings_it_changed(app):
    """A bisection as the stage records one (the broken pass above, cut short): the verdict, the link to
    the pass's Relax IR against the one before, and each changed binding's kernel (linked to the fused
    graph) and source layers."""
    from html import unescape

    from tests.test_pages import crafted_results, section, text, with_facts, write_job

    run = {"pass_index": None, "max_abs_err": 0.0, "cosine": 1.0, "sqnr_db": None, "top1_agree": None}
    broken = run | {"index": 29, "name": "BrokenSign", "pass_index": 0, "cosine": -0.4, "sqnr_db": 3.2}
    broken |= {"off": True, "seconds": 0.7}
    bisection = {
        "variant": "fp32",
        "reference": "onnxruntime",
        "tolerance_db": 60.0,
        "points": 44,
        "runs": [run | {"index": 0, "name": "imported", "off": False, "seconds": 0.5}, broken],
        "first": broken,
        "changed": [
            {"binding": "lv3", "kernel": "fused_conv2d1_add_relu", "layers": ["/conv1/Conv"], "cosine": -1.0}
            | {"sqnr_db": -6.0, "max_abs_err": 2.5, "reproducer": True}
        ],
        "changed_count": 4,
        "compared_with": 28,
        "first_pass": {"index": 0, "changed_ir": True},
        "seconds": 6.6,
    }
    layer_error = {
        "reference": "onnxruntime",
        "tolerance_db": 60.0,
        "layers": [
            {"layer": "/conv0/Conv", "off": False, "sqnr_db": None, "cosine": 1.0, "max_abs_err": 0.0},
            {"layer": "/conv1/Conv", "off": True, "sqnr_db": 12.5, "cosine": 0.97, "max_abs_err": 1.5},
        ],
        "compared": 2,
        "of": 3,
        "first_off": {"layer": "/conv1/Conv", "sqnr_db": 12.5, "cosine": 0.97},
        "lowest": {"layer": "/conv1/Conv", "sqnr_db": 12.5},
    }
    results = crafted_results() | {"bisection": [bisection], "layer_error": layer_error}
    job_id = write_job(app, with_facts(results))
    html = section(app.test_client().get(f"/r/{job_id}").get_data(as_text=True), "bisection")
    said = unescape(text(html))
    assert "The first step whose outputs leave ONNX Runtime's outputs: BrokenSign (point 29 of 44)" in said
    assert "SQNR 3.2 dB" in said and "2 of the 44 points built and run, in 6.6 s" in said
    assert "4 of the bindings both modules compute (this point's and point 28's, the last before" in said
    assert "differ beyond the tolerance; the first 1" in said
    assert f'href="/r/{job_id}?view=passes&amp;diff=1&amp;pass=0#code"' in html
    assert f'href="/r/{job_id}?graph=fused&amp;kernel=fused_conv2d1_add_relu#graph"' in html
    assert f'href="/r/{job_id}/repro/fused_conv2d1_add_relu.zip"' in html
    assert "/conv1/Conv" in said and "-1.0000" in said
    assert 'id="bisect-offer"' not in html
    assert "2 of the model's 3 layers compared" in said
    assert "The first below 60 dB: /conv1/Conv , SQNR 12.5 dB: the error first grows there" in said


def test_each_layer_against_onnx_runtime_marks_the_first_that_leaves_it(example_files, tmp_path):
    """TVM's layers of cnn-small against ONNX Runtime running a copy whose second convolution's bias is
    changed: the layers before it agree, it is the first off, and each after it is off too."""
    import onnx
    from onnx import numpy_helper

    from webapp.pipeline.stages import bench
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.layer_error import layer_errors

    path = example_files / "cnn-small.onnx"
    model = import_model(path)
    changed = onnx.load(str(path))
    convolutions = [n for n in changed.graph.node if n.op_type == "Conv"]
    bias = next(i for i in changed.graph.initializer if i.name == convolutions[1].input[2])
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 1.0, bias.name))
    onnx.save(changed, tmp_path / "changed.onnx")

    found = layer_errors(
        model.mod, model.layers, tmp_path / "changed.onnx", bench.make_inputs(model.inputs), 1, 60
    )
    rows = {r["layer"]: r for r in found["layers"]}
    order = [r["layer"] for r in found["layers"]]
    assert found["compared"] == len(order) >= len(changed.graph.node) - 1, (order, found["of"])
    assert found["first_off"]["layer"] == convolutions[1].name and found["first_off"]["sqnr_db"] < 60
    at = order.index(convolutions[1].name)
    assert not any(rows[layer]["off"] for layer in order[:at]), found["layers"]
    assert all(rows[layer]["off"] for layer in order[at:]), found["layers"]
    assert rows[order[0]]["sqnr_db"] is None or rows[order[0]]["sqnr_db"] > 100
