"""The four pictures of a tensor pair, drawn fast enough to run on every layer of a model.

Building a matplotlib figure (axes, ticks, fonts) costs far more than drawing it, so a
:class:`Plotter` builds each of its four figures once and, per tensor, only swaps the data,
the limits and the texts before saving. Figures are plain :class:`~matplotlib.figure.Figure`
objects on the Agg canvas: no pyplot, no global backend switch, nothing left open. Texts
never parse ``$...$`` as math, because tensor names are not ours. Callers pass samples
(see :mod:`accdbg.inspection.inspect`), never whole tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

HISTOGRAM_BINS = 100
CDF_BINS = 512
KDE_GRID = 512
DPI = 80
SIZE = (8.0, 4.5)
GOLDEN, TARGET, CALIBRATED = "tab:blue", "tab:orange", "tab:red"
PNG_OPTIONS = {"compress_level": 1}
# FreeType's auto-hinter (matplotlib's default) costs a third of the drawing time; unhinted
# glyphs look the same at this size. Set only while drawing, so users' settings are untouched.
RC = {"text.hinting": "no_hinting"}  # fast zlib level: twice the bytes, a third of the time
TITLE_CHARS = 90
PIXEL_MARKERS_FROM = 5_000  # beyond this many points a dot per pixel reads as well and draws 3x faster


def short(name: str) -> str:
    """A tensor name fit for a title: one line, at most ``TITLE_CHARS`` characters."""
    text = " ".join(str(name).split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"


def span(lo: float, hi: float) -> tuple[float, float]:
    """Axis limits around ``[lo, hi]`` with a margin; a single value gets a visible width."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return -1.0, 1.0
    if hi <= lo:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.03
    return lo - pad, hi + pad


def gaussian_kde(values: np.ndarray, lo: float, hi: float, grid: int = KDE_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Density of ``values`` on ``grid`` points spanning ``[lo, hi]``: a binned Gaussian KDE.

    The sample is binned on the grid and the counts are convolved with a Gaussian of Scott's
    bandwidth (``std * n**-0.2``), which is linear in the sample size instead of quadratic.
    A constant sample (zero bandwidth) gives a spike one grid step wide.
    """
    x = np.linspace(lo, hi, grid)
    step = x[1] - x[0]
    counts, _ = np.histogram(values, bins=grid, range=(lo - step / 2, hi + step / 2))
    bandwidth = float(np.std(values)) * values.size ** -0.2 if values.size > 1 else 0.0
    sigma = bandwidth / step
    if sigma >= 0.5:
        half = int(math.ceil(4 * sigma))
        offsets = np.arange(-half, half + 1)
        kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
        counts = np.convolve(counts, kernel / kernel.sum())[half : half + grid]
    return x, counts / (values.size * step)


def _figure(ncols: int = 1, grid: bool = False) -> tuple[Figure, list]:
    fig = Figure(figsize=SIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, ncols, squeeze=False)[0])
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.yaxis.set_major_locator(MaxNLocator(5))
        if grid:
            ax.grid(True, alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.86, bottom=0.13, wspace=0.3)
    return fig, axes


class Plotter:
    """Four reusable figures; each method draws one tensor's plot into ``path``."""

    def __init__(self) -> None:
        self._hist_fig, (ax,) = _figure()
        self._hist_ax = ax
        edges = np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1)
        zeros = np.zeros(HISTOGRAM_BINS)
        self._hist_golden = ax.stairs(zeros, edges, fill=True, alpha=0.45, color=GOLDEN, label="golden")
        self._hist_target = ax.stairs(zeros, edges, color=TARGET, linewidth=1.5, label="target")
        ax.set_xlabel("value")
        ax.set_ylabel("count")
        ax.legend(loc="upper right")
        self._hist_title = self._title(self._hist_fig)

        self._diff_fig, (a1, a2) = _figure(2)
        (self._diff_points,) = a1.plot([], [], ".", markersize=2, color=TARGET)
        (self._diff_identity,) = a1.plot([], [], "--", color="black", linewidth=1, label="target = golden")
        a1.set_xlabel("golden")
        a1.set_ylabel("target")
        a1.legend(loc="upper left")
        (self._diff_error,) = a2.plot([], [], ".", markersize=2, color=CALIBRATED)
        a2.axhline(0.0, color="black", linewidth=1)
        a2.set_xlabel("element index (C order)")
        a2.set_ylabel("target - golden")
        self._diff_axes = (a1, a2)
        self._diff_title = self._title(self._diff_fig)

        self._cdf_fig, (ax,) = _figure(grid=True)
        (self._cdf_golden,) = ax.plot([], [], drawstyle="steps-post", color=GOLDEN, linewidth=2, label="golden")
        (self._cdf_target,) = ax.plot([], [], drawstyle="steps-post", color=TARGET, linewidth=1.5, label="target")
        ax.set_xlabel("value")
        ax.set_ylabel("fraction of values <= x")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(loc="lower right")
        self._cdf_ax = ax
        self._cdf_title = self._title(self._cdf_fig)

        self._dist_fig, (ax,) = _figure()
        (self._dist_kde,) = ax.plot([], [], color=TARGET, linewidth=1.5)
        self._dist_lines = [
            ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5),
            ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5),
            ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5),
            ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5),
        ]
        ax.set_xlabel("value")
        ax.set_ylabel("density")
        self._dist_legend = ax.legend(
            [self._dist_kde, self._dist_lines[0], self._dist_lines[2]],
            ["target density", "target min/max", "calibrated min/max"], loc="upper right",
        )
        self._dist_ax = ax
        self._dist_title = self._title(self._dist_fig)

    @staticmethod
    def _title(fig: Figure):
        return fig.text(0.5, 0.985, "", ha="center", va="top", fontsize=10, parse_math=False)

    @staticmethod
    def _set_title(title, main: str, note: str) -> None:
        title.set_text(f"{short(main)}\n{note}")

    @staticmethod
    def _save(fig: Figure, path: Path) -> None:
        """Draw and write an RGB PNG (no alpha channel: a quarter fewer bytes to compress)."""
        canvas = fig.canvas
        with rc_context(RC):
            canvas.draw()
        width, height = canvas.get_width_height()
        image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        image.convert("RGB").save(path, format="png", **PNG_OPTIONS)

    def histograms(self, path: Path, golden: np.ndarray, target: np.ndarray, name: str, note: str) -> None:
        """Golden (filled) and target (outline) histograms on shared bins."""
        lo = min(float(golden.min()), float(target.min()))
        hi = max(float(golden.max()), float(target.max()))
        lo, hi = span(lo, hi)
        edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1)
        g, _ = np.histogram(golden, edges)
        t, _ = np.histogram(target, edges)
        self._hist_golden.set_data(g, edges)
        self._hist_target.set_data(t, edges)
        self._hist_ax.set_xlim(lo, hi)
        self._hist_ax.set_ylim(0, max(int(g.max()), int(t.max()), 1) * 1.08)
        self._set_title(self._hist_title, f"Histograms: {name}", note)
        self._save(self._hist_fig, path)

    def diff(self, path: Path, golden: np.ndarray, target: np.ndarray, index: np.ndarray, name: str, note: str) -> None:
        """Target against golden (points on the dashed line agree), and the error by element."""
        a1, a2 = self._diff_axes
        marker, size = (",", 1.0) if golden.size > PIXEL_MARKERS_FROM else (".", 3.0)
        for line in (self._diff_points, self._diff_error):
            line.set_marker(marker)
            line.set_markersize(size)
        self._diff_points.set_data(golden, target)
        lo = min(float(golden.min()), float(target.min()))
        hi = max(float(golden.max()), float(target.max()))
        self._diff_identity.set_data([lo, hi], [lo, hi])
        lo, hi = span(lo, hi)
        a1.set_xlim(lo, hi)
        a1.set_ylim(lo, hi)
        error = target - golden
        self._diff_error.set_data(index, error)
        a2.set_xlim(*span(float(index[0]), float(index[-1])))
        a2.set_ylim(*span(min(float(error.min()), 0.0), max(float(error.max()), 0.0)))
        self._set_title(self._diff_title, f"Diff: {name}", note)
        self._save(self._diff_fig, path)

    def cdf(self, path: Path, golden: np.ndarray, target: np.ndarray, name: str, note: str) -> None:
        """Empirical CDFs on a shared grid: a gap between the curves is a shift in values."""
        lo = min(float(golden.min()), float(target.min()))
        hi = max(float(golden.max()), float(target.max()))
        lo, hi = span(lo, hi)
        edges = np.linspace(lo, hi, CDF_BINS + 1)
        for line, values in ((self._cdf_golden, golden), (self._cdf_target, target)):
            counts, _ = np.histogram(values, edges)
            line.set_data(edges, np.concatenate([[0.0], np.cumsum(counts) / values.size]))
        self._cdf_ax.set_xlim(lo, hi)
        self._set_title(self._cdf_title, f"CDF: {name}", note)
        self._save(self._cdf_fig, path)

    def distribution(
        self,
        path: Path,
        target: np.ndarray,
        target_range: tuple[float, float],
        calibrated: tuple[float, float],
        name: str,
        note: str,
    ) -> None:
        """Target density with its own min/max (solid) and the calibrated min/max (dashed)."""
        values = (*target_range, *calibrated)
        lo, hi = span(min(values + (float(target.min()),)), max(values + (float(target.max()),)))
        x, density = gaussian_kde(target, lo, hi)
        self._dist_kde.set_data(x, density)
        for line, v in zip(self._dist_lines, values, strict=True):
            line.set_xdata([v, v])
        texts = self._dist_legend.get_texts()
        texts[1].set_text(f"target min/max [{values[0]:.5g}, {values[1]:.5g}]")
        texts[2].set_text(f"calibrated min/max [{values[2]:.5g}, {values[3]:.5g}]")
        self._dist_ax.set_xlim(lo, hi)
        self._dist_ax.set_ylim(0, max(float(density.max()), 1e-12) * 1.08)
        self._set_title(self._dist_title, f"Distribution: {name}", f"density (Gaussian KDE) of {note}")
        self._save(self._dist_fig, path)
