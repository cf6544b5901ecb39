"""Text rendered with a font from Debian (fonts-dejavu-core) as PP-OCR's models take it: lines for a
recognizer, a page of lines for a detector. Made here, so the tests need no image files."""

from __future__ import annotations

import numpy as np

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
WORDS = "invoice total paid order number station voltage north river garden summer delivery".split()


def lines(n: int = 20) -> list[str]:
    """n different lines of words and figures, the same every time."""
    rng = np.random.default_rng(4)
    out = []
    while len(out) < n:
        words = [WORDS[i] for i in rng.choice(len(WORDS), 2, replace=False)]
        figures = rng.integers(10, 9999), rng.integers(1, 99), rng.integers(10, 99)
        line = f"{words[0].capitalize()} {figures[0]} {words[1]} {figures[1]}.{figures[2]}"
        if line not in out:
            out.append(line)
    return out


def line_image(text: str, height: int = 48, width: int = 320) -> np.ndarray:
    """One line as PP-OCR's recognizer takes it: 3×height×width float32, black on white scaled to
    [-1, 1], its height fitted and the rest of the width padded with zeros (PaddleOCR's resize_norm_img)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(FONT, 32)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 16, bottom - top + 16), "white")
    ImageDraw.Draw(image).text((8 - left, 8 - top), text, font=font, fill="black")
    w = min(width, int(np.ceil(height * image.width / image.height)))
    x = np.asarray(image.resize((w, height), Image.BILINEAR), np.float32).transpose(2, 0, 1) / 255.0
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :w] = (x - 0.5) / 0.5
    return out


def page_image(texts: list[str], size: int = 320) -> np.ndarray:
    """Lines of text at different places on a white page, as PP-OCR's detector takes it: 3×size×size,
    normalized by ImageNet's mean and std."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for i, text in enumerate(texts):
        font = ImageFont.truetype(FONT, 18 + 4 * (i % 3))
        draw.text((12 + 20 * (i % 2), 16 + i * size // (len(texts) + 1)), text, font=font, fill="black")
    x = np.asarray(image, np.float32).transpose(2, 0, 1) / 255.0
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return ((x - mean[:, None, None]) / std[:, None, None]).astype(np.float32)
