"""What compiles, quantizes (benchmarks/quantize_all.py runs every light model of the onnx package and
every example, for x86-host and rpi5; these are the ones that fit in make test): the int8 build
succeeds, and where it runs here its output is within 25 dB SQNR of the fp32 build's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "quantize_all.py"


def quantize_all():
    spec = importlib.util.spec_from_file_location("quantize_all", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, preset",
    [
        ("squeezenet", "x86-host"),  # fire modules: concatenated branches, a dropout (its tuple output)
        ("squeezenet", "rpi5"),  # built only: the board runs it (tests/test_devices.py)
        ("cnn-small", "x86-host"),
        ("transformer-block", "rpi5"),
    ],
)
def test_int8_builds_and_stays_close_to_fp32(name, preset, example_files, tmp_path):
    script = quantize_all()
    path = script.light_models().get(name) or example_files / f"{name}.onnx"
    row = script.int8_against_fp32(path, preset, tmp_path)
    assert not row["failed"] and row["int8_layers"] > 0, row
    assert script.verdict(row) in ("ok", "built (not run here)"), row
    if preset == "x86-host":
        assert row["sqnr_db"] >= script.MIN_SQNR_DB
