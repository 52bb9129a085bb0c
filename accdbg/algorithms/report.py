"""The snooping reports: ``layerwise.csv`` / ``cumulative_layerwise.csv`` and their HTML.

Columns follow the reference: O/P Name, Status, Layer Type, Shape, Activations (min, max,
median of the golden output), one column per verifier, Orig Outputs (cumulative only) and
Info. Both files are rewritten after every finished batch or step through a temporary file
and a rename, so a killed run leaves a complete, shorter report - never a truncated one.
The HTML is the oneshot report's page (chart per verifier, marks, filterable table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from accdbg.algorithms.diagnosis.attribution import Attribution
from accdbg.algorithms.diagnosis.ranking import Ranking
from accdbg.algorithms.diagnosis.ranking.measures import CONTEXT, CONTEXT_IN
from accdbg.algorithms.judging import Judge
from accdbg.algorithms.statuses import ERRORS, PART
from accdbg.core.run_dir import write_json_atomic
from accdbg.reports.summary import write_csv

CULPRITS_JSON = "culprits.json"  # a snooping run's culprits (diagnosis.culprit.Culprit)

LEADING = ["O/P Name", "Status", "Layer Type", "Shape", "Activations"]
ORIG = "Orig Outputs"
INFO = "Info"
# layerwise: the layer run after its producers back to the nearest kernels (as HTP may fuse
# them), and the worst of its inputs in that same run


def columns(labels: Sequence[str], cumulative: bool) -> list[str]:
    extra = [ORIG] if cumulative else [CONTEXT, CONTEXT_IN]
    return [*LEADING, *labels, *extra, INFO]


def frame(rows: Sequence[dict[str, Any]], labels: Sequence[str], cumulative: bool) -> pd.DataFrame:
    """The report table, rows in execution order (private ``_`` fields dropped)."""
    ordered = sorted(rows, key=lambda r: r["_position"])
    cols = columns(labels, cumulative)
    numeric = [c for c in cols if c in labels or c in (CONTEXT, CONTEXT_IN)]
    data = [{c: r.get(c, math.nan if c in numeric else "") for c in cols} for r in ordered]
    df = pd.DataFrame(data, columns=cols)
    for c in numeric:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _flagged(row: dict[str, Any]) -> bool:
    return row["Status"] in (PART, *ERRORS) or any(
        p is False for p in row.get("_passed", {}).values()
    )


def marks(rows: Sequence[dict[str, Any]], judge: Judge, cumulative: bool) -> list[Attribution]:
    """Per verifier: the first flagged layer and the three layers losing the most score.

    Every score here is the layer's own error (its inputs are golden, or golden since the last
    partition point), so the score's distance from the ideal is what the layer adds.
    """
    ordered = sorted(rows, key=lambda r: r["_position"])
    out = []
    for label, v in judge.verifiers.items():
        flagged = [
            r
            for r in ordered
            if r.get("_passed", {}).get(label) is False and (not cumulative or r["Status"] == PART)
        ]
        ideal = v.ideal
        drops: list[tuple[str, float]] = []
        if ideal is not None:
            for r in ordered:
                value = r.get("_values", {}).get(label)
                if isinstance(value, float) and math.isfinite(value):
                    drops.append(
                        (r["O/P Name"], (ideal - value) if v.higher_is_better else (value - ideal))
                    )
            drops = sorted((d for d in drops if d[1] > 0), key=lambda d: -d[1])[:3]
        out.append(Attribution(label, flagged[0]["O/P Name"] if flagged else None, drops))
    return out


def write_reports(
    folder: Path,
    stem: str,
    rows: Sequence[dict[str, Any]],
    judge: Judge,
    cumulative: bool,
    title: str,
    meta: str = "",
    notes: Sequence[str] = (),
    html: bool = True,
    ranking: Ranking | None = None,
) -> tuple[pd.DataFrame, Path, Path]:
    """``<stem>.csv`` and (if ``html``) ``<stem>.html``, each replaced atomically; with the
    culprit ranking's columns and verdict (heading the HTML page) when given (the final write)."""
    from accdbg.reports.html_report import write_report

    df = frame(rows, judge.labels, cumulative)
    if ranking is not None:
        df = ranking.apply(df, "O/P Name")
        # the verdict's culprits, structured: what the fix search starts from
        write_json_atomic(folder / CULPRITS_JSON, [c.as_dict() for c in ranking.culprits])
    csv_path = write_csv(df, folder / f"{stem}.csv", durable=True)
    html_path = folder / f"{stem}.html"
    if not html:
        return df, csv_path, html_path
    ordered = sorted(rows, key=lambda r: r["_position"])
    html_df = df.rename(columns={"O/P Name": "Name", "Layer Type": "LayerType"})
    write_report(
        html_path,
        html_df,
        judge.verifiers,
        marks(rows, judge, cumulative),
        title,
        meta=meta,
        failed=[_flagged(r) for r in ordered],
        notes=notes,
        findings=ranking.findings if ranking is not None else (),
    )
    return df, csv_path, html_path
