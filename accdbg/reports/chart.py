"""The report's chart: each verifier's score along the execution order, and where it breaks.

One panel per verifier (its name and unit on the y axis), sharing an x axis labelled with
(abbreviated) layer names - the full name is in every point's hover. Each kind of mark has exactly one legend entry, whatever
the number of panels: clicking it hides that mark everywhere. Every axis has a title.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from accdbg.reports.cells import escape

MAX_TICKS = 48
NAME_CHARS = 20
RANK = "culprit_rank"
CAUSE = "cause"
COLORS = {
    "score": "#1f5fa8",
    "drop": "#e07b00",
    "threshold": "#b00020",
    "first crossing": "#b00020",
    "largest drops": "#e07b00",
    "culprit": "#6a1b9a",
}


class Metric(Protocol):
    """What a chart panel needs of a verifier: its unit and its pass mark (reports take plain
    data; any :class:`~accdbg.verifiers.base.Verifier` is one)."""

    unit: str
    pass_mark: float | None


class Marks(Protocol):
    """Where the error enters, for one verifier (e.g. an oneshot ``Attribution``)."""

    label: str
    first_crossing: str | None
    largest_drops: Sequence[tuple[str, float]]


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """A tick label: the name's tail, which tells layers apart better than its head."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def finite(values: pd.Series) -> list[float | None]:
    """Plot values: non-finite and missing become gaps (None), not zeros or infinities."""
    out: list[float | None] = []
    for v in pd.to_numeric(values, errors="coerce"):
        out.append(float(v) if v is not None and math.isfinite(v) else None)
    return out


def culprits(df: pd.DataFrame) -> list[tuple[int, int]]:
    """(row position, rank) of the rows with a ``culprit_rank``, best rank first."""
    if RANK not in df.columns:
        return []
    ranks = pd.to_numeric(df[RANK], errors="coerce").to_numpy(dtype=float)
    found = [(i, int(r)) for i, r in enumerate(ranks) if math.isfinite(r)]
    return sorted(found, key=lambda ir: (ir[1], ir[0]))


def ticks(names: Sequence[str], marked: Sequence[int]) -> tuple[list[int], list[str]]:
    """At most about MAX_TICKS evenly spaced layer names, plus every marked layer (in bold)."""
    n = len(names)
    step = max(1, math.ceil(n / MAX_TICKS))
    marked_set = set(marked)
    regular = [i for i in range(0, n, step) if all(abs(i - m) * 2 >= step for m in marked_set)]
    chosen = sorted(set(regular) | marked_set)
    text = [
        f"<b>{escape(short_name(names[i]))}</b>"
        if i in marked_set
        else escape(short_name(names[i]))
        for i in chosen
    ]
    return chosen, text


class _Legend:
    """Shows each kind of trace once in the legend; the panels' copies follow its toggle."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str) -> dict:
        first = kind not in self.seen
        self.seen.add(kind)
        return {"name": kind, "legendgroup": kind, "showlegend": first}


def figure(
    df: pd.DataFrame, verifiers: Mapping[str, Metric], marks: Sequence[Marks] = ()
) -> go.Figure:
    """One panel per verifier: score, drop, threshold, first crossing, largest drops, culprits."""
    labels = [lab for lab in verifiers if lab in df.columns]
    panels = max(len(labels), 1)
    fig = make_subplots(
        rows=panels,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12 if panels > 1 else 0.0,
        specs=[[{"secondary_y": True}] for _ in range(panels)],
    )
    names = [str(n) for n in df["Name"]]
    x = list(range(len(df)))
    types = df["LayerType"] if "LayerType" in df.columns else pd.Series([""] * len(df))
    hover = [
        f"<b>{escape(n)}</b><br>{escape(t)}"
        if str(t) not in ("", "None", "nan")
        else f"<b>{escape(n)}</b>"
        for n, t in zip(names, types, strict=True)
    ]
    position = {n: i for i, n in enumerate(names)}
    by_label = {m.label: m for m in marks}
    ranked = culprits(df)
    causes = df[CAUSE].fillna("").astype(str).tolist() if CAUSE in df.columns else [""] * len(df)
    legend = _Legend()
    for row, label in enumerate(labels, start=1):
        v = verifiers[label]
        unit = f" ({v.unit})" if v.unit else ""
        scores = finite(df[label])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=scores,
                mode="lines+markers",
                text=hover,
                hovertemplate="%{text}<br>" + escape(label) + " %{y:.4g}<extra></extra>",
                marker={"size": 4, "color": COLORS["score"]},
                line={"color": COLORS["score"], "width": 1.5},
                **legend("score"),
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=escape(label + unit), row=row, col=1, secondary_y=False)
        _drops(fig, df, label, x, hover, legend, row)
        thr = v.pass_mark
        if thr is not None and math.isfinite(thr):
            fig.add_hline(
                y=thr,
                line_dash="dash",
                line_color=COLORS["threshold"],
                row=row,
                col=1,
                annotation_text=f"threshold {thr:g}",
                annotation_position="top left",
            )
        m = by_label.get(label)
        if m is not None and m.first_crossing in position:
            i = position[m.first_crossing]
            fig.add_trace(
                go.Scatter(
                    x=[i],
                    y=[scores[i]],
                    mode="markers",
                    marker={"symbol": "star", "size": 16, "color": COLORS["first crossing"]},
                    hovertext=[hover[i]],
                    hoverinfo="text",
                    **legend("first crossing"),
                ),
                row=row,
                col=1,
            )
        drops = [
            position[n] for n, _ in (m.largest_drops if m is not None else ()) if n in position
        ]
        if drops:
            fig.add_trace(
                go.Scatter(
                    x=drops,
                    y=[scores[i] for i in drops],
                    mode="markers",
                    marker={"symbol": "diamond", "size": 12, "color": COLORS["largest drops"]},
                    hovertext=[hover[i] for i in drops],
                    hoverinfo="text",
                    **legend("largest drops"),
                ),
                row=row,
                col=1,
            )
        if ranked:
            fig.add_trace(_culprit_marks(ranked, scores, hover, causes, legend), row=row, col=1)
    tickvals, ticktext = ticks(names, [i for i, _ in ranked] or _marked(marks, position))
    fig.update_xaxes(tickmode="array", tickvals=tickvals, ticktext=ticktext, tickangle=-50)
    fig.update_xaxes(showticklabels=True, row=panels, col=1)
    fig.update_xaxes(
        title_text="layer output, in execution order (hover a point for its full name)",
        row=panels,
        col=1,
    )
    fig.update_layout(
        height=300 * panels + 170,
        margin={"l": 70, "r": 70, "t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        template="plotly_white",
        bargap=0.1,
    )
    return fig


def _drops(fig: go.Figure, df: pd.DataFrame, label: str, x, hover, legend, row: int) -> None:
    """The error each layer adds (``<label> drop``), as bars on the panel's second axis."""
    drop_col = f"{label} drop"
    if drop_col not in df.columns:
        return
    fig.add_trace(
        go.Bar(
            x=x,
            y=finite(df[drop_col]),
            opacity=0.35,
            marker_color=COLORS["drop"],
            hovertext=hover,
            hovertemplate="%{hovertext}<br>drop %{y:.4g}<extra></extra>",
            **legend("drop (error the layer adds)"),
        ),
        row=row,
        col=1,
        secondary_y=True,
    )
    fig.update_yaxes(
        title_text=escape(f"{label} drop"),
        row=row,
        col=1,
        secondary_y=True,
        showgrid=False,
        zeroline=True,
        tickmode="auto",
        nticks=5,
        tickformat="~g",
    )


def _culprit_marks(ranked, scores, hover, causes, legend) -> go.Scatter:
    """The culprits' rings, labelled with their rank, their cause on hover."""
    idx = [i for i, _ in ranked]
    return go.Scatter(
        x=idx,
        y=[scores[i] for i in idx],
        mode="markers+text",
        text=[f"#{r}" for _, r in ranked],
        textposition="top center",
        textfont={"color": COLORS["culprit"], "size": 13},
        marker={
            "symbol": "circle-open",
            "size": 18,
            "line": {"width": 2.5},
            "color": COLORS["culprit"],
        },
        hovertext=[f"{hover[i]}<br>culprit #{r}: {escape(causes[i])}" for i, r in ranked],
        hoverinfo="text",
        **legend("culprit"),
    )


def _marked(marks: Sequence[Marks], position: Mapping[str, int]) -> list[int]:
    """Rows the marks point at (when no culprit ranking is there), to label on the axis."""
    out = {position[m.first_crossing] for m in marks if m.first_crossing in position}
    out.update(position[n] for m in marks for n, _ in m.largest_drops if n in position)
    return sorted(out)
