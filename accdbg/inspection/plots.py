"""The four pictures of a tensor pair, drawn fast enough to run on every layer of a model.

Building a matplotlib figure (axes, ticks, fonts) costs more than drawing it, so a
:class:`Plotter` builds each of its four figures once and, per tensor, only swaps the data,
the limits and the texts before saving. Figures are plain :class:`~matplotlib.figure.Figure`
objects on the Agg canvas: no pyplot, no global backend switch, nothing left open. Texts
never parse ``$...$`` as math, because tensor names are not ours. Callers pass samples
(see :mod:`accdbg.inspection.inspect`), never whole tensors.

Text is most of the drawing time, so the figures carry little of it: colored captions
instead of legend boxes, axis labels at fixed offsets (matplotlib otherwise measures every
tick label twice to place them), at most five ticks per axis, and no font hinting.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import ScaledTranslation
from PIL import Image

HISTOGRAM_BINS = 100
CDF_BINS = 512
KDE_GRID = 512
DPI = 80
SIZE = (8.0, 4.5)
GOLDEN, TARGET, ERROR, CALIBRATED = "tab:blue", "tab:orange", "tab:red", "tab:red"
PNG_OPTIONS = {"compress_level": 1}  # fast zlib level: a third of the time for a few more bytes
# FreeType's auto-hinter (matplotlib's default) costs a third of the drawing time and makes no
# visible difference at this size. Set only while drawing: users' settings stay untouched.
RC = {"text.hinting": "no_hinting"}
TITLE_CHARS = 90
PIXEL_MARKERS_FROM = (
    5_000  # beyond this many points, one pixel per point reads as well and draws faster
)


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


def gaussian_kde(
    values: np.ndarray, lo: float, hi: float, grid: int = KDE_GRID
) -> tuple[np.ndarray, np.ndarray]:
    """Density of ``values`` on ``grid`` points spanning ``[lo, hi]``: a binned Gaussian KDE.

    The sample is binned on the grid and the counts are convolved with a Gaussian of Scott's
    bandwidth (``std * n**-0.2``), which is linear in the sample size instead of quadratic.
    A constant sample (zero bandwidth) gives a spike one grid step wide.
    """
    x = np.linspace(lo, hi, grid)
    step = x[1] - x[0]
    counts, _ = np.histogram(values, bins=grid, range=(lo - step / 2, hi + step / 2))
    bandwidth = float(np.std(values)) * values.size**-0.2 if values.size > 1 else 0.0
    sigma = bandwidth / step
    if sigma >= 0.5:
        half = int(math.ceil(4 * sigma))
        offsets = np.arange(-half, half + 1)
        kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
        counts = np.convolve(counts, kernel / kernel.sum())[half : half + grid]
    return x, counts / (values.size * step)


class _Panel:
    """One figure: its axes, a two-line title (tensor name, sampling note), and a save."""

    def __init__(self, ncols: int = 1, grid: bool = False):
        self.fig = Figure(figsize=SIZE, dpi=DPI)
        FigureCanvasAgg(self.fig)
        self.axes = list(self.fig.subplots(1, ncols, squeeze=False)[0])
        self.fig.subplots_adjust(left=0.1, right=0.97, top=0.86, bottom=0.13, wspace=0.3)
        for ax in self.axes:
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.yaxis.set_major_locator(MaxNLocator(4))
            ax.tick_params(labelsize=9)
            if grid:
                ax.grid(True, alpha=0.3)
        self.title = self.fig.text(
            0.5, 0.985, "", ha="center", va="top", fontsize=10, parse_math=False
        )

    def labels(self, ax, xlabel: str, ylabel: str) -> None:
        """Axis labels at fixed offsets from the axes (in points), clear of 6-digit tick labels."""
        ax.set_xlabel(xlabel, parse_math=False)
        ax.set_ylabel(ylabel, parse_math=False)
        ax.xaxis.set_label_coords(
            0.5, 0.0, ax.transAxes + ScaledTranslation(0, -24 / 72, self.fig.dpi_scale_trans)
        )
        ax.yaxis.set_label_coords(
            0.0, 0.5, ax.transAxes + ScaledTranslation(-40 / 72, 0, self.fig.dpi_scale_trans)
        )

    @staticmethod
    def caption(ax, lines: list[tuple[str, str]], corner: str = "upper right") -> list[Text]:
        """Colored words in a corner of the axes, one per line: a legend without the box."""
        top = corner.startswith("upper")
        right = corner.endswith("right")
        out = []
        for i, (text, color) in enumerate(lines):
            y = 0.96 - 0.075 * i if top else 0.04 + 0.075 * (len(lines) - 1 - i)
            out.append(
                ax.text(
                    0.98 if right else 0.02,
                    y,
                    text,
                    color=color,
                    transform=ax.transAxes,
                    ha="right" if right else "left",
                    va="top" if top else "bottom",
                    fontsize=10,
                    parse_math=False,
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1},
                )
            )
        return out

    def save(self, path: Path, name: str, note: str) -> None:
        """Set the title, draw, and write a 256-color PNG: a plot has few colors, and a palette
        image skips the per-row filter search that makes RGB PNGs slow to encode."""
        self.title.set_text(f"{short(name)}\n{note}")
        canvas = self.fig.canvas
        saved = {key: rcParams[key] for key in RC}
        rcParams.update(RC)
        try:
            canvas.draw()
        finally:
            rcParams.update(saved)
        width, height = canvas.get_width_height()
        image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        palette = image.convert("RGB").quantize(
            256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
        )
        palette.save(path, format="png", **PNG_OPTIONS)


class Plotter:
    """Four reusable figures; each method draws one tensor's plot into ``path``."""

    def __init__(self) -> None:
        self._hist = _Panel()
        ax = self._hist.axes[0]
        edges = np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1)
        zeros = np.zeros(HISTOGRAM_BINS)
        self._hist_golden = ax.stairs(zeros, edges, fill=True, alpha=0.45, color=GOLDEN)
        self._hist_target = ax.stairs(zeros, edges, color=TARGET, linewidth=1.5)
        self._hist.labels(ax, "value", "count")
        self._hist.caption(ax, [("golden (filled)", GOLDEN), ("target (line)", TARGET)])

        self._diff = _Panel()
        ax = self._diff.axes[0]
        (self._diff_error,) = ax.plot([], [], ".", markersize=2, color=ERROR)
        ax.axhline(0.0, color="black", linewidth=1)
        self._diff_steps = [
            ax.axhline(0.0, color="gray", linestyle=":", linewidth=1.2) for _ in range(2)
        ]
        self._diff.labels(ax, "element index (C order)", "target - golden")
        self._diff_caption = self._diff.caption(ax, [("", "gray")])[0]

        self._cdf = _Panel(grid=True)
        ax = self._cdf.axes[0]
        (self._cdf_golden,) = ax.plot([], [], drawstyle="steps-post", color=GOLDEN, linewidth=2)
        (self._cdf_target,) = ax.plot([], [], drawstyle="steps-post", color=TARGET, linewidth=1.5)
        ax.set_ylim(-0.02, 1.02)
        self._cdf.labels(ax, "value", "fraction <= value")
        self._cdf.caption(ax, [("golden", GOLDEN), ("target", TARGET)], corner="lower right")

        self._dist = _Panel()
        ax = self._dist.axes[0]
        (self._dist_kde,) = ax.plot([], [], color=TARGET, linewidth=1.5)
        self._dist_lines = [
            ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5),
            ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5),
            ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5),
            ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5),
        ]
        self._dist.labels(ax, "value", "density")
        self._dist_captions = self._dist.caption(
            ax, [("target density", TARGET), ("", GOLDEN), ("", CALIBRATED)]
        )

    def histograms(
        self, path: Path, golden: np.ndarray, target: np.ndarray, name: str, note: str
    ) -> None:
        """Golden (filled) and target (outline) histograms on shared bins."""
        lo, hi = span(min(golden.min(), target.min()), max(golden.max(), target.max()))
        edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1)
        g, _ = np.histogram(golden, edges)
        t, _ = np.histogram(target, edges)
        self._hist_golden.set_data(g, edges)
        self._hist_target.set_data(t, edges)
        ax = self._hist.axes[0]
        ax.set_xlim(lo, hi)
        ax.set_ylim(0, max(int(g.max()), int(t.max()), 1) * 1.15)
        self._hist.save(path, f"Histograms: {name}", note)

    def diff(
        self,
        path: Path,
        golden: np.ndarray,
        target: np.ndarray,
        index: np.ndarray,
        half_step: float | None,
        name: str,
        note: str,
    ) -> None:
        """The error of each element by position: channels of an NCHW tensor are runs of
        positions, so a bad channel shows as a block. Dotted lines: +/- half a quantization
        step, the most rounding alone can do to a value inside the calibrated range."""
        ax = self._diff.axes[0]
        pixels = golden.size > PIXEL_MARKERS_FROM
        self._diff_error.set_marker("," if pixels else ".")
        self._diff_error.set_markersize(1.0 if pixels else 3.0)
        error = target - golden
        self._diff_error.set_data(index, error)
        lo, hi = min(float(error.min()), 0.0), max(float(error.max()), 0.0)
        for line, y in zip(self._diff_steps, (-(half_step or 0.0), half_step or 0.0), strict=True):
            line.set_visible(bool(half_step))
            line.set_ydata([y, y])
        if half_step:
            lo, hi = min(lo, -half_step), max(hi, half_step)
        self._diff_caption.set_text(
            f"dotted: +/- half a step ({half_step:.3g})" if half_step else ""
        )
        ax.set_xlim(*span(float(index[0]), float(index[-1])))
        ax.set_ylim(*span(lo, hi))
        self._diff.save(path, f"Diff: {name}", note)

    def cdf(self, path: Path, golden: np.ndarray, target: np.ndarray, name: str, note: str) -> None:
        """Empirical CDFs on a shared grid: a gap between the curves is a shift in values."""
        lo, hi = span(min(golden.min(), target.min()), max(golden.max(), target.max()))
        edges = np.linspace(lo, hi, CDF_BINS + 1)
        for line, values in ((self._cdf_golden, golden), (self._cdf_target, target)):
            counts, _ = np.histogram(values, edges)
            line.set_data(edges, np.concatenate([[0.0], np.cumsum(counts) / values.size]))
        self._cdf.axes[0].set_xlim(lo, hi)
        self._cdf.save(path, f"CDF: {name}", note)

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
        lo, hi = span(min(*values, float(target.min())), max(*values, float(target.max())))
        x, density = gaussian_kde(target, lo, hi)
        self._dist_kde.set_data(x, density)
        for line, v in zip(self._dist_lines, values, strict=True):
            line.set_xdata([v, v])
        self._dist_captions[1].set_text(f"target min/max [{values[0]:.4g}, {values[1]:.4g}]")
        self._dist_captions[2].set_text(f"calibrated min/max [{values[2]:.4g}, {values[3]:.4g}]")
        ax = self._dist.axes[0]
        ax.set_xlim(lo, hi)
        ax.set_ylim(0, max(float(density.max()), 1e-12) * 1.3)
        self._dist.save(path, f"Distribution: {name}", f"Gaussian KDE, {note}")
