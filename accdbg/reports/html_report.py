"""The report an engineer reads in a minute: findings, chart, marks and a table, offline.

The page, its stylesheet and the table script ship inside the package
(``accdbg/reports/templates`` and ``static``) and are read with importlib.resources, so an
installed wheel writes the same report as a source tree. plotly's JavaScript is embedded (no
CDN), and every name, path and value is HTML-escaped.

The table leads with what decides: the name (kept in view while the table scrolls sideways),
the culprit rank and its cause when the ranking is there, then the scores with their drops
and marks; the rest follows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
import pandas as pd
from plotly.offline import get_plotlyjs

from accdbg.core.run_dir import write_bytes_atomic
from accdbg.errors import AccdbgError
from accdbg.reports.cells import escape
from accdbg.reports.chart import CAUSE, RANK, Marks, Metric, culprits, figure
from accdbg.reports.summary import format_value, inputs_html

MARK_COLUMNS = ["first_crossing", "largest_drop"]
VERDICT_COLUMNS = ["Status", "Failed"]
WIDE_TEXT = {CAUSE, "Status", "Failed", "Info", "Layout", "Golden_name"}


def asset(rel: str) -> str:
    """A file of the report's page (``templates/...`` or ``static/...``), from the package."""
    path = resources.files("accdbg.reports").joinpath(*rel.split("/"))
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise AccdbgError(
            f"report asset {rel!r} is missing from the installed accdbg package ({path}); "
            "reinstall accdbg"
        ) from None


def column_order(columns: Sequence[str], labels: Sequence[str]) -> list[str]:
    """Name, culprit rank and cause, layer type; the scores and their drops; each score's own
    columns; marks;
    Status/Failed; then everything else in its original order."""
    cols = [str(c) for c in columns]
    scores = [lab for lab in labels if lab in cols]
    lead = [c for c in ("Name", RANK, CAUSE, "LayerType") if c in cols]
    per_score = [
        c
        for lab in scores
        for c in cols
        if c not in scores and (c.startswith(f"{lab} ") or c.startswith(f"{lab}_"))
    ]
    drops = [f"{lab} drop" for lab in scores if f"{lab} drop" in cols]  # next to the scores
    front = lead + scores + drops + [c for c in dict.fromkeys(per_score) if c not in drops]
    front += [c for c in MARK_COLUMNS + VERDICT_COLUMNS if c in cols and c not in front]
    return front + [c for c in cols if c not in front]


def findings_html(findings: Sequence[str]) -> str:
    """The verdict lines as the page's headline (nothing when there are none)."""
    if not findings:
        return ""
    items = "".join(f"<li>{escape(f)}</li>" for f in findings)
    return f'<section class="findings" id="findings"><h2>Findings</h2><ul>{items}</ul></section>'


def marks_html(marks: Sequence[Marks], anchors: Mapping[str, str]) -> str:
    """Per verifier: the first crossing and the largest drops, linked to their rows."""
    if not marks:
        return ""
    items = []
    for m in marks:
        first = (
            f'<a class="first" href="#{anchors[m.first_crossing]}">{escape(m.first_crossing)}</a>'
            if m.first_crossing in anchors
            else "none"
        )
        drops = ", ".join(
            f'<a class="drop" href="#{anchors[n]}">{escape(n)}</a> (drop {escape(format_value(d)) or "n/a"})'
            for n, d in m.largest_drops
            if n in anchors
        )
        items.append(
            f"<li><b>{escape(m.label)}</b>: first layer crossing the threshold while its inputs did not: "
            f"{first}; layers adding the most error: {drops or 'none'}</li>"
        )
    return (
        '<section class="marks"><h2>Where the error enters</h2><ul>'
        + "".join(items)
        + "</ul></section>"
    )


def header_text(col: str) -> str:
    """A column name that may break after ``_`` and between camelCase words, never mid-word."""
    text = escape(col).replace("_", "_<wbr>")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "<wbr>", text)


def _cell(col: str, value: object) -> str:
    text = format_value(value)
    num = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
    classes = (
        (["num"] if num else [])
        + (["wide"] if col in WIDE_TEXT else [])
        + ([CAUSE] if col == CAUSE else [])
    )
    attr = f' class="{" ".join(classes)}"' if classes else ""
    if num:
        attr += f' data-value="{escape(text)}"'
    return f"<td{attr}>{escape(text)}</td>"


def table_html(
    df: pd.DataFrame,
    links: Mapping[str, Sequence[tuple[str, str]]],
    anchors: Mapping[str, str],
    failed: Sequence[bool],
    top: set[str],
    first: set[str],
    ranks: Mapping[int, int] | None = None,
) -> str:
    """The table (columns in the order given); row ``i`` is ``df.iloc[i]``."""
    cols = [str(c) for c in df.columns]
    ranks = ranks or {}
    head = "".join(
        f'<th scope="col" class="{"wide" if c in WIDE_TEXT else ""}">{header_text(c)}</th>'
        for c in cols
    )
    rows = []
    for i, rec in enumerate(df.itertuples(index=False, name=None)):
        name = str(rec[cols.index("Name")])
        cls = " ".join(
            c
            for c, on in (
                ("fail", failed[i]),
                ("topdrop", name in top),
                ("first", name in first),
                ("culprit", i in ranks),
            )
            if on
        )
        cells = [
            f'<th scope="row" class="name">{escape(name).replace("/", "/<wbr>")}</th>'
            if col == "Name"
            else _cell(col, v)
            for col, v in zip(cols, rec, strict=True)
        ]
        detail = " ".join(
            f'<a href="{escape(href)}">{escape(label)}</a>' for label, href in links.get(name, ())
        )
        rows.append(
            f'<tr id="{anchors[name]}" class="{cls}">{"".join(cells)}<td>{detail}</td></tr>'
        )
    return (
        '<div class="table-wrap"><table class="summary">'
        f"<thead><tr>{head}<th>details</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def write_report(
    path: str | Path,
    df: pd.DataFrame,
    verifiers: Mapping[str, Metric],
    marks: Sequence[Marks],
    title: str,
    meta: str = "",
    links: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    failed: Sequence[bool] | None = None,
    notes: Sequence[str] = (),
    findings: Sequence[str] = (),
    inputs: pd.DataFrame | None = None,
    input_pages: Mapping[str, str] | None = None,
) -> Path:
    """Write the self-contained HTML page; ``links`` maps a row name to (label, href)s.

    ``df`` has a ``Name`` column and one column per verifier label; ``culprit_rank`` and
    ``cause`` (the ranking), when present, are shown next to the name, highlighted in the
    table and marked on the chart. ``findings`` are the verdict lines shown first; ``inputs``
    (a run over several inputs) is the table of inputs shown after them, each linking to its
    page in ``input_pages``.
    """
    if "Name" not in df.columns:
        raise AccdbgError(f"the report table needs a Name column; it has {list(df.columns)}")
    df = df.reset_index(drop=True)
    anchors = {n: f"row-{i}" for i, n in enumerate(map(str, df["Name"]))}
    failed = list(failed) if failed is not None else [False] * len(df)
    top = {n for m in marks for n, _ in m.largest_drops}
    first = {m.first_crossing for m in marks if m.first_crossing}
    ranks = dict(culprits(df))
    fig_html = figure(df, verifiers, marks).to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True}
    )
    shown = df[column_order(df.columns, list(verifiers))]
    page = Template(asset("templates/summary.html")).substitute(
        title=escape(title),
        meta=escape(meta),
        css=asset("static/report.css"),
        plotly_js=get_plotlyjs(),
        findings=findings_html(findings),
        marks=(inputs_html(inputs, input_pages or {}) if inputs is not None else "")
        + marks_html(marks, anchors),
        figure=fig_html,
        table=table_html(shown, links or {}, anchors, failed, top, first, ranks),
        notes="".join(f'<p class="notes">{escape(n)}</p>' for n in notes),
        table_js=asset("static/table.js"),
    )
    path = Path(path)
    write_bytes_atomic(path, page.encode("utf-8"))
    return path
