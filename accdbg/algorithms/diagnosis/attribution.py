"""Where the error *enters*: per-layer score drops relative to the layers that feed it.

On a real 8-bit model an absolute threshold is useless: SQNR is already low a few layers in,
so every later layer "fails". What tells the culprit is the error a layer *adds*:

    drop = worst score among the layer's inputs  -  the layer's score      (higher is better)
    drop = the layer's score  -  worst score among its inputs               (lower is better)

A layer fed only by graph inputs (or by tensors that were not compared) is measured against
the ideal score when that is finite (cosine 1, MSE 0); SQNR's ideal is +inf, so such a layer
has no drop in dB.

Layers are *ranked* by the error they add on a linear scale, because a score drop alone
misleads on log scales: SQNR falling from 35 to 22 dB leaves 0.6 % noise, from 8 to 0 dB
destroys the signal. The linear error is the noise-to-signal power ``10**(-SQNR/10)`` for
SQNR, ``1 - cos`` for cosine similarity, and the score itself for error verifiers (MSE, MAE,
...); ``<label> error added`` is its increase over the worst input. Two marks follow:

* **first crossing**: the first layer (execution order) that fails the threshold while every
  compared input passes - where the error starts;
* **largest drops**: the layers adding the most error, whatever the absolute scores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from accdbg.verifiers.base import Verifier

TOP_DROPS = 3


@dataclass
class Attribution:
    """The marks for one verifier."""

    label: str
    first_crossing: str | None
    largest_drops: list[tuple[str, float]]


def _worse(a: float, b: float, higher_is_better: bool) -> float:
    return min(a, b) if higher_is_better else max(a, b)


def _passes(score: float, verifier: Verifier, threshold: float | None) -> bool | None:
    if threshold is None or score is None or (isinstance(score, float) and math.isnan(score)):
        return None
    return bool(score >= threshold) if verifier.higher_is_better else bool(score <= threshold)


def attribute(
    summary: pd.DataFrame,
    verifiers: Mapping[str, Verifier],
    inputs_of: Mapping[str, Sequence[str]],
    top: int = TOP_DROPS,
) -> tuple[pd.DataFrame, list[Attribution]]:
    """Add ``<label> drop``, ``first_crossing`` and ``largest_drop`` columns to a summary.

    ``summary`` has one row per layer output (column ``Name``) in execution order and one
    column per verifier label; ``inputs_of`` gives each layer output's input tensors.
    """
    df = summary.copy()
    names = list(df["Name"])
    position = {n: i for i, n in enumerate(names)}
    first_cross_col = pd.Series([""] * len(df), index=df.index, dtype=object)
    largest_col = pd.Series([""] * len(df), index=df.index, dtype=object)
    marks: list[Attribution] = []
    for label, verifier in verifiers.items():
        if label not in df.columns:
            continue
        scores = pd.to_numeric(df[label], errors="coerce").to_numpy(dtype=float)
        threshold = verifier.pass_mark
        hib = verifier.higher_is_better
        ideal = verifier.ideal
        drops = np.full(len(df), np.nan)
        added = np.full(len(df), np.nan)
        first: str | None = None
        for i, name in enumerate(names):
            s = scores[i]
            if math.isnan(s):
                continue
            fed = [
                position[x] for x in inputs_of.get(name, ()) if x in position and position[x] != i
            ]
            fed_scores = [scores[j] for j in fed if not math.isnan(scores[j])]
            if fed_scores:
                worst = fed_scores[0]
                for v in fed_scores[1:]:
                    worst = _worse(worst, v, hib)
            else:
                worst = ideal if ideal is not None else math.nan
            if math.isfinite(worst) or math.isfinite(s):  # inf - inf (exact both) is no drop
                d = (worst - s) if hib else (s - worst)
                drops[i] = d if math.isfinite(d) else np.nan
            e_in = max((verifier.linear_error(v) for v in fed_scores), default=0.0)
            e = verifier.linear_error(s) - e_in
            added[i] = e if math.isfinite(e) else np.nan
            if first is None and _passes(s, verifier, threshold) is False:
                if all(_passes(v, verifier, threshold) is not False for v in fed_scores):
                    first = name
        df[f"{label} drop"] = drops
        df[f"{label} error added"] = added
        order = [
            i for i in np.argsort(-np.nan_to_num(added, nan=-np.inf)) if not math.isnan(added[i])
        ][:top]
        largest = [(names[i], float(drops[i])) for i in order if added[i] > 0]
        for rank, (name, _) in enumerate(largest, start=1):
            i = position[name]
            largest_col.iloc[i] = _join(largest_col.iloc[i], f"{label} #{rank}")
        if first is not None:
            i = position[first]
            first_cross_col.iloc[i] = _join(first_cross_col.iloc[i], label)
        marks.append(Attribution(label, first, largest))
    df["first_crossing"] = first_cross_col
    df["largest_drop"] = largest_col
    return df, marks


def _fmt(d: float) -> str:
    return "n/a" if math.isnan(d) else f"{d:.4g}"


def _join(old: str, new: str) -> str:
    return f"{old}; {new}" if old else new
