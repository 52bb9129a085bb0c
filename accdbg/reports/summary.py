"""CSV, JSON and HTML views of a table of results (the verification summary and its parts).

Every writer takes a DataFrame, so other components and the rich report reuse them.
CSV cells are made formula-safe, HTML is escaped and self-contained (no script, no CDN),
and JSON keeps numbers as numbers: infinities become the strings ``"inf"``/``"-inf"`` and
NaN (no value) becomes ``null``, because JSON has neither.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.core.run_dir import atomic_path, write_json_atomic
from accdbg.reports.cells import escape, safe_cell, safe_frame

PASS, FAIL, NA = "pass", "fail", "na"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em} p.note{margin:.2em 0;color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin-top:.8em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f0f0f0;position:sticky;top:0} td.text{text-align:left}
td.fail{background:#f8d0d0;color:#800} td.pass{background:#e3f3e3} td.na{color:#999}
tr.problem td.text{color:#a05000}
div.table-wrap{overflow:auto;max-width:100%;max-height:75vh}
"""


def json_value(value: Any) -> Any:
    """A value JSON can hold: numpy scalars unwrapped, inf as a string, NaN as null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, np.ndarray):
        return [json_value(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def format_value(value: Any) -> str:
    """How a cell reads on screen: 6 significant digits, inf spelled out, blank for NaN."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.6g}"
    if isinstance(value, list | tuple | np.ndarray):
        return "[" + ", ".join(str(x) for x in value) + "]"
    return str(value)


def _exact(value: Any) -> str:
    """CSV text keeping every digit of a float (the HTML shows 6)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float | np.floating) and math.isfinite(value):
        return repr(float(value))
    return format_value(value)


def csv_ready(df: pd.DataFrame) -> pd.DataFrame:
    """Lists become ``[1, 2]`` text and text cannot become a spreadsheet formula."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(
                lambda v: format_value(v) if isinstance(v, list | tuple | np.ndarray) else v
            )
    return safe_frame(out)


def write_csv(df: pd.DataFrame, path: str | os.PathLike, durable: bool = False) -> Path:
    """The table as CSV (cells that could become formulas defused), written atomically."""
    path = Path(path)
    with atomic_path(path, durable) as tmp:
        csv_ready(df).to_csv(tmp, index=False, encoding="utf-8")
    return path


def write_record_csv(record: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """One row (a tensor's details) as a two-line CSV; cheaper than a DataFrame per file."""
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([safe_cell(str(k)) for k in record])
        writer.writerow([safe_cell(_exact(v)) for v in record.values()])
    return path


def html_page(title: str, body: str, notes: Iterable[str] = (), before: str = "") -> str:
    """A page: title, ``before`` (HTML built by this module: the findings, a small table),
    then the body, then the notes."""
    note_html = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    notes_part = f"<h2>Notes</h2>{note_html}" if note_html else ""
    return (  # the findings lead (in ``before``); how the page was made comes last
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{escape(title)}</h1>{before}{body}{notes_part}</body></html>\n"
    )


def html_table(
    df: pd.DataFrame,
    cell_class: Callable[[int, str, Any], str | None] | None = None,
    row_class: Callable[[int], str | None] | None = None,
    href: Callable[[int, str, Any], str | None] | None = None,
) -> str:
    """An escaped HTML table; ``cell_class(row, column, value)`` may colour cells and
    ``href(row, column, value)`` make a cell a (relative) link."""
    head = "".join(f"<th>{escape(c)}</th>" for c in df.columns)
    rows = []
    for i, values in enumerate(df.itertuples(index=False, name=None)):
        cells = []
        for col, value in zip(df.columns, values, strict=True):
            classes = (
                []
                if isinstance(value, int | float | np.number) and not isinstance(value, bool)
                else ["text"]
            )
            extra = cell_class(i, col, value) if cell_class else None
            if extra:
                classes.append(extra)
            cls = f' class="{" ".join(classes)}"' if classes else ""
            text = escape(format_value(value))
            link = href(i, col, value) if href else None
            if link:
                text = f'<a href="{escape(link)}">{text}</a>'
            cells.append(f"<td{cls}>{text}</td>")
        rc = row_class(i) if row_class else None
        rows.append(f'<tr class="{escape(rc)}">' if rc else "<tr>")
        rows.append("".join(cells) + "</tr>")
    # in its own box: a wide table scrolls there, never the page
    return (
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def write_html(
    df: pd.DataFrame,
    path: str | os.PathLike,
    title: str,
    notes: Iterable[str] = (),
    cell_class: Callable[[int, str, Any], str | None] | None = None,
    row_class: Callable[[int], str | None] | None = None,
    before: str = "",
) -> Path:
    """A self-contained HTML page holding ``df`` as a table (``before``: see html_page)."""
    path = Path(path)
    path.write_text(
        html_page(title, html_table(df, cell_class, row_class), notes, before), encoding="utf-8"
    )
    return path


def write_record_html(record: Mapping[str, Any], path: str | os.PathLike, title: str) -> Path:
    """One tensor's details as a two-column page (easier to read than one wide row)."""
    rows = "".join(
        f'<tr><th class="text">{escape(k)}</th><td class="text">{escape(format_value(v))}</td></tr>'
        for k, v in record.items()
    )
    path = Path(path)
    path.write_text(html_page(title, f"<table><tbody>{rows}</tbody></table>"), encoding="utf-8")
    return path


def verdict_classes(
    passed: Mapping[str, list[bool | None]],
) -> Callable[[int, str, Any], str | None]:
    """A ``cell_class`` colouring verifier columns from per-row verdicts (None: no verdict)."""

    def cls(row: int, col: str, value: Any) -> str | None:
        verdicts = passed.get(col)
        if verdicts is None:
            return None
        v = verdicts[row] if row < len(verdicts) else None
        if v is True:
            return PASS
        if v is False:
            return FAIL
        return NA

    return cls


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {str(k): json_value(v) for k, v in zip(df.columns, row, strict=True)}
        for row in df.itertuples(index=False, name=None)
    ]


def write_summary(
    df: pd.DataFrame,
    folder: str | os.PathLike,
    title: str,
    meta: Mapping[str, Any],
    passed: Mapping[str, list[bool | None]] | None = None,
    notes: Iterable[str] = (),
    stem: str = "summary",
    before: str = "",
    extra: Mapping[str, Any] | None = None,
    page: Callable[[Path], Path] | None = None,
) -> dict[str, Path]:
    """``<stem>.csv``, ``<stem>.html`` and ``<stem>.json`` for a summary table.

    The JSON holds ``meta`` (verifiers, thresholds, inputs...), the column list, one object
    per row, ``passed``: per verifier column, each row's verdict (true/false/null), then
    ``extra``'s keys. ``before`` is HTML shown above the table (see :func:`inputs_html`);
    ``page`` writes a page of the caller's own (given its path) in place of the table page.
    """
    folder = Path(folder)
    html_path = folder / f"{stem}.html"
    paths = {"csv": write_csv(df, folder / f"{stem}.csv")}
    if page is not None:
        paths["html"] = page(html_path)
    else:
        paths["html"] = write_html(
            df,
            html_path,
            title,
            notes,
            cell_class=verdict_classes(passed or {}),
            row_class=(
                lambda i: (
                    "problem"
                    if "Status" in df.columns and df["Status"].iloc[i] not in ("ok", FAIL)
                    else None
                )
            ),
            before=before,
        )
    data = {
        **json_value(dict(meta)),
        "columns": list(map(str, df.columns)),
        "rows": frame_records(df),
    }
    if passed is not None:
        data["passed"] = {k: list(v) for k, v in passed.items()}
    data.update(json_value(dict(extra or {})))
    write_json_atomic(folder / f"{stem}.json", data)
    paths["json"] = folder / f"{stem}.json"
    return paths


def inputs_html(table: pd.DataFrame, pages: Mapping[str, str]) -> str:
    """The per-input table of a run over several inputs: its ``Input`` cells link to each
    input's own summary page (``pages``: input -> relative href)."""
    if table is None or table.empty:
        return ""
    return (
        '<div class="inputs"><h3>Inputs</h3>'
        + html_table(
            table, href=lambda _i, col, value: pages.get(str(value)) if col == "Input" else None
        )
        + "</div>"
    )
