"""Several inputs in one table: each layer's worst score over the inputs (with its median,
mean and the input it came from), the model's final outputs, one row per input, and the
input that scores worst.

Its own module because it works on finished per-input summaries only, never on tensors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from accdbg.core.jsonio import read_json
from accdbg.core.provenance import input_files, recorded_inputs
from accdbg.verifiers import status as row_status
from accdbg.verifiers.base import Verifier
from accdbg.verifiers.configured import ConfiguredVerifier
from accdbg.verifiers.scoring import LEADING_COLUMNS, summary_columns


def aggregate_inputs(
    per_input: dict[str, pd.DataFrame],
    verifiers: list[ConfiguredVerifier],
) -> tuple[pd.DataFrame, dict[str, list[bool | None]]]:
    """One row per layer over all inputs: each verifier's worst value (and which input), its
    median and mean, the value ranges over all inputs, and the first input's note in Status."""
    keys: list[tuple[str, Any]] = []
    stacked = []
    for name, df in per_input.items():
        d = df.assign(_input=name, _key=list(zip(df["Name"], df["Golden_name"], strict=True)))
        stacked.append(d)
        for k in d["_key"]:
            if k not in keys:
                keys.append(k)
    all_rows = pd.concat(stacked, ignore_index=True)
    rows = []
    passed: dict[str, list[bool | None]] = {cv.label: [] for cv in verifiers}
    groups = dict(tuple(all_rows.groupby("_key", sort=False)))
    for key in keys:
        grp = groups[key]
        first = grp.iloc[0]
        row = {c: first[c] for c in LEADING_COLUMNS}
        failed = []
        failed_somewhere = {f for cell in grp["Failed"] for f in row_status.split_failed(cell)}
        for cv in verifiers:
            vals = grp[cv.label].astype(float)
            finite = vals.dropna()
            if finite.empty:
                worst, worst_in, mean, median = math.nan, None, math.nan, math.nan
            else:
                pos = finite.idxmin() if cv.verifier.higher_is_better else finite.idxmax()
                worst, worst_in = float(finite[pos]), grp.loc[pos, "_input"]
                with np.errstate(invalid="ignore"):
                    mean = float(np.mean(finite.to_numpy()))
                    median = float(np.median(finite.to_numpy()))
            row[cv.label] = worst
            for col in [c for c in grp.columns if c.startswith(f"{cv.label} ch_")]:
                vals = grp[col].astype(float).dropna()
                pick = vals.min() if cv.verifier.higher_is_better else vals.max()
                row[col] = float(pick) if not vals.empty else math.nan
            row[f"{cv.label}_median"] = median
            row[f"{cv.label}_mean"] = mean
            row[f"{cv.label}_worst_input"] = worst_in
            verdict = cv.verifier.judge(worst) if not math.isnan(worst) else None
            if cv.label in failed_somewhere:  # e.g. NaN on one input fails it whatever the values
                verdict = False
            passed[cv.label].append(verdict)
            if verdict is False:
                failed.append(cv.label)
        row["golden_min"] = grp["golden_min"].min()
        row["golden_max"] = grp["golden_max"].max()
        row["target_min"] = grp["target_min"].min()
        row["target_max"] = grp["target_max"].max()
        noted = [
            (i, row_status.note(st)) for i, st in zip(grp["_input"], grp["Status"], strict=True)
        ]
        first_note = next((f"{i}: {n}" for i, n in noted if n), "")
        row["Status"] = row_status.compose(failed, [first_note])
        row["Failed"] = ", ".join(failed)
        row["Golden_name"] = first["Golden_name"]
        row["Layout"] = first["Layout"]
        row["Order"] = len(rows)
        row["Inputs"] = int(len(grp))
        rows.append(row)
    columns = (
        summary_columns(verifiers)
        + ["Inputs"]
        + [f"{cv.label}_{s}" for cv in verifiers for s in ("median", "mean", "worst_input")]
    )
    return pd.DataFrame(rows, columns=columns), passed


def final_outputs(
    per_input: Mapping[str, pd.DataFrame],
    outputs: Sequence[str] | None,
    graph_struct: str | os.PathLike | None,
) -> list[str]:
    """The rows that are the model's final outputs: ``outputs`` when given, else the graph
    structure's tensors no layer consumes, else the last row."""
    names = list(next(iter(per_input.values()))["Name"])
    if outputs:
        found = [n for n in outputs if n in names]
        if found:
            return found
    if graph_struct is not None:
        data = read_json(graph_struct, "--graph_struct")
        layers = data.get("layers", []) if isinstance(data, dict) else data
        consumed = {i for layer in layers for i in layer.get("inputs", []) or []}
        sinks = [o for layer in layers for o in layer.get("outputs", []) or [] if o not in consumed]
        found = [n for n in names if n in set(sinks)]
        if found:
            return found
    return names[-1:]


def inputs_table(
    per_input: Mapping[str, pd.DataFrame],
    metas: Mapping[str, tuple[Mapping, Mapping]],
    outputs: Sequence[str],
    verifiers: Sequence[ConfiguredVerifier],
) -> pd.DataFrame:
    """One row per input: its files and each final output's score per verifier."""
    rows = []
    for key, df in per_input.items():
        g_meta, t_meta = metas[key]
        files = recorded_inputs(t_meta) or recorded_inputs(g_meta)
        row: dict[str, Any] = {"Input": key, "Files": input_files(files) or "(not recorded)"}
        by_name = df.drop_duplicates("Name").set_index("Name")
        for out in outputs:
            for cv in verifiers:
                if cv.label in by_name.columns and out in by_name.index:
                    row[f"{out} {cv.label}"] = by_name.loc[out, cv.label]
        rows.append(row)
    return pd.DataFrame(rows)


def worst_input(table: pd.DataFrame, verifiers: Mapping[str, Verifier]) -> str:
    """The input whose final outputs score worst on the first verifier (label -> verifier)
    that scored them."""
    return inputs_worst_first(table, verifiers)[0]


def inputs_worst_first(table: pd.DataFrame, verifiers: Mapping[str, Verifier]) -> list[str]:
    """The inputs, those whose final outputs score worst first, on the first verifier (label ->
    verifier) that scored them (in the table's order when none did)."""
    for label, verifier in verifiers.items():
        cols = [c for c in table.columns if c.endswith(f" {label}")]
        if not cols:
            continue
        scores = table[cols].apply(pd.to_numeric, errors="coerce")
        per_row = scores.min(axis=1) if verifier.higher_is_better else scores.max(axis=1)
        if per_row.isna().all():
            continue
        order = per_row.sort_values(ascending=verifier.higher_is_better, na_position="last")
        return [str(table.loc[pos, "Input"]) for pos in order.index]
    return [str(x) for x in table["Input"]]
