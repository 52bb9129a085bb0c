"""The four pictures of a tensor pair, drawn fast enough to run on every layer of a model.

Tensor inspection draws four plots for each of hundreds of tensors, and matplotlib spends
most of a draw on text (every glyph is rendered anew) and on the parts of a figure that never
change. So a :class:`Plotter` holds one tall *sheet*: a title strip and the four panels
stacked under it. Everything that is the same for every tensor (frames, axis labels,
legends, panel captions) is drawn once and kept as a background; per tensor the background
is restored and only what changes is drawn: the data, the ticks, the tensor's name (once for
all four plots) and a few values. This is matplotlib's documented blitting technique
(``copy_from_bbox`` / ``restore_region`` / ``draw_artist``). Each PNG is then the title
strip above one panel, cut from the sheet.

The figure is a plain :class:`~matplotlib.figure.Figure` on the Agg canvas: no pyplot, no
global backend switch, nothing left open. Texts never parse ``$...$`` as math, because tensor
names are not ours. Callers pass samples (see :mod:`accdbg.inspection.inspect`), never whole
tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from matplotlib import rcParams
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, MaxNLocator
from matplotlib.transforms import Bbox
from PIL import Image

from accdbg.reports.cells import shorten

HISTOGRAM_BINS = 100
CDF_BINS = 512
KDE_GRID = 512
DPI = 80
WIDTH, TITLE_HEIGHT, PANEL_HEIGHT = 640, 40, 360  # pixels
SIZE = (WIDTH / DPI, (TITLE_HEIGHT + PANEL_HEIGHT) / DPI)  # inches of each PNG
# Where the axes sit inside a panel, in pixels from the panel's top-left corner.
AXES_LEFT, AXES_RIGHT, AXES_TOP, AXES_BOTTOM = 72, WIDTH - 18, 44, PANEL_HEIGHT - 44
# The axes inside a written PNG (left, top, right, bottom), for whoever checks the pictures.
AXES_BOX = (AXES_LEFT, TITLE_HEIGHT + AXES_TOP, AXES_RIGHT, TITLE_HEIGHT + AXES_BOTTOM)
GOLDEN, TARGET, ERROR, CALIBRATED = "tab:blue", "tab:orange", "tab:red", "tab:red"
FILL_ALPHA = 0.45  # the golden histogram's fill
PNG_OPTIONS = {"compress_level": 1}  # fast zlib level: a third of the time for a few more bytes
# FreeType's auto-hinter (matplotlib's default) costs a third of the drawing time and makes no
# visible difference at this size. Set only while drawing: users' settings stay untouched.
RC = {"text.hinting": "no_hinting"}
TITLE_CHARS = 90
# Histograms, CDF and distribution share their axes: values across (the same range for all
# three, so the pictures line up), 0..1 up (counts over the tallest bin, fractions, density
# over its peak). Their x axis is then drawn once per tensor and copied to the others.
UNIT_Y = (-0.02, 1.06, [0.0, 0.25, 0.5, 0.75, 1.0])
SHARE_VALUE_AXIS = True
X_STRIP = 26  # pixels under the axes that hold the x ticks and their labels
TICK_BINS = 3  # at most 4 labels per axis: each is drawn anew for every tensor
PIXEL_MARKERS_FROM = 5_000  # beyond this many points one pixel per point reads as well, faster


def short(name: str) -> str:
    """A tensor name fit for a title: one line, at most ``TITLE_CHARS`` characters."""
    return shorten(name, TITLE_CHARS)


def span(lo: float, hi: float) -> tuple[float, float]:
    """Axis limits around ``[lo, hi]`` with a margin; a single value gets a visible width."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return -1.0, 1.0
    if hi <= lo:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.03
    return lo - pad, hi + pad


def value_span(*samples: np.ndarray, extra: tuple[float, ...] = ()) -> tuple[float, float]:
    """The x range shared by the value panels: every sample and ``extra`` value, with margin."""
    lo = min([float(s.min()) for s in samples] + [float(v) for v in extra])
    hi = max([float(s.max()) for s in samples] + [float(v) for v in extra])
    return span(lo, hi)


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


@contextmanager
def _drawing_rc():
    saved = {key: rcParams[key] for key in RC}
    rcParams.update(RC)
    try:
        yield
    finally:
        rcParams.update(saved)


class _Panel:
    """One plot on the sheet: fixed axes, static captions and legend, and the artists that
    change per tensor (created with :meth:`dynamic`, drawn by :meth:`render`)."""

    value_axis = False  # x is a tensor value, on the range shared by such panels

    def __init__(self, sheet: Figure, slot: int, caption: str, xlabel: str, ylabel: str):
        height = sheet.get_figheight() * DPI
        self._artists: list[Artist] = []
        self.top = TITLE_HEIGHT + slot * PANEL_HEIGHT  # pixels from the sheet's top

        def y(px: float) -> float:  # pixels below the panel's top -> figure fraction
            return 1.0 - (self.top + px) / height

        self.ax = sheet.add_axes(
            (
                AXES_LEFT / WIDTH,
                y(AXES_BOTTOM),
                (AXES_RIGHT - AXES_LEFT) / WIDTH,
                (AXES_BOTTOM - AXES_TOP) / height,
            )
        )
        for axis in (self.ax.xaxis, self.ax.yaxis):
            axis.set_major_locator(MaxNLocator(TICK_BINS))
            axis.set_animated(True)  # ticks change with every tensor
            # Axis labels are static texts below; a fixed (empty) label spares matplotlib
            # measuring every tick label again to place it.
            axis.set_label_coords(0.0, 0.0)
        self.ax.tick_params(labelsize=9)
        text = {"fontsize": 9, "parse_math": False}
        sheet.text(12 / WIDTH, y(6), caption, va="top", fontweight="bold", **text)
        sheet.text(
            (AXES_LEFT + AXES_RIGHT) / 2 / WIDTH, y(PANEL_HEIGHT - 6), xlabel, ha="center", **text
        )
        sheet.text(
            10 / WIDTH, y((AXES_TOP + AXES_BOTTOM) / 2), ylabel, va="center", rotation=90, **text
        )
        # Per-tensor values, right-aligned on the caption's line.
        self.values = self.dynamic(
            sheet.text(1 - 12 / WIDTH, y(6), "", ha="right", va="top", **text)
        )
        if self.value_axis:
            self.fixed_y(*UNIT_Y)
        # The x ticks and labels (from the frame's bottom row, which the ticks touch), in
        # display pixels (origin bottom left), for copying.
        bottom = height - (self.top + AXES_BOTTOM)
        self.x_strip = Bbox.from_extents(0, bottom - X_STRIP, WIDTH, bottom)

    def fixed_y(self, lo: float, hi: float, ticks: list[float]) -> None:
        """A y axis the same for every tensor: drawn once, with the background."""
        self.ax.set_ylim(lo, hi)
        self.ax.yaxis.set_major_locator(FixedLocator(ticks))
        self.ax.yaxis.set_animated(False)

    def dynamic(self, artist: Artist) -> Artist:
        """Register ``artist`` as one that changes per tensor (left out of the background)."""
        artist.set_animated(True)
        self._artists.append(artist)
        return artist

    def legend(self, handles: list[Artist]) -> None:
        """A legend just above the axes, on the right: never over the data."""
        self.ax.legend(
            handles=handles,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncols=len(handles),
            frameon=False,
            fontsize=9,
            borderaxespad=0.1,
            handlelength=1.6,
            columnspacing=1.2,
        )

    def render(self, draw_x: bool = True) -> None:
        """Draw what changes: ticks (and grid) under the data. The frame stays in the
        background: data never reaches it (axes have margins). Without ``draw_x`` the x
        ticks are left to a copy (see :meth:`Plotter._render`)."""
        ax = self.ax
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_animated() and (draw_x or axis is not ax.xaxis):
                ax.draw_artist(axis)
        for artist in self._artists:
            ax.draw_artist(artist)

    def crop_box(self) -> tuple[int, int, int, int]:
        return (0, self.top, WIDTH, self.top + PANEL_HEIGHT)


class _Histograms(_Panel):
    """Golden (filled) and target (outline) on shared bins. Counts of a sample say little in
    themselves: over the tallest bin of the two, the shapes compare the same."""

    value_axis = True

    def __init__(self, sheet: Figure, slot: int):
        super().__init__(
            sheet,
            slot,
            f"Histograms, {HISTOGRAM_BINS} shared bins",
            "value",
            "count / tallest bin",
        )
        edges = np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1)
        zeros = np.zeros(HISTOGRAM_BINS)
        self.golden = self.dynamic(
            self.ax.stairs(zeros, edges, fill=True, alpha=FILL_ALPHA, color=GOLDEN)
        )
        self.target = self.dynamic(self.ax.stairs(zeros, edges, color=TARGET, linewidth=1.5))
        self.legend(
            [
                Patch(facecolor=GOLDEN, alpha=FILL_ALPHA, label="golden"),
                Line2D([], [], color=TARGET, linewidth=1.5, label="target"),
            ]
        )

    def update(self, golden: np.ndarray, target: np.ndarray, lo: float, hi: float) -> _Histograms:
        edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1)
        g, _ = np.histogram(golden, edges)
        t, _ = np.histogram(target, edges)
        tallest = max(int(g.max()), int(t.max()), 1)
        self.golden.set_data(g / tallest, edges)
        self.target.set_data(t / tallest, edges)
        self.ax.set_xlim(lo, hi)
        return self


class _Diff(_Panel):
    """The error of each element by position: channels of an NCHW tensor are runs of
    positions, so a bad channel shows as a block. Dotted lines: +/- half a quantization
    step, the most rounding alone can do to a value inside the calibrated range."""

    def __init__(self, sheet: Figure, slot: int):
        super().__init__(
            sheet, slot, "Diff: target - golden", "element index (C order)", "target - golden"
        )
        (self.error,) = self.ax.plot([], [], ".", markersize=2, color=ERROR)
        self.dynamic(self.error)
        self.dynamic(self.ax.axhline(0.0, color="black", linewidth=1))  # moves with the y range
        self.steps = [
            self.dynamic(self.ax.axhline(0.0, color="gray", linestyle=":", linewidth=1.2))
            for _ in range(2)
        ]
        self.legend(
            [
                Line2D([], [], marker=".", linestyle="", color=ERROR, label="element"),
                Line2D([], [], color="gray", linestyle=":", label="+/- half a step"),
            ]
        )

    def update(
        self, golden: np.ndarray, target: np.ndarray, index: np.ndarray, half_step: float | None
    ) -> _Diff:
        pixels = golden.size > PIXEL_MARKERS_FROM
        self.error.set_marker("," if pixels else ".")
        self.error.set_markersize(1.0 if pixels else 3.0)
        error = target - golden
        self.error.set_data(index, error)
        lo, hi = min(float(error.min()), 0.0), max(float(error.max()), 0.0)
        for line, y in zip(self.steps, (-(half_step or 0.0), half_step or 0.0), strict=True):
            line.set_visible(bool(half_step))
            line.set_ydata([y, y])
        if half_step:
            lo, hi = min(lo, -half_step), max(hi, half_step)
        self.values.set_text(f"half a step = {half_step:.4g}" if half_step else "no step known")
        self.ax.set_xlim(*span(float(index[0]), float(index[-1])))
        self.ax.set_ylim(*span(lo, hi))
        return self


class _Cdf(_Panel):
    """Empirical CDFs on a shared grid: a gap between the curves is a shift in values."""

    value_axis = True

    def __init__(self, sheet: Figure, slot: int):
        super().__init__(sheet, slot, "CDF", "value", "fraction <= value")
        self.ax.grid(True, axis="y", alpha=0.3)
        (self.golden,) = self.ax.plot([], [], drawstyle="steps-post", color=GOLDEN, linewidth=2)
        (self.target,) = self.ax.plot([], [], drawstyle="steps-post", color=TARGET, linewidth=1.5)
        self.dynamic(self.golden)
        self.dynamic(self.target)
        self.legend(
            [
                Line2D([], [], color=GOLDEN, linewidth=2, label="golden"),
                Line2D([], [], color=TARGET, linewidth=1.5, label="target"),
            ]
        )

    def update(self, golden: np.ndarray, target: np.ndarray, lo: float, hi: float) -> _Cdf:
        edges = np.linspace(lo, hi, CDF_BINS + 1)
        for line, values in ((self.golden, golden), (self.target, target)):
            counts, _ = np.histogram(values, edges)
            line.set_data(edges, np.concatenate([[0.0], np.cumsum(counts) / values.size]))
        self.ax.set_xlim(lo, hi)
        return self


class _Distribution(_Panel):
    """Target density (over its peak: the shape matters, not the scale) with its own min/max
    (solid) and the calibrated min/max (dashed)."""

    value_axis = True

    def __init__(self, sheet: Figure, slot: int):
        super().__init__(
            sheet, slot, "Distribution of the target (Gaussian KDE)", "value", "density / peak"
        )
        (self.kde,) = self.ax.plot([], [], color=TARGET, linewidth=1.5)
        self.dynamic(self.kde)
        self.lines = [
            self.dynamic(self.ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5)),
            self.dynamic(self.ax.axvline(0.0, color=GOLDEN, linestyle="-", linewidth=1.5)),
            self.dynamic(self.ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5)),
            self.dynamic(self.ax.axvline(0.0, color=CALIBRATED, linestyle="--", linewidth=1.5)),
        ]
        self.legend(
            [
                Line2D([], [], color=TARGET, linewidth=1.5, label="target density"),
                Line2D([], [], color=GOLDEN, linewidth=1.5, label="target min/max"),
                Line2D([], [], color=CALIBRATED, linestyle="--", label="calibrated min/max"),
            ]
        )

    def update(
        self,
        target: np.ndarray,
        target_range: tuple[float, float],
        calibrated: tuple[float, float],
        lo: float,
        hi: float,
    ) -> _Distribution:
        values = (*target_range, *calibrated)
        x, density = gaussian_kde(target, lo, hi)
        self.kde.set_data(x, density / max(float(density.max()), 1e-300))
        for line, v in zip(self.lines, values, strict=True):
            line.set_xdata([v, v])
        self.values.set_text(
            f"target [{values[0]:.4g}, {values[1]:.4g}]   calibrated [{values[2]:.4g}, {values[3]:.4g}]"
        )
        self.ax.set_xlim(lo, hi)
        return self


class Plotter:
    """The sheet and its four panels. Per tensor: ``update`` the panels that apply, then
    :meth:`save` writes one PNG per panel (the title strip above the panel)."""

    value_span = staticmethod(value_span)

    def __init__(self) -> None:
        self.sheet = Figure(figsize=(SIZE[0], (TITLE_HEIGHT + 4 * PANEL_HEIGHT) / DPI), dpi=DPI)
        FigureCanvasAgg(self.sheet)
        self.histograms = _Histograms(self.sheet, 0)
        self.diff = _Diff(self.sheet, 1)
        self.cdf = _Cdf(self.sheet, 2)
        self.distribution = _Distribution(self.sheet, 3)
        self._title = self.sheet.text(
            0.5,
            1.0 - 4 / (self.sheet.get_figheight() * DPI),
            "",
            ha="center",
            va="top",
            fontsize=10,
            parse_math=False,
            animated=True,
        )
        with _drawing_rc():
            self.sheet.canvas.draw()
        self._background = self.sheet.canvas.copy_from_bbox(self.sheet.bbox)
        self._palette = self._calibrate_palette()

    def _calibrate_palette(self) -> Image.Image:
        """A 256-color palette for every PNG, chosen once from a drawing with every color and
        blend the plots use. Mapping a sheet onto a known palette costs a tenth of choosing
        a palette per image, and a plot has few colors, so the pictures look the same."""
        rng = np.random.default_rng(0)
        golden = rng.standard_normal(4_000)
        target = golden + rng.normal(0.0, 0.3, golden.size)
        lo, hi = value_span(golden, target)
        panels = {
            "histograms": self.histograms.update(golden, target, lo, hi),
            "diff": self.diff.update(golden, target, np.arange(golden.size), 0.2),
            "cdf": self.cdf.update(golden, target, lo, hi),
            "distribution": self.distribution.update(target, (-3.0, 3.0), (-2.0, 2.0), lo, hi),
        }
        sheet = self._render("calibration", "palette", panels)
        # The pure colors exactly, the blends and gradients from the drawing. An octree palette
        # averages colors (white would come out 254,254,254), and Pillow maps a pixel through
        # a cache of 4x4x4-level boxes, so an octree color sharing a box with a pure color
        # would take its place: those are dropped.
        pure = [to_rgb(c) for c in ("white", "black", "gray", GOLDEN, TARGET, ERROR, CALIBRATED)]
        pure.append(tuple(np.array(to_rgb(GOLDEN)) * FILL_ALPHA + (1 - FILL_ALPHA)))
        exact = np.array(sorted({tuple(round(v * 255) for v in color) for color in pure}))
        mixed = sheet.quantize(256 - len(exact), method=Image.Quantize.FASTOCTREE)
        octree = np.array(mixed.getpalette()[: 3 * (256 - len(exact))]).reshape(-1, 3)
        boxed = (octree[:, None, :] // 4 == exact[None, :, :] // 4).all(axis=-1).any(axis=1)
        colors = np.concatenate([exact, octree[~boxed]]).astype(np.uint8).ravel().tolist()
        palette = Image.new("P", (1, 1))
        palette.putpalette(colors)
        return palette

    def _render(self, name: str, note: str, panels: Mapping[str, _Panel]) -> Image.Image:
        """The sheet with ``panels`` drawn over the background, as an RGB image.

        Value panels on one x range have the same x ticks, pixel for pixel (same width, same
        range, same y axis beside them), so the first draws them and the others get a copy:
        tick labels are most of a panel's drawing time."""
        canvas = self.sheet.canvas
        canvas.restore_region(self._background)
        self._title.set_text(f"{short(name)}\n{note}")
        shared = [p for p in panels.values() if p.value_axis]
        if not SHARE_VALUE_AXIS or len({p.ax.get_xlim() for p in shared}) != 1:
            shared = []
        with _drawing_rc():
            self.sheet.draw_artist(self._title)
            for panel in panels.values():
                panel.render(draw_x=panel not in shared[1:])
        if shared:
            ticks = canvas.copy_from_bbox(shared[0].x_strip)
            x, y, _, _ = ticks.get_extents()  # pixels from the top left
            for panel in shared[1:]:
                canvas.restore_region(ticks, xy=(x, y + panel.top - shared[0].top))
        width, height = canvas.get_width_height()
        rgba = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        return rgba.convert("RGB")

    def save(self, out_dir: Path, name: str, note: str, panels: Mapping[str, _Panel]) -> None:
        """Draw the updated ``panels`` and write ``out_dir/<file>`` for each: the title strip
        above the panel, as a 256-color PNG (smaller, and much faster to encode than RGB)."""
        sheet = self._render(name, note, panels).quantize(
            palette=self._palette, dither=Image.Dither.NONE
        )
        title = sheet.crop((0, 0, WIDTH, TITLE_HEIGHT))
        for file, panel in panels.items():
            image = title.crop((0, 0, WIDTH, TITLE_HEIGHT + PANEL_HEIGHT))  # same palette
            image.paste(sheet.crop(panel.crop_box()), (0, TITLE_HEIGHT))
            image.save(out_dir / file, format="png", **PNG_OPTIONS)
