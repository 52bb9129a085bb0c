"""Order the layers of one suspect group by what their own encodings destroy.

Binary snooping stops at a subgraph of several ops and the dissection at an iteration that
added several nodes: the backend says the error is among them, not which. Each one's local
quantization evidence (:mod:`~accdbg.algorithms.diagnosis.evidence`: weights and output quantized with
their own encodings against the golden values; numpy, no backend) orders them, so the ranks
inside a group are not arbitrary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder, float_weights_of, nsr_db
from accdbg.algorithms.fragments import Layer, QdqModel
from accdbg.core.tensor_store import TensorFolder

log = logging.getLogger("accdbg.snooping")


def local_nsr(
    qdq: QdqModel,
    golden: Path,
    layers: Sequence[Layer],
    float_model: Path | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Each layer's local noise-to-signal power (NaN when there is no evidence)."""
    if not layers:
        return {}
    try:
        weights = (
            float_weights_of(onnx.load(str(float_model)))
            if float_model and float_model.is_file()
            else None
        )
        builder = EvidenceBuilder(
            qdq.model,
            TensorFolder(golden),
            lambda n: n,
            weights,
            layers=[layer.exposed for layer in layers],
            graph_inputs=feeds,
        )
        return {name: ev.local_nsr for name, ev in builder.build().items()}
    except Exception as exc:  # evidence is a tie-break: without it, execution order stands
        log.info("no local evidence to order the suspects: %s", exc)
        return {}


def worst_first(names: Sequence[str], nsr: Mapping[str, float]) -> list[str]:
    """``names`` with the largest local error first; those without evidence last, in order."""

    def key(item: tuple[int, str]) -> tuple[int, float, int]:
        i, name = item
        v = nsr.get(name, math.nan)
        return (0, -v, i) if isinstance(v, float) and math.isfinite(v) else (1, 0.0, i)

    return [name for _, name in sorted(enumerate(names), key=key)]


def local_text(name: str, nsr: Mapping[str, float]) -> str:
    v = nsr.get(name, math.nan)
    return (
        f"; its own encodings: local SQNR {nsr_db(v):.1f} dB" if math.isfinite(v) and v > 0 else ""
    )
