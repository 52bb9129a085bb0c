"""Defects found in the quantized model before any run, as the culprits they are.

:mod:`accdbg.encodings.defects` finds them from the encodings alone (a mask constant no
encoding holds, a Relu the quantizer dropped); the ranking names them first, in every
algorithm, with the tensors they hit as their region.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from accdbg.algorithms.diagnosis.culprit import Culprit
from accdbg.encodings.defects import Defect, defects_path, read_defects


def defects_beside(qdq_model: Path) -> list[Defect]:
    """The defects found quantizing ``qdq_model`` (kept beside it)."""
    return read_defects(defects_path(qdq_model))


def as_culprits(defects: Sequence[Defect], op_types: dict[str, str] | None = None) -> list[Culprit]:
    """One culprit per defect, ranked in their order; a fatal one (no backend takes its
    encodings) says what the run did instead."""
    out = []
    for rank, d in enumerate(defects, start=1):
        cause = f"{d.line()}; fix: {d.fix}"
        clamp = d.extra.get("clamp")
        if d.fatal and clamp is not None:
            cause += (
                f" - QNN refuses the model as quantized (no backend takes an infinite scale); "
                f"this run clamps the constant to {clamp:g}"
            )
        elif d.fatal:
            cause += " - QNN refuses such an encoding; this run keeps these tensors in float"
        out.append(
            Culprit(
                rank,
                d.name,
                (op_types or {}).get(d.name, ""),
                cause,
                kind=d.kind,
                region=d.tensors,
                source=d.constant or d.node,
                rules=("before-run",),
            )
        )
    return out
