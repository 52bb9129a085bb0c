"""The checker's tables: one row per tensor and variant, one table per check, and the summary
that ranks the tensors no setting quantizes well.

A tensor *fails* a variant when its SQNR is below the threshold (26 dB by default, as in
Qualcomm's checker), taken as the lowest of the whole-tensor SQNR, the median channel's and,
for a weight, the median input channel's: an outlier's own power dominates a whole-tensor
score (the tensor looks healthy while every other value keeps a few levels), so the median
channel speaks for the rest - the median output channel when the outlier is one output
channel, the median input channel when it is one input channel (it then sits in every output
channel, and per-channel weights do not help). The other checks (min/max against the encoding, the largest round-trip
difference, the share of the encoding's range the data uses, the distribution's shape) say
why, in the ``cause`` column.

Culprits are the tensors failing in at least one variant, ranked by the number of variants
they fail (most first), then by their worst SQNR (lowest first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from accdbg.algorithms.quant_checker.collect import Checked
from accdbg.reports.chart import CAUSE, RANK

SQNR_THRESHOLD = 26.0
CHECKED = "SQNR checked"  # min(SQNR, ch_median, in_median): the value the threshold judges
STATS = [
    "min",
    "max",
    "mean",
    "std",
    "skew",
    "kurtosis",
    "outlier_%",
    "peak_over_p99.9",
    "channel_range_ratio",
    "input_channel_range_ratio",
]
# check name -> the columns of its long table (besides Name, kind, variant)
CHECKS = {
    "sqnr": [
        "SQNR",
        "SQNR ch_median",
        "SQNR ch_worst",
        "SQNR in_median",
        CHECKED,
        "threshold",
        "pass",
    ],
    "min_max": ["min", "max", "enc_min", "enc_max", "min_diff", "max_diff", "clipped_%"],
    "max_diff": ["max_abs_diff", "max_abs_diff_steps", "scale"],
    "range_use": ["range_used_%", "levels_used", "bitwidth", "encoding"],
    "distribution": [
        "mean",
        "std",
        "skew",
        "kurtosis",
        "outlier_%",
        "peak_over_p99.9",
        "channel_range_ratio",
        "input_channel_range_ratio",
    ],
}


def _range_use(c: Checked, v: str) -> tuple[float, float, float, float]:
    """(share of the encoding's range the data spans in %, quantization steps it spans,
    encoding min, encoding max); per channel: the median channel's share and steps."""
    g, m = c.grids[v], c.moments
    lo, hi = g.channel_ends()
    if g.per_channel and m.ch_min is not None and m.ch_min.size == lo.size:
        span = m.ch_max - m.ch_min
        share = np.median(span / np.where(hi > lo, hi - lo, np.nan))
        steps = np.median(span / g.scale.reshape(-1))
    else:
        span = m.max - m.min
        share = span / (float(hi.max()) - float(lo.min()))
        steps = span / float(g.scale.reshape(-1)[0])
    return 100.0 * float(share), float(steps), float(lo.min()), float(hi.max())


def variant_rows(tensors: Sequence[Checked], variant: str, threshold: float) -> pd.DataFrame:
    """Every check of every tensor under one variant."""
    rows = []
    for c in tensors:
        if variant not in c.grids or c.moments is None or c.moments.n == 0:
            continue
        g = c.grids[variant]
        stats = c.moments.summary()
        err = c.errors[variant].summary()
        views = [err[k] for k in ("SQNR", "SQNR ch_median", "SQNR in_median")]
        checked = min(x for x in views if not math.isnan(x))
        share, steps, enc_lo, enc_hi = _range_use(c, variant)
        dq_lo = float(g.qdq(np.full(g.scale.shape, stats["min"])).min())
        dq_hi = float(g.qdq(np.full(g.scale.shape, stats["max"])).max())
        rows.append(
            {
                "Name": c.name,
                "kind": c.kind,
                "LayerType": c.op_type,
                "node": c.node,
                "Tensor_dims": list(c.shape),
                "variant": variant,
                **stats,
                "enc_min": enc_lo,
                "enc_max": enc_hi,
                "min_diff": dq_lo - stats["min"],
                "max_diff": stats["max"] - dq_hi,
                **err,
                CHECKED: checked,
                "threshold": threshold,
                "pass": bool(checked >= threshold),
                "range_used_%": share,
                "levels_used": steps,
                "scale": float(g.scale.reshape(-1)[0]) if not g.per_channel else math.nan,
                "bitwidth": g.bitwidth,
                "encoding": g.describe(),
            }
        )
    return pd.DataFrame(rows)


def check_table(per_variant: dict[str, pd.DataFrame], check: str) -> pd.DataFrame:
    """One check over every variant, long form: Name, kind, variant, the check's columns."""
    cols = ["Name", "kind", "LayerType", "variant", *CHECKS[check]]
    frames = [df[[c for c in cols if c in df.columns]] for df in per_variant.values() if len(df)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def summary_table(
    tensors: Sequence[Checked], per_variant: dict[str, pd.DataFrame], threshold: float
) -> pd.DataFrame:
    """One row per tensor: each variant's SQNR, how many variants it fails, the worst,
    the distribution, ``culprit_rank`` and ``cause``."""
    variants = list(per_variant)
    by_v = {v: df.set_index("Name") for v, df in per_variant.items() if len(df)}
    rows = []
    for c in tensors:
        if c.moments is None or c.moments.n == 0:
            rows.append(
                {
                    "Name": c.name,
                    "kind": c.kind,
                    "LayerType": c.op_type,
                    "Status": c.note or "not checked",
                }
            )
            continue
        row = {
            "Name": c.name,
            RANK: math.nan,
            CAUSE: "",
            "kind": c.kind,
            "LayerType": c.op_type,
            "node": c.node,
            "Tensor_dims": list(c.shape),
        }
        scores = {}
        for v in variants:
            if v in by_v and c.name in by_v[v].index:
                scores[v] = float(by_v[v].loc[c.name, CHECKED])
                row[f"SQNR {v}"] = scores[v]
        failing = [v for v, s in scores.items() if s < threshold]
        worst_v = min(scores, key=lambda v: scores[v]) if scores else ""
        row.update(
            {
                "fails_in": len(failing),
                "variants": len(scores),
                "failing_variants": ", ".join(failing),
                "worst_variant": worst_v,
                "worst SQNR": scores.get(worst_v, math.nan),
                "best_variant": max(scores, key=lambda v: scores[v]) if scores else "",
            }
        )
        if worst_v:
            w = by_v[worst_v].loc[c.name]
            row.update(
                {
                    "clipped_% (worst)": float(w["clipped_%"]),
                    "range_used_% (worst)": float(w["range_used_%"]),
                    "max_abs_diff_steps (worst)": float(w["max_abs_diff_steps"]),
                }
            )
        row.update({k: v for k, v in c.moments.summary().items()})
        row["Status"] = "fail" if failing else "ok"
        rows.append(row)
    full = next((r for r in rows if "fails_in" in r), rows[0] if rows else {})
    columns = [c for c in full if c != "Status"]
    columns += [c for r in rows for c in r if c not in columns and c != "Status"]
    df = pd.DataFrame(rows, columns=list(dict.fromkeys(columns)) + ["Status"])
    if not len(df):
        return df
    df[RANK] = pd.array([pd.NA] * len(df), dtype="Int64")
    cand = df[df.get("fails_in", pd.Series(0, index=df.index)).fillna(0) > 0]
    order = cand.sort_values(["fails_in", "worst SQNR"], ascending=[False, True]).index
    for rank, i in enumerate(order, start=1):
        df.at[i, RANK] = rank
        df.at[i, CAUSE] = cause(
            tensors_by_name(tensors)[df.at[i, "Name"]], df.loc[i], by_v, threshold
        )
    df[CAUSE] = df[CAUSE].fillna("")
    return df


def tensors_by_name(tensors: Sequence[Checked]) -> dict[str, Checked]:
    return {c.name: c for c in tensors}


def cause(c: Checked, row: pd.Series, by_v: dict[str, pd.DataFrame], threshold: float) -> str:
    """Why a failing tensor fails, from the checks of its worst variant."""
    v = row["worst_variant"]
    w = by_v[v].loc[c.name]
    g = c.grids[v]
    what = {"weight": "weight range", "bias": "bias range"}.get(c.kind, "activation range")
    stats = c.moments.summary()
    parts = []
    ratio = stats["channel_range_ratio"]
    ch = c.moments.widest_channel()
    if ratio == ratio and ratio >= 8 and ch is not None:
        axis_name = "output channel" if c.kind == "weight" else "channel"
        parts.append(f"{axis_name} {ch} spans {ratio:.3g}x the median channel's range")
    in_ratio = stats["input_channel_range_ratio"]
    in_ch = c.moments.widest_channel(inputs=True)
    if in_ratio == in_ratio and in_ratio >= 8 and in_ch is not None and not parts:
        parts.append(
            f"input channel {in_ch} spans {in_ratio:.3g}x the median input channel's range"
        )
    peak = stats["peak_over_p99.9"]
    if peak == peak and peak >= 8 and not parts:
        parts.append(f"its largest value is {peak:.3g}x the 99.9th percentile of |values|")
    if float(w["clipped_%"]) >= 0.1:
        parts.append(f"clipping: {float(w['clipped_%']):.3g}% of values outside the encoding")
    if not parts:
        parts.append(
            f"the data spans {float(w['levels_used']):.3g} quantization steps"
            f" (kurtosis {stats['kurtosis']:.3g})"
        )
    fixed = row.get("best_variant", "")
    fixed_note = ""
    best = float(row.get(f"SQNR {fixed}", math.nan)) if fixed else math.nan
    if fixed and best >= threshold:
        fixed_note = f"; {fixed} quantizes it ({best:.3g} dB)"
    ranges = [p for p in parts if not p.startswith("clipping")]
    clipping = [p for p in parts if p.startswith("clipping")]
    body = "; ".join(([f"{what}: " + "; ".join(ranges)] if ranges else []) + clipping)
    return (
        f"{body}; {v} ({g.describe()}): SQNR {float(w[CHECKED]):.3g} dB "
        f"(fails in {int(row['fails_in'])} of {int(row['variants'])} variants){fixed_note}"
    )


def findings(
    summary: pd.DataFrame, variants: Sequence[str], threshold: float, top: int = 3
) -> list[str]:
    """The verdict lines: what fails everywhere, the culprits, the best variant."""
    out: list[str] = []
    if not len(summary) or "fails_in" not in summary.columns:
        return ["no tensor was checked"]
    checked = summary[summary["fails_in"].notna()]
    n_var = len(variants)
    everywhere = checked[checked["fails_in"] >= n_var]
    if len(everywhere):
        names = ", ".join(everywhere.sort_values("worst SQNR")["Name"].astype(str).head(5))
        more = f" (+{len(everywhere) - 5} more)" if len(everywhere) > 5 else ""
        out.append(
            f"{len(everywhere)} of {len(checked)} tensors fail SQNR < {threshold:g} dB in every "
            f"variant ({n_var}): {names}{more}"
        )
    ranked = checked[checked[RANK].notna()].sort_values(RANK)
    if not len(ranked):
        out.append(
            f"every tensor meets SQNR >= {threshold:g} dB in every variant ({len(checked)} tensors, {n_var} variants)"
        )
    else:
        if not len(everywhere):
            out.append(
                f"no tensor fails in every variant: each failing tensor has a setting that quantizes it "
                f"({len(ranked)} fail in at least one of {n_var})"
            )
        for _, r in ranked.head(top).iterrows():
            op = f" ({r['LayerType']} {r['kind']})" if r["LayerType"] else f" ({r['kind']})"
            out.append(f"culprit #{int(r[RANK])}: {r['Name']}{op} - {r[CAUSE]}")
    fails = {
        v: int((checked.get(f"SQNR {v}", pd.Series(dtype=float)) < threshold).sum())
        for v in variants
    }
    if fails:
        best = min(fails, key=lambda v: (fails[v], variants.index(v)))
        out.append(
            "tensors failing per variant: "
            + ", ".join(f"{v} {n}" for v, n in fails.items())
            + f"; fewest: {best}"
        )
    return out
