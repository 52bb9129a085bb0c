"""Float runs on onnxruntime's CPU provider: per-channel statistics and output comparisons.

The planting sizes a fault from the real activations (an outlier channel K times the tensor's
largest value needs that value), and a compensated fault must leave the float outputs as they
were: :func:`output_change` is that check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort


def _with_dims(model: onnx.ModelProto, dims: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in dims:
            for d, v in zip(vi.type.tensor_type.shape.dim, dims[vi.name], strict=True):
                d.Clear()
                d.dim_value = int(v)
    return m


def session(model: onnx.ModelProto, extra_outputs: Sequence[str] = ()) -> ort.InferenceSession:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in extra_outputs:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    # the model as written: no fusion may hide or reorder what is compared
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def load_feeds(
    paths: Sequence[Path], name: str, dims: tuple[int, ...]
) -> list[dict[str, np.ndarray]]:
    return [{name: np.fromfile(p, dtype=np.float32).reshape(dims)} for p in paths]


def run(
    model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]], extra: Sequence[str] = ()
) -> list[dict[str, np.ndarray]]:
    """The model's outputs (and ``extra`` tensors) for each feed, by name."""
    s = session(model, extra)
    names = [o.name for o in s.get_outputs()]
    return [dict(zip(names, s.run(names, f), strict=True)) for f in feeds]


def output_change(
    before: Sequence[dict[str, np.ndarray]], after: Sequence[dict[str, np.ndarray]]
) -> float:
    """Largest difference of each tensor relative to its scale (max |before|), over feeds."""
    worst = 0.0
    for b_outs, a_outs in zip(before, after, strict=True):
        for name, b in b_outs.items():
            b, a = np.asarray(b, np.float64), np.asarray(a_outs[name], np.float64)
            if a.shape != b.shape or not np.all(np.isfinite(a)):
                return float("inf")
            scale = max(float(np.max(np.abs(b))), 1e-12)
            worst = max(worst, float(np.max(np.abs(a - b))) / scale)
    return worst


@dataclass
class TensorStats:
    """Min, max and per-channel largest magnitude of a tensor over the calibration inputs."""

    shape: tuple[int, ...]
    lo: float
    hi: float
    chan_absmax: np.ndarray | None  # along axis 1 for 4-D tensors, the last axis otherwise

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def channel_axis(rank: int) -> int:
    return 1 if rank == 4 else rank - 1


class FloatProbe:
    """Statistics of a model's float tensors over some inputs, computed once, on demand."""

    def __init__(self, model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]):
        self.model = _with_dims(model, {k: v.shape for k, v in feeds[0].items()})
        self.feeds = list(feeds)
        self._stats: dict[str, TensorStats] | None = None
        self.values_of_first: dict[str, np.ndarray] = {}

    def _float_tensors(self) -> list[str]:
        inferred = onnx.shape_inference.infer_shapes(self.model)
        types = {
            vi.name: vi.type.tensor_type.elem_type
            for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
        }
        out = []
        for n in self.model.graph.node:
            if n.op_type == "Constant":
                continue
            out += [o for o in n.output if o and types.get(o) == onnx.TensorProto.FLOAT]
        return out

    def stats(self) -> dict[str, TensorStats]:
        if self._stats is None:
            names = self._float_tensors()
            s = session(self.model, names)
            wanted = [o.name for o in s.get_outputs()]
            acc: dict[str, TensorStats] = {}
            for i, feed in enumerate(self.feeds):
                for name, v in zip(wanted, s.run(wanted, feed), strict=True):
                    v = np.asarray(v)
                    if v.dtype != np.float32 or v.size == 0:
                        continue
                    if i == 0:
                        self.values_of_first[name] = v
                    ax = channel_axis(v.ndim) if v.ndim >= 2 else None
                    cam = (
                        np.abs(v).max(axis=tuple(a for a in range(v.ndim) if a != ax))
                        if ax is not None
                        else None
                    )
                    old = acc.get(name)
                    if old is None:
                        acc[name] = TensorStats(v.shape, float(v.min()), float(v.max()), cam)
                    else:
                        old.lo, old.hi = min(old.lo, float(v.min())), max(old.hi, float(v.max()))
                        if cam is not None and old.chan_absmax is not None:
                            old.chan_absmax = np.maximum(old.chan_absmax, cam)
            self._stats = acc
        return self._stats

    def first(self, name: str) -> np.ndarray:
        """The tensor's value on the first input (the debugged one)."""
        self.stats()
        return self.values_of_first[name]
