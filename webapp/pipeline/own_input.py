"""A result's model on the user's own input, in the sandbox (`python -m webapp.pipeline.own_input
<run_dir>`): the upload (an .npz of the model's inputs, or an image for a model with one NCHW image
input) read and prepared, then every build the job kept (TVM fp32, and its quantized build) and the
reference runtimes (ONNX Runtime, PyTorch) run on it, their outputs compared. What the worker
prepared is in input/run.json (webapp/jobs/own_input.py); what this finds goes to result.json, the
outputs to files/outputs.npz."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

from webapp.jsonfile import write_json_atomic

MAX_RUNS = 2000  # inputs (batch items) run one by one, at most
MAX_PIXELS = 40_000_000  # a larger picture is refused before it is decoded (a decompression bomb)
# ImageNet's per-channel mean and standard deviation, as C×1×1 for an image's C×H×W
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


class InputError(Exception):
    """What is wrong with the upload, in words for its page."""


def image_input(path: Path, spec: dict, prepare: dict) -> tuple[np.ndarray, str]:
    """The picture as the model's one NCHW input: resized to its height and width, scaled to [0, 1],
    then as `prepare` says ("digits": grey, bright strokes on dark as the digits data, a picture with
    a light background inverted; "imagenet": RGB normalized by ImageNet's mean and std; "plain":
    [0, 1] alone). Returns the array and how it was prepared."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    _, channels, height, width = spec["shape"]
    try:
        image: Image.Image = Image.open(path)  # reads the header only
        if image.width * image.height > MAX_PIXELS:
            raise InputError(f"The image is {image.width}×{image.height}: more than {MAX_PIXELS:,} pixels.")
        image.load()
    except (OSError, Image.DecompressionBombError, ValueError) as e:
        raise InputError(f"The image could not be read ({e}).") from None
    said = [f"{image.format or 'image'} {image.width}×{image.height} resized to {width}×{height}"]
    image = image.convert("L" if channels == 1 else "RGB").resize((width, height), Image.Resampling.BILINEAR)
    x = np.asarray(image, dtype=np.float32) / 255.0
    x = x[None] if channels == 1 else x.transpose(2, 0, 1)
    if prepare.get("kind") == "digits":
        if x.mean() > 0.5:
            x = 1.0 - x
            said.append("inverted (a light background: the digits data has bright strokes on dark)")
        said.append("grey values in [0, 1], as the digits data")
    elif prepare.get("kind") == "imagenet" and channels == 3:
        x = (x - IMAGENET_MEAN) / IMAGENET_STD
        said.append("RGB scaled to [0, 1], then normalized by ImageNet's mean and std")
    else:
        said.append(f"{'RGB' if channels == 3 else 'grey'} values scaled to [0, 1]")
    if not spec["dtype"].startswith("float"):  # an integer input takes the pixel values themselves
        x = np.round(x * 255)
        said = said[:1] + [f"pixel values 0–255 as {spec['dtype']}"]
    return x[None].astype(spec["dtype"]), "; ".join(said)


def npz_inputs(path: Path, specs: list[dict]) -> tuple[list[np.ndarray], str]:
    """The .npz's arrays as the model's inputs: by name where every input's name is in it, else in
    order. An array may hold several inputs along its first axis (N times the model's batch): they
    are run one by one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"The .npz could not be read ({e}).") from None
    names = [s["name"] for s in specs]
    if all(n in arrays for n in names):
        chosen, how = [arrays[n] for n in names], "matched by name"
    elif len(arrays) >= len(specs):
        chosen, how = (
            list(arrays.values())[: len(specs)],
            f"taken in order ({', '.join(list(arrays)[: len(specs)])})",
        )
    else:
        raise InputError(
            f"The .npz holds {len(arrays)} arrays; the model takes {len(specs)} inputs ({', '.join(names)})."
        )
    out = []
    for array, spec in zip(chosen, specs, strict=True):
        shape = [d if isinstance(d, int) else None for d in spec["shape"]]
        if array.ndim != len(shape) or any(
            d is not None and a != d for a, d in zip(array.shape[1:], shape[1:], strict=True)
        ):
            raise InputError(
                f"Input {spec['name']!r} is {spec['shape']} in the model; the .npz's is {list(array.shape)}."
            )
        if array.dtype.kind not in "biuf":
            raise InputError(f"Input {spec['name']!r}: the array's dtype {array.dtype} is not a number type.")
        out.append(array.astype(spec["dtype"]))
    return out, how


def split_runs(arrays: list[np.ndarray], specs: list[dict]) -> list[list[np.ndarray]]:
    """The inputs of each run: an array that holds its input (of a fixed first dimension) N times
    along its first axis is cut into N (every such input the same N); a scalar, an input whose first
    dimension is free, or one given once beside stacked ones goes whole into each run."""
    counts: list[int | None] = []
    for a, spec in zip(arrays, specs, strict=True):
        first = spec["shape"][0] if spec["shape"] else None
        if a.ndim == 0 or not isinstance(first, int):
            counts.append(None)
        elif first <= 0 or a.shape[0] == 0 or a.shape[0] % first:
            raise InputError(
                f"{spec['name']!r}: the array's first axis ({a.shape[0]}) is no multiple of {first}."
            )
        else:
            counts.append(a.shape[0] // first)
    found = {c for c in counts if c is not None}
    if len(found) > 1 and 1 in found:  # an input given once, beside stacked ones: whole into each run
        counts, found = [None if c == 1 else c for c in counts], found - {1}
    if len(found) > 1:
        raise InputError(
            f"The arrays hold different numbers of inputs along their first axis ({sorted(found)})."
        )
    runs = found.pop() if found else 1
    if runs > MAX_RUNS:
        raise InputError(f"{runs} inputs: at most {MAX_RUNS} are run.")
    cut = lambda a, c, i: a if c is None else a[i * (a.shape[0] // c) : (i + 1) * (a.shape[0] // c)]  # noqa: E731
    return [[cut(a, c, i) for a, c in zip(arrays, counts, strict=True)] for i in range(runs)]


def callers(spec: dict, run_dir: Path) -> dict:
    """Runtime label -> a function of one run's inputs giving its outputs as numpy arrays: each TVM
    library the job kept, then ONNX Runtime and PyTorch on the job's model files."""
    import tvm
    from tvm import relax

    from webapp.pipeline.stages.bench import (
        flatten_outputs,
        onnxruntime_session,
        pytorch_module,
        torch_outputs,
    )

    threads = int(spec.get("threads", 1))
    out: dict[str, Callable[..., list[np.ndarray]]] = {}
    for label, lib in spec["libraries"].items():
        main = relax.VirtualMachine(tvm.runtime.load_module(str(run_dir / lib)), tvm.cpu())["main"]
        out[label] = lambda xs, f=main: flatten_outputs(f(*[tvm.runtime.tensor(x) for x in xs]))
    refs = spec.get("references", {})
    if "onnxruntime" in refs:
        session = onnxruntime_session(run_dir / refs["onnxruntime"], threads)
        names = [i.name for i in session.get_inputs()]
        out["ONNX Runtime"] = lambda xs: session.run(None, dict(zip(names, xs, strict=False)))
    if "pytorch" in refs:
        import torch

        module = pytorch_module(run_dir / refs["pytorch"], threads)

        def torch_call(xs):
            with torch.no_grad():
                return torch_outputs(module(*[torch.from_numpy(x) for x in xs]))

        out["PyTorch"] = torch_call
    return out


def run_all(call: Callable[[list[np.ndarray]], list], runs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Each output of the model over every run, concatenated along the first axis."""
    outs = [[np.asarray(o) for o in call(inputs)] for inputs in runs]
    if len(outs) == 1:
        return outs[0]
    join = lambda parts: np.concatenate(parts) if parts[0].ndim else np.stack(parts)  # noqa: E731
    return [join([o[i] for o in outs]) for i in range(len(outs[0]))]


def top5(scores: np.ndarray, classes: list[str] | None) -> list[list]:
    """Each input's five best classes and their probabilities (a softmax of the scores)."""
    rows = []
    for row in scores.astype(np.float64):
        p = np.exp(row - row.max())
        p /= p.sum()
        best = np.argsort(-row, kind="stable")[:5]
        rows.append(
            [[classes[i] if classes and i < len(classes) else str(int(i)), float(p[i])] for i in best]
        )
    return rows


def run(run_dir: Path) -> dict:
    from webapp.pipeline.stages.fidelity import fidelity

    spec = json.loads((run_dir / "input" / "run.json").read_text())
    specs, upload = spec["inputs"], run_dir / spec["upload"]
    if spec["kind"] == "image":
        if len(specs) != 1 or len(specs[0]["shape"]) != 4 or specs[0]["shape"][1] not in (1, 3):
            raise InputError(
                "An image is taken by a model of one image input (N×C×H×W, 1 or 3 channels); send an .npz."
            )
        x, how = image_input(upload, specs[0], spec.get("prepare") or {})
        arrays = [x]
    else:
        arrays, how = npz_inputs(upload, specs)
    runs = split_runs(arrays, specs)
    outputs, rows = {}, []
    for label, call in callers(spec, run_dir).items():
        try:
            outputs[label] = run_all(call, runs)
            shapes = [{"shape": list(o.shape), "dtype": str(o.dtype)} for o in outputs[label]]
            rows.append({"runtime": label, "outputs": shapes})
        except Exception as e:  # one runtime that cannot run the input: said, the others go on
            rows.append({"runtime": label, "error": f"{type(e).__name__}: {e}"[:2000]})
    if not outputs:
        raise InputError("No runtime could run this input: " + "; ".join(r["error"] for r in rows))
    reference = next((r for r in ("ONNX Runtime", "PyTorch") if r in outputs), next(iter(outputs)))
    classifier = spec.get("classifier") and all(len(o) == 1 and o[0].ndim == 2 for o in outputs.values())
    for row in rows:
        mine = outputs.get(row["runtime"])
        if mine is None:
            continue
        first = mine[0].ravel()
        row["first_values"] = [float(v) for v in first[:8]]
        if row["runtime"] != reference:
            row["against"] = {"reference": reference, **fidelity(mine, outputs[reference], classifier)}
        if classifier:
            row["top5"] = top5(mine[0][:1], spec.get("classes"))[0]
            row["top1"] = [int(i) for i in mine[0].argmax(1)]
    kind = read_outputs(spec, run_dir, [list(a.shape) for a in runs[0]], reference, outputs, rows)
    out_dir = run_dir / "files"
    out_dir.mkdir(exist_ok=True)
    saved = {f"{label}/{i}": a for label, arrays_ in outputs.items() for i, a in enumerate(arrays_)}
    # numpy's stub: **kwds might name its allow_pickle (bool)
    np.savez_compressed(out_dir / "outputs.npz", **saved)  # type: ignore[arg-type]
    return {
        "inputs": [
            {"name": s["name"], "shape": list(a.shape), "dtype": str(a.dtype)}
            for s, a in zip(specs, arrays, strict=True)
        ],
        "runs": len(runs),
        "prepared": how,
        "reference": reference,
        "classifier": bool(classifier),
        **({"reading": kind} if kind else {}),
        "runtimes": rows,
    }


def read_outputs(
    spec: dict, run_dir: Path, shapes: list[list[int]], reference: str, outputs: dict, rows: list[dict]
) -> str | None:
    """Where the model says how to read its outputs (webapp.pipeline.reports.readings: a recognizer's
    text, a detector's boxes), each runtime's `reading` of every input and, against the reference, how
    many it reads the same; returns what was read ("text", "boxes"), None where nothing. `shapes`: one
    run's input shapes. A runtime whose outputs cannot be read so just has no reading."""
    from webapp.pipeline.reports.readings import MAX_SHOWN, agreement, reader

    onnx_file = (spec.get("references") or {}).get("onnxruntime")
    try:
        read = reader(run_dir / onnx_file if onnx_file else None, shapes, outputs[reference])
        if read is None:
            return None
        kind, of = read
        wanted = of(outputs[reference])
    except Exception:  # noqa: BLE001 - a reading is an extra: the run stands without it
        traceback.print_exc()
        return None
    for row in rows:
        if row["runtime"] not in outputs:
            continue
        try:
            mine = wanted if row["runtime"] == reference else of(outputs[row["runtime"]])
            row["reading"] = mine[:MAX_SHOWN]
            if "against" in row:
                row["against"]["reading"] = agreement(kind, mine, wanted)
        except Exception:  # noqa: BLE001 - outputs of another shape than the reference's
            traceback.print_exc()
    return kind


def failed(e: Exception) -> dict:
    """A run's result when it raised: an input's message as it is, our bug's with its traceback in the log."""
    if isinstance(e, InputError):
        return {"status": "failed", "error": str(e)}
    traceback.print_exc()
    return {"status": "failed", "error": f"The run failed: {type(e).__name__}: {e}"[:4000]}


def main(run_dir: Path) -> int:
    try:
        result = {"status": "done", **run(run_dir)}
    except Exception as e:  # noqa: BLE001 - an input no check caught, or our bug: said on the run's page
        result = failed(e)
    write_json_atomic(run_dir / "result.json", result)
    return 0 if result["status"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
