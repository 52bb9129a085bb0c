"""The ranking's measures: the noise floor a layer stands out from, the shares of the outputs'
error that make it matter, the table's columns, and how figures are said."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.sensitivity import Share
from accdbg.core.shares import share_words

# layerwise's runs of a layer in context (after its producers, as HTP fuses them): its SQNR
# there and its worst input's, columns of layerwise.csv the ranking reads back
CONTEXT = "in-context SQNR"
CONTEXT_IN = "in-context input SQNR"

RANK = "culprit_rank"
CAUSE = "cause"
LOCAL = "local SQNR"
SHARE_COL = "output error share"
REMOVED_COL = "output error removed"
# a standout measured again with the layers it hurts the outputs with (its outlier's carriers,
# a compensated pair's other half): what they cost together
PARTNERS_COL = "output error with partners"
KIND_COL = "culprit_kind"  # what a culprit loses (diagnosis.culprit.KINDS): what its fix aims at
VERIFIED_FIX = "verified_fix"  # the cheapest change QNN HTP measured to fix it
VERIFIED_GAIN = "verified_gain_db"  # that change's gain of the outputs' SQNR on QNN, dB
RULES_COL = "rules"  # the ranking rules that decided the row (diagnosis.rules)
TEXT_COLUMNS = (CAUSE, KIND_COL, VERIFIED_FIX, RULES_COL)
COLUMNS = (
    RANK,
    CAUSE,
    KIND_COL,
    VERIFIED_FIX,
    VERIFIED_GAIN,
    RULES_COL,
    LOCAL,
    "weight SQNR",
    "output quant SQNR",
    "clipped %",
    SHARE_COL,
    REMOVED_COL,
    PARTNERS_COL,
)


class Impact(Protocol):
    """This layer's (or this group's) part of the outputs' error: with only its encodings
    applied, and removed when only its quantizers are taken out (NaN when not measured)."""

    def __call__(self, names: str | Sequence[str], enough: float = ...) -> Share:
        """``enough``: a first measure at or above it settles the verdict (the second, which
        costs a run of the QDQ model, may be skipped)."""


def cpu_run(quantized: bool, layer: bool = False) -> str:
    """What QNN is compared with: the CPU fake-quant of the model QNN runs, or, for a float
    model QNN runs in fp16, the CPU's float run of it (of one ``layer``, or of the model)."""
    run = "CPU fake-quant" if quantized else "CPU run"
    of = "this layer" if layer else "the same QDQ model" if quantized else "the same float model"
    return f"onnxruntime's {run} of {of}"


def robust_floor(values_db: Sequence[float]) -> tuple[float, float]:
    """Median and robust spread (1.4826 x MAD) of finite values, in dB."""
    v = np.asarray([x for x in values_db if math.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    med = float(np.median(v))
    return med, float(1.4826 * np.median(np.abs(v - med)))


def standout_cut(values_db: Sequence[float]) -> tuple[float, float, float]:
    """The floor, spread (:func:`robust_floor`) and the value under which one of ``values_db``
    stands out from the rest (:func:`standout_gap` under the floor; -inf with no finite value)."""
    floor, spread = robust_floor(values_db)
    return floor, spread, floor - standout_gap(spread) if math.isfinite(floor) else -math.inf


def _clip_bar(clipped: Sequence[float]) -> float:
    """The share of clipped values at which a layer's clipping stands out: ``POLICY.clip_min``, or
    ``POLICY.clip_ratio`` times the model's median layer when the calibration clips everywhere."""
    v = [x for x in clipped if math.isfinite(x)]
    return max(POLICY.clip_min, POLICY.clip_ratio * float(np.median(v))) if v else math.inf


def standout_gap(spread: float) -> float:
    """How far from the floor a layer must be: 3.5 robust sigmas, at least 10 dB, at most 15."""
    return min(max(POLICY.z_min * spread, POLICY.gap_db), POLICY.max_gap_db)


def compared_inputs(
    inputs_of: Mapping[str, Sequence[str]], compared: set[str]
) -> dict[str, list[str]]:
    """Each layer's nearest compared ancestors: an input that was not compared passes on its own
    inputs, so its error is never taken for the consumer's own."""
    out: dict[str, list[str]] = {}
    for name, inputs in inputs_of.items():
        found: list[str] = []
        seen: set[str] = {name}
        stack = list(inputs)[::-1]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in compared:
                found.append(x)
            else:
                stack.extend(list(inputs_of.get(x, ()))[::-1])
        out[name] = found
    return out


def _pct(x: float) -> str:
    return share_words(x)


def _both(share: Share) -> str:
    """Both measures, or the one taken (the second is skipped when the first is enough), and
    the output the larger is of when the model has several."""
    parts = [("alone", share.alone), ("taken out of the quantized model", share.removed)]
    return ", ".join(f"{k} {_pct(v)}" for k, v in parts if not math.isnan(v)) + _of(share)


def _of(share: Share) -> str:
    """The output a share is of, when the model has several ("" else)."""
    return f"; of the output {share.at}'s error" if share.at else ""


def _at(group: Share, share: Share) -> str:
    """The output a group's share is of, when not the one its layer's own share names (that
    one ends the layer's shares)."""
    return f" at the output {group.at}" if group.at and group.at != share.at else ""


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _add_cause(columns: dict[str, dict[str, object]], n: str, text: str) -> None:
    """A layer's cause, with ``text`` after what it says already."""
    col = columns.setdefault(n, {})
    col[CAUSE] = f"{col[CAUSE]}; {text}" if col.get(CAUSE) else text
