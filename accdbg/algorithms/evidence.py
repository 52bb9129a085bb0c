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

from accdbg.core import onnx_model as om
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines.exposure import Exposed, select
from accdbg.errors import AccdbgError
from accdbg.verifiers.channels import by_channel, channel_axis, channel_power, live

log = logging.getLogger("accdbg.evidence")

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
    output_nsr: float = math.nan  # median channel, clipping included
    output_nsr_tensor: float = math.nan
    clipped: float = math.nan  # share of golden values outside the encoding's range
    clip_nsr: float = math.nan  # the part of output_nsr_tensor that clipping alone causes
    range_used: float = math.nan  # golden range over the encoding's range
    output_note: str = ""
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
    return -10.0 * math.log10(nsr) if math.isfinite(nsr) else -math.inf


def _qrange(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def qdq(x: np.ndarray, scale, zero_point, dtype: np.dtype) -> np.ndarray:
    """Quantize (round half to even, saturate) and dequantize, as QuantizeLinear/DequantizeLinear."""
    lo, hi = _qrange(dtype)
    q = np.clip(np.rint(x / scale) + zero_point, lo, hi)
    return (q - zero_point) * scale


def _channel_nsr(g2: np.ndarray, d2: np.ndarray) -> tuple[float, np.ndarray]:
    """Median NSR over live channels, and each channel's NSR."""
    power = channel_power(g2)
    noise = channel_power(d2)
    with np.errstate(divide="ignore", invalid="ignore"):
        nsr = np.where(power > 0, noise / power, np.nan)
    alive = live(power)
    vals = nsr[alive]
    return (float(np.median(vals)) if vals.size else math.nan), nsr


def _ratio_note(ranges: np.ndarray, alive: np.ndarray, what: str) -> tuple[str, float]:
    """'channel 7 spans 43x the median channel's range' for the loudest live channel."""
    if alive.sum() < 2:
        return "", math.nan
    med = float(np.median(ranges[alive]))
    if med <= 0:
        return "", math.nan
    idx = int(np.argmax(np.where(alive, ranges, -np.inf)))
    ratio = float(ranges[idx]) / med
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
    ):
        self.model = qdq_model
        self.golden = golden
        self.golden_name = golden_name
        self.float_weights = dict(float_weights or {})
        self.nodes = om.topological_nodes(qdq_model.graph)
        self.inits = {i.name: i for i in qdq_model.graph.initializer}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        known = {r.name for r in golden}
        self.layers = layers if layers is not None else select(qdq_model, known)
        self.row_of = {e.qdq_tensor: e.name for e in self.layers}

    # ------------------------------------------------------------ tensors
    def _array(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def _golden(self, row: str) -> tuple[np.ndarray, str | None] | None:
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
            ev = Evidence(e.name, e.op_type, [self.row_of[x] for x in e.inputs if x in self.row_of])
            node = self.nodes[e.index]
            try:
                self._weights(node, ev)
                gold = self._golden(e.name)
                if gold is not None and e.quantized:
                    self._output(e, gold, ev)
                    if e.op_type == "Concat":
                        self._concat(e, ev)
            except (ValueError, IndexError, TypeError) as exc:  # odd shapes: no evidence, say why
                log.info("no quantization evidence for %s: %s", e.name, exc)
            out[e.name] = ev
        return out

    def _weights(self, node: onnx.NodeProto, ev: Evidence) -> None:
        axis_out = WEIGHT_OUT_AXIS.get(node.op_type)
        if axis_out is None:
            return
        for i, x in enumerate(node.input):
            dq = self.producer.get(x)
            if i != 1 or dq is None or dq.op_type != "DequantizeLinear":
                continue
            wq = self._array(dq.input[0])
            if wq is None or wq.ndim < 2:
                continue
            scale = self._array(dq.input[1])
            zp = self._array(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
            zp = np.zeros_like(scale, dtype=np.int64) if zp is None else zp.astype(np.int64)
            q_axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            if scale.size > 1:  # per-axis: broadcast scale/zp along their axis
                shape = [1] * wq.ndim
                shape[q_axis] = scale.size
                scale, zp = scale.reshape(shape), zp.reshape(shape)
            deq = (wq.astype(np.int64) - zp) * scale.astype(np.float64)
            if node.op_type == "Gemm":
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                axis_out = 0 if trans_b else 1
            name = dq.input[0].removesuffix("_quantized")
            w = self.float_weights.get(name)
            w2 = by_channel(deq, axis_out)
            if w is not None and w.shape == deq.shape:
                f2 = by_channel(w, axis_out)
                ev.weight_nsr, _ = _channel_nsr(f2, f2 - w2)
                ref = f2
            else:  # no float weights (a given QDQ model): rounding noise of one step, s^2/12
                step = np.broadcast_to(scale, deq.shape).astype(np.float64)
                noise2 = by_channel(step**2 / 12.0, axis_out)
                power = channel_power(w2)
                with np.errstate(divide="ignore", invalid="ignore"):
                    nsr = np.where(power > 0, noise2.sum(axis=1) / power, np.inf)
                alive = np.ones(len(nsr), bool)
                ev.weight_nsr = float(np.median(nsr[alive]))
                ref = w2
            ranges = np.abs(ref).max(axis=1)
            alive = live(channel_power(ref))
            note, ratio = _ratio_note(ranges, alive, "output channel")
            flat = np.abs(ref).ravel()
            p99 = float(np.percentile(flat, 99)) if flat.size >= 100 else math.nan
            single = float(flat.max()) / p99 if p99 and p99 > 0 else math.nan
            notes = []
            if not math.isnan(single) and single >= 4 and single > (ratio or 0):
                pos = np.unravel_index(
                    int(np.argmax(np.abs(w if w is not None else deq))), deq.shape
                )
                notes.append(
                    f"weight {list(map(int, pos))} is {single:.3g}x the tensor's 99th percentile"
                )
            elif note:
                notes.append(note)
            per = "per-channel" if scale.size > 1 else "per-tensor"
            ev.weight_note = "; ".join([f"{per} {8 * wq.dtype.itemsize}-bit", *notes])
            return

    def _output(self, e: Exposed, gold: tuple[np.ndarray, str | None], ev: Evidence) -> None:
        g, layout = gold
        dtype = np.dtype(e.native_dtype or "uint8")
        d = qdq(g, e.scale, e.zero_point, dtype) - g
        gg = float(np.einsum("i,i->", g.ravel(), g.ravel()))
        dd = float(np.einsum("i,i->", d.ravel(), d.ravel()))
        ev.output_nsr_tensor = dd / gg if gg > 0 else (0.0 if dd == 0 else math.inf)
        lo, hi = _qrange(dtype)
        vmin, vmax = (lo - e.zero_point) * e.scale, (hi - e.zero_point) * e.scale
        ev.clipped = float(((g < vmin - e.scale / 2) | (g > vmax + e.scale / 2)).mean())
        c = np.clip(g, vmin, vmax) - g
        cc = float(np.einsum("i,i->", c.ravel(), c.ravel()))
        ev.clip_nsr = cc / gg if gg > 0 else 0.0
        ev.range_used = float((g.max() - g.min()) / (vmax - vmin)) if vmax > vmin else math.nan
        axis = channel_axis(g.shape, layout, e.op_type)
        notes = [f"{8 * dtype.itemsize}-bit"]
        if axis is None:
            ev.output_nsr = ev.output_nsr_tensor
        else:
            g2, d2 = by_channel(g, axis), by_channel(d, axis)
            ev.output_nsr, _ = _channel_nsr(g2, d2)
            alive = live(channel_power(g2))
            note, ratio = _ratio_note(np.ptp(g2, axis=1), alive, "channel")
            if note and ratio >= 4:
                notes.append(note)
        if ev.clipped > 0:
            notes.append(f"{100 * ev.clipped:.3g}% of values clipped")
        if not math.isnan(ev.range_used):
            notes.append(f"uses {100 * min(ev.range_used, 1):.3g}% of its range")
        ev.output_note = "; ".join(notes)

    def _concat(self, e: Exposed, ev: Evidence) -> None:
        dtype = np.dtype(e.native_dtype or "uint8")
        worst, note = math.nan, ""
        for x in e.inputs:
            row = self.row_of.get(x)
            gold = self._golden(row) if row else None
            if gold is None:
                continue
            g = gold[0].ravel()
            d = qdq(g, e.scale, e.zero_point, dtype) - g
            gg = float(np.einsum("i,i->", g, g))
            nsr = float(np.einsum("i,i->", d, d)) / gg if gg > 0 else math.nan
            if not math.isnan(nsr) and (math.isnan(worst) or nsr > worst):
                lo, hi = _qrange(dtype)
                share = float(np.ptp(g)) / ((hi - lo) * e.scale)
                worst, note = nsr, f"input {row} uses {100 * share:.3g}% of the output's range"
        ev.concat_nsr, ev.concat_note = worst, note


def float_weights_of(model_path) -> dict[str, np.ndarray]:
    """Float initializers (2-D and more) of the pre-processed float model, by name."""
    model = onnx.load(str(model_path))
    return {
        i.name: numpy_helper.to_array(i)
        for i in model.graph.initializer
        if len(i.dims) >= 2 and i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    }
