"""How far an outlier channel reaches: the layers whose range it blows.

A layer that makes one channel far louder than its others (a weight outlier, an output channel
scaled up) blows its own output's range - and the channel travels. Every layer it flows into,
through convolutions that mix it into their other channels and activations that bend it, may
see its range blown too; one quantizer at a time, none of them explains the outputs' loss,
which is the outlier's. A channel that merely happens to be the loudest of a tensor reaches
nothing: the layers after it keep their ranges with or without it.

So the float model (pre-processed as for QNN; onnxruntime CPU, the debugged input) is run as it
is and once per candidate with that channel brought down to the median channel's size: the
layers whose range (max - min) narrows by ``POLICY.reach`` (one bit of their encoding) or more are
its reach. Only ranges leave the session (a ReduceMax and a ReduceMin per tensor), never the
tensors, and one model and session serve the plain run and every candidate (a boolean input
and a scale input each; the switches as the sensitivity's).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranges import range_outputs, session, spans, with_ranges
from accdbg.algorithms.diagnosis.sensitivity import Feeds, float_tensor
from accdbg.core.cpu_session import stop_if_asked
from accdbg.engines.exposure import Exposed
from accdbg.verifiers.channels import channel_axis, channel_extent

log = logging.getLogger("accdbg.reach")


@dataclass(frozen=True)
class Reach:
    """The outlier channel a layer makes and the layers whose range it blows."""

    channel: int
    ratio: float  # the channel's extent (largest |value|) over the median channel's
    layers: dict[str, float] = field(default_factory=dict)  # layer -> range with it / without


class OutlierReach:
    """Measures the reach of the loudest channel of given layers (float model, CPU)."""

    def __init__(self, float_model: onnx.ModelProto, layers: Sequence[Exposed], feeds: Feeds):
        self.model = float_model
        self.feeds = dict(feeds)
        produced = {o for n in float_model.graph.node for o in n.output}
        self.tensor: dict[str, str] = {}  # layer -> its float tensor (quantized layers only)
        for e in layers:
            t = float_tensor(e, produced) if e.quantized else None
            if t is not None and t not in self.tensor.values():
                self.tensor[e.name] = t
        self.op_type = {e.name: e.op_type for e in layers}

    def __call__(self, names: Sequence[str]) -> dict[str, Reach]:
        """The reach of each named layer whose loudest channel is ``POLICY.loud`` times its median
        channel; layers without one are left out."""
        names = [n for n in dict.fromkeys(names) if n in self.tensor]
        if not names:
            return {}
        try:
            return self._measure(names)
        except Exception as exc:  # onnxruntime refusing the edited model: no reach known
            log.info("no outlier reach measured: %s", str(exc).splitlines()[0])
            return {}

    def _measure(self, names: list[str]) -> dict[str, Reach]:
        tensors = list(self.tensor.values())
        wanted = [self.tensor[n] for n in names]
        model = _with_switches(with_ranges(self.model, tensors), wanted)
        ranges = range_outputs(tensors)
        sess = session(model, [*ranges, *wanted])
        off = {**self.feeds, **{_flag(t): np.array(False) for t in wanted}}
        off.update({_scale(t): np.ones(1, np.float32) for t in wanted})
        out = sess.run(None, off)
        base = spans(tensors, out[: len(ranges)])
        loud: dict[str, tuple[int, float, np.ndarray]] = {}
        for n, value in zip(names, out[len(ranges) :], strict=True):
            found = _loudest(np.asarray(value), self.op_type[n])
            if found is not None:
                loud[n] = found
        reaches = {}
        for n, (channel, ratio, scale) in loud.items():
            t = self.tensor[n]
            stop_if_asked()
            cut = spans(
                tensors, sess.run(ranges, {**off, _flag(t): np.array(True), _scale(t): scale})
            )
            layers = {}
            for m, x in self.tensor.items():
                if m == n or base[x] <= 0:
                    continue
                times = base[x] / cut[x] if cut[x] > 0 else math.inf
                if times >= POLICY.reach:
                    layers[m] = times
            reaches[n] = Reach(channel, ratio, layers)
        return reaches


def _loudest(value: np.ndarray, op_type: str) -> tuple[int, float, np.ndarray] | None:
    """(channel, its extent over the median channel's, the scale bringing it to the median) of
    a tensor whose loudest channel is ``POLICY.loud`` times the median one."""
    axis = channel_axis(value.shape, None, op_type, min_per_channel=1)
    if axis is None:
        return None
    extent = channel_extent(value, axis)
    alive = extent[extent > 0]
    if alive.size < 2:
        return None
    median = float(np.median(alive))
    c = int(np.argmax(extent))
    ratio = float(extent[c]) / median
    if ratio < POLICY.loud:
        return None
    scale = np.ones(value.shape[axis], np.float32)
    scale[c] = median / float(extent[c])
    shape = [1] * value.ndim
    shape[axis] = value.shape[axis]
    return c, ratio, scale.reshape(shape)


def _flag(tensor: str) -> str:
    return f"__reach_on_{tensor}"


def _scale(tensor: str) -> str:
    return f"__reach_scale_{tensor}"


def _with_switches(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """The model (edited in place) with each tensor's readers (not its range) reading it times
    a scale (an input) when its switch (a boolean input) is on. The switch goes right after
    the node making the tensor, so the order ``with_ranges`` chose is kept."""
    g = model.graph
    own = set(range_outputs(tensors))
    sel = {t: f"{t}__reach_sel" for t in tensors}
    nodes = []
    for node in g.node:
        if not any(o in own for o in node.output):  # its own range is measured as it is
            for i, x in enumerate(node.input):
                if x in sel:
                    node.input[i] = sel[x]
        nodes.append(node)
        for t in (o for o in node.output if o in sel):
            flag, scale = _flag(t), _scale(t)
            g.input.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
            g.input.append(helper.make_tensor_value_info(scale, onnx.TensorProto.FLOAT, None))
            nodes += [
                helper.make_node("Mul", [t, scale], [f"{t}__reach_scaled"]),
                helper.make_node("Where", [flag, f"{t}__reach_scaled", t], [sel[t]]),
            ]
    copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes]
    del g.node[:]
    g.node.extend(copies)
    return model
