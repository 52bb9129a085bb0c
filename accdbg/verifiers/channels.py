"""Per-channel scores: one loud channel cannot make a tensor look healthy.

A per-tensor score weighs every element by its power. When one channel carries a range many
times the others' (an activation outlier), that channel dominates the sums: the tensor scores a
healthy 40 dB while every other channel was crushed to a few quantization levels. Scoring each
channel alone and summarising them (the median channel, the worst live channel) shows it.

The channel axis comes from the recorded layout (NCHW, NHWC, ...), else from the rank: 4-D
ONNX activations are NCHW, 2-D ones ``[batch, features]``; 3-D tensors are channel-first after
1-D convolutions and ``[batch, sequence, features]`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

CONV_LIKE = {
    "conv",
    "convtranspose",
    "batchnormalization",
    "instancenormalization",
    "maxpool",
    "averagepool",
    "conv_2d",
    "depthwise_conv_2d",
}
LIVE_POWER = 1e-4  # a channel below this share of the median channel's power is "dead"
STATS = ("ch_median", "ch_worst")
MIN_PER_CHANNEL = 4


def channel_axis(
    shape: Sequence[int],
    layout: str | None = None,
    op_type: str | None = None,
    min_per_channel: int = MIN_PER_CHANNEL,
) -> int | None:
    """The channel axis of an activation, or None when it has no meaningful channels (fewer
    than ``min_per_channel`` values each: a channel's score needs a few values of its own)."""
    ndim = len(shape)
    if ndim < 2:
        return None
    if layout:
        lay = layout.upper()
        if len(lay) == ndim and "C" in lay:
            return lay.index("C")
    if ndim == 4 or ndim == 2:
        axis = 1
    elif ndim == 3:
        axis = 1 if (op_type or "").lower() in CONV_LIKE else 2
    else:
        return None
    size = int(np.prod(shape))
    # a channel needs a few values of its own to be scored (not [1, C, 1, 1] or [1, classes])
    return axis if shape[axis] > 1 and size // shape[axis] >= min_per_channel else None


def by_channel(arr: np.ndarray, axis: int) -> np.ndarray:
    """``[channels, everything else]`` as float64 (one copy)."""
    a = np.moveaxis(np.asarray(arr), axis, 0)
    return np.ascontiguousarray(a, dtype=np.float64).reshape(a.shape[0], -1)


def channel_extent(arr: np.ndarray, axis: int) -> np.ndarray:
    """Each channel's largest magnitude along ``axis`` (in the array's own dtype)."""
    a = np.moveaxis(np.abs(np.asarray(arr)), axis, 0)
    return a.reshape(a.shape[0], -1).max(axis=1)


class ChannelPair:
    """Golden and target as ``[channels, elements]``, with the per-channel sums every metric
    shares computed once (views of the flat pair when channels lead, as in NCHW batch 1)."""

    def __init__(self, golden: np.ndarray, target: np.ndarray, diff: np.ndarray | None = None):
        self.golden, self.target = golden, target
        self._diff = diff

    @cached_property
    def diff(self) -> np.ndarray:
        return self._diff if self._diff is not None else self.golden - self.target

    @cached_property
    def gg(self) -> np.ndarray:
        return channel_power(self.golden)

    @cached_property
    def tt(self) -> np.ndarray:
        return channel_power(self.target)

    @cached_property
    def gt(self) -> np.ndarray:
        return np.einsum("ij,ij->i", self.golden, self.target)

    @cached_property
    def dd(self) -> np.ndarray:
        return channel_power(self.diff)

    @classmethod
    def of(cls, golden: np.ndarray, target: np.ndarray, axis: int, diff_flat=None) -> ChannelPair:
        """From arrays of one shape; reuses the flat difference when channels lead."""
        if int(np.prod(golden.shape[:axis])) == 1:  # channel-major: plain reshapes, no copy
            c = golden.shape[axis]
            d = None if diff_flat is None else diff_flat.reshape(c, -1)
            return cls(golden.reshape(c, -1), target.reshape(c, -1), d)
        return cls(by_channel(golden, axis), by_channel(target, axis))


def channel_power(g2: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", g2, g2)


def live(power: np.ndarray) -> np.ndarray:
    """Channels that carry signal: dead ReLU channels and near-silent ones are left out.

    Measured against the *median* channel, never the loudest: with one outlier channel every
    other channel is "silent" next to it, and those are exactly the channels to look at.
    """
    nonzero = power[power > 0]
    if nonzero.size == 0:
        return np.zeros(power.shape, bool)
    return power > LIVE_POWER * float(np.median(nonzero))


def sqnr_db(signal: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """10·log10(signal/noise) element-wise: +inf without noise, -inf without signal (Python
    floats too: numpy's division, not Python's, which raises on 0)."""
    signal, noise = np.asarray(signal), np.asarray(noise)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 10.0 * np.log10(signal / noise)
    out = np.where(noise == 0, np.inf, out)
    return np.where((signal == 0) & (noise > 0), -np.inf, out)


def summarize(values: np.ndarray, alive: np.ndarray, higher_is_better: bool) -> dict[str, float]:
    """Median and worst over the live channels (NaN when none)."""
    v = values[alive & ~np.isnan(values)]
    if v.size == 0:
        return {s: float("nan") for s in STATS}
    worst = float(v.min()) if higher_is_better else float(v.max())
    return {"ch_median": float(np.median(v)), "ch_worst": worst}
