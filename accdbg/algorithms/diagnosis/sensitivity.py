"""What one layer's quantization does to the model's outputs, alone and taken out of the whole
quantized model (CPU simulation, not QNN).

A layer can lose much of its own information and still not matter: the error already upstream
may be larger, or later layers may not care. So a layer that stands out in the evidence is a
culprit only if it *hurts the outputs*, measured both ways AIMET's QuantAnalyzer does, on
onnxruntime's CPU and only for the few candidates:

* **alone** - the float model (pre-processed as for QNN) with only that layer's encodings
  applied: its weights and bias quantized and dequantized, its output passed through a
  QuantizeLinear/DequantizeLinear with its scale and zero point;
* **removed** - the whole QDQ model with that layer's quantizers taken out (float weights and
  bias, no output QuantizeLinear/DequantizeLinear): the part of the error that goes away when
  it alone is kept in float. This one sees what the first cannot - an encoding that hurts only together
  with the others: a channel crushed by one layer's output range and amplified by the next
  layer's weights, an outlier that blows the ranges of every layer carrying it. A Relu or Clip
  the quantizer folded into the layer's QuantizeLinear (QNN's QDQ model has none of its own)
  stays applied: only the rounding and the range go.

Both are stated over the error of the whole QDQ model on the same CPU (the worst output),
error powers summed over the inputs given.

An output made by a Softmax or a Sigmoid is measured before it, at its logits: a saturating
output turns a wrong score into the same 0 or 1 whatever the size of the error, so the share
of a layer that wrecks the scores would look as small as that of a harmless one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.quantization.quant_utils import (
    compute_scale_zp,
    get_qmin_qmax_for_qType,
    quantize_nparray,
)

from accdbg.algorithms.diagnosis.evidence import SAME_VALUES, dequantized_weight, weight_axes
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranges import run_with_ranges
from accdbg.core import onnx_model as om
from accdbg.core.cpu_session import exact_session, stop_if_asked
from accdbg.engines.exposure import Exposed
from accdbg.verifiers.base import dot

log = logging.getLogger("accdbg.sensitivity")


def _runs(sess: ort.InferenceSession, names: Sequence[str], feeds) -> list[list[np.ndarray]]:
    """The named outputs of one session on every input."""
    out = []
    for f in feeds:
        stop_if_asked()
        out.append(sess.run(list(names), f))
    return out


def output_noise(golden: Sequence[np.ndarray], target: Sequence[np.ndarray]) -> np.ndarray:
    """Each output's error power Σ(g - t)²."""
    out = []
    for g, t in zip(golden, target, strict=True):
        d = np.asarray(g, np.float64).ravel() - np.asarray(t, np.float64).ravel()
        out.append(dot(d, d))
    return np.asarray(out)


SATURATING = ("Softmax", "Sigmoid", "LogSoftmax")
# ops a score passes through unchanged in meaning (a reshape, a constant rescale)
PASSING = (*SAME_VALUES, "Mul", "Div")
QDQ = ("QuantizeLinear", "DequantizeLinear")  # a QDQ model's output passes its own pair


def scores(model: onnx.ModelProto, compared: Collection[str] | None = None) -> list[str]:
    """The tensors a model's outputs are judged at: each output, or its logits when a
    Softmax/Sigmoid makes it (looked for through reshapes and constant rescales; the tensor
    keeps its name in the QDQ model). With ``compared`` (the tensors a run compared), a logits
    tensor that was not compared - a Flatten the pre-processing put before the Softmax - is
    followed back through ops that keep its values to one that was."""
    return list(judged_outputs(model, compared))


def judged_outputs(
    model: onnx.ModelProto, compared: Collection[str] | None = None
) -> dict[str, str]:
    """Each tensor the outputs are judged at (:func:`scores`, in its order) -> the model output
    it stands for, as the user knows it (the first, when two share their logits)."""
    out: dict[str, str] = {}
    for o, judged in zip(model.graph.output, judged_at(model, compared), strict=True):
        out.setdefault(judged, o.name)
    return out


def judged_at(model: onnx.ModelProto, compared: Collection[str] | None = None) -> list[str]:
    """:func:`scores` output by output, in the graph's order (two may share their logits); in
    a QDQ model, the logits as the Softmax reads them (after their Q/DQ pair)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    out = []
    for o in model.graph.output:
        name, node = o.name, producer.get(o.name)
        while node is not None and node.op_type in (*PASSING, *QDQ):
            if node.op_type in ("Mul", "Div") and not all(x in consts for x in node.input[1:]):
                break
            node = producer.get(node.input[0])
        if node is not None and node.op_type in SATURATING:
            name = node.input[0]
        while compared is not None and name not in compared:
            node = producer.get(name)
            if node is None or node.op_type not in SAME_VALUES:
                break
            name = node.input[0]
        out.append(name)
    return out


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


def exposing(
    qdq_model: onnx.ModelProto, judged: Sequence[str]
) -> tuple[onnx.ModelProto, list[str]]:
    """The QDQ model with the float tensors ``judged`` among its outputs, each read after its
    own Q/DQ pair where it has one (:func:`dequantized`), and their names there; the model
    itself when they are outputs already (a Softmax output's logits are not)."""
    names = [dequantized(qdq_model, n) or n for n in judged]
    if set(names) <= {o.name for o in qdq_model.graph.output}:
        return qdq_model, names
    return om.with_outputs(qdq_model, names, keep_existing=True), names


@dataclass(frozen=True)
class Share:
    """A layer's (or a group's) part of the outputs' error: ``alone`` with only its encodings
    applied, ``removed`` the error that goes away with only its quantizers taken out (both over
    the whole QDQ model's error; NaN when not measured)."""

    alone: float
    removed: float = math.nan
    # the model output each was taken at (judged at its logits for a Softmax/Sigmoid output),
    # when the model has several (a layer can cost one output most of its error and another
    # little: the share is the output it costs most)
    alone_at: str = ""
    removed_at: str = ""

    @property
    def best(self) -> float:
        """The larger of the two: either way the layer is shown to matter."""
        vals = [v for v in (self.alone, self.removed) if not math.isnan(v)]
        return max(vals) if vals else math.nan

    @property
    def at(self) -> str:
        """The output :attr:`best` was taken at ("" with one output)."""
        return self.alone_at if self.best == self.alone else self.removed_at


Feeds = Mapping[str, np.ndarray]


class Sensitivity:
    """Runs the float model with one layer's encodings applied at a time, and the QDQ model
    with one layer's quantizers taken out.

    Both are one model each, built once for the ``layers`` that will be asked about: each such
    layer's encodings sit behind a switch (a boolean graph input choosing, with ``Where``,
    between its quantized and its float weights and output), so one session answers every
    question about them - a session per question costs more than its run. With every switch
    off the first model is the float golden and the second the whole QDQ model. A layer outside
    ``layers`` gets a model of its own when asked.

    With several inputs the error powers are summed over them before any share is taken: a
    layer is judged on the inputs debugged together, not on the one where the model happens to
    be worst."""

    def __init__(
        self,
        float_model: onnx.ModelProto,
        qdq_model: onnx.ModelProto,
        feeds: Feeds | Sequence[Feeds],
        layers: Sequence[Exposed] = (),
        singles: Sequence[Sequence[Exposed]] = (),
    ):
        self.feeds = [dict(feeds)] if isinstance(feeds, Mapping) else [dict(f) for f in feeds]
        # the model output each judged tensor is (its logits for a Softmax/Sigmoid output): a
        # share names the output, as the user knows it; its keys, in order, are :func:`scores`
        self._output_of = judged_outputs(float_model)
        self.outputs = list(self._output_of)
        self.float_model = om.with_outputs(float_model, self.outputs)
        self._qdq_nodes = om.topological_nodes(qdq_model.graph)
        self._qdq_inits = {i.name: i for i in qdq_model.graph.initializer}
        self._float_inits = {i.name: i for i in float_model.graph.initializer}
        self._producer = {o: n for n in self._qdq_nodes for o in n.output}
        self._folded = folded_activations(float_model, self._producer)
        fetch = {n: dequantized(qdq_model, n) for n in self.outputs}
        self._fetch = fetch
        self._fetch_names = [t for t in fetch.values() if t is not None]
        self._qdq_out = om.with_outputs(qdq_model, self._fetch_names)
        # where each layer's node sits in the file, and what reads each tensor
        at = {id(n): i for i, n in enumerate(qdq_model.graph.node)}
        self._position = [at[id(n)] for n in self._qdq_nodes]
        self._readers: dict[str, list[int]] = {}
        for i, n in enumerate(qdq_model.graph.node):
            for x in n.input:
                self._readers.setdefault(x, []).append(i)
        self._alone, self._removed, self.golden = self._prepare(_distinct(layers))
        self.golden_power = _power(self.golden)
        self.whole_noise = self._qdq_noise(self._removed, ())
        self._alone_known: dict[tuple[int, ...], np.ndarray] = {}
        self._adds = self._additive([list(g) for g in singles])

    def _prepare(self, layers: list[Exposed]):
        """The two switched models and the golden outputs; a layer the models cannot take
        (onnxruntime refusing the edit) leaves them plain, each layer then asked on its own."""
        try:
            alone = _Switched(self._alone_model(layers), layers)
            return (
                alone,
                _Switched(self._removed_model(layers), layers),
                alone.run(self.outputs, self.feeds, ()),
            )
        except Exception as exc:
            if not layers:
                raise
            log.info("no shared sensitivity model (%s): one per layer", str(exc).splitlines()[0])
            return self._prepare([])

    def _qdq_noise(self, switched: _Switched, off: Sequence[Exposed]) -> np.ndarray:
        """Each output's error power from the QDQ model with the ``off`` layers' quantizers
        taken out."""
        runs = switched.run(self._fetch_names, self.feeds, off)
        return self._pooled_noise(
            [self._fetched(gold, run) for gold, run in zip(self.golden, runs, strict=True)]
        )

    def _fetched(self, golden: Sequence[np.ndarray], run: Sequence[np.ndarray]) -> list:
        """One QDQ run's outputs in ``self.outputs``' order (the fetched names' values; an output
        the QDQ model has no dequantized tensor for keeps its golden value)."""
        got = dict(zip(self._fetch_names, run, strict=True))
        return [got.get(self._fetch[n], g) for n, g in zip(self.outputs, golden, strict=True)]

    def _pooled_noise(self, outs: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
        """Each output's error power, summed over the inputs (``outs``: per input, per output)."""
        return np.sum([output_noise(g, t) for g, t in zip(self.golden, outs, strict=True)], axis=0)

    def _additive(self, singles: Sequence[Sequence[Exposed]]) -> np.ndarray:
        """Per output, whether shares of its error power mean anything. An output of a few
        values (a presence score, a handedness logit: one per input) has an error but no
        noise: each layer's rounding moves it by a signed amount, they cancel, and one layer
        alone can move it several times more than the whole model does. Where the
        ``singles`` (the standouts to be asked, each a layer and the layer of its weights),
        each alone, cost such an output more than ``POLICY.adds_up`` times its error in sum, its
        shares do not add up and it is not judged on; outputs of many values are (their
        errors average into noise powers that add)."""
        ok = np.ones(len(self.outputs), dtype=bool)
        values = np.sum([[np.asarray(g).size for g in run] for run in self.golden], axis=0)
        few = np.asarray(values) < POLICY.few_values
        if not few.any() or len(singles) < 2:
            return ok
        try:
            total = np.sum([self.alone_noise(g) for g in singles], axis=0)
        except Exception as exc:  # a layer onnxruntime cannot isolate: judged as before
            log.info("no additivity check: %s", str(exc).splitlines()[0])
            return ok
        with np.errstate(divide="ignore", invalid="ignore"):
            ok[few] = ~(total[few] > POLICY.adds_up * self.whole_noise[few])
        if not ok.all():
            ratio = total / np.maximum(self.whole_noise, 1e-30)
            log.info(
                "outputs of few values whose shares do not add up, not judged on (the standouts "
                "alone cost them more than their error): %s",
                ", ".join(
                    f"{o} ({r:.3g}x)"
                    for o, r, k in zip(self.outputs, ratio, ok, strict=True)
                    if not k
                ),
            )
        return ok

    def _useful(self) -> np.ndarray:
        """The outputs shares are taken over: with signal and error, and adding up (if any
        output does)."""
        useful = (self.golden_power > 0) & (self.whole_noise > 0)
        adding = useful & self._adds
        return adding if adding.any() else useful

    def share(self, layers: Exposed | Sequence[Exposed], enough: float = math.inf) -> Share:
        """These layers' part of the whole model's output error power, both ways (the worst
        output; scale-free, so it holds when a golden output is all zero). When the first
        reaches ``enough`` the second is not needed."""
        useful = self._useful()
        if not useful.any():  # outputs with no signal (all zero) or no error: nothing to weigh
            return Share(math.nan)
        group = [layers] if isinstance(layers, Exposed) else list(layers)
        whole = self.whole_noise[useful]
        names = [self._output_of[o] for o, u in zip(self.outputs, useful, strict=True) if u]

        def at(values: np.ndarray) -> str:
            return names[int(np.argmax(values))] if len(names) > 1 else ""

        alone_all = self.alone_noise(group)[useful] / whole
        alone = float(alone_all.max())
        if alone >= enough:
            return Share(alone, alone_at=at(alone_all))
        try:
            removed_all = 1.0 - self.removed_noise(group)[useful] / whole
        except Exception as exc:  # onnxruntime refusing the edited QDQ model: one measure only
            log.info("no leave-one-out measure for %s: %s", group[0].name, str(exc)[:200])
            return Share(alone, alone_at=at(alone_all))
        return Share(alone, float(removed_all.max()), at(alone_all), at(removed_all))

    def clamped_share(self, levels: Sequence[tuple[Exposed, float]]) -> float:
        """The part of the outputs' error that goes when each layer's weights are brought to
        within its level (their few outliers clamped) - in the float model and in the
        QDQ model, requantized over the range that leaves - each judged against its own float.

        A weight far beyond the rest of its tensor can make the error without its layer's
        encodings being the cause: its output channel then carries one input channel many
        times over, so that channel's error - from every encoding upstream - reaches the
        outputs as many times louder, while alone or taken out the layer costs little. The
        question is then the float model's own, and this is its measure (error powers summed
        over the inputs, the worst output, as :meth:`share`)."""
        useful = self._useful()
        if not useful.any():
            return math.nan
        edits = [(layer, lambda w, v=level: np.clip(w, -v, v)) for layer, level in levels]
        noise, _ = self._edited_noise(edits, refit=False)
        # error powers, not noise-to-signal: the weight's own signal goes with it, and the
        # outputs' error is what the user sees in the outputs' units
        return float((1.0 - noise[useful] / self.whole_noise[useful]).max())

    def channel_share(self, channels: Sequence[tuple[Exposed, int, float]]) -> float:
        """The part of the outputs' noise-to-signal that goes when each layer's loud output
        channel (its index given) has its weights brought to ``level`` (the next widest
        channel's largest |w|) - in the float model and in the QDQ model, its weights
        requantized and every activation encoding refitted to the range the change leaves
        (:meth:`_refitted`) - each judged against its own float.

        One output channel far beyond every other makes its output carry its inputs' error that
        many times louder than the other channels do, and blows the range of every layer the
        channel flows into; alone, taken out, or with the layers whose range it blows, the
        layer can cost little - the error is its inputs' encodings', multiplied. Noise-to-signal
        and not error powers: the channel's signal changes with it, and a model with an
        output channel gone quiet could show less error by having less output."""
        useful = self._useful()
        if not useful.any():
            return math.nan
        edits = [
            (layer, _channel_edit(self._qdq_nodes[layer.index], c, level))
            for layer, c, level in channels
        ]
        noise, power = self._edited_noise(edits, refit=True)
        before = self.whole_noise[useful] / self.golden_power[useful]
        with np.errstate(divide="ignore", invalid="ignore"):
            after = noise[useful] / power[useful]
        return float((1.0 - after / before).max())

    def _edited_noise(self, edits, refit: bool) -> tuple[np.ndarray, np.ndarray]:
        """Each output's error power and golden power (summed over the inputs) of the QDQ
        model against the float model, both with each layer's float weights edited
        (``edits``: (layer, weights -> new weights)) and the QDQ model's requantized on their
        encodings' own terms; ``refit``: its activation encodings too, to the ranges the
        edited float model shows (:meth:`_refit`; those ranges come from the same session as
        its golden outputs)."""
        flt, qdq = onnx.ModelProto(), onnx.ModelProto()
        flt.CopyFrom(self.float_model)
        qdq.CopyFrom(self._qdq_out)
        f_inits = {i.name: i for i in flt.graph.initializer}
        q_inits = {i.name: i for i in qdq.graph.initializer}
        for layer, edit in edits:
            for x in self._qdq_nodes[layer.index].input:
                w = self._float_weight_of(x, self._float_inits)
                if w is None:
                    continue
                new = edit(numpy_helper.to_array(w).astype(np.float64))
                f_inits[w.name].CopyFrom(numpy_helper.from_array(new.astype(np.float32), w.name))
                for t in requantized(self._producer[x], q_inits, new):
                    q_inits[t.name].CopyFrom(t)
        if refit and self._encodings:
            ranges, golden = run_with_ranges(flt, self._encoded, self.feeds, self.outputs)
            self._refit(q_inits, ranges)
        else:
            golden = _runs(exact_session(flt), self.outputs, self.feeds)
        runs = _runs(exact_session(qdq), self._fetch_names, self.feeds)
        noise = np.sum(
            [output_noise(g, self._fetched(g, r)) for g, r in zip(golden, runs, strict=True)],
            axis=0,
        )
        return noise, _power(golden)

    @cached_property
    def _encodings(self) -> list[_Encoding]:
        """The QDQ model's per-tensor activation encodings, each once, with the float tensor
        it quantizes and every (scale, zero point) pair holding it (its QuantizeLinear's and
        its DequantizeLinear's, when that keeps terms of its own)."""
        produced = {o for n in self.float_model.graph.node for o in n.output}
        inits = {i.name for i in self._qdq_out.graph.initializer}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for d in self._qdq_out.graph.node:
            for x in d.input:
                readers.setdefault(x, []).append(d)
        found: dict[str, _Encoding] = {}
        for n in self._qdq_out.graph.node:
            if n.op_type != "QuantizeLinear" or len(n.input) != 3 or n.input[0] in inits:
                continue
            t = float_name(n.input[0], produced)
            if t is None or not {n.input[1], n.input[2]} <= inits:
                continue
            if n.input[1] in found or math.prod(self._qdq_inits[n.input[1]].dims) != 1:
                continue
            pairs = [(n.input[1], n.input[2])] + [
                (d.input[1], d.input[2])
                for d in readers.get(n.output[0], [])
                if d.op_type == "DequantizeLinear"
                and len(d.input) == 3
                and {d.input[1], d.input[2]} <= inits
            ]
            found[n.input[1]] = _Encoding(t, tuple(dict.fromkeys(pairs)))
        return list(found.values())

    @cached_property
    def _encoded(self) -> list[str]:
        """The float tensors :attr:`_encodings` quantize, each once."""
        return list(dict.fromkeys(e.tensor for e in self._encodings))

    @cached_property
    def _plain_ranges(self) -> dict[str, tuple[float, float]]:
        """The float model's range of each tensor :attr:`_encodings` quantizes, over the inputs."""
        return run_with_ranges(self.float_model, self._encoded, self.feeds)[0]

    def _refit(
        self, q_inits: Mapping[str, onnx.TensorProto], after: Mapping[str, tuple[float, float]]
    ) -> None:
        """Refit the activation encodings held in ``q_inits`` (in place) to an edited float
        model's ranges ``after``: each end of an encoding's range moves by what that end of its
        tensor moves over the inputs, the float model against the edited one - the
        calibration's own margins kept, as if the engine had calibrated the edited model."""
        before = self._plain_ranges
        for enc in self._encodings:
            sc, zp_name = enc.terms[0]
            scale = float(numpy_helper.to_array(q_inits[sc]).ravel()[0])
            zp = numpy_helper.to_array(q_inits[zp_name])
            qmin, qmax = get_qmin_qmax_for_qType(helper.np_dtype_to_tensor_dtype(zp.dtype))
            lo, hi = (qmin - float(zp.ravel()[0])) * scale, (qmax - float(zp.ravel()[0])) * scale
            (b_lo, b_hi), (e_lo, e_hi) = before[enc.tensor], after[enc.tensor]
            new_lo = lo * e_lo / b_lo if b_lo < 0 and e_lo < 0 else lo
            new_hi = hi * e_hi / b_hi if b_hi > 0 and e_hi > 0 else hi
            if (new_lo, new_hi) == (lo, hi):
                continue
            symmetric = qmin < 0 and not zp.any()
            z, s = compute_scale_zp(
                np.float32(new_lo), np.float32(new_hi), qmin, qmax, symmetric=symmetric
            )
            for scale_name, zero_name in enc.terms:
                q_inits[scale_name].CopyFrom(
                    numpy_helper.from_array(
                        np.asarray(s, np.float32).reshape(q_inits[scale_name].dims), scale_name
                    )
                )
                q_inits[zero_name].CopyFrom(
                    numpy_helper.from_array(np.asarray(z, zp.dtype).reshape(zp.shape), zero_name)
                )

    def _switched(self, made: _Switched, build, layers: Sequence[Exposed]) -> _Switched:
        """``made`` when it switches these layers, else a model of their own."""
        if made.covers(layers):
            return made
        return _Switched(build(layers), layers)

    def removed_noise(self, layers: Sequence[Exposed]) -> np.ndarray:
        """Each output's error power with every encoding applied but these layers' own: their
        weights float again, their output QuantizeLinear/DequantizeLinear a pass-through."""
        layers = _distinct(layers)
        return self._qdq_noise(self._switched(self._removed, self._removed_model, layers), layers)

    def alone_noise(self, layers: Sequence[Exposed]) -> np.ndarray:
        """Each output's error power with only these layers' weights, biases and output
        encodings applied (each group measured once)."""
        layers = _distinct(layers)
        key = tuple(sorted(e.index for e in layers))
        if key not in self._alone_known:
            alone = self._switched(self._alone, self._alone_model, layers)
            self._alone_known[key] = self._pooled_noise(alone.run(self.outputs, self.feeds, layers))
        return self._alone_known[key]

    def _removed_model(self, layers: Sequence[Exposed]) -> onnx.ModelProto:
        """The QDQ model (fetching the outputs) with each layer's quantizers behind its switch:
        on, its float weights and its output's QuantizeLinear/DequantizeLinear bypassed."""
        model = onnx.ModelProto()
        model.CopyFrom(self._qdq_out)
        g = model.graph
        added: set[str] = set()
        for layer in layers:
            on = _switch(g, layer)
            node = g.node[self._position[layer.index]]
            for i, x in enumerate(node.input):
                w = self._float_weight_of(x, self._float_inits, biases=True)
                if w is None:
                    continue
                name = f"{w.name}__sens_float"
                if name not in added:  # a weight shared by two layers
                    added.add(name)
                    g.initializer.append(w)
                    g.initializer[-1].name = name
                node.input[i] = _where(g, on, name, x, f"{x}__sens_w{layer.index}")
            if layer.quantized:
                bypass = None  # the layer's output as the float model has it (made once)
                for q in self._readers.get(layer.qdq_tensor, []):
                    if g.node[q].op_type != "QuantizeLinear":
                        continue
                    for d in self._readers.get(g.node[q].output[0], []):
                        dq = g.node[d]
                        if dq.op_type == "DequantizeLinear":  # its readers keep their input name
                            out = dq.output[0]
                            dq.output[0] = f"{out}__sens_dq"
                            if bypass is None:
                                bypass = _activation(g, layer.qdq_tensor, self._folded)
                            _where(g, on, bypass, dq.output[0], out)
        return _sorted(model)

    def _float_weight_of(self, x: str, inits: Mapping[str, onnx.TensorProto], biases: bool = False):
        """The float model's weight tensor behind a QDQ input ``x`` (a DequantizeLinear of a
        quantized initializer), or None (activations; biases and other 1-D parameters unless
        ``biases``: a layer's encodings include its bias's - on a model whose outputs amplify
        small differences, a simulation leaving biases in float parts from the QDQ model by
        far more than their rounding)."""
        dq = self._producer.get(x)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in self._qdq_inits:
            return None
        w = inits.get(dq.input[0].removesuffix("_quantized"))
        return w if w is not None and len(w.dims) >= (1 if biases else 2) else None

    def _alone_model(self, layers: Sequence[Exposed]) -> onnx.ModelProto:
        """The float model with each layer's encodings behind its switch: on, its weights
        quantized and dequantized and its output through a QuantizeLinear/DequantizeLinear."""
        model = onnx.ModelProto()
        model.CopyFrom(self.float_model)
        g = model.graph
        inits = {i.name: i for i in g.initializer}
        produced = {o for n in g.node for o in n.output}  # the float model's own tensors
        for layer in layers:
            on = _switch(g, layer)
            node = self._qdq_nodes[layer.index]
            for x in node.input:
                w = self._float_weight_of(x, inits, biases=True)
                if w is None:
                    continue
                quant = numpy_helper.from_array(
                    dequantized_weight(self._producer[x], self._qdq_inits)[2].astype(np.float32),
                    f"{w.name}__sens_q{layer.index}",
                )
                g.initializer.append(quant)
                sel = f"{w.name}__sens_w{layer.index}"
                _rewire(g, w.name, sel)
                _where(g, on, quant.name, w.name, sel)
            if layer.quantized:
                tensor = float_tensor(layer, produced)
                if tensor is None:
                    raise KeyError(f"{layer.qdq_tensor} is not a tensor of the float model")
                _insert_qdq(g, layer, tensor, on)
        return _sorted(model)


@dataclass(frozen=True)
class _Encoding:
    """An activation encoding of the QDQ model: the float tensor it quantizes and the
    (scale, zero point) initializer pairs that hold it."""

    tensor: str
    terms: tuple[tuple[str, str], ...]


def _power(runs: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """Each output's power, summed over the runs (per run, per output)."""
    return sum(
        np.asarray([dot(x, x) for x in (np.asarray(g, np.float64).ravel() for g in run)])
        for run in runs
    )


def _channel_edit(node: onnx.NodeProto, channel: int, level: float):
    """Weights -> the same with output ``channel`` scaled until its largest |w| is ``level``."""

    def edit(w: np.ndarray) -> np.ndarray:
        sl = [slice(None)] * w.ndim
        sl[weight_axes(node, w.ndim)[0]] = channel
        out = np.array(w, copy=True)
        peak = float(np.abs(out[tuple(sl)]).max())
        if peak > 0:
            out[tuple(sl)] *= level / peak
        return out

    return edit


def requantized(
    dq: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto], weights: np.ndarray
) -> list[onnx.TensorProto]:
    """A weight's integers, scale and zero point for new float ``weights``, as onnxruntime's
    quantizer (which made the engine's QDQ model) computes them, on the encoding's own terms:
    its integer type, per tensor or along its axis, symmetric when its zero points are all zero
    in a signed type."""
    stored = [numpy_helper.to_array(inits[x]) for x in dq.input[1:3]]
    wq = numpy_helper.to_array(inits[dq.input[0]])
    symmetric = np.iinfo(wq.dtype).min < 0 and not (len(stored) > 1 and np.any(stored[1]))
    qtype = helper.np_dtype_to_tensor_dtype(wq.dtype)
    qmin, qmax = get_qmin_qmax_for_qType(qtype, symmetric=symmetric)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) if stored[0].size > 1 else 0
    # per axis, one slice per channel; per tensor, the whole tensor as one slice
    slices = np.moveaxis(weights, axis, 0) if stored[0].size > 1 else weights[None]
    ints, scales, zps = [], [], []
    for w in slices.astype(np.float32):
        zp, scale = compute_scale_zp(w.min(), w.max(), qmin, qmax, symmetric=symmetric)
        ints.append(quantize_nparray(qtype, w, scale, zp))
        scales.append(scale)
        zps.append(zp)
    ints = np.moveaxis(np.stack(ints), 0, axis) if stored[0].size > 1 else ints[0]
    return [
        numpy_helper.from_array(ints.astype(wq.dtype), dq.input[0]),
        *(
            numpy_helper.from_array(np.asarray(v, t.dtype).reshape(t.shape), name)
            for v, t, name in zip((scales, zps), stored, dq.input[1:3], strict=False)
        ),
    ]


def float_tensor(layer: Exposed, produced: Collection[str]) -> str | None:
    """The float model's tensor for a layer of the QDQ model (``produced``: the float model's
    computed tensors): :func:`float_name`, else the layer's own name."""
    found = float_name(layer.qdq_tensor, produced)
    return found if found is not None or layer.name not in produced else layer.name


def float_name(qdq_tensor: str, produced: Collection[str]) -> str | None:
    """The float model's name of a QDQ model's activation (``produced``: the float model's
    computed tensors); the quantizer renames a graph output's producer
    "<output>_QuantizeLinear_Input"."""
    names = (qdq_tensor, qdq_tensor.removesuffix("_QuantizeLinear_Input"))
    return next((t for t in names if t in produced), None)


class _Switched:
    """One session of a model whose layers' encodings are switched by boolean inputs."""

    def __init__(self, model: onnx.ModelProto, layers: Sequence[Exposed]):
        self.model = model
        self.flags = [_flag(e) for e in layers]
        self._sess: ort.InferenceSession | None = None

    def covers(self, layers: Sequence[Exposed]) -> bool:
        return all(_flag(e) in self.flags for e in layers)

    def run(self, names: Sequence[str], feeds: Sequence[Feeds], on: Sequence[Exposed]):
        """The named outputs on every input, with the switches of ``on`` turned on."""
        if self._sess is None:
            self._sess = exact_session(self.model)
        lit = {_flag(e) for e in on}
        flags = {f: np.array(f in lit) for f in self.flags}
        return _runs(self._sess, names, [{**f, **flags} for f in feeds])


def folded_activations(
    float_model: onnx.ModelProto, qdq_producer: Mapping[str, onnx.NodeProto]
) -> dict[str, tuple[float | None, float | None]]:
    """The Relu/Clip outputs of the float model that the quantizer folded into a
    QuantizeLinear (the QDQ model computes the tensor with the op before them and lets the
    encoding's saturation clip it): tensor -> (low, high) bounds of the activation. Taking
    such a layer's quantizer out must keep its activation, or the layer loses its Relu."""
    consts = om.constants(float_model)
    out: dict[str, tuple[float | None, float | None]] = {}
    for n in float_model.graph.node:
        if n.op_type not in ("Relu", "Clip") or not n.output:
            continue
        made = qdq_producer.get(n.output[0])
        if made is None or made.op_type == n.op_type:
            continue
        if n.op_type == "Relu":
            out[n.output[0]] = (0.0, None)
            continue
        if any(name and name not in consts for name in n.input[1:3]):
            continue  # bounds computed at run time (a spectrogram's max - 80 dB): not folded
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        bounds = [attrs.get("min"), attrs.get("max")]  # opset < 11
        for i, name in enumerate(n.input[1:3]):
            if name:
                bounds[i] = float(numpy_helper.to_array(consts[name]).reshape(-1)[0])
        out[n.output[0]] = (bounds[0], bounds[1])
    return out


def _activation(
    g: onnx.GraphProto, t: str, folded: Mapping[str, tuple[float | None, float | None]]
) -> str:
    """``t`` as the float model has it: through the Relu/Clip the quantizer folded into the
    encoding's saturation, if any (one call per layer: the names it adds are the layer's)."""
    if t not in folded:
        return t
    names = []
    for which, bound in zip(("lo", "hi"), folded[t], strict=True):
        names.append("" if bound is None else f"{t}__sens_{which}")
        if bound is not None:
            g.initializer.append(numpy_helper.from_array(np.array(bound, np.float32), names[-1]))
    g.node.append(helper.make_node("Clip", [t, *names], [f"{t}__sens_act"]))
    return f"{t}__sens_act"


def _distinct(layers: Sequence[Exposed]) -> list[Exposed]:
    """Each layer once: a group may name one layer twice (a row and the layer whose weights it
    stands for, which is also a partner), and its switch is one graph input."""
    return list({e.index: e for e in layers}.values())


def _flag(layer: Exposed) -> str:
    return f"__sens_on_{layer.index}"


def _switch(g: onnx.GraphProto, layer: Exposed) -> str:
    """The layer's switch: a boolean scalar graph input."""
    name = _flag(layer)
    g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, []))
    return name


def _where(g: onnx.GraphProto, on: str, when_on: str, when_off: str, out: str) -> str:
    """``out`` = ``when_on`` if the switch is on, else ``when_off`` (exactly one of them)."""
    g.node.append(helper.make_node("Where", [on, when_on, when_off], [out]))
    return out


def _rewire(g: onnx.GraphProto, old: str, new: str) -> None:
    """Every node reading ``old`` reads ``new`` instead."""
    for n in g.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new


def _insert_qdq(g: onnx.GraphProto, layer: Exposed, t: str, on: str) -> None:
    """Tensor ``t`` through a QuantizeLinear/DequantizeLinear with the layer's encoding when the
    switch ``on`` is on."""
    scale = numpy_helper.from_array(np.array(layer.scale, np.float32), f"{t}__sens_scale")
    zp = numpy_helper.from_array(
        np.array(layer.zero_point, np.dtype(layer.native_dtype or "uint8")), f"{t}__sens_zp"
    )
    g.initializer.extend([scale, zp])
    src = t
    if any(o.name == t for o in g.output):  # a graph output keeps its name: rename its producer
        src = f"{t}__sens_float"
        for n in g.node:
            for i, x in enumerate(n.output):
                if x == t:
                    n.output[i] = src
        out = t
    else:
        out = f"{t}__sens_sel"
        _rewire(g, t, out)
    g.node.extend(
        [
            helper.make_node("QuantizeLinear", [src, scale.name, zp.name], [f"{t}__sens_q"]),
            helper.make_node(
                "DequantizeLinear", [f"{t}__sens_q", scale.name, zp.name], [f"{t}__sens_dq"]
            ),
        ]
    )
    _where(g, on, f"{t}__sens_dq", src, out)


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes back in a topological order for onnxruntime (new nodes were appended), and no
    stale types (a bypass carries float where integers were typed)."""
    g = model.graph
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in om.topological_nodes(g)]
    del g.node[:]
    g.node.extend(nodes)
    g.ClearField("value_info")
    return model
