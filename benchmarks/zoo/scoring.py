"""From an algorithm's table to the zoo's figures: ranks of the culprit rows, hits, false alarms.

accdbg's tables carry a ``culprit_rank`` column (1 = most likely culprit; empty = not a
culprit). Hit rates are given over all faults and by how much each fault costs the model's
outputs on QNN: a fault that leaves the outputs as they were is no culprit of theirs, and by
the ranking's own rule (a layer is named only when it matters to the outputs) it is not named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

NAME_COLUMN = {
    "oneshot": "Name",
    "layerwise": "O/P Name",
    "cumulative": "O/P Name",
    "aimet_enabled": "Name",  # the peer (benchmarks/aimet_peer.py): every layer ranked
    "aimet_disabled": "Name",
}
RANK_COLUMN = "culprit_rank"
HARM_DB = 3.0  # a fault at least doubles the outputs' error power (the ranking's own bar)
VERSION = 2  # of score()'s figures: a cached row scored by another version is scored again


def ranks_of(table: pd.DataFrame) -> pd.Series:
    """Each row's culprit rank (NaN = not named)."""
    if RANK_COLUMN not in table.columns:
        raise KeyError(f"the table has no {RANK_COLUMN} column")
    return pd.to_numeric(table[RANK_COLUMN], errors="coerce").astype("Float64").astype(float)


def score(algorithm: str, table: pd.DataFrame, culprits: Sequence[str]) -> dict:
    """Where the culprit rows rank, and what was named."""
    names = table[NAME_COLUMN[algorithm]].astype(str)
    ranks = ranks_of(table)
    named = ranks.notna()
    order = ranks[named].sort_values()
    in_table = [c for c in culprits if c in set(names)]
    culprit_ranks = [float(ranks[i]) for i in names.index if names[i] in set(culprits)]
    culprit_ranks = [r for r in culprit_ranks if not math.isnan(r)]
    best = min(culprit_ranks) if culprit_ranks else math.nan
    causes = table["cause"].astype(str) if "cause" in table.columns else None
    backend = 0 if causes is None else int(causes[named].str.startswith("backend").sum())
    return {
        "ranking": RANK_COLUMN,
        "best_rank": best,
        "hit1": bool(culprits) and best <= 1,
        "hit3": bool(culprits) and best <= 3,
        "n_named": int(named.sum()),
        "n_backend": backend,  # named as the backend's (their cause starts "backend")
        "scoring": VERSION,
        "named": " | ".join(f"{int(ranks[i])}:{names[i]}" for i in order.index[:5]),
        "culprit_in_table": bool(in_table),
    }


def sqnr_db(golden: np.ndarray, target: np.ndarray) -> float:
    g, t = np.asarray(golden, np.float64).ravel(), np.asarray(target, np.float64).ravel()
    noise = float(np.sum((g - t) ** 2))
    return math.inf if noise == 0 else 10.0 * math.log10(max(float(np.sum(g**2)), 1e-30) / noise)


ALGORITHM_ORDER = ("oneshot", "layerwise", "cumulative", "aimet_enabled", "aimet_disabled")


LOSS_BANDS = ((3.0, math.inf, ">= 3 dB"), (1.0, 3.0, "1-3 dB"), (-math.inf, 1.0, "< 1 dB"))


def summary_table(rows: pd.DataFrame, kinds: Sequence[str]) -> pd.DataFrame:
    """Per algorithm and fault kind: cases, hit@1, hit@3, and hit@3 by what the fault costs the
    outputs on QNN (``out_loss_db``: >= 3 dB, 1-3 dB, < 1 dB); clean: false alarms (a clean
    case where some layer is ranked)."""
    out = []
    algos = [a for a in ALGORITHM_ORDER if a in set(rows["algorithm"])]
    loss = pd.to_numeric(rows.get("out_loss_db", pd.Series(math.nan, index=rows.index)))
    for algo in algos:
        mine = rows[rows["algorithm"] == algo]
        groups = [(k, mine[mine["kind"] == k]) for k in kinds if k != "clean"]
        groups.append(("**all faults**", mine[mine["kind"] != "clean"]))
        groups.append(("clean", mine[mine["kind"] == "clean"]))
        for kind, grp in groups:
            if grp.empty:
                continue
            done = grp[grp["status"] == "ok"]
            n = len(done)
            row = {"algorithm": algo, "fault kind": kind, "cases": n}
            if kind == "clean":
                alarms = int((done["n_named"] > 0).sum() - len(real_backend(done)))
                row |= {"hit@1": "", "hit@3": ""} | {
                    f"hit@3, outputs lose {b[2]}": "" for b in LOSS_BANDS
                }
                row["false alarms"] = f"{alarms}/{n}"
            else:
                row["hit@1"] = _pct(int(done["hit1"].sum()), n)
                row["hit@3"] = _pct(int(done["hit3"].sum()), n)
                for lo, hi, label in LOSS_BANDS:
                    band = done[(loss[done.index] >= lo) & (loss[done.index] < hi)]
                    row[f"hit@3, outputs lose {label}"] = _pct(int(band["hit3"].sum()), len(band))
                row["false alarms"] = ""
            row["failed runs"] = len(grp) - n
            out.append(row)
    return pd.DataFrame(out)


def real_backend(clean: pd.DataFrame) -> pd.DataFrame:
    """Clean runs that named only backend culprits on a model whose outputs lose ``HARM_DB``
    or more on QNN against the CPU fake-quant of the same QDQ model (measured apart, by
    :class:`benchmarks.zoo.harm.HarmMeter`): the shipped model has a backend divergence of
    its own, and naming it is no false alarm."""
    gap = pd.to_numeric(clean.get("backend_gap_db", pd.Series(math.nan, index=clean.index)))
    backend = pd.to_numeric(clean.get("n_backend", pd.Series(0, index=clean.index))).fillna(0)
    named = clean["n_named"]
    return clean[(named > 0) & (backend == named) & (gap >= HARM_DB)]


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """Hit flags and named counts typed, a failed row counting as no hit."""
    for col in ("hit1", "hit3"):
        df[col] = df[col].fillna(False).astype(bool) if col in df else False
    df["n_named"] = pd.to_numeric(df.get("n_named", 0), errors="coerce").fillna(0).astype(int)
    return df


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k}/{n})" if n else "-"
