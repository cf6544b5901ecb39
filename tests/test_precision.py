"""Mixed precision chosen by an accuracy budget (webapp/pipeline/stages/precision.py): the layers of an int8
job kept in float, searched by the error each adds against the time its kernel saves, every point built,
compared with fp32 and timed; the fastest within the budget kept; each point built again on request."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

BATCH = 256  # the digits CNN's 8x8 images at batch 1 take 4 us in fp32: int8 pays only on a batch


def digits_batch_files(out: Path) -> tuple[Path, Path]:
    """The digits CNN (trained weights) exported for batches of 64 images as a user exports it (the
    TorchScript exporter), and calibration data from the digits training images: (.onnx, .npz) in out."""
    from webapp.pipeline.datasets import digits
    from webapp.pipeline.examples import build_example

    model, data = out / "digits.onnx", out / "calibration.npz"
    batch = (torch.zeros(BATCH, 1, 8, 8),)
    torch.onnx.export(build_example("digits-cnn"), batch, model, dynamo=False, input_names=["input"])
    images = digits()[0]
    batches = len(images) // BATCH
    np.savez(data, input=images[: batches * BATCH].reshape(batches, BATCH, 1, 8, 8).astype("float32"))
    return model, data


@pytest.fixture(scope="module")
def digits_batch(tmp_path_factory) -> tuple[bytes, bytes]:
    model, data = digits_batch_files(tmp_path_factory.mktemp("digits"))
    return model.read_bytes(), data.read_bytes()


def submit(client, model: bytes, data: bytes, **options) -> dict:
    from tests.conftest import wait_for_job

    form = {
        "model": (io.BytesIO(model), "digits.onnx"),
        "calibration_data": (io.BytesIO(data), "calibration.npz"),
        "quantize": "int8",
        **options,
    }
    answer = client.post("/api/jobs", data=form, content_type="multipart/form-data")
    assert answer.status_code == 202, answer.get_json()
    job = wait_for_job(client, answer.get_json()["id"])
    assert job["status"] == "done", job["error"]
    return job


def test_the_budget_keeps_the_fastest_mix_that_holds_it_and_each_point_builds_again(
    client, digits_batch, one_thread
):
    """With a budget the int8 build misses, the search keeps layers in float until a point holds it;
    the chosen point holds it, is the fastest point that does and is faster than fp32, and the job's
    int8 build is that point (its layers in float are its skipped layers). POST .../precision builds
    another point as a new job with that point's layers in float."""
    model, calibration = digits_batch
    clipped = {"calibration": "global", "global_scale": "3"}  # activations clipped: errors to choose from
    loose = submit(client, model, calibration, accuracy_budget="1", **clipped)["results"]["quantization"]
    first = loose["precision_search"]
    assert "error" not in first, first
    int8 = first["points"][0]
    assert int8["k"] == 0 and int8["keeps"] and first["chosen"] == 0, first["points"]
    assert first["points"][-1]["k"] is None and first["points"][-1]["speedup_vs_fp32"] == 1.0
    assert int8["speedup_vs_fp32"] > 1.0, first["points"]  # int8 pays on this batch (1.5-1.9x seen)

    # a budget above what int8 alone keeps: layers go to float
    budget = f"{int8['sqnr_db'] + 2:.1f} dB"
    job = submit(client, model, calibration, accuracy_budget=budget, **clipped)
    q = job["results"]["quantization"]
    search = q["precision_search"]
    points, chosen = search["points"], search["points"][search["chosen"]]
    assert search["least"] == pytest.approx(int8["sqnr_db"] + 2, abs=0.06) and search["metric"] == "sqnr_db"
    assert not points[0]["keeps"] and len(points) >= 3, points
    assert chosen["keeps"] and chosen["k"] is not None and chosen["sqnr_db"] >= search["least"], points
    assert chosen["speedup_vs_fp32"] > 1.0 and search["library"] == "model.so", points
    assert chosen["pareto"] and sorted(q["skipped"]) == chosen["float_layers"]
    assert {row["layer"] for row in search["ranking"]} <= {row["layer"] for row in q["layer_speed"]["layers"]}

    other = next(i for i, p in enumerate(points) if i != search["chosen"] and p["k"] is not None)
    assert client.post(f"/api/jobs/{job['id']}/precision", json={"point": 99}).status_code == 400
    fp32 = client.post(f"/api/jobs/{job['id']}/precision", json={"point": len(points) - 1})
    assert fp32.status_code == 400 and "float build" in fp32.get_json()["error"]
    from tests.conftest import wait_for_job

    answer = client.post(f"/api/jobs/{job['id']}/precision", json={"point": other})
    assert answer.status_code in (200, 202), answer.get_json()
    again = wait_for_job(client, answer.get_json()["id"])
    assert again["status"] == "done", again["error"]
    assert again["options"]["accuracy_budget"] == ""
    assert (again["options"]["layer_precision"] or {}) == points[other]["layer_precision"]
    assert sorted(again["results"]["quantization"]["skipped"]) == points[other]["float_layers"]


def test_layer_precision_keeps_layers_in_float_or_gives_them_4_bit_weights(digits_batch, tmp_path):
    """layer_precision on the quantizer itself: "float" keeps the layer out of the integer model, "int4"
    quantizes its weights to 4 bits (the activations stay 8-bit), a name the model lacks is refused."""
    from webapp.options import JobOptions
    from webapp.pipeline.stages.importers import import_model
    from webapp.pipeline.stages.quantize import quantize
    from webapp.targets import host

    (tmp_path / "digits.onnx").write_bytes(digits_batch[0])
    model = import_model(tmp_path / "digits.onnx")
    samples = [
        {"input": np.random.default_rng(i).standard_normal((BATCH, 1, 8, 8), "float32")} for i in range(2)
    ]
    given = {"00 conv2d 16x1x3x3": "float", "01 conv2d 32x16x3x3": "int4"}
    q = quantize(model.mod, host(), JobOptions(quantize="int8", layer_precision=given), samples)
    assert [layer.name for layer in q.skipped] == ["00 conv2d 16x1x3x3"]
    rows = {row["layer"]: row for row in q.layer_table()}
    assert rows["01 conv2d 32x16x3x3"]["weight_bits"] == 4 and rows["02 matmul 512x10"]["weight_bits"] == 8
    weights = {r.layer.name: r.weight_q for r in q.layers}
    assert np.abs(weights["01 conv2d 32x16x3x3"]).max() <= 7 < np.abs(weights["02 matmul 512x10"]).max()
    with pytest.raises(ValueError, match="layer_precision names 1 layer"):
        quantize(
            model.mod, host(), JobOptions(quantize="int8", layer_precision={"99 conv": "float"}), samples
        )


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"quantize": "int8", "accuracy_budget": "lots"}, "SQNR against fp32 in dB"),
        ({"quantize": "none", "accuracy_budget": "30 dB"}, "needs quantize int8"),
        ({"quantize": "int8", "layer_precision": '{"00 conv2d": "int3"}'}, "float, int8 or int4"),
        ({"quantize": "int4", "layer_precision": '{"00 conv2d": "float"}'}, "needs quantize int8"),
    ],
)
def test_a_budget_or_layer_precision_the_server_cannot_take_is_refused_at_once(client, form, message):
    answer = client.post("/api/jobs", data={"example": "mlp", **form})
    assert answer.status_code == 400 and message in answer.get_json()["error"], answer.get_json()


def test_the_chosen_point_and_the_front_are_drawn_with_a_button_for_each_other_point(app):
    """The page's part, rendered from a result's precision_search alone: the chart's dots (the chosen
    one marked), the budget line, and a build button on every point but the chosen and fp32."""
    from webapp.web.chart import pareto_chart

    search = {
        "budget": "40 dB", "metric": "sqnr_db", "least": 40.0, "device": "here", "samples": 8, "chosen": 1,
        "library": "model.so", "quantized_within": 1, "points": [
            {"k": 0, "float_layers": [], "int8_layers": 3, "ms": 1.0, "speedup_vs_fp32": 2.0, "sqnr_db": 35.0,
             "exact": False, "top1_agree": 1.0, "keeps": False, "pareto": True, "layer_precision": {}},
            {"k": 1, "float_layers": ["00 conv"], "int8_layers": 2, "ms": 1.2, "speedup_vs_fp32": 1.67,
             "sqnr_db": 45.0, "exact": False, "top1_agree": 1.0, "keeps": True, "pareto": True,
             "layer_precision": {"00 conv": "float"}},
            {"k": None, "float_layers": None, "int8_layers": 0, "ms": 2.0, "speedup_vs_fp32": 1.0,
             "sqnr_db": None, "exact": True, "top1_agree": 1.0, "keeps": True, "pareto": True,
             "layer_precision": None},
        ],
    }  # fmt: skip
    chart = pareto_chart(search)
    assert chart is not None and [d["label"] for d in chart["dots"]] == ["0 float", "1 float", "fp32"]
    ys = [d["y"] for d in chart["dots"]]
    assert ys[2] < ys[1] < chart["budget_y"] < ys[0]  # fp32 on top, the budget between the points
    xs = [d["x"] for d in chart["dots"]]
    assert xs[0] < xs[1] < xs[2]
    with app.test_request_context():
        from flask import render_template

        html = render_template(
            "_precision.html", q={"precision_search": search, "variant": "int8"}, job={"id": "x"},
            precision_chart=chart,
        )  # fmt: skip
    assert 'id="pareto-chart"' in html and html.count('class="dot chosen"') == 1
    assert html.count('class="build-point"') == 1 and "1 layer in float" in html and "1.67" in html
    assert "timed in turn on here" in html and "estimated ms" not in html

    # a board's points: llvm-mca's estimates, each with the share of the operations it analysed
    board = search | {"timed_by": "llvm-mca", "device": "rpi5: llvm-mca's estimate for cortex-a76"}
    shares = (0.97, 1.0, 0.5)
    board["points"] = [p | {"analysed_flop_share": f} for p, f in zip(search["points"], shares, strict=True)]
    with app.test_request_context():
        html = render_template(
            "_precision.html", q={"precision_search": board, "variant": "int8"}, job={"id": "x"},
            precision_chart=pareto_chart(board),
        )  # fmt: skip
    assert "estimated ms" in html and "timed in turn" not in html
    assert "estimate for cortex-a76" in html
    assert [c in html for c in (">97%<", ">100%<", ">50%<")] == [True] * 3
    assert pareto_chart(board)["x_unit"] == "ms a run, llvm-mca's estimate (lower is faster)"
    assert all(d["labelled"] for d in chart["dots"])
    # two points on one spot: the chosen one's label is written, the other's left to its tooltip
    close = search | {"points": [search["points"][0] | {"sqnr_db": 44.5}, *search["points"][1:]]}
    assert [d["labelled"] for d in (pareto_chart(close) or {})["dots"]] == [False, True, True]


@pytest.mark.parametrize(
    ("n", "first_keeping", "tried"),
    [(6, 5, [0, 1, 2, 4, 5]), (40, 11, [0, 1, 2, 4, 8, 16, 12, 10, 11]), (1, 1, [0]), (6, 0, [0])],
)
def test_the_search_doubles_then_halves_to_the_fewest_float_layers_in_budget(n, first_keeping, tried):
    """k layers of the ranking in float: 1, 2, 4, ... up to n - 1 (n is the float build), then halving
    between the last point that missed the budget and the first that kept it."""
    from webapp.pipeline.stages.precision import walk

    class Points:  # the points as walk() asks for them; each one keeps 40 dB from first_keeping on
        built: dict = {}

        def at(self, k: int) -> dict:
            self.built[k] = None
            return {"sqnr_db": 50.0 if k >= first_keeping else 10.0}

    points = Points()
    points.built = {}
    walk(points, n, "sqnr_db", 40.0)
    assert list(points.built) == tried


def test_a_budget_is_searched_where_the_code_runs_or_llvm_mca_models_its_core_and_said_why_not_elsewhere():
    """x86 presets are timed here, the boards estimated by llvm-mca; a GPU, or a CPU timed neither here nor
    on a board (riscv64), gets no search, and the result says why."""
    from webapp.pipeline.stages.precision import not_searched
    from webapp.targets import get

    assert not_searched(get("x86-host")) is None and not_searched(get("rpi5")) is None
    for name in ("cuda-sm80", "riscv64"):
        why = not_searched(get(name)) or ""
        assert f"{name}'s code runs neither on this server nor on a board" in why and "llvm-mca" in why
