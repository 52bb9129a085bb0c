"""The report an engineer reads in a minute: chart, marks and a sortable table, offline.

Template and styles live in the repository's top-level ``reports/`` folder; plotly's
JavaScript is embedded (no CDN), and every name, path and value is HTML-escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from string import Template

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from accdbg.algorithms.attribution import Attribution
from accdbg.core.run_dir import write_bytes_atomic
from accdbg.errors import AccdbgError
from accdbg.reports.cells import escape
from accdbg.reports.summary import format_value, inputs_html
from accdbg.verifiers.base import Verifier

ASSETS = Path(__file__).resolve().parents[2] / "reports"


def asset(rel: str) -> str:
    path = ASSETS / rel
    if not path.is_file():
        raise AccdbgError(
            f"report asset {str(path)!r} is missing (install accdbg from its source tree: pip install -e .)"
        )
    return path.read_text(encoding="utf-8")


def _finite(values: pd.Series) -> list[float | None]:
    out = []
    for v in pd.to_numeric(values, errors="coerce"):
        out.append(float(v) if v is not None and math.isfinite(v) else None)
    return out


def figure(
    df: pd.DataFrame, verifiers: Mapping[str, Verifier], marks: Sequence[Attribution]
) -> go.Figure:
    """One panel per verifier: score along execution order, threshold, first crossing, drops."""
    labels = [lab for lab in verifiers if lab in df.columns]
    fig = make_subplots(
        rows=max(len(labels), 1),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=labels,
        specs=[[{"secondary_y": True}] for _ in labels] or [[{}]],
    )
    x = list(range(len(df)))
    hover = [
        f"{escape(n)}<br>{escape(t)}"
        for n, t in zip(df["Name"], df.get("LayerType", [""] * len(df)), strict=False)
    ]
    by_label = {m.label: m for m in marks}
    position = {n: i for i, n in enumerate(df["Name"])}
    for row, label in enumerate(labels, start=1):
        v = verifiers[label]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=_finite(df[label]),
                mode="lines+markers",
                name=label,
                text=hover,
                hovertemplate="%{text}<br>" + escape(label) + " %{y:.4g}<extra></extra>",
                marker={"size": 4},
            ),
            row=row,
            col=1,
        )
        drop_col = f"{label} drop"
        if drop_col in df.columns:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=_finite(df[drop_col]),
                    name=f"{label} drop",
                    opacity=0.35,
                    marker_color="#e07b00",
                    hovertext=hover,
                    hovertemplate="%{hovertext}<br>drop %{y:.4g}<extra></extra>",
                ),
                row=row,
                col=1,
                secondary_y=True,
            )
        thr = v.pass_mark
        if thr is not None and math.isfinite(thr):
            fig.add_hline(
                y=thr,
                line_dash="dash",
                line_color="#b00020",
                row=row,
                col=1,
                annotation_text=f"threshold {thr:g}",
                annotation_position="top left",
            )
        m = by_label.get(label)
        if m and m.first_crossing in position:
            i = position[m.first_crossing]
            fig.add_trace(
                go.Scatter(
                    x=[i],
                    y=_finite(df[label].iloc[[i]]),
                    mode="markers",
                    name="first crossing",
                    marker={"symbol": "star", "size": 16, "color": "#b00020"},
                    hovertext=[escape(m.first_crossing)],
                    hoverinfo="text",
                ),
                row=row,
                col=1,
            )
        if m and m.largest_drops:
            idx = [position[n] for n, _ in m.largest_drops]
            fig.add_trace(
                go.Scatter(
                    x=idx,
                    y=_finite(df[label].iloc[idx]),
                    mode="markers",
                    name="largest drops",
                    marker={"symbol": "diamond", "size": 12, "color": "#e07b00"},
                    hovertext=[escape(n) for n, _ in m.largest_drops],
                    hoverinfo="text",
                ),
                row=row,
                col=1,
            )
    fig.update_layout(
        height=320 * max(len(labels), 1),
        margin={"l": 60, "r": 30, "t": 40, "b": 40},
        legend={"orientation": "h"},
        template="plotly_white",
    )
    fig.update_xaxes(title_text="layer (execution order)", row=max(len(labels), 1), col=1)
    return fig


def marks_html(marks: Sequence[Attribution], anchors: Mapping[str, str]) -> str:
    items = []
    for m in marks:
        first = (
            f'<a class="first" href="#{anchors[m.first_crossing]}">{escape(m.first_crossing)}</a>'
            if m.first_crossing
            else "none"
        )
        drops = ", ".join(
            f'<a class="drop" href="#{anchors[n]}">{escape(n)}</a> (drop {escape(format_value(d)) or "n/a"})'
            for n, d in m.largest_drops
        )
        items.append(
            f"<li><b>{escape(m.label)}</b>: first layer crossing the threshold while its inputs did not: "
            f"{first}; layers adding the most error: {drops or 'none'}</li>"
        )
    return "<ul>" + "".join(items) + "</ul>"


def table_html(
    df: pd.DataFrame,
    links: Mapping[str, Sequence[tuple[str, str]]],
    anchors: Mapping[str, str],
    failed: Sequence[bool],
    top: set[str],
    first: set[str],
) -> str:
    cols = list(df.columns)
    head = "".join(f"<th>{escape(c)}</th>" for c in cols) + "<th>details</th>"
    rows = []
    for i, rec in enumerate(df.itertuples(index=False)):
        name = str(rec[0])
        cls = " ".join(
            c
            for c, on in (("fail", failed[i]), ("topdrop", name in top), ("first", name in first))
            if on
        )
        cells = []
        for v in rec:
            text = format_value(v)
            num = isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
            attr = f' class="num" data-value="{escape(text)}"' if num else ""
            cells.append(f"<td{attr}>{escape(text)}</td>")
        detail = " ".join(
            f'<a href="{escape(href)}">{escape(label)}</a>' for label, href in links.get(name, ())
        )
        rows.append(
            f'<tr id="{anchors[name]}" class="{cls}">{"".join(cells)}<td>{detail}</td></tr>'
        )
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _findings_html(findings: Sequence[str]) -> str:
    if not findings:
        return ""
    items = "".join(f"<li>{escape(f)}</li>" for f in findings)
    return f'<div class="findings"><h3>Verdict</h3><ul>{items}</ul></div>'


def write_report(
    path: str | Path,
    df: pd.DataFrame,
    verifiers: Mapping[str, Verifier],
    marks: Sequence[Attribution],
    title: str,
    meta: str = "",
    links: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    failed: Sequence[bool] | None = None,
    notes: Sequence[str] = (),
    findings: Sequence[str] = (),
    inputs: pd.DataFrame | None = None,
    input_pages: Mapping[str, str] | None = None,
) -> Path:
    """Write the self-contained HTML summary; ``links`` maps a row name to (label, href)s;
    ``findings`` are the verdict lines shown first; ``inputs`` (a run over several inputs)
    is the table of inputs shown after them, each linking to its page in ``input_pages``."""
    anchors = {n: f"row-{i}" for i, n in enumerate(df["Name"])}
    failed = list(failed) if failed is not None else [False] * len(df)
    top = {n for m in marks for n, _ in m.largest_drops}
    first = {m.first_crossing for m in marks if m.first_crossing}
    fig_html = figure(df, verifiers, marks).to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False}
    )
    page = Template(asset("templates/summary.html")).substitute(
        title=escape(title),
        meta=escape(meta),
        css=asset("static/report.css"),
        plotly_js=get_plotlyjs(),
        marks=_findings_html(findings)
        + (inputs_html(inputs, input_pages or {}) if inputs is not None else "")
        + marks_html(marks, anchors),
        figure=fig_html,
        table=table_html(df, links or {}, anchors, failed, top, first),
        notes="".join(f'<p class="notes">{escape(n)}</p>' for n in notes),
        table_js=asset("static/table.js"),
    )
    path = Path(path)
    write_bytes_atomic(path, page.encode("utf-8"))
    return path
