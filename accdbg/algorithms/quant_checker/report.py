"""``quant_checker.html``: the report family's page (same template, stylesheet, table script
and escaping as the verification summary), leading with the tensors that fail in every
variant, then the SQNR of every tensor under each variant and the table of all tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from string import Template

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from accdbg.core.run_dir import write_bytes_atomic
from accdbg.reports.cells import escape
from accdbg.reports.chart import RANK, culprits, finite, ticks
from accdbg.reports.html_report import asset, findings_html, table_html
from accdbg.reports.summary import html_table as plain_table

HEADINGS = {
    "<h2>Score per layer, in execution order</h2>": "<h2>SQNR per tensor and variant, in model order</h2>",
    "<h2>All layers</h2>": "<h2>All tensors</h2>",
    "only failing layers": "only failing tensors",
}
LEAD = [
    "Name",
    RANK,
    "cause",
    "kind",
    "LayerType",
    "fails_in",
    "variants",
    "worst SQNR",
    "worst_variant",
]


def figure(summary: pd.DataFrame, variants: Sequence[str], threshold: float) -> go.Figure:
    """SQNR per tensor (model order) for each variant, the threshold, the culprits circled."""
    fig = go.Figure()
    names = [str(n) for n in summary["Name"]]
    x = list(range(len(names)))
    hover = [
        f"<b>{escape(n)}</b><br>{escape(k)} {escape(t)}"
        for n, k, t in zip(
            names, summary["kind"].astype(str), summary["LayerType"].astype(str), strict=True
        )
    ]
    for v in variants:
        col = f"SQNR {v}"
        if col not in summary.columns:
            continue
        fig.add_trace(
            go.Scatter(
                x=x,
                y=finite(summary[col]),
                mode="markers",
                name=escape(v),
                text=hover,
                hovertemplate="%{text}<br>" + escape(v) + " %{y:.4g} dB<extra></extra>",
                marker={"size": 6},
            )
        )
    fig.add_hline(
        y=threshold,
        line_dash="dash",
        line_color="#b00020",
        annotation_text=f"threshold {threshold:g} dB",
        annotation_position="top left",
    )
    ranked = culprits(summary)
    if ranked:
        idx = [i for i, _ in ranked]
        worst = finite(summary["worst SQNR"])
        fig.add_trace(
            go.Scatter(
                x=idx,
                y=[worst[i] for i in idx],
                mode="markers+text",
                text=[f"#{r}" for _, r in ranked],
                textposition="top center",
                marker={
                    "symbol": "circle-open",
                    "size": 16,
                    "line": {"width": 2},
                    "color": "#6a1b9a",
                },
                hovertext=[hover[i] for i in idx],
                hoverinfo="text",
                name="culprit (worst variant)",
            )
        )
    tv, tt = ticks(names, [i for i, _ in ranked][:20])
    fig.update_xaxes(
        tickmode="array",
        tickvals=tv,
        ticktext=tt,
        tickangle=-50,
        title_text="tensor, in model order (hover a point for its name)",
    )
    fig.update_yaxes(
        title_text="SQNR checked (dB): lowest of tensor, median channel, median input channel"
    )
    fig.update_layout(
        height=520,
        template="plotly_white",
        margin={"l": 70, "r": 30, "t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
    )
    return fig


def everywhere_html(summary: pd.DataFrame, n_variants: int, anchors: Mapping[str, str]) -> str:
    """The tensors no variant quantizes well, first; else the most-failing ones."""
    if "fails_in" not in summary.columns:
        return ""
    failing = summary[summary["fails_in"].fillna(0) > 0].sort_values(
        ["fails_in", "worst SQNR"], ascending=[False, True]
    )
    every = failing[failing["fails_in"] >= n_variants]
    title = (
        f"Tensors failing in every variant ({len(every)})"
        if len(every)
        else f"No tensor fails in every variant; the {min(len(failing), 20)} failing most"
    )
    shown = every if len(every) else failing.head(20)
    if not len(shown):
        return '<section class="marks"><h2>No tensor fails in any variant</h2></section>'
    table = pd.DataFrame(
        {
            "Name": shown["Name"].astype(str),
            RANK: [None if pd.isna(r) else int(r) for r in shown[RANK]],
            "kind": shown["kind"],
            "fails in": [
                f"{int(a)} of {int(b)}"
                for a, b in zip(shown["fails_in"], shown["variants"], strict=True)
            ],
            "worst SQNR (dB)": shown["worst SQNR"].astype(float),
            "cause": shown["cause"],
        }
    )
    body = plain_table(
        table, href=lambda _i, col, v: f"#{anchors[v]}" if col == "Name" and v in anchors else None
    )
    return (
        f'<section class="marks"><h2>{escape(title)}</h2><div class="inputs">{body}</div></section>'
    )


def variants_html(
    descriptions: Mapping[str, str], fails: Mapping[str, int], links: Mapping[str, str]
) -> str:
    items = "".join(
        f"<li><b>{escape(v)}</b>: {escape(d)} - {fails.get(v, 0)} failing tensor(s) - "
        f'<a href="{escape(links[v])}">{escape(links[v])}</a></li>'
        for v, d in descriptions.items()
    )
    return f'<section class="marks"><h2>Variants</h2><ul>{items}</ul></section>'


def write_report(
    path: Path,
    summary: pd.DataFrame,
    descriptions: Mapping[str, str],
    threshold: float,
    findings: Sequence[str],
    links: Mapping[str, Sequence[tuple[str, str]]],
    variant_csvs: Mapping[str, str],
    meta: str = "",
    notes: Sequence[str] = (),
) -> Path:
    """Write the self-contained page (plotly embedded, every name and value escaped)."""
    df = summary.reset_index(drop=True)
    variants = list(descriptions)
    anchors = {n: f"row-{i}" for i, n in enumerate(map(str, df["Name"]))}
    lead = [c for c in LEAD if c in df.columns]
    shown = df[lead + [c for c in df.columns if c not in lead]]
    failed = [str(s) == "fail" for s in df.get("Status", pd.Series([""] * len(df)))]
    fails = {
        v: int((pd.to_numeric(df[f"SQNR {v}"], errors="coerce") < threshold).sum())
        for v in variants
        if f"SQNR {v}" in df.columns
    }
    fig_html = figure(df, variants, threshold).to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True}
    )
    page = Template(asset("templates/summary.html")).substitute(
        title=escape("Quantization checker"),
        meta=escape(meta),
        css=asset("static/report.css"),
        plotly_js=get_plotlyjs(),
        findings=findings_html(findings),
        marks=everywhere_html(df, len(variants), anchors)
        + variants_html(descriptions, fails, variant_csvs),
        figure=fig_html,
        table=table_html(shown, links, anchors, failed, set(), set(), dict(culprits(df))),
        notes="".join(f'<p class="notes">{escape(n)}</p>' for n in notes),
        table_js=asset("static/table.js"),
    )
    for layer_words, tensor_words in HEADINGS.items():  # the template speaks of layers
        page = page.replace(layer_words, tensor_words, 1)
    write_bytes_atomic(path, page.encode("utf-8"))
    return path
