"""Realistic inputs made here, with numpy and PIL only: nothing is downloaded.

Audio: harmonic tones with vibrato, plucked melodies and chords, chirps, speech-like formant
signals, noise. Images: gradients, shapes, text, noise, cartoon faces, street scenes with people.
Text: ordinary English sentences of varied length (so fixed-length padding leaves some positions
masked).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from scipy.signal import lfilter

SENTENCES: tuple[str, ...] = (
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "How do I reset my password if I no longer have access to my email?",
    "Quantized networks trade a little accuracy for a lot of speed on phones.",
    "It rained all night, so the match was moved to Sunday afternoon.",
    "Two dogs are playing in the snow.",
    "Please send the quarterly report to the finance team before Friday noon.",
    "The museum opens at nine and closes at five, except on public holidays.",
    "She plays the violin beautifully.",
    "Which train goes from the airport to the city centre after midnight?",
    "Neural text encoders map sentences to vectors that capture their meaning.",
    "The soup was too salty, but the bread was fresh and warm.",
    "Turn left at the second traffic light and the pharmacy is on your right.",
    "A child is riding a red bicycle down a steep hill while her father watches.",
    "Thanks!",
    "Our flight was delayed by three hours because of a storm over the Alps.",
)

VOWEL_FORMANTS: tuple[tuple[float, float, float], ...] = (
    (730.0, 1090.0, 2440.0),  # a
    (530.0, 1840.0, 2480.0),  # e
    (270.0, 2290.0, 3010.0),  # i
    (570.0, 840.0, 2410.0),  # o
    (300.0, 870.0, 2240.0),  # u
    (660.0, 1720.0, 2410.0),  # ae
)


def sentences(n: int, rng: np.random.Generator) -> list[str]:
    """n sentences, without repeats while the list lasts."""
    order = rng.permutation(len(SENTENCES))
    return [SENTENCES[order[i % len(order)]] for i in range(n)]


# --- audio --------------------------------------------------------------------------------


def _resonator(x: np.ndarray, freq: float, bw: float, sr: int) -> np.ndarray:
    """A two-pole formant filter (the classic cascade formant synthesizer's element)."""
    r = np.exp(-np.pi * bw / sr)
    a = [1.0, -2.0 * r * np.cos(2.0 * np.pi * freq / sr), r * r]
    return lfilter([1.0 - r], a, x)


def speech_like(sr: int, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Voiced syllables (glottal pulses through three formants, f0 contour with jitter), short
    fricative noise bursts and pauses: close enough to speech for a VAD or a speech encoder."""
    n = int(sr * seconds)
    out = np.zeros(n)
    t = 0
    f0_base = rng.uniform(95.0, 230.0)
    while t < n:
        if rng.random() < 0.2:  # pause
            t += int(sr * rng.uniform(0.08, 0.35))
            continue
        length = int(sr * rng.uniform(0.12, 0.32))
        seg_t = np.arange(length) / sr
        f0 = f0_base * (1.0 + 0.08 * np.sin(2 * np.pi * rng.uniform(2, 5) * seg_t))
        f0 *= 1.0 + 0.01 * rng.standard_normal(length).cumsum() / np.sqrt(length)
        phase = np.cumsum(f0 / sr)
        pulses = np.diff(np.floor(phase), prepend=0.0)  # one impulse per glottal period
        src = lfilter([1.0], [1.0, -0.97], pulses)  # glottal roll-off
        formants = VOWEL_FORMANTS[rng.integers(len(VOWEL_FORMANTS))]
        voiced = sum(
            _resonator(src, f * rng.uniform(0.93, 1.07), 60.0 + 40.0 * k, sr) * (0.9**k)
            for k, f in enumerate(formants)
        )
        env = np.sin(np.pi * np.linspace(0.0, 1.0, length)) ** 0.6
        seg = voiced * env
        if rng.random() < 0.35:  # a fricative onset
            m = min(length, int(sr * rng.uniform(0.03, 0.08)))
            seg[:m] += 0.3 * np.std(seg) * _resonator(rng.standard_normal(m), 4500.0, 2500.0, sr)
        end = min(n, t + length)
        out[t:end] += seg[: end - t]
        t = end
    out /= np.max(np.abs(out)) + 1e-9
    out *= rng.uniform(0.3, 0.7)
    out += rng.uniform(0.002, 0.01) * rng.standard_normal(n)  # room noise
    return out.astype(np.float32)


def harmonic_note(
    sr: int, seconds: float, f0: float, rng: np.random.Generator, pluck: bool = True
) -> np.ndarray:
    """A note of a few decaying harmonics, with vibrato; plucked (exponential decay) or bowed."""
    t = np.arange(int(sr * seconds)) / sr
    vib = 1.0 + rng.uniform(0.0, 0.006) * np.sin(2 * np.pi * rng.uniform(4.5, 6.5) * t)
    phase = 2 * np.pi * np.cumsum(f0 * vib) / sr
    note = sum((0.7**k) * np.sin((k + 1) * phase + rng.uniform(0, 6.28)) for k in range(6))
    if pluck:
        env = np.exp(-t * rng.uniform(2.0, 5.0)) * np.minimum(1.0, t / 0.005)
    else:
        env = np.minimum(1.0, t / 0.05) * np.minimum(1.0, (t[-1] - t + 1e-3) / 0.08)
    return note * env


def melody(sr: int, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Notes of a random major or minor key, some as chords, with percussive clicks and noise."""
    n = int(sr * seconds)
    out = np.zeros(n)
    tonic = 48 + int(rng.integers(0, 12))  # MIDI note
    scale = [0, 2, 4, 5, 7, 9, 11] if rng.random() < 0.5 else [0, 2, 3, 5, 7, 8, 10]
    t = 0
    while t < n:
        dur = rng.choice([0.125, 0.25, 0.25, 0.5, 0.75])
        degree = int(rng.integers(0, 7))
        notes = [tonic + 12 * int(rng.integers(0, 2)) + scale[degree]]
        if rng.random() < 0.3:  # a triad
            notes += [tonic + scale[(degree + 2) % 7] + 12, tonic + scale[(degree + 4) % 7] + 12]
        for midi in notes:
            f0 = 440.0 * 2 ** ((midi - 69) / 12)
            seg = harmonic_note(sr, dur * 1.5, f0, rng, pluck=rng.random() < 0.7)
            end = min(n, t + len(seg))
            out[t:end] += seg[: end - t] / len(notes)
        if rng.random() < 0.5:  # a drum-like click
            m = min(n - t, int(0.03 * sr))
            out[t : t + m] += 0.4 * rng.standard_normal(m) * np.exp(-np.arange(m) / (0.005 * sr))
        t += int(dur * sr)
    out /= np.max(np.abs(out)) + 1e-9
    out *= rng.uniform(0.4, 0.8)
    out += rng.uniform(0.001, 0.01) * rng.standard_normal(n)
    return out.astype(np.float32)


def chirp(sr: int, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """A logarithmic sweep with harmonics, over noise (a bird-call or a siren, say)."""
    t = np.arange(int(sr * seconds)) / sr
    f_start, f_end = rng.uniform(200, 900), rng.uniform(1500, 6000)
    freq = f_start * (f_end / f_start) ** (t / t[-1])
    phase = 2 * np.pi * np.cumsum(freq) / sr
    x = np.sin(phase) + 0.3 * np.sin(2 * phase)
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.5, 3.0) * t) ** 2
    x += rng.uniform(0.02, 0.1) * rng.standard_normal(len(t))
    return (0.5 * x / np.max(np.abs(x))).astype(np.float32)


def audio_clip(sr: int, seconds: float, rng: np.random.Generator, kind: str) -> np.ndarray:
    """One clip: ``speech``, ``music``, ``chirp`` or ``mix`` (speech over music and noise)."""
    if kind == "speech":
        return speech_like(sr, seconds, rng)
    if kind == "music":
        return melody(sr, seconds, rng)
    if kind == "chirp":
        return chirp(sr, seconds, rng)
    mixed = speech_like(sr, seconds, rng) + 0.35 * melody(sr, seconds, rng)
    return (mixed / max(1.0, float(np.max(np.abs(mixed))))).astype(np.float32)


def clip_kinds(n: int, kinds: tuple[str, ...]) -> list[str]:
    return [kinds[i % len(kinds)] for i in range(n)]


# --- images -------------------------------------------------------------------------------


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size)


def _gradient(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[0:h, 0:w]
    s = (np.cos(angle) * xx / w + np.sin(angle) * yy / h) / 1.5
    return c0 + (c1 - c0) * np.clip(s, 0, 1)[..., None]


def _finish(img: Image.Image, rng: np.random.Generator) -> np.ndarray:
    """Slight blur and sensor noise, as a camera gives."""
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.0, 0.8)))
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + rng.normal(0.0, rng.uniform(1.0, 6.0), arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def scene(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A gradient, random shapes (some large and salient) and a line of text: HxWx3 uint8."""
    img = Image.fromarray(_gradient(h, w, rng).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 10))):
        x0, y0 = rng.uniform(-0.1, 0.9, 2) * (w, h)
        sw, sh = rng.uniform(0.08, 0.45, 2) * (w, h)
        color = tuple(int(c) for c in rng.uniform(0, 255, 3))
        box = (x0, y0, x0 + sw, y0 + sh)
        shape = rng.integers(3)
        if shape == 0:
            draw.ellipse(box, fill=color)
        elif shape == 1:
            draw.rectangle(box, fill=color, outline=(0, 0, 0), width=int(rng.integers(0, 3)))
        else:
            pts = [(x0 + rng.uniform(0, sw), y0 + rng.uniform(0, sh)) for _ in range(3)]
            draw.polygon(pts, fill=color)
    text = sentences(1, rng)[0][:24]
    draw.text(
        (rng.uniform(0, 0.3) * w, rng.uniform(0.05, 0.85) * h),
        text,
        fill=tuple(int(c) for c in rng.uniform(0, 255, 3)),
        font=_font(max(10, h // 14)),
    )
    return _finish(img, rng)


def _face(draw: ImageDraw.ImageDraw, cx: float, cy: float, r: float, rng: np.random.Generator):
    """A frontal cartoon face: skin oval, hair, eyes with pupils, brows, nose and mouth."""
    skin = tuple(int(c) for c in np.array([224, 172, 140]) * rng.uniform(0.45, 1.1))
    hair = tuple(int(c) for c in rng.uniform(10, 120, 3))
    draw.ellipse((cx - 1.05 * r, cy - 1.35 * r, cx + 1.05 * r, cy + 0.6 * r), fill=hair)
    draw.ellipse((cx - 0.85 * r, cy - 1.1 * r, cx + 0.85 * r, cy + 1.1 * r), fill=skin)
    for side in (-1, 1):
        ex, ey = cx + side * 0.35 * r, cy - 0.2 * r
        draw.ellipse((ex - 0.18 * r, ey - 0.1 * r, ex + 0.18 * r, ey + 0.1 * r), fill="white")
        draw.ellipse(
            (ex - 0.07 * r, ey - 0.07 * r, ex + 0.07 * r, ey + 0.07 * r), fill=(40, 30, 20)
        )
        draw.line((ex - 0.2 * r, ey - 0.25 * r, ex + 0.2 * r, ey - 0.28 * r), fill=hair, width=3)
    shade = tuple(int(c * 0.8) for c in skin)
    draw.polygon([(cx, cy - 0.1 * r), (cx - 0.1 * r, cy + 0.3 * r), (cx + 0.1 * r, cy + 0.3 * r)],
                 fill=shade)  # fmt: skip
    draw.arc((cx - 0.35 * r, cy + 0.25 * r, cx + 0.35 * r, cy + 0.7 * r), 20, 160,
             fill=(150, 40, 50), width=max(2, int(r / 12)))  # fmt: skip


def faces_scene(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """One to four cartoon faces of varied size and skin tone on a cluttered background."""
    img = Image.fromarray(scene(h, w, rng))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 5))):
        r = rng.uniform(0.07, 0.22) * min(h, w)
        cx, cy = rng.uniform(r, w - r), rng.uniform(1.3 * r, h - r)
        _face(draw, cx, cy, r, rng)
    return _finish(img, rng)


def street_scene(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Sky, buildings, a road and a few standing people (head, torso, arms, legs)."""
    img = Image.fromarray(_gradient(h, w, rng).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    horizon = rng.uniform(0.45, 0.65) * h
    x = 0.0
    while x < w:  # buildings
        bw = rng.uniform(0.1, 0.3) * w
        top = horizon - rng.uniform(0.1, 0.4) * h
        color = tuple(int(c) for c in rng.uniform(60, 200, 3))
        draw.rectangle((x, top, x + bw, horizon), fill=color)
        for wy in np.arange(top + 8, horizon - 8, 14):
            for wx in np.arange(x + 6, x + bw - 6, 12):
                draw.rectangle((wx, wy, wx + 5, wy + 7), fill=(230, 230, 180))
        x += bw
    draw.rectangle((0, horizon, w, h), fill=tuple(int(c) for c in rng.uniform(70, 130, 3)))
    for _ in range(int(rng.integers(1, 5))):  # people, nearer ones lower and larger
        foot = rng.uniform(horizon + 0.05 * h, h - 2)
        ph = (foot - horizon + 0.15 * h) * rng.uniform(0.9, 1.6)
        px = rng.uniform(0.05, 0.95) * w
        skin = tuple(int(c) for c in np.array([224, 172, 140]) * rng.uniform(0.45, 1.1))
        shirt = tuple(int(c) for c in rng.uniform(0, 255, 3))
        trousers = tuple(int(c) for c in rng.uniform(0, 120, 3))
        head = ph * 0.13
        top = foot - ph
        draw.ellipse((px - head / 2, top, px + head / 2, top + head), fill=skin)
        draw.rounded_rectangle((px - ph * 0.12, top + head, px + ph * 0.12, top + ph * 0.55),
                               radius=ph * 0.03, fill=shirt)  # fmt: skip
        for side in (-1, 1):
            arm = (px + side * ph * 0.12, top + head * 1.2, px + side * ph * 0.2, top + ph * 0.5)
            draw.line(arm, fill=shirt, width=max(2, int(ph * 0.05)))
            draw.line((px + side * ph * 0.06, top + ph * 0.55, px + side * ph * 0.09, foot),
                      fill=trousers, width=max(2, int(ph * 0.07)))  # fmt: skip
    return _finish(img, rng)
