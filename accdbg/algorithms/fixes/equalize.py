"""Cross-layer equalization of a Conv->Conv pair (Nagel et al., "Data-Free Quantization").

Between the two convolutions only ops that commute with a positive per-channel scale are
allowed (nothing, Relu, LeakyRelu, MaxPool, Identity): then dividing the producer's output
channel ``c`` (weights and bias) by ``s_c`` and multiplying the consumer's input channel
``c`` by ``s_c`` leaves the float function unchanged, while both weight tensors get the same
per-channel range ``sqrt(r1_c * r2_c)``. The caller proves the float outputs unchanged
(:func:`float_change`) before any quantized number is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

# ops between the pair that commute with a positive per-channel scale
HOMOGENEOUS = ("Relu", "LeakyRelu", "MaxPool", "Identity")


@dataclass(frozen=True)
class Pair:
    """Two Conv nodes (by name) and the weights equalization rescales."""

    producer: str
    consumer: str
    producer_out: str  # the producer's output tensor (a culprit row may name a later one)
    consumer_out: str
    between: tuple[str, ...]  # tensors from producer output to consumer input

    @property
    def label(self) -> str:
        return f"{self.producer}->{self.consumer}"


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def conv_pairs(model: onnx.ModelProto) -> list[Pair]:
    """Every Conv->Conv pair equalization can rescale without changing the float function."""
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for n in model.graph.node:
        if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        if _attr(n, "group", 1) != 1:
            continue
        path = [n.output[0]]
        cur = n.output[0]
        while True:
            if cur in outputs:
                break
            nxt = consumers.get(cur, [])
            if len(nxt) != 1:
                break
            c = nxt[0]
            if c.op_type in HOMOGENEOUS and c.input[0] == cur:
                if c.op_type == "MaxPool" and len(c.output) > 1 and c.output[1]:
                    break
                cur = c.output[0]
                path.append(cur)
                continue
            if (
                c.op_type == "Conv"
                and c.input[0] == cur
                and len(c.input) > 1
                and c.input[1] in inits
                and _attr(c, "group", 1) == 1
            ):
                pairs.append(Pair(n.name, c.name, n.output[0], c.output[0], tuple(path)))
            break
    return pairs


def equalize(model: onnx.ModelProto, pairs: list[Pair]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with each pair equalized; returns it and one note per pair."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    nodes = {n.name: n for n in m.graph.node}
    notes = []
    for p in pairs:
        a, b = nodes[p.producer], nodes[p.consumer]
        w1 = numpy_helper.to_array(inits[a.input[1]]).astype(np.float64)
        w2 = numpy_helper.to_array(inits[b.input[1]]).astype(np.float64)
        r1 = np.abs(w1).reshape(w1.shape[0], -1).max(1)
        r2 = np.abs(np.moveaxis(w2, 1, 0)).reshape(w2.shape[1], -1).max(1)
        s = np.ones_like(r1)
        live = (r1 > 0) & (r2 > 0)
        s[live] = np.sqrt(r1[live] / r2[live])
        w1 /= s.reshape(-1, *([1] * (w1.ndim - 1)))
        w2 *= s.reshape(1, -1, *([1] * (w2.ndim - 2)))
        _set(inits[a.input[1]], w1)
        _set(inits[b.input[1]], w2)
        if len(a.input) > 2 and a.input[2] in inits:
            _set(inits[a.input[2]], numpy_helper.to_array(inits[a.input[2]]) / s)
        before = float(r1.max() / max(np.median(r1), 1e-30))
        after_r = np.abs(w1).reshape(w1.shape[0], -1).max(1)
        notes.append(
            f"{p.label}: channel scales {s.min():.3g}..{s.max():.3g}; the producer's widest "
            f"channel went from {before:.3g}x to {after_r.max() / max(np.median(after_r), 1e-30):.3g}x "
            "its median channel"
        )
    return m, notes


def _set(init: onnx.TensorProto, value: np.ndarray) -> None:
    dtype = numpy_helper.to_array(init).dtype
    init.CopyFrom(numpy_helper.from_array(value.astype(dtype), init.name))


def float_change(before: onnx.ModelProto, after: onnx.ModelProto, feeds: list[dict]) -> float:
    """Largest change of any float output, relative to that output's largest magnitude, over
    every input (onnxruntime CPU): the proof equalization left the function unchanged."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    worst = 0.0
    sessions = [
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for m in (before, after)
    ]
    names = [o.name for o in sessions[0].get_outputs()]
    for feed in feeds:
        x, y = (s.run(names, feed) for s in sessions)
        for a, b in zip(x, y, strict=True):
            scale = float(np.max(np.abs(a))) or 1.0
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / scale)
    return worst
