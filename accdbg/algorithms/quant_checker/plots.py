"""The checker's pictures of one tensor, every variant on the same axes.

``Histograms.png`` and ``CDF_plots.png`` (the float values, each distinct encoding's min/max as
vertical lines), ``Diff_plots.png`` (value minus its quantize-dequantize round trip, per
variant, with half a step dotted), ``Distribution_min-max.png`` (the density of the values
under each variant's encoding range) and, on request, ``Per_channel.png`` (each channel's
min/max, and its SQNR per variant). File names follow tensor inspection's, so its folder
naming applies. Plain :class:`~matplotlib.figure.Figure` on Agg: no pyplot state; texts never
parse ``$`` as math (tensor names are not ours). Values are a random sample
(``max_plot_points``), and each picture says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

from accdbg.algorithms.quant_checker.grid import Grid
from accdbg.algorithms.quant_checker.stats import ErrorSums
from accdbg.inspection.plots import _drawing_rc, gaussian_kde, short, span

HISTOGRAMS, DIFF, CDF, DISTRIBUTION, PER_CHANNEL = (
    "Histograms.png",
    "Diff_plots.png",
    "CDF_plots.png",
    "Distribution_min-max.png",
    "Per_channel.png",
)
SIZE, DPI = (8.0, 4.6), 80
TEXT = {"parse_math": False}


def _figure(title: str, note: str) -> tuple[Figure, object]:
    fig = Figure(figsize=SIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    fig.suptitle(short(title), fontsize=10, **TEXT)
    fig.text(0.5, 0.905, note, ha="center", fontsize=8, color="#555", **TEXT)
    ax = fig.add_axes((0.1, 0.13, 0.86, 0.7))
    ax.tick_params(labelsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(5))  # few ticks: their text is most of the time
    ax.yaxis.set_major_locator(MaxNLocator(4))
    return fig, ax


def _save(fig: Figure, path: Path) -> None:
    with _drawing_rc():  # no font hinting: a third of the drawing time, no visible change
        fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 1})


def _distinct(grids: Mapping[str, Grid]) -> dict[tuple, tuple[list[str], Grid]]:
    """Variants sharing a grid drawn once, labelled with all their names."""
    out: dict[tuple, tuple[list[str], Grid]] = {}
    for v, g in grids.items():
        out.setdefault(g.key, ([], g))[0].append(v)
    return out


def tensor_plots(
    out_dir: Path,
    name: str,
    values: np.ndarray,
    positions: np.ndarray | None,
    full: np.ndarray | None,
    grids: Mapping[str, Grid],
    note: str,
) -> list[str]:
    """Write the four pictures; ``values`` is the sample, ``full`` the whole tensor when at
    hand (a weight: per-channel grids need each value's channel), ``positions`` the sample's
    flat indices into it. Returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vals = np.asarray(values, np.float64)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return []
    groups = _distinct(grids)
    ends = [(labels, float(g.lo.min()), float(g.hi.max())) for labels, g in groups.values()]
    lo, hi = span(
        min([vals.min()] + [e[1] for e in ends]), max([vals.max()] + [e[2] for e in ends])
    )
    colors = [f"C{i % 10}" for i in range(len(ends))]
    written = []

    fig, ax = _figure(name, f"float values - {note}")
    counts, edges = np.histogram(vals, bins=100, range=(lo, hi))
    ax.stairs(np.maximum(counts, 0.5), edges, baseline=0.5, fill=True, color="tab:blue", alpha=0.6)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(numticks=4))
    ax.yaxis.set_minor_locator(NullLocator())
    for (labels, a, b), col in zip(ends, colors, strict=True):
        ax.axvline(a, color=col, ls="--", lw=1, label=f"{', '.join(labels)} min/max")
        ax.axvline(b, color=col, ls="--", lw=1)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("value")
    ax.set_ylabel("count (log)")
    ax.legend(fontsize=7, loc="upper right")
    _save(fig, out_dir / HISTOGRAMS)
    written.append(HISTOGRAMS)

    fig, ax = _figure(name, f"cumulative distribution - {note}")
    srt = np.sort(vals)
    ax.plot(srt, np.arange(1, srt.size + 1) / srt.size, color="tab:blue", lw=1.2)
    for (labels, a, b), col in zip(ends, colors, strict=True):
        ax.axvline(a, color=col, ls="--", lw=1, label=f"{', '.join(labels)} min/max")
        ax.axvline(b, color=col, ls="--", lw=1)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("value")
    ax.set_ylabel("fraction of values <=")
    ax.legend(fontsize=7, loc="lower right")
    _save(fig, out_dir / CDF)
    written.append(CDF)

    fig, ax = _figure(name, f"value - qdq(value) per variant - {note}")
    for (labels, g), col in zip(groups.values(), colors, strict=True):
        if g.per_channel:
            if full is None or positions is None:
                continue
            x = np.asarray(full, np.float64)
            d = (x - g.qdq(x)).reshape(-1)[positions]
            xs = x.reshape(-1)[positions]
        else:
            xs = vals
            d = vals - g.qdq(vals)
        ax.plot(xs, d, ",", color=col, alpha=0.6, label=", ".join(labels))
        if not g.per_channel:
            half = 0.5 * float(g.scale.reshape(-1)[0])
            ax.axhline(half, color=col, ls=":", lw=0.8)
            ax.axhline(-half, color=col, ls=":", lw=0.8)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("value")
    ax.set_ylabel("value - qdq(value)")
    ax.legend(fontsize=7, loc="upper right", markerscale=20)
    _save(fig, out_dir / DIFF)
    written.append(DIFF)

    fig, ax = _figure(name, f"density and each variant's encoding range - {note}")
    x, dens = gaussian_kde(vals, lo, hi)
    peak = float(dens.max()) or 1.0
    ax.fill_between(x, dens / peak, color="tab:blue", alpha=0.3, label="density (peak = 1)")
    ax.axvline(float(vals.min()), color="k", lw=1, label="data min/max")
    ax.axvline(float(vals.max()), color="k", lw=1)
    for i, ((labels, a, b), col) in enumerate(zip(ends, colors, strict=True)):
        y = 1.1 + 0.12 * i
        ax.plot([a, b], [y, y], color=col, lw=3, label=", ".join(labels))
    ax.set_xlim(lo, hi)
    ax.set_ylim(0, 1.2 + 0.12 * len(ends))
    ax.set_xlabel("value")
    ax.set_ylabel("density / encoding ranges")
    ax.legend(fontsize=7, loc="center right", framealpha=0.85)
    _save(fig, out_dir / DISTRIBUTION)
    written.append(DISTRIBUTION)
    return written


def channel_plot(
    out_dir: Path,
    name: str,
    ch_min: np.ndarray,
    ch_max: np.ndarray,
    errors: Mapping[str, ErrorSums],
    threshold: float,
) -> str:
    """Each channel's range, and each variant's per-channel SQNR with the threshold."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(SIZE[0], SIZE[1] * 1.5), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.suptitle(short(name), fontsize=10, **TEXT)
    top = fig.add_axes((0.1, 0.56, 0.86, 0.36))
    bottom = fig.add_axes((0.1, 0.08, 0.86, 0.36))
    ch = np.arange(ch_min.size)
    top.vlines(ch, ch_min, ch_max, color="tab:blue", lw=2)
    top.set_ylabel("channel min..max")
    seen = set()
    for e in errors.values():
        s = e.channel_sqnr()
        if s is None or id(e) in seen:
            continue
        seen.add(id(e))
        labels = [k for k, o in errors.items() if o is e]
        finite = np.where(np.isfinite(s), s, np.nan)
        bottom.plot(np.arange(finite.size), finite, marker=".", lw=1, label=", ".join(labels))
    bottom.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold:g} dB")
    bottom.set_xlabel("channel")
    bottom.set_ylabel("SQNR (dB)")
    bottom.legend(fontsize=7, loc="lower right")
    _save(fig, out_dir / PER_CHANNEL)
    return PER_CHANNEL
