"""The rules that name, drop or reorder a layer: each one an id and a one-line statement.

A row of the summary (``rules`` column) and each culprit (:attr:`Culprit.rules`) say which
rules decided it, in the order they fired, so a reader can follow a verdict without reading
code. The thresholds the statements name are :class:`~accdbg.algorithms.diagnosis.policy.Policy`
fields.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    statement: str


_ALL = [
    Rule(
        "before-run",
        "a defect found in the quantized model before any run (an encoding that cannot hold "
        "its tensor, an activation the quantizer dropped) is named first",
    ),
    Rule(
        "calibration",
        "the debugged input clipped at a graph input or at coverage_layers layers names the "
        "calibration: its encodings were made for other data",
    ),
    Rule(
        "standout",
        "a layer whose own encodings lose far more than the model's noise floor (z_min spreads "
        "and gap_db under it, and under abs_db), or clip clip_ratio times the median layer, stands out",
    ),
    Rule(
        "carried",
        "a standout whose outlier came in with its input is its source's carrier: the source is measured",
    ),
    Rule(
        "matters",
        "a standout is named when it costs the outputs share of their error (alone, taken out, "
        "or with the layers its outlier blows)",
    ),
    Rule(
        "lone",
        "the model's only standout is named from lone_share of the outputs' error",
    ),
    Rule(
        "destroyed",
        "a standout under destroyed_db (its information gone) is named from min_share, whatever masks it",
    ),
    Rule(
        "small",
        "a standout costing the outputs under its bar is measured, not named",
    ),
    Rule(
        "masked",
        "a standout whose quantizers, taken out of the quantized model, remove under its bar is "
        "not named: its fix alone would not show",
    ),
    Rule(
        "trained-spread",
        "a standout losing only the rounding of encodings over channels spread as trained is "
        "not named: a change of the model's encodings answers it",
    ),
    Rule(
        "outlier-weights",
        "a layer with a few weights blown_ratio times the rest is named when the model without "
        "them loses share of the outputs' error",
    ),
    Rule(
        "amplifier",
        "a layer whose error jumps because it amplifies its input's rounding (a Log, a "
        "reciprocal) names that input",
    ),
    Rule(
        "backend",
        "a layer whose QNN result is backend_db beyond what its encodings, its inputs and the "
        "CPU fake-quant explain is the kernel's, named when that difference costs share",
    ),
    Rule(
        "upstream-first",
        "an upstream culprit costing share itself goes before the layers its outlier blows",
    ),
    Rule("ordered", "culprits are ordered by what they were measured to cost the outputs"),
    Rule("past-max", "past max_culprits culprits, a layer is not ranked: fix those first"),
    Rule(
        "confirmed",
        "a culprit is named only when its region kept in fp16 on QNN HTP gains confirm_db at "
        "the outputs; its fix is the cheapest change within within_db of that",
    ),
    Rule(
        "unconfirmed",
        "a layer the CPU measures named whose region in fp16 gains under confirm_db on QNN is not named",
    ),
]
RULES: dict[str, Rule] = {r.id: r for r in _ALL}


def rule(rule_id: str) -> Rule:
    """The rule of that id (a typo is a bug: it raises)."""
    return RULES[rule_id]
