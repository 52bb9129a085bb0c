"""Where the backend parts from the quantization: QNN against onnxruntime's CPU fake-quant.

The same QDQ model runs on onnxruntime's CPU provider (every QuantizeLinear/DequantizeLinear
executed as written, in float) with every layer output exposed exactly as the QNN dump exposes it.
Both sides carry the same quantization; they differ by the kernels' rounding, which adds up
slowly along the graph. A layer where the QNN result suddenly parts from the CPU one, far
more than at its inputs, is a backend matter: fine in fake-quant, wrong on HTP.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from accdbg.core import onnx_model as om
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines.exposure import Exposed
from accdbg.verifiers.base import dot

log = logging.getLogger("accdbg.divergence")


def divergence(
    qdq_model: onnx.ModelProto,
    layers: Sequence[Exposed],
    feeds: Mapping[str, np.ndarray],
    target: TensorFolder,
) -> dict[str, float]:
    """Per layer: ``Σ(qnn - cpu)² / Σcpu²`` for every layer dumped in ``target``."""
    wanted = [e for e in layers if e.name in target]
    outputs = list(dict.fromkeys(e.graph_tensor for e in wanted))
    model = om.with_outputs(qdq_model, outputs)
    # every Q/DQ executed as written (no fusion into QLinear kernels): the exact fake-quant
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values = dict(zip(outputs, sess.run(outputs, dict(feeds)), strict=True))
    out: dict[str, float] = {}
    for e in wanted:
        cpu = np.asarray(e.dequantize(values[e.graph_tensor]), np.float64).ravel()
        try:
            qnn = np.asarray(target.load(e.name), np.float64).ravel()
        except Exception:  # unreadable dump: no verdict for this layer
            continue
        if qnn.size != cpu.size or not (np.isfinite(qnn).all() and np.isfinite(cpu).all()):
            continue
        d = qnn - cpu
        ss, dd = dot(cpu, cpu), dot(d, d)
        out[e.name] = dd / ss if ss > 0 else (0.0 if dd == 0 else math.inf)
    return out
