"""The dataset run's tables, built in input-list order from the small per-input results.

* ``scores``: one row per input and layer (long form), sorted by input line then execution
  order - the same bytes whatever executor ran the inputs and in whatever order they finished;
* ``layers``: one row per layer - the running statistics, each verifier's median and 5-95 %
  band across inputs, and how often the layer is the input's top contributor (the layer
  adding the most error, :func:`~accdbg.algorithms.diagnosis.attribution.attribute` on that input's rows);
* ``inputs``: one row per input - files, final outputs' SQNR/cosine, top-1 agreement, kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from accdbg.algorithms.diagnosis.attribution import attribute
from accdbg.algorithms.diagnosis.culprits import noise_verifier
from accdbg.verifiers.base import Verifier

BAND = (5, 95)


def scores_table(
    per_input: Mapping[int, dict],
    layers: Sequence[dict],
    columns: Sequence[str],
) -> pd.DataFrame:
    """The long score table; ``per_input[index]`` holds ``values`` (layers x columns),
    ``status`` and ``failed``; ``layers`` each layer's Name, LayerType, Golden_name."""
    frames = []
    for index in sorted(per_input):
        rec = per_input[index]
        df = pd.DataFrame(np.asarray(rec["values"], dtype=float), columns=list(columns))
        df.insert(0, "Input", f"Result_{index}")
        df.insert(1, "Line", index + 1)
        df.insert(2, "Order", range(len(layers)))
        df.insert(3, "Name", [lay["Name"] for lay in layers])
        df.insert(4, "LayerType", [lay["LayerType"] for lay in layers])
        df["Golden_name"] = [lay["Golden_name"] for lay in layers]
        df["Status"] = list(rec["status"])
        df["Failed"] = list(rec["failed"])
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["Input", "Line", "Order", "Name", "LayerType", *columns])
    return pd.concat(frames, ignore_index=True)


def top_contributors(
    scores: pd.DataFrame,
    verifiers: Mapping[str, Verifier],
    inputs_of: Mapping[str, Sequence[str]],
) -> tuple[str | None, dict[str, str | None]]:
    """Per input, the layer adding the most error (the noise verifier's ``error added``,
    else the first verifier's); returns the verifier label used and input -> layer."""
    label = noise_verifier(verifiers, scores.columns) or next(
        (lab for lab in verifiers if lab in scores.columns), None
    )
    out: dict[str, str | None] = {}
    if label is None:
        return None, out
    for key, rows in scores.groupby("Input", sort=False):
        df, _ = attribute(rows.reset_index(drop=True), {label: verifiers[label]}, inputs_of)
        added = pd.to_numeric(df[f"{label} error added"], errors="coerce")
        out[str(key)] = None if added.isna().all() else str(df.loc[added.idxmax(), "Name"])
    return label, out


def layer_table(
    stats: pd.DataFrame,
    scores: pd.DataFrame,
    labels: Sequence[str],
    top: Mapping[str, str | None],
) -> pd.DataFrame:
    """The running statistics with each verifier's median and 5-95 % band across inputs and
    the top-contributor count and share."""
    df = stats.copy()
    by_layer = scores.groupby("Order", sort=True)
    for label in labels:
        if label not in scores.columns:
            continue
        med, lo, hi = [], [], []
        for order in df["Order"]:
            vals = (
                pd.to_numeric(by_layer.get_group(order)[label], errors="coerce").to_numpy(float)
                if order in by_layer.groups
                else np.array([])
            )
            vals = vals[~np.isnan(vals)]
            if vals.size:
                # +inf (identical tensors) is a valid SQNR: percentiles of it stay inf
                with np.errstate(invalid="ignore"):
                    med.append(float(np.median(vals)))
                    p = np.percentile(vals, BAND)
                lo.append(float(p[0]))
                hi.append(float(p[1]))
            else:
                med.append(math.nan)
                lo.append(math.nan)
                hi.append(math.nan)
        df[f"{label}_median"] = med
        df[f"{label}_p{BAND[0]}"] = lo
        df[f"{label}_p{BAND[1]}"] = hi
    counts = pd.Series([v for v in top.values() if v is not None]).value_counts()
    n = max(len(top), 1)
    df["top_contributor_inputs"] = [int(counts.get(name, 0)) for name in df["Name"]]
    df["top_contributor_%"] = 100.0 * df["top_contributor_inputs"] / n
    return df


def worst_line(inputs: pd.DataFrame, worst: str, label: str, column: str) -> str:
    """The finding naming the input the culprit ranking looked at, and why."""
    row = inputs.set_index("Input").loc[worst]
    values = pd.to_numeric(inputs[column], errors="coerce").dropna()
    median = f" (median over inputs {np.median(values):.4g})" if not values.empty else ""
    return (
        f"the culprit ranking is on the worst of {len(inputs)} inputs: {worst} ({row['Files']})"
        f" - final outputs {label} {row[column]:.4g}{median}"
    )


def stability_line(
    culprit: str | None, top: Mapping[str, str | None], shows_at: Sequence[str] = ()
) -> str | None:
    """How many inputs agree with the ranking: share whose top contributor is culprit #1 (or
    ``shows_at``, where its error appears: the Log amplifying its rounding), and the most
    frequent top contributor when it is another layer."""
    scored = [v for v in top.values() if v is not None]
    if not scored:
        return None
    counts = pd.Series(scored).value_counts()
    leader, lead_n = str(counts.index[0]), int(counts.iloc[0])
    n = len(scored)
    if culprit is None:
        return (
            f"no culprit ranked; the most frequent top contributor is {leader} "
            f"({lead_n} of {n} inputs, {100 * lead_n / n:.0f} %)"
        )
    agree = sum(int(counts.get(x, 0)) for x in (culprit, *shows_at))
    where = f" (its error showing at {', '.join(shows_at)})" if shows_at else ""
    text = (
        f"culprit #1 {culprit}{where} is the top contributor on {agree} of {n} inputs "
        f"({100 * agree / n:.0f} %)"
    )
    if leader not in (culprit, *shows_at):
        text += f"; most often it is {leader} ({lead_n} of {n})"
    return text
