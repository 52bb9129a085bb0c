"""Streaming statistics of one tensor, and the error one grid puts on it.

Activations arrive one input (and one batch of tensors) at a time, so everything here is a
running sum that a chunk updates: :class:`Moments` (min, max, mean, standard deviation,
skewness, excess kurtosis, outliers, per-channel ranges and a random sample for the plots) and
:class:`ErrorSums` (signal and noise power, per channel too, the largest round-trip difference,
clipping). A weight is one chunk: its figures are exact.
"""

from __future__ import annotations

import math

import numpy as np

from accdbg.algorithms.quant_checker.grid import Grid
from accdbg.verifiers.channels import live, sqnr_db

OUTLIER_SIGMAS = 6.0  # a value further than this many standard deviations from the mean


def _by_channel(x: np.ndarray, axis: int | None) -> np.ndarray | None:
    """``[channels, rest]`` view/copy of ``x``, or None without a channel axis."""
    if axis is None or x.ndim < 2:
        return None
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


class Moments:
    """Distribution of a tensor's values over every chunk seen.

    Power sums are taken around the first chunk's mean (a shift that keeps them from
    cancelling), so the central moments stay exact enough for skewness and kurtosis.
    Outliers are counted per chunk against that chunk's own mean and standard deviation
    (exact for a weight; per input for an activation).
    """

    def __init__(self, sample_size: int, rng: np.random.Generator):
        self.n = 0
        self.shift = 0.0
        self.s = np.zeros(4)
        self.min, self.max = math.inf, -math.inf
        self.outliers = 0
        self.nonfinite = 0
        self.ch_min: np.ndarray | None = None
        self.ch_max: np.ndarray | None = None
        self.abs_peak = 0.0
        self.in_ranges: np.ndarray | None = None  # a weight's input channels
        self._summary: tuple[int, dict[str, float]] | None = None
        self.sample_size = sample_size
        self.samples: list[np.ndarray] = []
        self._rng = rng

    def update(
        self, x: np.ndarray, ch_axis: int | None, chunks: int = 1, in_axis: int | None = None
    ) -> None:
        """Add one chunk (float64, tensor shape); ``chunks`` = how many chunks will come
        in all, so each contributes its share of the sample."""
        flat = x.reshape(-1)
        finite = np.isfinite(flat)
        if not finite.all():
            self.nonfinite += int(flat.size - np.count_nonzero(finite))
            flat = flat[finite]
        if flat.size == 0:
            return
        if self.n == 0:
            self.shift = float(flat.mean())
        d = flat - self.shift
        d2 = d * d
        self.s += (float(d.sum()), float(d2.sum()), float((d2 * d).sum()), float((d2 * d2).sum()))
        self.n += flat.size
        self.min = min(self.min, float(flat.min()))
        self.max = max(self.max, float(flat.max()))
        self.abs_peak = max(self.abs_peak, float(np.abs(flat).max()))
        mu, sd = float(flat.mean()), float(flat.std())
        if sd > 0:
            self.outliers += int(np.count_nonzero(np.abs(flat - mu) > OUTLIER_SIGMAS * sd))
        rows = _by_channel(x, ch_axis)
        if rows is not None and finite.all():
            lo, hi = rows.min(axis=1), rows.max(axis=1)
            self.ch_min = lo if self.ch_min is None else np.minimum(self.ch_min, lo)
            self.ch_max = hi if self.ch_max is None else np.maximum(self.ch_max, hi)
        rows = _by_channel(x, in_axis)
        if rows is not None and finite.all():  # a weight: one chunk
            self.in_ranges = rows.max(axis=1) - rows.min(axis=1)
        k = max(1, self.sample_size // max(1, chunks))
        if flat.size > k:
            flat = flat[np.sort(self._rng.choice(flat.size, size=k, replace=False))]
        self.samples.append(flat.astype(np.float32))

    @property
    def sample(self) -> np.ndarray:
        return np.concatenate(self.samples) if self.samples else np.zeros(0, np.float32)

    def central(self) -> tuple[float, float, float, float]:
        """mean, variance, third and fourth central moments."""
        if self.n == 0:
            return (math.nan,) * 4
        m1, m2, m3, m4 = (s / self.n for s in self.s)
        var = m2 - m1 * m1
        c3 = m3 - 3 * m1 * m2 + 2 * m1**3
        c4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1**4
        return self.shift + m1, max(var, 0.0), c3, c4

    def summary(self) -> dict[str, float]:
        """The statistics (computed once, after the last chunk: the tables ask per variant)."""
        if self._summary is None or self._summary[0] != self.n:
            self._summary = (self.n, self._compute())
        return dict(self._summary[1])

    def _compute(self) -> dict[str, float]:
        mean, var, c3, c4 = self.central()
        std = math.sqrt(var) if var == var else math.nan
        tiny = var <= 0 or var != var
        sample = self.sample
        p999 = float(np.quantile(np.abs(sample), 0.999)) if sample.size else math.nan
        return {
            "min": self.min if self.n else math.nan,
            "max": self.max if self.n else math.nan,
            "mean": mean,
            "std": std,
            "skew": math.nan if tiny else c3 / var**1.5,
            "kurtosis": math.nan if tiny else c4 / var**2 - 3.0,
            "outlier_%": 100.0 * self.outliers / self.n if self.n else math.nan,
            "peak_over_p99.9": self.abs_peak / p999 if p999 > 0 else math.nan,
            "channel_range_ratio": self.channel_range_ratio(),
            "input_channel_range_ratio": self.channel_range_ratio(inputs=True),
        }

    def channel_range_ratio(self, inputs: bool = False) -> float:
        """The widest (output, or input) channel's range over the median live channel's
        (1 = balanced)."""
        ranges = (
            self.in_ranges
            if inputs
            else (None if self.ch_min is None else self.ch_max - self.ch_min)
        )
        if ranges is None:
            return math.nan
        alive = live(ranges * ranges)
        if not alive.any():
            return math.nan
        med = float(np.median(ranges[alive]))
        return float(ranges.max()) / med if med > 0 else math.nan

    def widest_channel(self, inputs: bool = False) -> int | None:
        if inputs:
            return None if self.in_ranges is None else int(np.argmax(self.in_ranges))
        if self.ch_min is None:
            return None
        return int(np.argmax(self.ch_max - self.ch_min))


class ErrorSums:
    """What one grid does to a tensor: the round-trip error, summed over chunks."""

    def __init__(self, grid: Grid):
        self.grid = grid
        self.n = 0
        self.signal = 0.0
        self.noise = 0.0
        self.max_diff = 0.0
        self.max_steps = 0.0
        self.clipped = 0
        self.ch_signal: np.ndarray | None = None
        self.ch_noise: np.ndarray | None = None
        self.in_signal: np.ndarray | None = None  # per input channel (weights)
        self.in_noise: np.ndarray | None = None

    def update(self, x: np.ndarray, ch_axis: int | None, in_axis: int | None = None) -> None:
        g = self.grid
        if not np.isfinite(x).all():
            x = np.where(np.isfinite(x), x, 0.0)
        d = x - g.qdq(x)
        ad = np.abs(d)
        self.n += x.size
        self.signal += float(np.einsum("i,i->", x.reshape(-1), x.reshape(-1)))
        self.noise += float(np.einsum("i,i->", d.reshape(-1), d.reshape(-1)))
        self.max_diff = max(self.max_diff, float(ad.max()) if ad.size else 0.0)
        steps = ad / g.scale
        self.max_steps = max(self.max_steps, float(steps.max()) if steps.size else 0.0)
        half = 0.5 * g.scale
        self.clipped += int(np.count_nonzero((x < g.lo - half) | (x > g.hi + half)))
        axis = g.axis if g.axis is not None else ch_axis
        rows_x, rows_d = _by_channel(x, axis), _by_channel(d, axis)
        if rows_x is not None:
            sx = np.einsum("ij,ij->i", rows_x, rows_x)
            sd = np.einsum("ij,ij->i", rows_d, rows_d)
            if self.ch_signal is None:
                self.ch_signal, self.ch_noise = sx, sd
            else:
                self.ch_signal, self.ch_noise = self.ch_signal + sx, self.ch_noise + sd
        rows_x, rows_d = _by_channel(x, in_axis), _by_channel(d, in_axis)
        if rows_x is not None:
            self.in_signal = np.einsum("ij,ij->i", rows_x, rows_x)
            self.in_noise = np.einsum("ij,ij->i", rows_d, rows_d)

    def channel_sqnr(self, inputs: bool = False) -> np.ndarray | None:
        """Each (output, or with ``inputs`` input) channel's SQNR in dB (NaN for dead ones)."""
        signal, noise = (
            (self.in_signal, self.in_noise) if inputs else (self.ch_signal, self.ch_noise)
        )
        if signal is None:
            return None
        alive = live(signal)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = 10.0 * np.log10(signal / noise)
        out = np.where(noise == 0, np.inf, out)
        return np.where(alive, out, np.nan)

    def summary(self) -> dict[str, float]:
        sqnr = float(sqnr_db(self.signal, self.noise))
        ch = self.channel_sqnr()
        vals = ch[~np.isnan(ch)] if ch is not None else np.zeros(0)
        med = float(np.median(vals)) if vals.size else math.nan
        worst = float(vals.min()) if vals.size else math.nan
        ins = self.channel_sqnr(inputs=True)
        ins = ins[~np.isnan(ins)] if ins is not None else np.zeros(0)
        return {
            "SQNR": sqnr,
            "SQNR ch_median": med,
            "SQNR ch_worst": worst,
            "SQNR in_median": float(np.median(ins)) if ins.size else math.nan,
            "max_abs_diff": self.max_diff,
            "max_abs_diff_steps": self.max_steps,
            "clipped_%": 100.0 * self.clipped / self.n if self.n else math.nan,
        }
