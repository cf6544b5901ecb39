"""A job's options: one dataclass, one name per option and one default each, shared by the form,
the JSON API, the CLI, the worker and the pipeline. Plain Python (the web process parses these)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from webapp.catalog import CALIBRATION_MODES, QUANTIZE_MODES, WEIGHT_GRANULARITY, WEIGHT_SCALE_MODES
from webapp.targets import TARGETS

MAX_TUNE_TRIALS = 20000


class SubmitError(ValueError):
    """A request refused at once; the message says why."""

    status = 400
    retry_after: int | None = None


class Busy(SubmitError):
    """A request refused for now (too many jobs queued): 429, with when to try again."""

    status = 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class JobOptions:
    target: str = "x86-host"
    quantize: str = "none"  # QUANTIZE_MODES; "sweep" builds every bit-width side by side
    calibration: str = "max"  # CALIBRATION_MODES
    weight_scale: str = "max"  # WEIGHT_SCALE_MODES
    weight_granularity: str = "channel"  # WEIGHT_GRANULARITY
    global_scale: float = 8.0  # calibration "global": every activation clipped to +-this
    skip_first: bool = False  # keep the first quantizable layer in float
    skip_last: bool = False
    tune_trials: int = 0  # MetaSchedule trials, 0: none
    input_shapes: dict | None = None  # input name -> shape, for dynamic dimensions
    # input name -> its value (a number, or nested lists): built with it as a constant (Silero's
    # sample rate, a fixed sequence length), and fed to every runtime
    input_values: dict | None = None
    bisect: bool = False  # the first pass whose outputs leave the reference (stages/bisect.py)
    # quantize int8: the accuracy a mix of float and int8 layers must keep, "30 dB" (SQNR against fp32)
    # or "99%" (top-1 agreement with fp32): the layers kept in float chosen by it (stages/precision.py)
    accuracy_budget: str = ""
    # quantize int8: layer name -> "float", "int8" or "int4" (4-bit weights on the 8-bit kernels); the
    # layers not named are int8, and none is put in float by their timing (stages.fallback). A point of
    # the precision search, built again.
    layer_precision: dict | None = None

    @property
    def bits(self) -> int:
        """The quantized bit-width (8 for a sweep's first variant and for no quantization)."""
        return int(self.quantize.removeprefix("int")) if self.quantize.startswith("int") else 8

    @property
    def per_channel(self) -> bool:
        return self.weight_granularity == "channel"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> JobOptions:
        """From a stored job (unknown keys, e.g. the upload's file name, are ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @classmethod
    def parse(cls, form: Mapping[str, str]) -> JobOptions:
        """From form fields (the HTML form, the API, the CLI): every value checked, SubmitError if not."""
        d = cls()

        def choice(name: str, allowed) -> str:
            value = (form.get(name) or getattr(d, name)).strip()
            if value not in allowed:
                raise SubmitError(f"Unknown {name} {value!r}; choose one of: {', '.join(allowed)}.")
            return value

        try:
            trials = int(form.get("tune_trials") or d.tune_trials)
        except ValueError:
            raise SubmitError("tune_trials must be a whole number.") from None
        if not 0 <= trials <= MAX_TUNE_TRIALS:
            raise SubmitError(f"tune_trials must be between 0 and {MAX_TUNE_TRIALS} on this server.")
        scale = d.global_scale
        if (form.get("global_scale") or "").strip():
            try:
                scale = float(form["global_scale"])
            except ValueError:
                raise SubmitError(
                    "global_scale must be a number (the clipping threshold, e.g. 8.0)."
                ) from None
            if not 0 < scale < 1e6:
                raise SubmitError("global_scale must be above 0 (the clipping threshold, e.g. 8.0).")
        target = choice("target", tuple(TARGETS))
        if trials and TARGETS[target].tune_refusal():
            raise SubmitError(TARGETS[target].tune_refusal())
        quantize = choice("quantize", QUANTIZE_MODES)
        if quantize != "none" and TARGETS[target].no_quantization:
            raise SubmitError(TARGETS[target].no_quantization)
        if (form.get("accuracy_budget") or "").strip() and (form.get("layer_precision") or "").strip():
            raise SubmitError("Give accuracy_budget (a search) or layer_precision (one point), not both.")
        return cls(
            target=target,
            quantize=quantize,
            calibration=choice("calibration", CALIBRATION_MODES),
            weight_scale=choice("weight_scale", WEIGHT_SCALE_MODES),
            weight_granularity=choice("weight_granularity", WEIGHT_GRANULARITY),
            global_scale=scale,
            skip_first=flag(form.get("skip_first")),
            skip_last=flag(form.get("skip_last")),
            tune_trials=trials,
            input_shapes=parse_input_shapes(form.get("input_shapes") or ""),
            input_values=parse_input_values(form.get("input_values") or ""),
            bisect=flag(form.get("bisect")),
            accuracy_budget=parse_accuracy_budget(form.get("accuracy_budget") or "", quantize),
            layer_precision=parse_layer_precision(form.get("layer_precision") or "", quantize),
        )


def flag(value: object) -> bool:
    """A form's or an API body's yes: 1, true, on, yes (any case), or True."""
    return str(value or "").strip().lower() in ("1", "true", "on", "yes")


MAX_RANK = 8
MAX_INPUT_ELEMENTS = 1 << 28  # 1 GiB of float32


def over_shape_limits(shape: list[int]) -> bool:
    """Whether an input of this shape is more than this server takes (checked at submit for
    input_shapes, and at import for the shapes a model declares)."""
    return len(shape) > MAX_RANK or math.prod(shape) > MAX_INPUT_ELEMENTS


def parse_input_shapes(text: str) -> dict[str, list[int]] | None:
    if not text.strip():
        return None
    try:
        shapes = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: brackets nested thousands deep
        raise SubmitError('input_shapes must be JSON, for example {"input": [1, 3, 224, 224]}.') from None
    if not isinstance(shapes, dict) or not all(
        isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)
        for v in shapes.values()
    ):
        raise SubmitError("input_shapes must map each input name to a list of positive integers.")
    for name, shape in shapes.items():
        elements = math.prod(shape)
        if over_shape_limits(shape):
            raise SubmitError(
                f"input_shapes gives {str(name)[:100]!r} {len(shape)} dimensions and {elements:,} "
                f"elements; this server takes at most {MAX_RANK} dimensions and {MAX_INPUT_ELEMENTS:,} "
                "elements an input."
            )
    return shapes


PRECISIONS = ("float", "int8", "int4")


def parse_accuracy_budget(text: str, quantize: str) -> str:
    """ "30", "30 dB" -> "30 dB" (the outputs' SQNR against fp32); "99%" -> "99%" (top-1 agreement)."""
    text = text.strip()
    if not text:
        return ""
    if quantize != "int8":
        raise SubmitError("accuracy_budget chooses layers between float and int8: it needs quantize int8.")
    top1 = text.endswith("%")
    try:
        value = float(text.removesuffix("%") if top1 else re.sub(r"(?i)\s*db$", "", text))
    except ValueError:
        value = -1.0
    if not (0 < value <= 100 if top1 else 0 < value < 200):
        raise SubmitError(
            'accuracy_budget is an SQNR against fp32 in dB ("30 dB", above 0) or a top-1 agreement with '
            'fp32 in percent ("99%").'
        )
    return f"{value:g}%" if top1 else f"{value:g} dB"


def budget_of(text: str) -> tuple[str, float]:
    """A parsed accuracy_budget as (the fidelity key it bounds, its least value): ("sqnr_db", 30.0) or
    ("top1_agree", 0.99)."""
    if text.endswith("%"):
        return "top1_agree", float(text[:-1]) / 100
    return "sqnr_db", float(text.removesuffix(" dB"))


def parse_layer_precision(text: str, quantize: str) -> dict | None:
    """{layer name: "float" | "int8" | "int4"}; the names are checked against the model at quantization."""
    if not text.strip():
        return None
    example = 'for example {"00 conv2d 16x1x3x3": "float"}'
    try:
        given = json.loads(text)
    except (ValueError, RecursionError):
        raise SubmitError(f"layer_precision must be JSON, {example}.") from None
    if not isinstance(given, dict) or not all(v in PRECISIONS for v in given.values()):
        raise SubmitError(f"layer_precision maps layer names to float, int8 or int4, {example}.")
    if quantize != "int8":
        raise SubmitError("layer_precision sets layers of an int8 model: it needs quantize int8.")
    return given  # {}: every layer int8, the timing's choice of float layers left out too


MAX_GIVEN_ELEMENTS = 4096  # a given value is part of the job's options, not a tensor upload


def parse_input_values(text: str) -> dict | None:
    """{input name: a number or nested lists of numbers}; its shape and type are checked against the
    model at import (the web process never reads the model)."""
    if not text.strip():
        return None
    example = 'for example {"sr": 16000}'
    shape_error = f"input_values must map each input name to a number or a list of numbers, {example}."
    try:
        values = json.loads(text)
    except (ValueError, RecursionError):
        raise SubmitError(f"input_values must be JSON, {example}.") from None
    if not isinstance(values, dict):
        raise SubmitError(shape_error)

    def count(v, depth: int = 0) -> int:
        if isinstance(v, bool) or depth > MAX_RANK:
            raise SubmitError("input_values takes numbers (not true or false), at most 8 levels of lists.")
        if isinstance(v, int | float):
            return 1
        if not isinstance(v, list):
            raise SubmitError(shape_error)
        return sum(count(x, depth + 1) for x in v)

    for name, value in values.items():
        if count(value) > MAX_GIVEN_ELEMENTS:
            raise SubmitError(
                f"input_values gives {str(name)[:100]!r} more than {MAX_GIVEN_ELEMENTS} numbers: give a "
                "larger input as a shape, or run the result on your own input."
            )
    return values
