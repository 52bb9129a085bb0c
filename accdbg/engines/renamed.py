"""Tensors the pre-processing renamed, found again in the user's model by their values.

onnxruntime's constant folding and QNN pre-processing rebuild some nodes (a fused
Unsqueeze+Concat, a Gemm between two Reshapes), and the tensors they make get new names; a
tf2onnx model's ``...:0`` tensors then have no counterpart by name, and their rows would be
lost. Both float models compute the same values, so each such tensor of the prepared model is
run on onnxruntime's CPU (one input) and matched with the source model's tensor of the same
shape and values, when exactly one matches (:data:`RTOL` of its scale).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from accdbg.core import onnx_model as om

log = logging.getLogger("accdbg.inference_engine")

# two float computations of one tensor (folded or fused differently) agree to float32 rounding
# accumulated over the ops between: well within this share of the tensor's largest value
RTOL = 1e-4
MAX_CANDIDATES = 2000  # source tensors run at once at most (one CPU run holds them all)


def _values(model: onnx.ModelProto, names: Sequence[str], feed: Mapping[str, np.ndarray]):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        om.with_outputs(model, names).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    wanted = {i.name for i in sess.get_inputs()}
    return dict(
        zip(
            names,
            sess.run(list(names), {k: v for k, v in feed.items() if k in wanted}),
            strict=True,
        )
    )


def match_by_value(
    prepared: onnx.ModelProto,
    source: onnx.ModelProto,
    unmapped: Sequence[str],
    taken: set[str],
    feed: Mapping[str, np.ndarray],
) -> dict[str, str]:
    """Prepared-model tensor -> source-model tensor, for each of ``unmapped`` that one source
    tensor not in ``taken`` equals; empty when either model cannot be run."""
    if not unmapped:
        return {}
    candidates = [
        n
        for n in om.all_tensor_names(source)
        if n not in taken and n not in om.initializer_names(source)
    ][:MAX_CANDIDATES]
    try:
        mine = _values(prepared, list(unmapped), feed)
        theirs = _values(source, candidates, feed) if candidates else {}
    except Exception as exc:  # a model the CPU cannot run with these outputs: names only
        log.debug("renamed tensors not matched by value: %s", str(exc).splitlines()[0])
        return {}
    by_shape: dict[tuple, list[str]] = {}
    for n, v in theirs.items():
        if np.issubdtype(np.asarray(v).dtype, np.floating):
            by_shape.setdefault(np.shape(v), []).append(n)
    out: dict[str, str] = {}
    used: set[str] = set()
    for name, v in mine.items():
        v = np.asarray(v, np.float64)
        scale = float(np.max(np.abs(v))) if v.size else 0.0
        if not np.issubdtype(np.asarray(mine[name]).dtype, np.floating) or scale == 0:
            continue  # an all-zero tensor equals too many others to tell
        same = [
            c
            for c in by_shape.get(v.shape, [])
            if c not in used
            and np.max(np.abs(np.asarray(theirs[c], np.float64) - v)) <= RTOL * scale
        ]
        if len(same) == 1:
            out[name] = same[0]
            used.add(same[0])
    return out
