"""What one layer's quantization does to the model's outputs, alone and taken out of the whole
quantized model (CPU simulation, not QNN).

A layer can lose much of its own information and still not matter: the error already upstream
may be larger, or later layers may not care. So a layer that stands out in the evidence is a
culprit only if it *hurts the outputs*, measured both ways AIMET's QuantAnalyzer does, on
onnxruntime's CPU and only for the few candidates:

* **alone** - the float model (pre-processed as for QNN) with only that layer's encodings
  applied: its weights quantized and dequantized, its output passed through a
  QuantizeLinear/DequantizeLinear with its scale and zero point;
* **removed** - the whole QDQ model with that layer's quantizers taken out (float weights, no
  output QuantizeLinear/DequantizeLinear): the part of the error that goes away when it alone is
  kept in float. This one sees what the first cannot - an encoding that hurts only together
  with the others: a channel crushed by one layer's output range and amplified by the next
  layer's weights, an outlier that blows the ranges of every layer carrying it.

Both are stated over the error of the whole QDQ model on the same CPU (the worst output),
error powers summed over the inputs given.

An output made by a Softmax or a Sigmoid is measured before it, at its logits: a saturating
output turns a wrong score into the same 0 or 1 whatever the size of the error, so the share
of a layer that wrecks the scores would look as small as that of a harmless one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from accdbg.algorithms.evidence import dequantized_weight
from accdbg.core import onnx_model as om
from accdbg.engines.exposure import Exposed
from accdbg.verifiers.base import dot

log = logging.getLogger("accdbg.sensitivity")


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _runs(sess: ort.InferenceSession, names: Sequence[str], feeds) -> list[list[np.ndarray]]:
    """The named outputs of one session on every input."""
    return [sess.run(list(names), f) for f in feeds]


def output_noise(golden: Sequence[np.ndarray], target: Sequence[np.ndarray]) -> np.ndarray:
    """Each output's error power Σ(g - t)²."""
    out = []
    for g, t in zip(golden, target, strict=True):
        d = np.asarray(g, np.float64).ravel() - np.asarray(t, np.float64).ravel()
        out.append(dot(d, d))
    return np.asarray(out)


SATURATING = ("Softmax", "Sigmoid", "LogSoftmax")
# ops a score passes through unchanged in meaning (a reshape, a constant rescale)
PASSING = (
    "Identity",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Cast",
    "Mul",
    "Div",
)


def scores(model: onnx.ModelProto) -> list[str]:
    """The tensors a model's outputs are judged at: each output, or its logits when a
    Softmax/Sigmoid makes it (looked for through reshapes and constant rescales; the tensor
    keeps its name in the QDQ model)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    out = []
    for o in model.graph.output:
        name, node = o.name, producer.get(o.name)
        while node is not None and node.op_type in PASSING:
            if node.op_type in ("Mul", "Div") and not all(x in consts for x in node.input[1:]):
                break
            node = producer.get(node.input[0])
        if node is not None and node.op_type in SATURATING:
            name = node.input[0]
        out.append(name)
    return list(dict.fromkeys(out))


def dequantized(qdq_model: onnx.ModelProto, name: str) -> str | None:
    """The QDQ model's tensor for float tensor ``name``: after its own QuantizeLinear /
    DequantizeLinear pair when it has one (None when the tensor is not in the model)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    produced = set()
    for n in qdq_model.graph.node:
        produced.update(n.output)
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    if name not in produced:
        return None
    for q in consumers.get(name, []):
        if q.op_type == "QuantizeLinear":
            for dq in consumers.get(q.output[0], []):
                if dq.op_type == "DequantizeLinear":
                    return dq.output[0]
    return name


@dataclass(frozen=True)
class Share:
    """A layer's (or a group's) part of the outputs' error: ``alone`` with only its encodings
    applied, ``removed`` the error that goes away with only its quantizers taken out (both over
    the whole QDQ model's error; NaN when not measured)."""

    alone: float
    removed: float = math.nan

    @property
    def best(self) -> float:
        """The larger of the two: either way the layer is shown to matter."""
        vals = [v for v in (self.alone, self.removed) if not math.isnan(v)]
        return max(vals) if vals else math.nan


Feeds = Mapping[str, np.ndarray]


class Sensitivity:
    """Runs the float model with one layer's encodings applied at a time, and the QDQ model
    with one layer's quantizers taken out.

    With several inputs the error powers are summed over them before any share is taken: a
    layer is judged on the inputs debugged together, not on the one where the model happens to
    be worst."""

    def __init__(
        self,
        float_model: onnx.ModelProto,
        qdq_model: onnx.ModelProto,
        feeds: Feeds | Sequence[Feeds],
    ):
        self.float_model = float_model
        self.qdq_model = qdq_model
        self.feeds = [dict(feeds)] if isinstance(feeds, Mapping) else [dict(f) for f in feeds]
        self.outputs = scores(float_model)
        self.float_model = om.with_outputs(float_model, self.outputs)
        self.golden = _runs(_session(self.float_model), self.outputs, self.feeds)
        self._qdq_nodes = om.topological_nodes(qdq_model.graph)
        self._qdq_inits = {i.name: i for i in qdq_model.graph.initializer}
        self._producer = {o: n for n in self._qdq_nodes for o in n.output}
        self.golden_power = sum(
            np.asarray([dot(x, x) for x in (np.asarray(g, np.float64).ravel() for g in run)])
            for run in self.golden
        )
        # the whole QDQ model on the CPU: every encoding applied
        fetch = {n: dequantized(qdq_model, n) for n in self.outputs}
        names = [t for t in fetch.values() if t is not None]
        self._fetch, self._fetch_names = fetch, names
        self._qdq_out = om.with_outputs(qdq_model, names)
        self.whole_noise = self._qdq_noise(self._qdq_out)
        self._float_inits = {i.name: i for i in float_model.graph.initializer}
        # where each layer's node sits in the file (copies keep the order), what feeds it and
        # what reads each tensor: built once for every leave-one-out model
        at = {id(n): i for i, n in enumerate(qdq_model.graph.node)}
        self._position = [at[id(n)] for n in self._qdq_nodes]
        self._readers: dict[str, list[int]] = {}
        for i, n in enumerate(qdq_model.graph.node):
            for x in n.input:
                self._readers.setdefault(x, []).append(i)

    def _qdq_noise(self, model: onnx.ModelProto) -> np.ndarray:
        """Each output's error power from a QDQ model that fetches the outputs' tensors."""
        names = self._fetch_names
        outs = []
        for gold, run in zip(self.golden, _runs(_session(model), names, self.feeds), strict=True):
            got = dict(zip(names, run, strict=True))
            outs.append(
                [got.get(self._fetch[n], g) for n, g in zip(self.outputs, gold, strict=True)]
            )
        return self._pooled_noise(outs)

    def _pooled_noise(self, outs: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
        """Each output's error power, summed over the inputs (``outs``: per input, per output)."""
        return np.sum([output_noise(g, t) for g, t in zip(self.golden, outs, strict=True)], axis=0)

    def share(self, layers: Exposed | Sequence[Exposed], enough: float = math.inf) -> Share:
        """These layers' part of the whole model's output error power, both ways (the worst
        output; scale-free, so it holds when a golden output is all zero). When the first
        reaches ``enough`` the second is not needed: it costs a session of the QDQ model."""
        useful = (self.golden_power > 0) & (self.whole_noise > 0)
        if not useful.any():  # outputs with no signal (all zero) or no error: nothing to weigh
            return Share(math.nan)
        group = [layers] if isinstance(layers, Exposed) else list(layers)
        whole = self.whole_noise[useful]
        alone = float((self.alone_noise(group)[useful] / whole).max())
        if alone >= enough:
            return Share(alone)
        try:
            removed = float((1.0 - self.removed_noise(group)[useful] / whole).max())
        except Exception as exc:  # onnxruntime refusing the edited QDQ model: one measure only
            log.info("no leave-one-out measure for %s: %s", group[0].name, str(exc)[:200])
            removed = math.nan
        return Share(alone, removed)

    def removed_noise(self, layers: Sequence[Exposed]) -> np.ndarray:
        """Each output's error power with every encoding applied but these layers' own: their
        weights float again, their output QuantizeLinear/DequantizeLinear a pass-through."""
        model = onnx.ModelProto()
        model.CopyFrom(self._qdq_out)
        g = model.graph
        added: set[str] = set()
        for layer in layers:
            node = g.node[self._position[layer.index]]
            for i, x in enumerate(node.input):
                dq = self._producer.get(x)
                if (
                    dq is None
                    or dq.op_type != "DequantizeLinear"
                    or dq.input[0] not in self._qdq_inits
                ):
                    continue
                w = self._float_inits.get(dq.input[0].removesuffix("_quantized"))
                if w is None or len(w.dims) < 2:
                    continue
                name = f"{w.name}__sens_float"
                if name not in added:  # a weight shared by two layers of the group
                    added.add(name)
                    g.initializer.append(w)
                    g.initializer[-1].name = name
                node.input[i] = name
            if layer.quantized:
                for q in self._readers.get(layer.qdq_tensor, []):
                    if g.node[q].op_type != "QuantizeLinear":
                        continue
                    for d in self._readers.get(g.node[q].output[0], []):
                        dq = g.node[d]
                        if dq.op_type == "DequantizeLinear":  # keeps its output name
                            dq.op_type = "Identity"
                            del dq.input[:], dq.attribute[:]
                            dq.input.append(layer.qdq_tensor)
        g.ClearField("value_info")  # the pass-throughs carry float where integers were typed
        return self._qdq_noise(model)

    def alone_noise(self, layers: Sequence[Exposed]) -> np.ndarray:
        """Each output's error power with only these layers' weights and output encodings
        applied."""
        model = onnx.ModelProto()
        model.CopyFrom(self.float_model)
        inits = {i.name: i for i in model.graph.initializer}
        for layer in layers:
            self._apply(model, inits, layer)
        return self._pooled_noise(_runs(_session(model), self.outputs, self.feeds))

    def _apply(self, model: onnx.ModelProto, inits: dict, layer: Exposed) -> None:
        """Quantize one layer's weights and its output, in place."""
        node = self._qdq_nodes[layer.index]
        for x in node.input:
            dq = self._producer.get(x)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in self._qdq_inits:
                continue
            name = dq.input[0].removesuffix("_quantized")
            if name not in inits or len(inits[name].dims) < 2:
                continue
            inits[name].CopyFrom(
                numpy_helper.from_array(
                    dequantized_weight(dq, self._qdq_inits)[2].astype(np.float32), name
                )
            )
        if layer.quantized:
            produced = {o for n in model.graph.node for o in n.output}
            # the quantizer may rename a tensor (a graph output's producer gets "_QuantizeLinear_Input")
            names = (
                layer.qdq_tensor,
                layer.qdq_tensor.removesuffix("_QuantizeLinear_Input"),
                layer.name,
            )
            tensor = next((t for t in names if t in produced), None)
            if tensor is None:
                raise KeyError(f"{layer.qdq_tensor} is not a tensor of the float model")
            self._insert_qdq(model, layer, tensor)

    @staticmethod
    def _insert_qdq(model: onnx.ModelProto, layer: Exposed, t: str) -> None:
        g = model.graph
        scale = numpy_helper.from_array(np.array(layer.scale, np.float32), f"{t}__sens_scale")
        zp = numpy_helper.from_array(
            np.array(layer.zero_point, np.dtype(layer.native_dtype or "uint8")), f"{t}__sens_zp"
        )
        g.initializer.extend([scale, zp])
        q_out, dq_out = f"{t}__sens_q", f"{t}__sens_dq"
        for n in g.node:
            for i, x in enumerate(n.input):
                if x == t:
                    n.input[i] = dq_out
        for o in g.output:
            if o.name == t:  # a graph output keeps its name: rename the producer's side instead
                for n in g.node:
                    for i, x in enumerate(n.output):
                        if x == t:
                            n.output[i] = f"{t}__sens_float"
                g.node.extend(
                    [
                        helper.make_node(
                            "QuantizeLinear", [f"{t}__sens_float", scale.name, zp.name], [q_out]
                        ),
                        helper.make_node("DequantizeLinear", [q_out, scale.name, zp.name], [t]),
                    ]
                )
                return
        g.node.extend(
            [
                helper.make_node("QuantizeLinear", [t, scale.name, zp.name], [q_out]),
                helper.make_node("DequantizeLinear", [q_out, scale.name, zp.name], [dq_out]),
            ]
        )
        # keep the graph topologically sorted for onnxruntime
        nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in om.topological_nodes(g)]
        del g.node[:]
        g.node.extend(nodes)
