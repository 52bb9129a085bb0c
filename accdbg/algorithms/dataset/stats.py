"""Per-layer running statistics over a dataset, merged exactly so the order does not matter.

Each input gives, per layer, a *partial*: the count, sum and sum of squares of the error
(target - golden), the golden and target min/max, and a histogram of the golden values on
fixed edges taken from the layer's encoding (so every input bins alike): ``BINS`` bins over
the encoding's range widened by half a step, plus an underflow and an overflow bin - the
values the encoding clips.

Why exact sums: items finish in any order (local workers, Ray), and float additions in a
different order give different last bits. The sums are kept as :class:`fractions.Fraction`
(a float converts exactly), so the merged statistics - and the table written from them - are
the same bytes whichever executor ran the items and in whatever order they came back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import pandas as pd

BINS = 16
HIST_WIDTH = BINS + 2  # underflow, BINS bins, overflow
# one partial row: count, sum, sum of squares, golden min/max, target min/max
P_COUNT, P_SUM, P_SQ, P_GMIN, P_GMAX, P_TMIN, P_TMAX = range(7)
PARTIAL_WIDTH = 7


def encoding_edges(scale: float | None, zero_point: int | None, native_dtype: str | None):
    """The ``BINS + 1`` inner edges of a layer's histogram: the encoding's representable range
    widened by half a step (what rounds into it); None for a layer that is not quantized."""
    if scale is None or native_dtype is None:
        return None
    info = np.iinfo(np.dtype(native_dtype))
    zp = int(zero_point or 0)
    lo = (info.min - zp) * float(scale) - float(scale) / 2
    hi = (info.max - zp) * float(scale) + float(scale) / 2
    return np.linspace(lo, hi, BINS + 1)


def partial(golden: np.ndarray, target: np.ndarray, edges: np.ndarray | None):
    """One input's partial of one layer: a float row (``PARTIAL_WIDTH``) and the histogram
    counts (``HIST_WIDTH``, all -1 without edges). Non-finite positions are left out."""
    g = np.asarray(golden, dtype=np.float64).ravel()
    t = np.asarray(target, dtype=np.float64).ravel()
    row = np.full(PARTIAL_WIDTH, np.nan)
    hist = np.full(HIST_WIDTH, -1, dtype=np.int64)
    if g.size != t.size or g.size == 0:
        row[P_COUNT] = 0
        return row, hist
    ok = np.isfinite(g) & np.isfinite(t)
    if not ok.all():
        g, t = g[ok], t[ok]
    row[P_COUNT] = g.size
    if g.size:
        err = t - g
        row[P_SUM] = float(err.sum())
        row[P_SQ] = float(np.einsum("i,i->", err, err))
        row[P_GMIN], row[P_GMAX] = float(g.min()), float(g.max())
        row[P_TMIN], row[P_TMAX] = float(t.min()), float(t.max())
    if edges is not None:
        # uniform edges: a bin index by arithmetic (searchsorted costs 10x more on big
        # tensors); 0 is below the first edge (clipped low), HIST_WIDTH - 1 above the last
        width = (edges[-1] - edges[0]) / BINS
        idx = np.floor((g - edges[0]) / width).astype(np.int64) + 1
        np.clip(idx, 0, HIST_WIDTH - 1, out=idx)
        hist = np.bincount(idx, minlength=HIST_WIDTH).astype(np.int64)
    return row, hist


@dataclass
class LayerAccumulator:
    """The running statistics of one layer: exact sums, extremes, histogram."""

    count: int = 0
    err_sum: Fraction = field(default_factory=Fraction)
    err_sq: Fraction = field(default_factory=Fraction)
    g_min: float = math.inf
    g_max: float = -math.inf
    t_min: float = math.inf
    t_max: float = -math.inf
    hist: np.ndarray | None = None
    inputs: int = 0

    def add(self, row: Sequence[float], hist: Sequence[int]) -> None:
        n = int(row[P_COUNT]) if math.isfinite(row[P_COUNT]) else 0
        if n <= 0:
            return
        self.inputs += 1
        self.count += n
        self.err_sum += Fraction(float(row[P_SUM]))
        self.err_sq += Fraction(float(row[P_SQ]))
        self.g_min = min(self.g_min, float(row[P_GMIN]))
        self.g_max = max(self.g_max, float(row[P_GMAX]))
        self.t_min = min(self.t_min, float(row[P_TMIN]))
        self.t_max = max(self.t_max, float(row[P_TMAX]))
        h = np.asarray(hist, dtype=np.int64)
        if h.size == HIST_WIDTH and h[0] >= 0:
            self.hist = h.copy() if self.hist is None else self.hist + h

    def summary(self) -> dict[str, float]:
        if not self.count:
            return {"inputs": 0}
        mean = self.err_sum / self.count
        var = self.err_sq / self.count - mean * mean
        out = {
            "inputs": self.inputs,
            "elements": self.count,
            "error_mean": float(mean),
            "error_std": math.sqrt(max(float(var), 0.0)),
            "error_rms": math.sqrt(float(self.err_sq / self.count)),
            "golden_min": self.g_min,
            "golden_max": self.g_max,
            "target_min": self.t_min,
            "target_max": self.t_max,
        }
        if self.hist is not None:
            total = int(self.hist.sum())
            out["clipped_low_%"] = 100.0 * int(self.hist[0]) / total if total else math.nan
            out["clipped_high_%"] = 100.0 * int(self.hist[-1]) / total if total else math.nan
            out["clipped_%"] = out["clipped_low_%"] + out["clipped_high_%"]
            out["histogram"] = " ".join(str(int(c)) for c in self.hist)
        return out


class RunningStats:
    """Every layer's accumulator; items are added as they finish, in any order."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.layers = [LayerAccumulator() for _ in self.names]

    def add(self, partials: np.ndarray, hists: np.ndarray) -> None:
        for acc, row, hist in zip(self.layers, partials, hists, strict=True):
            acc.add(row, hist)

    def table(self, edges: Sequence[np.ndarray | None]) -> pd.DataFrame:
        rows = []
        for order, (name, acc, e) in enumerate(zip(self.names, self.layers, edges, strict=True)):
            row = {"Name": name, "Order": order, **acc.summary()}
            if e is not None:
                row["histogram_low"], row["histogram_high"] = float(e[0]), float(e[-1])
            rows.append(row)
        return pd.DataFrame(rows)
