"""Judging a layer: its output from a part against its golden value, as a report row.

A row is a dict with the report columns plus private fields (``_position``, ``_values``,
``_passed``) the reports, the checkpoint and the partition decisions use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from accdbg.algorithms.fragments import Layer
from accdbg.algorithms.golden import Golden, GoldenError
from accdbg.algorithms.statuses import ERR_COMPARE, OK
from accdbg.errors import AccdbgError
from accdbg.verifiers import get_verifier
from accdbg.verifiers.base import TensorPair, Verifier

CPU_INFO = "ran on the CPU"  # the Info of a layer QNN left on the CPU


@dataclass
class Judge:
    """The verifiers, labelled as report columns."""

    verifiers: dict[str, Verifier]

    @classmethod
    def from_specs(cls, specs: Sequence[Any]) -> Judge:
        out: dict[str, Verifier] = {}
        for spec in specs:
            v = get_verifier(spec)
            if v.tensors_per_side != 1:
                raise AccdbgError(
                    f"verifier {v.name} compares several tensors per side; layerwise snooping "
                    "compares one layer output at a time: choose e.g. CosineSimilarity"
                )
            label = v.name if v.name not in out else v.label
            out[label] = v
        if not out:
            raise AccdbgError("no verifier: give at least one, e.g. CosineSimilarity")
        return cls(out)

    @property
    def labels(self) -> list[str]:
        return list(self.verifiers)

    def mark(self, label: str) -> str:
        v = self.verifiers[label]
        if v.pass_mark is None:
            return "no threshold"
        return f"pass {'>=' if v.higher_is_better else '<='} {v.pass_mark:g}"

    def scores(
        self, golden: np.ndarray, target: np.ndarray, scale: float | None
    ) -> tuple[dict, dict, list[str]]:
        """Values, verdicts and notes of every verifier on one pair."""
        pair = TensorPair(golden, target, scale)
        values, passed, notes = {}, {}, list(pair.notes)
        for label, v in self.verifiers.items():
            res = v.verify(pair)
            values[label] = res.value
            passed[label] = res.passed
            if res.status not in ("ok", "; ".join(pair.notes)):
                notes.append(f"{label}: {res.status}")
        return values, passed, notes


def _num(v: float) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"


def base_row(layer: Layer, shape: Sequence[int] | None, status: str = OK) -> dict[str, Any]:
    return {
        "O/P Name": layer.name,
        "Status": status,
        "Layer Type": layer.op_type,
        "Shape": list(shape) if shape is not None else None,
        "Activations": "",
        "Info": "",
        "_position": layer.position,
        "_passed": {},
        "_values": {},
    }


def judge_layer(
    layer: Layer, values: np.ndarray, golden: Golden, judge: Judge, cpu: bool = False
) -> dict[str, Any]:
    """One report row: the layer's output from a part against its golden value."""
    target = layer.dequantize(values)
    row = base_row(layer, target.shape)
    info: list[str] = [f"{CPU_INFO}: QNN did not take this node"] if cpu else []
    try:
        g = golden.load(layer.exposed.qdq_tensor, None, layer.name)
    except GoldenError as exc:
        row["Status"], row["Info"] = ERR_COMPARE, "; ".join([*info, str(exc)])
        return row
    if g.size != target.size:
        row["Status"] = ERR_COMPARE
        row["Info"] = "; ".join(
            [*info, f"golden has {g.size} values, the backend output {list(target.shape)}"]
        )
        return row
    g = np.asarray(g, dtype=np.float64).reshape(target.shape)
    finite = g[np.isfinite(g)]
    if finite.size:
        row["Activations"] = f"[{finite.min():.4g}, {finite.max():.4g}, {np.median(finite):.4g}]"
    vals, passed, notes = judge.scores(g, target, layer.exposed.scale)
    row["_values"], row["_passed"] = vals, passed
    for label in judge.labels:
        row[label] = vals[label]
        if passed[label] is False:
            info.append(f"{label} {_num(vals[label])} fails ({judge.mark(label)})")
    info += notes
    if all(isinstance(v, float) and math.isnan(v) for v in vals.values()):
        row["Status"] = ERR_COMPARE
    row["Info"] = "; ".join(info)
    return row


def failing(row: dict[str, Any]) -> bool:
    return any(p is False for p in row.get("_passed", {}).values())


def error_row(layer: Layer, status: str, message: str, shape=None) -> dict[str, Any]:
    row = base_row(layer, shape, status)
    row["Info"] = message.splitlines()[0] if message else ""
    return row


def finalize_row(row: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint/JSON-safe copy (NaN and infinities as strings)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float | np.floating) and not math.isfinite(float(v)):
            out[k] = str(float(v))
        elif isinstance(v, dict):
            out[k] = {
                kk: (
                    str(float(vv))
                    if isinstance(vv, float | np.floating) and not math.isfinite(float(vv))
                    else vv
                )
                for kk, vv in v.items()
            }
        elif isinstance(v, np.generic):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def restore_row(row: dict[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    out = dict(row)
    for label in labels:
        v = out.get(label)
        out[label] = float(v) if isinstance(v, str) else (math.nan if v is None else v)
    out["_values"] = {
        k: float(v) if isinstance(v, str) else v for k, v in out.get("_values", {}).items()
    }
    return out


def orig_outputs_text(scores: dict[str, dict[str, float]]) -> str:
    """``{"output": {"CosineSimilarity": 0.99}}`` as the reference prints the column."""
    return json.dumps(
        {
            k: {
                kk: (round(vv, 6) if isinstance(vv, float) and math.isfinite(vv) else str(vv))
                for kk, vv in v.items()
            }
            if isinstance(v, dict)
            else v
            for k, v in scores.items()
        }
    )
