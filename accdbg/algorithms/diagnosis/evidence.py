"""Why a layer loses information: what quantizing its weights and its output does on its own.

Computed from the golden (float) tensors and the encodings alone, in numpy, no backend run:
each tensor is quantized and dequantized with its own encoding and compared with its float
value. That error belongs to the tensor's *owner*: a layer owns its weights and its output
encoding; an input's encoding belongs to the layer that produced it. So a consumer fed by a
tensor whose range one channel has blown is not blamed - the producer is.

Per layer (one row per exposed layer output):

* **weights** - per output channel, the noise-to-signal power of ``qdq(W)`` against the float
  ``W`` (median channel: one outlier weight or channel spends the whole per-tensor range and
  crushes the other channels); the outlier behind it (the largest channel range over the median
  one, the largest weight over the tensor's 99th percentile).
* **output** - per channel, ``qdq(golden)`` against golden with the output's own encoding,
  clipping included (median channel); the share of values clipped; the share of the encoding's
  range the golden uses; the loudest channel's range over the median channel's.
* **concatenation** - each input of a Concat quantized with the Concat's output encoding: an
  input whose range is a sliver of the others' keeps a few levels only.

``local`` is the worst of these: the information this layer's own encodings destroy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.core import onnx_model as om
from accdbg.core.cpu_session import stop_if_asked
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines.exposure import Exposed, select
from accdbg.errors import AccdbgError
from accdbg.verifiers.channels import (
    by_channel,
    channel_axis,
    channel_power,
    live,
)

log = logging.getLogger("accdbg.evidence")


# ops that carry their input's values unchanged (a reshape, a transpose): the same error
SAME_VALUES = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Cast")

# output-channel axis of each op's weight tensor (ONNX layouts)
WEIGHT_OUT_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": 0}


@dataclass
class Evidence:
    """What one layer's own encodings do to its data (NSR: noise-to-signal power, 0 = exact)."""

    name: str
    op_type: str
    inputs: list[str] = field(default_factory=list)  # row names of its activation inputs
    weight_nsr: float = math.nan  # median output channel
    weight_note: str = ""
    weight_per_channel: bool | None = None  # None: no quantized weights
    # what blows the weight range: "weight", "output channel", "input channel" (the last is
    # the mark of a compensated pair: the producer shrank that channel, these weights undo it)
    weight_outlier: str = ""
    offset_from: str = ""  # the input whose large mean the weights' rounding multiplies
    # the input channel whose weights span least against the median input channel's, and how
    # many times less (weights that scale back a channel its producer made loud)
    quiet_input: int = -1
    quiet_ratio: float = math.nan
    # the uncompared layer whose weights these are (a Gemm the QNN pre-processing put between
    # two Reshapes, whose values only this layer's golden shows)
    weights_of: str = ""
    # the output channel whose weights span the most, and how many times the median output
    # channel's: weights that make that channel of the output loud themselves
    loud_weights: int = -1
    loud_weights_ratio: float = math.nan
    # a few weights far beyond the rest of their tensor (count, the largest of the rest, note):
    # what the model is like without them is asked of the outputs (Sensitivity.clamped_share)
    few_outliers: int = 0
    rest_max: float = math.nan
    few_ratio: float = math.nan
    few_note: str = ""
    # the output channel whose weights reach furthest, how many times the next widest channel
    # (not the median: one channel alone beyond all the others), and that next channel's
    # largest |w|: what the model is like with it brought there is asked of the outputs
    # (Sensitivity.channel_share)
    lone_channel: int = -1
    lone_ratio: float = math.nan
    lone_level: float = math.nan
    # the channel that blows the weights' range (``weight_outlier`` an output or input
    # channel): its range over the next widest channel's on the same axis. Under
    # POLICY.outlier_ratio it is the widest of a spread the channels have as trained, which
    # per-channel encodings answer - not one channel alone beyond the others
    outlier_next: float = math.nan
    output_nsr: float = math.nan  # median channel, clipping included
    output_nsr_tensor: float = math.nan
    clipped: float = math.nan  # share of golden values outside the encoding's range
    clip_nsr: float = math.nan  # the part of output_nsr_tensor that clipping alone causes
    range_used: float = math.nan  # golden range over the encoding's range
    output_note: str = ""
    output_bits: int = 0  # of its output's encoding (0: not quantized, or no golden value)
    # the output channel reaching farthest from zero, and how far over the median channel
    # (an offset channel counts: it blows the range as much as a wide one)
    loud_channel: int = -1
    loud_ratio: float = math.nan
    # that channel's reach from zero over the next loudest channel's: under POLICY.outlier_ratio the
    # range is set by several channels as trained (the loudest of a spread), not one alone
    loud_next: float = math.nan
    channels: int = 0
    concat_nsr: float = math.nan
    concat_note: str = ""

    @property
    def local_nsr(self) -> float:
        vals = [v for v in (self.weight_nsr, self.output_nsr, self.concat_nsr) if not math.isnan(v)]
        return max(vals) if vals else math.nan

    @property
    def owner(self) -> str:
        """Which of the layer's own encodings loses the most: weights, output or concat."""
        parts = {"weights": self.weight_nsr, "output": self.output_nsr, "concat": self.concat_nsr}
        parts = {k: v for k, v in parts.items() if not math.isnan(v)}
        return max(parts, key=parts.get) if parts else ""


def nsr_db(nsr: float) -> float:
    """Noise-to-signal power as an SQNR in dB (+inf when exact)."""
    if math.isnan(nsr):
        return math.nan
    if nsr <= 0:
        return math.inf
    # + 0.0: an error as large as the signal reads 0.0 dB, not -0.0
    return -10.0 * math.log10(nsr) + 0.0 if math.isfinite(nsr) else -math.inf


def _qrange(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def qdq(x: np.ndarray, scale, zero_point, dtype: np.dtype) -> np.ndarray:
    """Quantize (round half to even, saturate) and dequantize, as QuantizeLinear/DequantizeLinear."""
    lo, hi = _qrange(dtype)
    q = np.divide(x, scale)  # one array, worked in place: activations are large
    np.rint(q, out=q)
    q += zero_point
    np.clip(q, lo, hi, out=q)
    q -= zero_point
    q *= scale
    return q


def _channel_nsr(
    g2: np.ndarray, d2: np.ndarray, power: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """Median NSR over live channels, and each channel's NSR (``power``: each channel's
    golden power, when known)."""
    power = channel_power(g2) if power is None else power
    noise = channel_power(d2)
    with np.errstate(divide="ignore", invalid="ignore"):
        nsr = np.where(power > 0, noise / power, np.nan)
    alive = live(power)
    vals = nsr[alive]
    return (float(np.median(vals)) if vals.size else math.nan), nsr


def _weighted_nsr(
    w: np.ndarray,
    dw: np.ndarray | None,
    axis_out: int,
    axis_in: int,
    stats_in: np.ndarray | None,
    groups: int = 1,
    bias: np.ndarray | None = None,
    step: np.ndarray | float = 0.0,
) -> tuple[float, float]:
    """Median over output channels of the output noise-to-signal power that quantizing the
    weights causes, each input channel weighted by the signal it carries (inputs taken as
    uncorrelated around their means; ``stats_in``: each input channel's mean square and mean).

    The means are summed exactly, with the bias: an offset the bias cancels in float (a channel
    carrying a large constant) adds nothing to the output's signal but multiplies the weights'
    rounding (``dw``, the signed error, squared in place; when it is not known, a rounding of
    ``step``: s^2/12):
    signal_o = Σ_i W²[o,i] Var_i + (Σ_i W[o,i] μ_i + b_o)²,
    noise_o = Σ_i ΔW²[o,i] Var_i + (Σ_i ΔW[o,i] μ_i)².
    Returns the NSR and the share of the noise (all output channels) the means' term makes."""
    rest = tuple(a for a in range(w.ndim) if a not in (axis_out, axis_in))
    order = (axis_out % w.ndim, axis_in % w.ndim, *rest)

    def per_pair(x: np.ndarray) -> np.ndarray:  # [out, in], summed over the kernel
        t = np.transpose(x, order)  # a view; a 2-D weight has no kernel to sum (no copy)
        return t if t.ndim == 2 else t.reshape(t.shape[0], t.shape[1], -1).sum(axis=2)

    n_out, per_group = w.shape[order[0]], w.shape[order[1]]
    power = mean = None  # each input channel's (a grouped layer's: per output channel's inputs)
    if stats_in is not None:
        size = stats_in.shape[1]
        if groups > 1 and size == per_group * groups:
            idx = (np.arange(n_out) // max(1, n_out // groups))[:, None] * per_group + np.arange(
                per_group
            )
            power, mean = stats_in[:, idx]
        elif size == per_group:
            power, mean = stats_in
    # the means' term first: then the signed error is squared in place (a big layer's weights
    # are held a few times over at most)
    dc_noise = None if power is None or dw is None else _rowdot(per_pair(dw), mean) ** 2
    err2 = np.square(dw, out=dw) if dw is not None else np.asarray(step, np.float64) ** 2 / 12.0
    err = per_pair(np.broadcast_to(err2, w.shape))
    sig = per_pair(np.square(w))
    dc_share = 0.0
    if power is None:
        signal, noise = sig.sum(axis=1), err.sum(axis=1)
    else:
        var = np.maximum(power - mean**2, 0.0)
        dc = _rowdot(per_pair(w), mean) + (0.0 if bias is None else bias)
        signal = _rowdot(sig, var) + dc**2
        if dc_noise is None:
            # the rounding is not known: its mean error is no better than its power
            noise = _rowdot(err, power)
        else:
            noise = _rowdot(err, var) + dc_noise
            total = float(noise.sum())
            dc_share = float(dc_noise.sum()) / total if total > 0 else 0.0
    alive = live(signal)
    with np.errstate(divide="ignore", invalid="ignore"):
        nsr = np.where(signal > 0, noise / signal, np.nan)
    vals = nsr[alive]
    return (float(np.median(vals)) if vals.size else math.nan), dc_share


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a * b).sum(axis=1)`` for ``b`` of a's shape or one row of it, without the product
    (a 2-D weight's [out, in] is as large as the weight)."""
    if b.ndim == 1:
        return np.einsum("ij,j->i", a, b)
    return np.einsum("ij,ij->i", a, b)


def _offset_channel(stats_in: np.ndarray | None) -> tuple[int, float] | None:
    """(index, ratio) of the input channel whose mean is at least ``POLICY.offset_ratio`` times the
    median channel's RMS - a constant a channel carries, not the signal's own mean."""
    if stats_in is None or stats_in.shape[1] < 2:
        return None
    rms = float(np.median(np.sqrt(stats_in[0])))
    loud = int(np.argmax(np.abs(stats_in[1])))
    ratio = abs(float(stats_in[1][loud])) / rms if rms > 0 else math.nan
    return (loud, ratio) if ratio >= POLICY.offset_ratio else None


def _outlier_notes(
    ref: np.ndarray,
    out_ranges: np.ndarray,
    in_ranges: np.ndarray,
    p99: float,
    absw: np.ndarray | None = None,
) -> tuple[str, str, float]:
    """The outlier behind a blown weight range - one weight, one output or input channel (their
    ranges given; ``p99``: :func:`weight_p99`) - as (what, note, how many times the rest);
    ("", "", nan) when none is four times the rest."""
    absw = np.abs(ref) if absw is None else absw  # ``absw``: |ref|, when already made
    single = float(absw.max()) / p99 if p99 and p99 > 0 else math.nan
    best = (0.0, "", "")
    for ranges, what in ((out_ranges, "output channel"), (in_ranges, "input channel")):
        note, ratio = _ratio_note(ranges, ranges > 0, what)
        if note and ratio > best[0]:
            best = (ratio, what, note)
    if not math.isnan(single) and single >= POLICY.outlier_ratio and single > best[0]:
        return "weight", _largest_note(absw, single), single
    return (
        (best[1], best[2], best[0])
        if best[2] and best[0] >= POLICY.outlier_ratio
        else ("", "", math.nan)
    )


def weight_axes(node: onnx.NodeProto, ndim: int) -> tuple[int, int]:
    """(output axis, input axis) of a layer's weight tensor of ``ndim`` dimensions."""
    axis_out = WEIGHT_OUT_AXIS[node.op_type] % ndim  # MatMul's -1: a 2-D weight's input is 0
    axis_in = 1 - axis_out if ndim == 2 else (0 if node.op_type == "ConvTranspose" else 1)
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        axis_out, axis_in = (0, 1) if trans_b else (1, 0)
    return axis_out, axis_in


def lone_channel(ranges: np.ndarray) -> tuple[int, float, float]:
    """(index, its range over the next widest's, the next widest's range) of the output channel
    whose weights reach furthest; (-1, nan, nan) under two channels with a range.

    Against the next channel, not the median: trained weights spread their channels' ranges
    widely (PP-OCRv3 det's widest 1x1 channel is 54x the median but 1.4x the next), which
    per-channel encodings answer; one channel alone far beyond every other is something the
    float model leans on - its output carries whatever error its inputs bring that many times
    louder than its neighbours do."""
    live = np.sort(ranges[ranges > 0])
    if live.size < 2:
        return -1, math.nan, math.nan
    return int(np.argmax(ranges)), float(live[-1] / live[-2]), float(live[-2])


def weight_p99(ref: np.ndarray, magnitudes: bool = False) -> float:
    """The 99th percentile of a weight tensor's magnitudes (``magnitudes``: ``ref`` holds them
    already), the scale its outliers are measured against; NaN under 100 weights (no
    percentile to trust)."""
    if ref.size < 100:
        return math.nan
    return float(np.percentile(ref if magnitudes else np.abs(ref), 99))


def _largest_note(absw: np.ndarray, ratio: float) -> str:
    """Where the largest weight is (``absw``: the magnitudes)."""
    pos = list(map(int, np.unravel_index(int(np.argmax(absw)), absw.shape)))
    return f"weight {pos} is {ratio:.3g}x the tensor's 99th percentile"


def few_outliers(
    ref: np.ndarray, p99: float | None = None, absw: np.ndarray | None = None
) -> tuple[int, float, float, str]:
    """The weights beyond ``POLICY.outlier_ratio`` x the tensor's 99th percentile (``p99``, computed
    when not given), when they are at most one in a thousand (a channel scaled as a whole is
    not "a few weights"): (how many, the largest magnitude of the rest, the largest's ratio to
    the percentile, a note); (0, nan, nan, "") when there are none or too many."""
    absw = np.abs(ref) if absw is None else absw  # ``absw``: |ref|, when already made
    p99 = weight_p99(absw, magnitudes=True) if p99 is None else p99
    if not p99 > 0:  # NaN too: under 100 weights
        return 0, math.nan, math.nan, ""
    over = absw > POLICY.outlier_ratio * p99
    count = int(over.sum())
    if not 0 < count <= max(1, absw.size // 1000):
        return 0, math.nan, math.nan, ""
    ratio = float(absw.max()) / p99
    note = _largest_note(absw, ratio)
    if count > 1:
        note += f" ({count} weights beyond {POLICY.outlier_ratio:g}x)"
    return count, float(np.max(absw, where=~over, initial=0.0)), ratio, note


def _widest(ranges: np.ndarray, alive: np.ndarray | None = None) -> tuple[int, float]:
    """(index, its range over the median live channel's) of the live channel spanning most
    (``alive``: default, those with a range); (-1, nan) under two live channels."""
    alive = ranges > 0 if alive is None else alive
    if alive.sum() < 2:
        return -1, math.nan
    med = float(np.median(ranges[alive]))
    if med <= 0:
        return -1, math.nan
    idx = int(np.argmax(np.where(alive, ranges, -np.inf)))
    return idx, float(ranges[idx]) / med


def _quietest(ranges: np.ndarray) -> tuple[int, float]:
    """(index, median over its range) of the channel whose weights span least."""
    alive = ranges > 0
    if alive.sum() < 2:
        return -1, math.nan
    idx = int(np.argmin(np.where(alive, ranges, np.inf)))
    return idx, float(np.median(ranges[alive]) / ranges[idx])


def _ratio_note(ranges: np.ndarray, alive: np.ndarray, what: str) -> tuple[str, float]:
    """'channel 7 spans 43x the median channel's range' for the loudest live channel."""
    idx, ratio = _widest(ranges, alive)
    if idx < 0:
        return "", math.nan
    return f"{what} {idx} spans {ratio:.3g}x the median {what}'s range", ratio


class EvidenceBuilder:
    """Evidence for every layer of a QDQ model, from golden tensors."""

    def __init__(
        self,
        qdq_model: onnx.ModelProto,
        golden: TensorFolder,
        golden_name: Callable[[str], str | None],
        float_weights: Mapping[str, np.ndarray] | None = None,
        layers: list[Exposed] | None = None,
        graph_inputs: Mapping[str, np.ndarray] | None = None,
    ):
        self.model = qdq_model
        self.golden = golden
        self.golden_name = golden_name
        self.float_weights = dict(float_weights or {})
        self.graph_inputs = dict(graph_inputs or {})  # the model's own inputs (not dumped)
        self.nodes = om.topological_nodes(qdq_model.graph)
        self.inits = {i.name: i for i in qdq_model.graph.initializer}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        known = {r.name for r in golden}
        self.layers = layers if layers is not None else select(qdq_model, known)
        self.row_of = {e.qdq_tensor: e.name for e in self.layers}
        self._stats: dict[str, dict[tuple[int, int], np.ndarray]] = {}  # row -> channel_powers
        self._read_as: dict[str, set[int]] = {}  # row -> how weighted layers read it (1, -1)
        for n in self.nodes:
            if n.op_type in WEIGHT_OUT_AXIS and n.input:
                row = self.row_of.get(self._activation(n.input[0]))
                if row is not None:
                    self._read_as.setdefault(row, set()).add(
                        1 if n.op_type.startswith("Conv") else -1
                    )

    # ------------------------------------------------------------ tensors
    def golden_of(self, row: str) -> tuple[np.ndarray, str | None] | None:
        """A row's golden tensor (float64, its recorded shape) and layout; None when the golden
        has none, or not finite."""
        g = self.golden_name(row)
        if g is None or g not in self.golden:
            return None
        rec = self.golden.records[g]
        try:
            arr = np.asarray(self.golden.load(g), dtype=np.float64).reshape(rec.shape or (-1,))
        except (AccdbgError, ValueError):
            return None
        if not np.isfinite(arr).all():
            return None
        return arr, rec.layout

    # ------------------------------------------------------------ the evidence
    def build(self) -> dict[str, Evidence]:
        out: dict[str, Evidence] = {}
        for e in self.layers:
            stop_if_asked()  # a build beside the backend run may be asked to stop
            ev = Evidence(e.name, e.op_type, [self.row_of[x] for x in e.inputs if x in self.row_of])
            node = self.nodes[e.index]
            try:
                self._weights(node, ev)
                gold = self.golden_of(e.name)
                kinds = self._read_as.get(e.name)
                if gold is not None and kinds:  # its consumers weigh their weights by these
                    self._stats[e.name] = channel_powers(*gold, tuple(kinds))
                if gold is not None and e.quantized:
                    output_evidence(e, gold, ev)
                    if e.op_type == "Concat":
                        self._concat(e, ev)
            except (ValueError, IndexError, TypeError) as exc:  # odd shapes: no evidence, say why
                log.info("no quantization evidence for %s: %s", e.name, exc)
            out[e.name] = ev
        self._fold_reshaped(out)
        return out

    def _fold_reshaped(self, out: dict[str, Evidence]) -> None:
        """A weighted layer without a golden tensor whose values one layer with a golden only
        reshapes (onnxruntime's QNN pre-processing turns a MatMul with a bias into Reshape,
        Gemm, Reshape; the framework's tensor is the last): its weights' evidence is that
        layer's, which stands for both."""
        known = set(self.golden.names())
        readers: dict[str, list[Exposed]] = {}
        for e in self.layers:
            for x in out[e.name].inputs:
                readers.setdefault(x, []).append(e)
        for e in self.layers:
            ev = out[e.name]
            if math.isnan(ev.weight_nsr) or self.golden_name(e.name) in known:
                continue
            users = readers.get(e.name, [])
            if len(users) != 1 or users[0].op_type not in SAME_VALUES:
                continue
            row = out[users[0].name]
            if self.golden_name(row.name) not in known or not math.isnan(row.weight_nsr):
                continue
            row.weight_nsr, row.weight_note = ev.weight_nsr, ev.weight_note
            row.weight_outlier, row.offset_from = ev.weight_outlier, ev.offset_from
            row.weights_of, row.inputs = e.name, list(ev.inputs)
            row.few_outliers, row.rest_max = ev.few_outliers, ev.rest_max
            row.few_ratio, row.few_note = ev.few_ratio, ev.few_note
            row.loud_weights, row.loud_weights_ratio = ev.loud_weights, ev.loud_weights_ratio
            row.lone_channel, row.lone_ratio = ev.lone_channel, ev.lone_ratio
            row.outlier_next, row.weight_per_channel = ev.outlier_next, ev.weight_per_channel
            row.lone_level = ev.lone_level

    def _weights(self, node: onnx.NodeProto, ev: Evidence) -> None:
        if node.op_type not in WEIGHT_OUT_AXIS:
            return
        weight = self._dequantized(node.input[1]) if len(node.input) > 1 else None
        if weight is None:
            return
        dq, (wq, scale, deq) = weight
        if wq.ndim < 2:
            return
        axis_out, axis_in = weight_axes(node, wq.ndim)
        w = self.float_weights.get(dq.input[0].removesuffix("_quantized"))
        ref = w.astype(np.float64) if w is not None and w.shape == deq.shape else deq
        # no float weights (a given QDQ model): the rounding is not known, only its step
        dw = None if ref is deq else np.subtract(deq, ref, out=deq)  # deq is not used again
        stats_in = self._input_stats(node, axis_in, ref.shape[axis_in])
        groups = next((a.i for a in node.attribute if a.name == "group"), 1)
        bias = self._bias(node, ref.shape[axis_out])
        ev.weight_nsr, dc_share = _weighted_nsr(
            ref, dw, axis_out, axis_in, stats_in, groups, bias, step=scale
        )
        ev.weight_per_channel = scale.size > 1
        notes = [f"{'per-channel' if scale.size > 1 else 'per-tensor'} {8 * wq.dtype.itemsize}-bit"]
        del dw  # the largest arrays of a big layer, one at a time
        absw = np.abs(ref)  # once: the ranges and both kinds of outlier are measured on it
        ranges = {
            axis: absw.max(axis=tuple(a for a in range(absw.ndim) if a != axis))
            for axis in (axis_out, axis_in)
        }
        p99 = weight_p99(absw, magnitudes=True)
        ev.weight_outlier, note, blown = _outlier_notes(
            ref, ranges[axis_out], ranges[axis_in], p99, absw
        )
        ev.few_outliers, ev.rest_max, ev.few_ratio, ev.few_note = few_outliers(ref, p99, absw)
        del absw
        ev.loud_weights, ev.loud_weights_ratio = _widest(ranges[axis_out])
        ev.lone_channel, ev.lone_ratio, ev.lone_level = lone_channel(ranges[axis_out])
        if ev.weight_outlier == "output channel":  # the axis lone_channel just measured
            ev.outlier_next = ev.lone_ratio
        elif ev.weight_outlier == "input channel":
            ev.outlier_next = lone_channel(ranges[axis_in])[1]
        depthwise = groups > 1 and ref.shape[axis_in] == 1
        ev.quiet_input, ev.quiet_ratio = _quietest(ranges[axis_out if depthwise else axis_in])
        offset = _offset_channel(stats_in) if dc_share >= 0.5 and ev.inputs else None
        if offset is not None and not blown >= POLICY.blown_ratio:
            # weights whose rounding multiplies an input's offset: its maker is the cause (with
            # a range of their own blown POLICY.blown_ratio times, their coarse step is)
            loud, ratio = offset
            ev.weight_outlier, ev.offset_from = "input offset", ev.inputs[0]
            note = (
                f"the weights' rounding multiplies input channel {loud}'s mean of "
                f"{stats_in[1][loud]:.4g} ({ratio:.3g}x the median channel's RMS; "
                f"{100 * dc_share:.0f}% of the weights' error)"
            )
        ev.weight_note = "; ".join([*notes, note] if note else notes)

    def _bias(self, node: onnx.NodeProto, n_out: int) -> np.ndarray | None:
        """The layer's float bias (dequantized), one per output channel, when it has one."""
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3:
            return None
        x = node.input[2]
        quantized = self._dequantized(x)
        if quantized is not None:
            b = quantized[1][2]
        elif x in self.inits:
            b = numpy_helper.to_array(self.inits[x]).astype(np.float64)
        else:
            return None
        return b.ravel() if b.size == n_out else None

    def _dequantized(self, x: str):
        """(its DequantizeLinear, :func:`dequantized_weight`) when ``x`` dequantizes an
        initializer, else None."""
        dq = self.producer.get(x)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in self.inits:
            return None
        return dq, dequantized_weight(dq, self.inits)

    def _activation(self, x: str) -> str:
        """The float activation behind a DequantizeLinear/QuantizeLinear chain."""
        while x in self.producer and self.producer[x].op_type in (
            "QuantizeLinear",
            "DequantizeLinear",
        ):
            x = self.producer[x].input[0]
        return x

    def _input_stats(self, node: onnx.NodeProto, axis_in: int, n: int) -> np.ndarray | None:
        """Mean square of each input channel of the layer's golden input: a weight matters as
        much as the signal it multiplies (a huge weight on a silent channel does nothing)."""
        x = self._activation(node.input[0])
        row = self.row_of.get(x)
        if row is not None and row in self._stats:  # measured when its producer was
            return self._stats[row].get((1 if node.op_type.startswith("Conv") else -1, n))
        gold = self.golden_of(row) if row else None
        if gold is None and x in self.graph_inputs:
            gold = (np.asarray(self.graph_inputs[x], np.float64), None)
        if gold is None:
            return None
        return channel_powers(*gold).get((1 if node.op_type.startswith("Conv") else -1, n))

    def _concat(self, e: Exposed, ev: Evidence) -> None:
        dtype = np.dtype(e.native_dtype or "uint8")
        worst, note = math.nan, ""
        for x in e.inputs:
            row = self.row_of.get(x)
            gold = self.golden_of(row) if row else None
            if gold is None:
                continue
            g = gold[0].ravel()
            d = qdq(g, e.scale, e.zero_point, dtype)
            d -= g
            gg = float(np.einsum("i,i->", g, g))
            nsr = float(np.einsum("i,i->", d, d)) / gg if gg > 0 else math.nan
            if not math.isnan(nsr) and (math.isnan(worst) or nsr > worst):
                lo, hi = _qrange(dtype)
                share = float(np.ptp(g)) / ((hi - lo) * e.scale)
                worst, note = nsr, f"input {row} uses {100 * share:.3g}% of the output's range"
        ev.concat_nsr, ev.concat_note = worst, note


def output_evidence(e: Exposed, gold: tuple[np.ndarray, str | None], ev: Evidence) -> None:
    """The output encoding's own loss on the golden tensor: per tensor and per channel, what
    clipping alone takes, how much of the encoding's range the values use."""
    g, layout = gold
    if g.size == 0:
        return
    dtype = np.dtype(e.native_dtype or "uint8")
    d = qdq(g, e.scale, e.zero_point, dtype)
    d -= g
    gg = float(np.einsum("i,i->", g.ravel(), g.ravel()))
    dd = float(np.einsum("i,i->", d.ravel(), d.ravel()))
    ev.output_nsr_tensor = dd / gg if gg > 0 else (0.0 if dd == 0 else math.inf)
    lo, hi = _qrange(dtype)
    vmin, vmax = (lo - e.zero_point) * e.scale, (hi - e.zero_point) * e.scale
    # beyond the encoding's range (few values, if any): what clipping alone takes away, and
    # how many values lie beyond half a step past it
    under, over = g[g < vmin], g[g > vmax]
    ev.clipped = (
        int(np.count_nonzero(under < vmin - e.scale / 2))
        + int(np.count_nonzero(over > vmax + e.scale / 2))
    ) / g.size
    cc = float(np.sum((vmin - under) ** 2) + np.sum((over - vmax) ** 2))
    ev.clip_nsr = cc / gg if gg > 0 else 0.0
    axis = channel_axis(g.shape, layout, e.op_type)
    ev.output_bits = 8 * dtype.itemsize
    notes = [f"{ev.output_bits}-bit"]
    if axis is None:
        ev.output_nsr = ev.output_nsr_tensor
        top, bottom = float(g.max()), float(g.min())
    else:
        g2, d2 = by_channel(g, axis), by_channel(d, axis)
        power = channel_power(g2)
        ev.output_nsr, _ = _channel_nsr(g2, d2, power)
        cmax, cmin = g2.max(axis=1), g2.min(axis=1)
        top, bottom = float(cmax.max()), float(cmin.min())
        extent = np.maximum(np.abs(cmax), np.abs(cmin))
        alive = live(power) & (extent > 0)
        if alive.sum() >= 2:
            ev.channels = int(extent.size)
            ev.loud_channel, ev.loud_ratio = _widest(extent, alive)
            ev.loud_next = lone_channel(extent[alive])[1]
        note, ratio = _ratio_note(cmax - cmin, live(power), "channel")
        if note and ratio >= 4:
            notes.append(note)
    ev.range_used = (top - bottom) / (vmax - vmin) if vmax > vmin else math.nan
    if ev.clipped > 0:
        notes.append(f"{100 * ev.clipped:.3g}% of values clipped")
    if not math.isnan(ev.range_used):
        notes.append(f"uses {100 * min(ev.range_used, 1):.3g}% of its range")
    ev.output_note = "; ".join(notes)


def channel_powers(
    g: np.ndarray, layout: str | None, kinds: tuple[int, ...] = (1, -1)
) -> dict[tuple[int, int], np.ndarray]:
    """Mean square and mean of each channel of a tensor (rows 0 and 1), keyed ``(kind,
    channels)``: kind 1 is the channel axis a convolution reads (axis 1; NHWC: 3), -1 the last
    axis a MatMul/Gemm reads."""
    if g.ndim < 2:
        return {}
    conv = 3 if layout and layout.upper() == "NHWC" and g.ndim == 4 else 1
    out = {}
    for kind, axis in ((k, conv if k == 1 else g.ndim - 1) for k in kinds):
        g2 = by_channel(g, axis)
        out[(kind, g.shape[axis])] = np.stack([channel_power(g2) / g2.shape[1], g2.mean(axis=1)])
    return out


def dequantized_weight(
    dq: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight's integers, its scale (broadcast along a per-axis encoding's axis) and its
    dequantized float64 values, from its DequantizeLinear and the model's initializers."""
    wq = numpy_helper.to_array(inits[dq.input[0]])
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zp_name = dq.input[2] if len(dq.input) > 2 else ""
    zp = (
        numpy_helper.to_array(inits[zp_name]).astype(np.int64)
        if zp_name
        else np.zeros_like(scale, dtype=np.int64)
    )
    if scale.size > 1:  # per-axis: broadcast scale/zp along their axis
        shape = [1] * wq.ndim
        shape[next((a.i for a in dq.attribute if a.name == "axis"), 1)] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    # integers to 32 bits are exact in float64; worked in place (weights are large)
    deq = wq.astype(np.float64)
    deq -= zp
    deq *= scale
    return wq, scale, deq


def float_weights_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Float initializers (2-D and more) of the pre-processed float model, by name."""
    return {
        i.name: numpy_helper.to_array(i)
        for i in model.graph.initializer
        if len(i.dims) >= 2 and i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    }
