"""Calibration that does not cover the debugged input: a model-wide cause, named as one.

Encodings calibrated by min/max on the debugged inputs clip none of their values. When the
debugged input is clipped at its graph input's encoding, or at many layers, the encodings were
made for other data (``-qo`` encodings calibrated on dark images and debugged on normal ones,
a percentile calibration cutting a tail this input lives in): the fix is a calibration that
sees inputs like it, not a change of one layer. The verification measures recalibration on the
debugged inputs (:mod:`accdbg.algorithms.fixes.verify`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from accdbg.algorithms.diagnosis.culprit import CALIBRATION, Culprit
from accdbg.algorithms.diagnosis.evidence import Evidence
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.core.shares import share_words
from accdbg.encodings.qdq import input_quantizers


def input_clipping(qdq: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Each quantized graph input's share of values outside its encoding's range."""
    return {n: q.clipped(feeds[n]) for n, q in input_quantizers(qdq).items() if n in feeds}


def coverage_culprit(
    qdq: onnx.ModelProto,
    evidence: Mapping[str, Evidence],
    feeds: Mapping[str, np.ndarray] | None,
    rank: int,
) -> Culprit | None:
    """The calibration named as a culprit when the debugged input is clipped at a graph input
    (``POLICY.clip_min`` of its values or more) or at ``POLICY.coverage_layers`` layers."""
    inputs = {
        n: share
        for n, share in input_clipping(qdq, feeds or {}).items()
        if share >= POLICY.clip_min
    }
    layers = sorted(
        ((n, ev.clipped) for n, ev in evidence.items() if ev.clipped >= POLICY.clip_min),
        key=lambda x: -x[1],
    )
    if not inputs and len(layers) < POLICY.coverage_layers:
        return None
    said = [
        f"input {n}: {share_words(s)} of its values outside its encoding" for n, s in inputs.items()
    ]
    if layers:
        shown = ", ".join(f"{n} {share_words(s)}" for n, s in layers[:5])
        said.append(f"{len(layers)} layer(s) clip it ({shown}{' ...' if len(layers) > 5 else ''})")
    cause = (
        "calibration coverage: the encodings were not calibrated on inputs like this one - "
        + "; ".join(said)
        + "; fix: calibrate on inputs like it (the debugged inputs: min/max calibration, no -qo "
        "activation encodings)"
    )
    region = tuple([*inputs, *(n for n, _ in layers)])
    return Culprit(
        rank, region[0], "", cause, kind=CALIBRATION, region=region, rules=("calibration",)
    )
