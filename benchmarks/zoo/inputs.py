"""Deterministic, realistic inputs rendered locally (no downloads).

OCR models get dark text on paper-like backgrounds (so the detector's map is not all zero and
the recognizer sees glyphs); the face models get a skin-toned oval with eyes and a mouth on a
smooth background. Images are normalised as the packages do: ``(pixel / 255 - 0.5) / 0.5``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

WORDS = (
    "invoice total 42.50 EUR",
    "ACCURACY DEBUGGER",
    "Qualcomm NPU layer 17",
    "hello world 2024",
    "receipt no. 008-731",
    "quantization error",
    "the quick brown fox",
    "PP-OCRv4 text line",
)


def _font(size: int) -> ImageFont.ImageFont:
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    return ImageFont.truetype(str(path), size)


def _paper(h: int, w: int, rng: np.random.Generator) -> Image.Image:
    """Off-white paper with a gentle illumination gradient and fibre noise."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    tone = rng.uniform(200, 240)
    tint = rng.uniform(-12, 12, size=3)
    light = 18 * (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1))
    img = tone + light[..., None] + tint + rng.normal(0, 4, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _ink(rng: np.random.Generator) -> tuple[int, int, int]:
    base = int(rng.integers(10, 70))
    return tuple(int(np.clip(base + rng.integers(-15, 15), 0, 255)) for _ in range(3))


def page(h: int, w: int, seed: int) -> np.ndarray:
    """A page with a few lines of text at several sizes (text detection input), HxWx3 uint8."""
    rng = np.random.default_rng(seed)
    img = _paper(h, w, rng)
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(2, max(3, h // 12)))
    while y < h - 12:
        size = int(rng.integers(max(10, h // 22), max(12, h // 9)))
        text = WORDS[int(rng.integers(len(WORDS)))]
        x = int(rng.integers(2, max(3, w // 6)))
        draw.text((x, y), text, fill=_ink(rng), font=_font(size))
        y += int(size * rng.uniform(1.4, 2.2))
    return np.asarray(img.filter(ImageFilter.GaussianBlur(0.6)))


def text_line(h: int, w: int, seed: int) -> np.ndarray:
    """One cropped text line filling the height, left aligned (recognizer / classifier input)."""
    rng = np.random.default_rng(seed)
    img = _paper(h, w, rng)
    draw = ImageDraw.Draw(img)
    text = WORDS[int(rng.integers(len(WORDS)))]
    size = int(h * rng.uniform(0.55, 0.75))
    font = _font(size)
    while font.getlength(text) > w - 4 and len(text) > 4:
        text = text[:-1]
    draw.text((int(rng.integers(1, 6)), (h - size) // 2 - 2), text, fill=_ink(rng), font=font)
    arr = np.asarray(img.filter(ImageFilter.GaussianBlur(0.5)))
    if seed % 2:  # an upside-down line: the classifier's second class
        arr = arr[::-1, ::-1]
    return arr


def face(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth background with a skin-toned face oval, eyes, brows and a mouth, HxWx3 uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    bg = np.stack(
        [
            rng.uniform(40, 200) + 50 * np.sin(3 * xx + rng.uniform(0, 6)),
            rng.uniform(40, 200) + 50 * np.cos(2 * yy + rng.uniform(0, 6)),
            rng.uniform(40, 200) + 40 * np.sin(2 * (xx + yy)),
        ],
        axis=-1,
    )
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    cx, cy = w * rng.uniform(0.4, 0.6), h * rng.uniform(0.42, 0.58)
    fw, fh = w * rng.uniform(0.28, 0.4), h * rng.uniform(0.36, 0.5)
    skin = (int(rng.uniform(150, 235)), int(rng.uniform(110, 180)), int(rng.uniform(80, 150)))
    draw.ellipse([cx - fw / 2, cy - fh / 2, cx + fw / 2, cy + fh / 2], fill=skin)
    dark = (40, 30, 30)
    for side in (-1, 1):
        ex, ey = cx + side * fw * 0.2, cy - fh * 0.1
        r = fw * 0.07
        draw.ellipse([ex - r, ey - r * 0.6, ex + r, ey + r * 0.6], fill=(245, 245, 245))
        draw.ellipse([ex - r * 0.45, ey - r * 0.45, ex + r * 0.45, ey + r * 0.45], fill=dark)
        draw.line([ex - r * 1.2, ey - r * 1.6, ex + r * 1.2, ey - r * 1.9], fill=dark, width=2)
    draw.line([cx, cy - fh * 0.02, cx - fw * 0.04, cy + fh * 0.12], fill=(150, 90, 80), width=2)
    draw.chord(
        [cx - fw * 0.18, cy + fh * 0.14, cx + fw * 0.18, cy + fh * 0.3], 0, 180, fill=(150, 50, 60)
    )
    return np.asarray(img.filter(ImageFilter.GaussianBlur(1.0)))


RENDERERS = {"page": page, "text_line": text_line, "face": face}


def normalise(img: np.ndarray, layout: str) -> np.ndarray:
    """uint8 HxWx3 -> float32 batch of one in [-1, 1], NCHW or NHWC."""
    x = (img.astype(np.float32) / 255.0 - 0.5) / 0.5
    x = x[None]
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if layout == "NCHW" else x)


def write_inputs(
    kind: str, dims: tuple[int, ...], layout: str, out_dir: Path, count: int, seed: int
) -> list[Path]:
    """``count`` .raw float32 files of one model input, rendered with ``RENDERERS[kind]``."""
    h, w = (dims[2], dims[3]) if layout == "NCHW" else (dims[1], dims[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        x = normalise(RENDERERS[kind](h, w, seed + i), layout)
        assert x.shape == tuple(dims), (x.shape, dims)
        p = out_dir / f"input_{i}.raw"
        x.astype(np.float32).tofile(p)
        paths.append(p)
    return paths
