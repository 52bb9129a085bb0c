"""From an algorithm's table to the zoo's figures: ranks of the culprit rows, hits, false alarms.

accdbg's tables carry a ``culprit_rank`` column (1 = most likely culprit; empty = not a
culprit). Until that column exists, :func:`provisional_ranks` derives a stand-in from the
columns the tables have today; it is labelled "provisional" everywhere and is the only place
that knows about those columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

NAME_COLUMN = {"oneshot": "Name", "layerwise": "O/P Name", "cumulative": "O/P Name"}
RANK_COLUMN = "culprit_rank"


def provisional_ranks(algorithm: str, table: pd.DataFrame) -> pd.Series:
    """PROVISIONAL, to delete when ``culprit_rank`` lands (issue #12).

    oneshot: the order of the ``largest_drop`` marks of SQNR (the three layers adding the most
    noise-to-signal power, ``SQNR error added``), cosine's when SQNR is absent.
    layerwise / cumulative: the layers failing their verifier, worst score first, top three.
    """
    ranks = pd.Series(np.nan, index=table.index, dtype=float)
    if algorithm == "oneshot":
        marks = table.get("largest_drop", pd.Series("", index=table.index)).fillna("").astype(str)
        for label in ("SQNR", "CosineSimilarity"):
            found = False
            for i, text in marks.items():
                for part in text.split(";"):
                    part = part.strip()
                    if part.startswith(f"{label} #"):
                        ranks[i] = float(part.split("#")[1])
                        found = True
            if found:
                return ranks
        return ranks
    if "CosineSimilarity" in table.columns:
        col, worst_first = "CosineSimilarity", True
    elif "SQNR" in table.columns:
        col, worst_first = "SQNR", True
    else:
        return ranks
    status = table.get("Status", pd.Series("", index=table.index)).fillna("").astype(str)
    ok = status.isin(["", "ok", "part", "nan"])  # judged normally (part: cumulative's cut)
    info = table.get("Info", pd.Series("", index=table.index)).fillna("").astype(str)
    failing = ok & info.str.contains(f"{col} .* fails", regex=True)
    scores = pd.to_numeric(table[col], errors="coerce")
    order = scores[failing].sort_values(ascending=worst_first).index[:3]
    for r, i in enumerate(order, start=1):
        ranks[i] = float(r)
    return ranks


def ranks_of(algorithm: str, table: pd.DataFrame) -> tuple[pd.Series, str]:
    """Each row's culprit rank (NaN = not named) and where it came from."""
    if RANK_COLUMN in table.columns:
        ranks = pd.to_numeric(table[RANK_COLUMN], errors="coerce")
        return ranks.astype("Float64").astype(float), RANK_COLUMN  # nullable Int64 -> NaN
    return provisional_ranks(algorithm, table), "provisional"


def score(algorithm: str, table: pd.DataFrame, culprits: Sequence[str]) -> dict:
    """Where the culprit rows rank, and what was named."""
    names = table[NAME_COLUMN[algorithm]].astype(str)
    ranks, source = ranks_of(algorithm, table)
    named = ranks.notna()
    order = ranks[named].sort_values()
    in_table = [c for c in culprits if c in set(names)]
    culprit_ranks = [float(ranks[i]) for i in names.index if names[i] in set(culprits)]
    culprit_ranks = [r for r in culprit_ranks if not math.isnan(r)]
    best = min(culprit_ranks) if culprit_ranks else math.nan
    return {
        "ranking": source,
        "best_rank": best,
        "hit1": bool(culprits) and best <= 1,
        "hit3": bool(culprits) and best <= 3,
        "n_named": int(named.sum()),
        "named": " | ".join(f"{int(ranks[i])}:{names[i]}" for i in order.index[:5]),
        "culprit_in_table": bool(in_table),
    }


def sqnr_db(golden: np.ndarray, target: np.ndarray) -> float:
    g, t = np.asarray(golden, np.float64).ravel(), np.asarray(target, np.float64).ravel()
    noise = float(np.sum((g - t) ** 2))
    return math.inf if noise == 0 else 10.0 * math.log10(max(float(np.sum(g**2)), 1e-30) / noise)


ALGORITHM_ORDER = ("oneshot", "layerwise", "cumulative")


def summary_table(rows: pd.DataFrame, kinds: Sequence[str]) -> pd.DataFrame:
    """Per algorithm and fault kind: cases, hit@1, hit@3, how many faults hurt QNN's result and
    hit@3 among those; clean: false alarms (a clean case where some layer is ranked)."""
    out = []
    algos = [a for a in ALGORITHM_ORDER if a in set(rows["algorithm"])]
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
                alarms = int((done["n_named"] > 0).sum())
                row |= {"hit@1": "", "hit@3": "", "QNN hurt": "", "hit@3 where hurt": ""}
                row["false alarms"] = f"{alarms}/{n}"
            else:
                hurt = done[done["hurts"].fillna(False).astype(bool)]
                row["hit@1"] = _pct(int(done["hit1"].sum()), n)
                row["hit@3"] = _pct(int(done["hit3"].sum()), n)
                row["QNN hurt"] = f"{len(hurt)}/{n}"
                row["hit@3 where hurt"] = _pct(int(hurt["hit3"].sum()), len(hurt))
                row["false alarms"] = ""
            row["failed runs"] = len(grp) - n
            out.append(row)
    return pd.DataFrame(out)


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}% ({k}/{n})" if n else "-"
