"""Deterministic, image-like test inputs (no download): printed text on paper for OCR models."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CHARS = list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 abcdefghijk")


def text_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """1x3xHxW float32 in [-1, 1] (PaddleOCR's normalisation): dark text lines on a light page."""
    rng = np.random.default_rng(seed)
    paper = tuple(int(v) for v in rng.integers(200, 256, 3))
    img = Image.new("RGB", (width, height), paper)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    step = max(12, height // 6)
    for y in range(2, height - 10, step):
        text = "".join(rng.choice(CHARS, max(4, width // 8)))
        ink = tuple(int(v) for v in rng.integers(0, 80, 3))
        draw.text((int(rng.integers(1, max(2, width // 10))), y), text, fill=ink, font=font)
    a = np.asarray(img, np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])
