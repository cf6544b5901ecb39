"""What a model's outputs say, where the model's file says how to read them, so that an own-input run
can tell whether TVM's build reads the input as ONNX Runtime does, not just how far apart the numbers
are: a CTC text recognizer's lines (PaddleOCR writes its character list into the ONNX file's metadata,
"character") decoded greedily, and a text detector's boxes (an output of one channel the size of the
input image, a probability per pixel) as the regions above DB's threshold."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

BOX_THRESHOLD = 0.3  # DB's (PaddleOCR's det_db_thresh)
MIN_BOX_PIXELS = 9  # a region smaller than 3x3 pixels is noise, not text
MAX_BOXES = 200
MAX_SHOWN = 200  # inputs whose reading the run's JSON lists (the agreement counts them all)


def characters(onnx_path: Path) -> list[str] | None:
    """A CTC recognizer's classes from its ONNX metadata: the blank, the listed characters, a space."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    listed = next((p.value for p in model.metadata_props if p.key == "character"), None)
    return None if not listed else ["", *(c.rstrip("\r") for c in listed.split("\n")), " "]


def reader(
    onnx_path: Path | None, shapes: list[list[int]], outputs: list[np.ndarray]
) -> tuple[str, Callable[[list[np.ndarray]], list]] | None:
    """("text" or "boxes", a function of a runtime's outputs giving each input's reading), or None for
    a model whose outputs this cannot read. `shapes`: the model's inputs' shapes in one run."""
    first = outputs[0] if outputs else None
    if first is None:
        return None
    chars = characters(onnx_path) if onnx_path is not None else None
    if chars and first.ndim == 3 and first.shape[-1] == len(chars):
        return "text", lambda outs: [ctc_greedy(row, chars) for row in outs[0]]
    image = shapes[0] if len(shapes) == 1 and len(shapes[0]) == 4 else None
    if image and first.ndim == 4 and first.shape[1] == 1 and list(first.shape[2:]) == image[2:]:
        if np.all((first >= 0) & (first <= 1)):
            return "boxes", lambda outs: [regions(m[0] > BOX_THRESHOLD) for m in outs[0]]
    return None


def ctc_greedy(scores: np.ndarray, chars: list[str]) -> str:
    """The best class at each step, repeats merged, blanks (class 0) dropped."""
    best = scores.argmax(-1)
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    return "".join(chars[i] for i in best[keep & (best != 0)])


def regions(mask: np.ndarray) -> list[list[int]]:
    """The bounding boxes [x0, y0, x1, y1] (x1, y1 exclusive) of the 8-connected regions of a mask,
    largest first, those under MIN_BOX_PIXELS left out."""
    from scipy import ndimage

    labels, count = ndimage.label(mask, structure=np.ones((3, 3), bool))
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    boxes = [
        (int(sizes[i + 1]), [s[1].start, s[0].start, s[1].stop, s[0].stop])
        for i, s in enumerate(ndimage.find_objects(labels))
        if s is not None and sizes[i + 1] >= MIN_BOX_PIXELS
    ]
    return [b for _, b in sorted(boxes, key=lambda p: -p[0])[:MAX_BOXES]]


def iou(a: list[int], b: list[int]) -> float:
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def agreement(kind: str, mine: list, reference: list) -> dict:
    """How a runtime's readings agree with the reference's: the lines read the same; or, each box of
    the reference matched to its best-overlapping box here, the mean IoU, the lowest, and the boxes
    found here and there."""
    if kind == "text":
        same = sum(a == b for a, b in zip(mine, reference, strict=True))
        return {"lines": len(reference), "lines_same": same}
    ious = [
        max((iou(r, m) for m in ours), default=0.0)
        for ours, refs in zip(mine, reference, strict=True)
        for r in refs
    ]
    return {
        "boxes": sum(len(b) for b in mine),
        "reference_boxes": len(ious),
        "mean_iou": round(float(np.mean(ious)), 4) if ious else None,
        "min_iou": round(float(np.min(ious)), 4) if ious else None,
    }
