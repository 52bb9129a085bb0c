"""Each tensor's smallest and largest value in a float model's runs, without holding the
tensors: a ReduceMin and a ReduceMax per tensor go into the graph and only they leave the
session. The outlier reach (``reach.py``) and the sensitivity's refitted encodings
(``sensitivity.py``) both ask it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from accdbg.core import onnx_model as om
from accdbg.core.cpu_session import exact_session


def range_outputs(tensors: Sequence[str]) -> list[str]:
    """The names of the reductions :func:`with_ranges` adds, max then min per tensor."""
    return [f"{t}__reach_{w}" for t in tensors for w in ("max", "min")]


def ends(tensors: Sequence[str], values: Sequence[np.ndarray]) -> dict[str, tuple[float, float]]:
    """Each tensor's (smallest, largest) value from the reductions' values (one run)."""
    it = iter(values)
    found = {}
    for t in tensors:
        hi = float(next(it))  # range_outputs: max, then min
        found[t] = (float(next(it)), hi)
    return found


def spans(tensors: Sequence[str], values: Sequence[np.ndarray]) -> dict[str, float]:
    """Each tensor's range (max - min) from the reductions' values."""
    return {t: hi - lo for t, (lo, hi) in ends(tensors, values).items()}


def with_ranges(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """A copy that also computes each tensor's largest and smallest value.

    The reductions go last, the latest tensor's first: onnxruntime orders a graph by a
    depth-first walk back from its last leaf, so each reduction then runs right after the
    node that makes its tensor, and every tensor is freed as in the plain model. In file
    order, every reduction ran at the end and held all the model's tensors at once (det at
    320x320: 186 MB against 50)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    made = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    for t in sorted(tensors, key=lambda t: made.get(t, -1), reverse=True):
        for op, w in (("ReduceMax", "max"), ("ReduceMin", "min")):
            r = f"{t}__reach_{w}"
            m.graph.node.append(helper.make_node(op, [t], [r], name=r, keepdims=0))
    return m


def session(model: onnx.ModelProto, outputs: Sequence[str]):
    """A CPU session of ``model`` fetching ``outputs`` (value_info dropped: the reductions'
    outputs are untyped, and a stale shape there would refuse them)."""
    proto = om.with_outputs(model, outputs)
    proto.graph.ClearField("value_info")
    return exact_session(proto)


def run_with_ranges(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    feeds: Sequence[Mapping[str, np.ndarray]],
    outputs: Sequence[str] = (),
) -> tuple[dict[str, tuple[float, float]], list[list[np.ndarray]]]:
    """Each tensor's (smallest, largest) value over the runs of ``feeds`` (CPU), and each run's
    ``outputs`` - one session for both."""
    names = range_outputs(tensors)
    sess = session(with_ranges(model, tensors), [*outputs, *names])
    lo = dict.fromkeys(tensors, np.inf)
    hi = dict.fromkeys(tensors, -np.inf)
    fetched = []
    for feed in feeds:
        values = sess.run([*outputs, *names], dict(feed))
        fetched.append(values[: len(outputs)])
        for t, (t_lo, t_hi) in ends(tensors, values[len(outputs) :]).items():
            lo[t], hi[t] = min(lo[t], t_lo), max(hi[t], t_hi)
    return {t: (lo[t], hi[t]) for t in tensors}, fetched
