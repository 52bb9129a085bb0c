"""The dataset run's page: each layer's score across inputs, who contributes most, worst inputs.

Plain tables in (no algorithm imported), one self-contained HTML file out (plotly embedded,
offline). Per verifier, a panel along the execution order with the median across inputs as a
line and the 5-95 % band as a shaded area (one input's line would hide how the others behave);
then how often each layer is an input's top contributor; then the kept inputs (worst first)
linking to their tensor folders, and the per-input table. Every name and value is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from accdbg.core.run_dir import write_bytes_atomic
from accdbg.reports.cells import escape
from accdbg.reports.chart import finite, short_name
from accdbg.reports.summary import html_page, html_table

BAND_COLOR = "rgba(31,95,168,0.2)"
LINE_COLOR = "#1f5fa8"


def band_polygons(low: pd.Series, high: pd.Series) -> list[tuple[list[float], list[float]]]:
    """The band as one closed polygon per run of layers where both ends are known: a layer
    without a score (not compared) breaks the band instead of a fill drawn across it. An
    infinite end (identical tensors: SQNR +inf) is drawn at the panel's largest finite value."""
    lo = pd.to_numeric(low, errors="coerce").astype(float).to_numpy()
    hi = pd.to_numeric(high, errors="coerce").astype(float).to_numpy()
    both = [v for v in [*lo, *hi] if math.isfinite(v)]
    if not both:
        return []
    top, bottom = max(both), min(both)
    lo = lo.clip(bottom, top)  # NaN stays NaN; +-inf to the finite extremes
    hi = hi.clip(bottom, top)
    polygons, run = [], []
    for i in [*range(len(lo)), None]:
        if i is not None and not (math.isnan(lo[i]) or math.isnan(hi[i])):
            run.append(i)
            continue
        if run:
            xs = [float(j) for j in run]
            polygons.append(
                (xs + xs[::-1], [float(hi[j]) for j in run] + [float(lo[j]) for j in run[::-1]])
            )
        run = []
    return polygons


def band_figure(
    layers: pd.DataFrame,
    labels: Sequence[str],
    units: Mapping[str, str],
    thresholds: Mapping[str, float | None],
) -> go.Figure:
    """One panel per verifier: median across inputs and its 5-95 % band, threshold dotted."""
    shown = [lab for lab in labels if f"{lab}_median" in layers.columns]
    fig = make_subplots(rows=max(len(shown), 1), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    names = [str(n) for n in layers["Name"]]
    x = list(range(len(names)))
    for row, lab in enumerate(shown, start=1):
        hover = [f"{n}<br>{escape(lab)} median %{{y:.4g}}" for n in map(escape, names)]
        first = True
        for xs, ys in band_polygons(layers[f"{lab}_p5"], layers[f"{lab}_p95"]):
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    line={"width": 0},
                    fill="toself",
                    fillcolor=BAND_COLOR,
                    name="5-95 % of inputs",
                    showlegend=row == 1 and first,
                    legendgroup="band",
                    hoverinfo="skip",
                ),
                row=row,
                col=1,
            )
            first = False
        fig.add_trace(
            go.Scatter(
                x=x,
                y=finite(layers[f"{lab}_median"]),
                mode="lines+markers",
                line={"color": LINE_COLOR},
                marker={"size": 4},
                name="median over inputs",
                showlegend=row == 1,
                legendgroup="median",
                hovertemplate=hover,
            ),
            row=row,
            col=1,
        )
        mark = thresholds.get(lab)
        if mark is not None and math.isfinite(mark):
            fig.add_hline(y=mark, line={"dash": "dot", "color": "#b00020"}, row=row, col=1)
        unit = units.get(lab) or ""
        fig.update_yaxes(title_text=escape(f"{lab} ({unit})" if unit else lab), row=row, col=1)
    step = max(1, len(names) // 48)
    fig.update_xaxes(
        tickmode="array",
        tickvals=x[::step],
        ticktext=[escape(short_name(n)) for n in names[::step]],
        tickangle=-60,
    )
    fig.update_xaxes(title_text="layer (execution order)", row=max(len(shown), 1), col=1)
    fig.update_layout(
        height=260 * max(len(shown), 1) + 120, template="plotly_white", margin={"t": 30}
    )
    return fig


def top_figure(layers: pd.DataFrame) -> go.Figure | None:
    """How many inputs each layer is the top contributor of (layers that are, only)."""
    if "top_contributor_inputs" not in layers.columns:
        return None
    df = layers[layers["top_contributor_inputs"] > 0].sort_values(
        ["top_contributor_inputs", "Order"], ascending=[False, True]
    )
    if df.empty:
        return None
    x = list(range(len(df)))  # positions, not names: two long names may share a tail
    fig = go.Figure(
        go.Bar(
            x=x,
            y=list(df["top_contributor_inputs"]),
            hovertext=[escape(str(n)) for n in df["Name"]],
            marker={"color": "#e07b00"},
        )
    )
    fig.update_xaxes(
        tickmode="array", tickvals=x, ticktext=[escape(short_name(str(n), 40)) for n in df["Name"]]
    )
    fig.update_layout(
        height=360,
        template="plotly_white",
        margin={"t": 30},
        xaxis_title="layer",
        yaxis_title="inputs where it adds the most error",
    )
    return fig


def write_dataset_report(
    path: str | Path,
    title: str,
    findings: Sequence[str],
    layers: pd.DataFrame,
    inputs: pd.DataFrame,
    labels: Sequence[str],
    units: Mapping[str, str],
    thresholds: Mapping[str, float | None],
    kept_links: Mapping[str, tuple[str, str]],
    notes: Sequence[str] = (),
) -> Path:
    """Write the page; ``kept_links`` maps each kept input, worst first, to its golden and
    target manifests (relative paths)."""
    config = {"displaylogo": False, "responsive": True}
    parts = [f"<h2>Findings</h2><ul>{''.join(f'<li>{escape(f)}</li>' for f in findings)}</ul>"]
    parts.append("<h2>Score per layer across inputs</h2>")
    parts.append(
        band_figure(layers, labels, units, thresholds).to_html(
            full_html=False, include_plotlyjs=False, config=config
        )
    )
    top = top_figure(layers)
    if top is not None:
        parts.append("<h2>Top contributor: how often each layer adds the most error</h2>")
        parts.append(top.to_html(full_html=False, include_plotlyjs=False, config=config))
    rank_col = next((c for c in inputs.columns if c.startswith("final ")), None)
    if kept_links:
        by_key = inputs.set_index("Input")
        rows = []
        for key, (gold, target) in kept_links.items():  # worst first, as given
            row = {"Input": key}
            for col in ("Line", "Files", rank_col):
                if col and key in by_key.index and col in by_key.columns:
                    row[col] = by_key.loc[key, col]
            rows.append({**row, "golden tensors": gold, "QNN tensors": target})
        parts.append("<h2>Kept inputs (worst first), with their tensors</h2>")
        parts.append(
            html_table(
                pd.DataFrame(rows),
                href=lambda i, c, v: str(v) if c in ("golden tensors", "QNN tensors") else None,
            )
        )
    parts.append("<h2>Inputs</h2>")
    parts.append(html_table(inputs.reset_index(drop=True)))
    shown = [
        c
        for c in layers.columns
        if c in ("Order", "Name", "inputs", "clipped_%", "error_rms", "top_contributor_inputs")
        or any(c.startswith(f"{lab}_") for lab in labels)
    ]
    parts.append("<h2>Layers</h2>")
    parts.append(html_table(layers[shown].reset_index(drop=True)))
    body = f"<script>{get_plotlyjs()}</script>" + "".join(parts)
    page = html_page(title, body, notes)
    path = Path(path)
    write_bytes_atomic(path, page.encode("utf-8"))
    return path
