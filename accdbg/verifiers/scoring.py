"""One row of a verification summary: the table's columns, and the one scoring step that
fills a row from two aligned float64 arrays (every verifier, per-channel scores, notes).

Its own module because dataset mode scores arrays still in memory with the same step and
columns, and the aggregate over inputs builds on the same columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accdbg.verifiers.base import TensorPair, VerifierResult, finite_range
from accdbg.verifiers.channels import STATS, ChannelPair, channel_axis, live, summarize
from accdbg.verifiers.configured import ConfiguredVerifier

LEADING_COLUMNS = ["Name", "LayerType", "Size", "Tensor_dims"]
RANGE_COLUMNS = ["golden_min", "golden_max", "target_min", "target_max"]
EXTRA_COLUMNS = ["Status", "Failed", "Golden_name", "Layout", "Order"]


def score_pair(
    row: dict[str, Any],
    g_arr: np.ndarray,
    t_arr: np.ndarray,
    scale: float | np.ndarray | None,
    g_layout: str | None,
    verifiers: Sequence[ConfiguredVerifier],
) -> dict[str, VerifierResult]:
    """Two aligned float64 arrays through every verifier: fills the row's target range,
    per-channel scores and notes, returns each verifier's result. The one scoring step of a
    pair, whether the arrays were read from dumps or are still in memory (a dataset run)."""
    row["target_min"], row["target_max"] = finite_range(t_arr)
    pair = TensorPair(g_arr, t_arr, scale)
    results = {cv.label: cv.verifier.verify(pair) for cv in verifiers}
    if not pair.notes and not pair.problem:
        row.update(_per_channel(pair, g_arr.shape, g_layout, row["LayerType"], verifiers))
    pair_note = "; ".join(pair.notes)
    notes = list(pair.notes)
    notes += [
        f"{label}: {res.status}"
        for label, res in results.items()
        if res.status not in ("ok", pair_note)
    ]
    if notes:
        row["Status"] = "; ".join(notes)
    return results


def _per_channel(
    pair: TensorPair, shape, layout, op_type, verifiers: list[ConfiguredVerifier]
) -> dict[str, float]:
    """``<label> ch_median`` / ``ch_worst`` of every verifier that has a per-channel form."""
    axis = channel_axis(shape, layout, op_type)
    if axis is None:
        return {}
    g, t = pair.golden.reshape(shape), pair.target.reshape(shape)
    cp = ChannelPair.of(g, t, axis, pair.__dict__.get("diff"))
    alive = live(cp.gg)
    out: dict[str, float] = {}
    for cv in verifiers:
        with np.errstate(all="ignore"):
            values = cv.verifier.per_channel(cp)
        if values is not None:
            stats = summarize(values, alive, cv.verifier.higher_is_better)
            out.update({f"{cv.label} {k}": v for k, v in stats.items()})
    return out


def channel_columns(verifiers: Sequence[ConfiguredVerifier]) -> list[str]:
    """The per-channel columns of the verifiers that have a per-channel form."""
    probe = ChannelPair(np.ones((2, 1)), np.ones((2, 1)))
    return [
        f"{cv.label} {k}"
        for cv in verifiers
        if cv.tensors is None and cv.verifier.per_channel(probe) is not None
        for k in STATS
    ]


def summary_columns(verifiers: Sequence[ConfiguredVerifier]) -> list[str]:
    """A summary's columns: the reference's first, the per-channel scores after them."""
    labels = [cv.label for cv in verifiers]
    return LEADING_COLUMNS + labels + RANGE_COLUMNS + EXTRA_COLUMNS + channel_columns(verifiers)
