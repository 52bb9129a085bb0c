"""Encodings that cannot do their job, found in the QDQ model before any backend runs it.

Some losses need no measurement: the encoding itself says it cannot hold its tensor.

* **unholdable** - an activation encoding with an infinite, NaN or zero scale, a range beyond
  :data:`MAX_RANGE`, or steps finer than float32 can tell apart at its values. The usual source
  is a *mask constant*: transformers put float32's minimum (-3.4e38) on the padded keys of the
  attention scores, the quantizer calibrates every tensor that carries it on that range, and
  the scores it was meant to leave alone get one step for the whole real range (or an infinite
  scale, which QNN refuses). The tensors are grouped by the constant their values come from,
  traced back in the float model, and the group says where the constant goes in (a ``Where``
  selecting it by a graph input, a ``Mul`` scaling one).
* **dropped activation** - onnxruntime's quantizer removes a Relu/Clip in front of a quantized
  tensor and lets the tensor's encoding clamp instead; that is exact only when the encoding
  starts (and, for a Clip, ends) at the activation's bounds. An encoding given with ``-qo`` that
  starts below zero lets every negative value the Relu would zero through.

:func:`find_defects` returns one :class:`Defect` per group; the engine prints one line each
(:meth:`Defect.line`) and the culprit ranking names them first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from accdbg.core.onnx_model import constants
from accdbg.encodings.model import ACTIVATION, Encoding
from accdbg.encodings.qdq import qdq_encodings

# An activation encoding wider than this holds no tensor a network computes with: the step
# of 8 bits over it is ~4000, of 16 bits ~15 - the real values vanish into one or two steps.
MAX_RANGE = 1e6
# A constant this far from zero (or infinite) is a sentinel, not a weight: float32's extremes
# (3.4e38), -1e9 and -inf are what exporters and hand-written masks use.
SENTINEL = 1e9
# How far below the scores a clamped mask puts the positions it masks: e^-20 (2e-9) of a
# Softmax's weight per masked key - nothing a model reads, a range an encoding can hold.
MASK_MARGIN = 20.0
# How far back from a tensor its sentinel constant is looked for (ops between the constant and
# the tensor: a Where, an Add, a Reshape, a Transpose... per attention layer a handful).
TRACE_DEPTH = 24

DEFECTS_SUFFIX = ".defects.json"  # <stem>.defects.json beside <stem>.qdq.onnx


def defects_path(qdq_model) -> Path:
    """Where the defects of a quantized model are kept: beside it, named after it."""
    p = Path(qdq_model)
    return p.with_name(p.name.removesuffix(".qdq.onnx") + DEFECTS_SUFFIX)


UNHOLDABLE = "unholdable encoding"
MASK = "mask constant"
DROPPED = "dropped activation"
ACTIVATIONS = ("Relu", "Clip")


@dataclass(frozen=True)
class Defect:
    """One group of tensors whose encodings cannot hold their values, and why."""

    kind: str  # UNHOLDABLE, MASK or DROPPED
    tensors: tuple[str, ...]  # the quantized tensors it hits, in execution order
    what: str  # what is wrong with their encodings
    source: str  # where the values come from (words)
    fix: str  # what to change (words)
    constant: str = ""  # MASK: the float model's constant holding the sentinel
    value: float = math.nan  # MASK: the sentinel's value
    node: str = ""  # DROPPED: the activation the quantizer removed
    # an infinite, NaN or zero scale: no backend takes the encoding (QNN refuses the model),
    # so the engine runs these tensors in float (:func:`accdbg.engines.legalize.keep_float`)
    fatal: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The row it is reported at: its first tensor."""
        return self.tensors[0]

    def shown(self, n: int = 3) -> str:
        more = f" and {len(self.tensors) - n} more" if len(self.tensors) > n else ""
        return ", ".join(self.tensors[:n]) + more

    def line(self) -> str:
        """What the engine prints, one line per group."""
        return f"{self.source}: {len(self.tensors)} tensor(s) ({self.shown()}) {self.what}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["tensors"] = list(self.tensors)
        d["value"] = None if math.isnan(self.value) else self.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Defect:
        value = d.get("value")
        return cls(
            **{
                **{k: v for k, v in d.items() if k in cls.__dataclass_fields__},
                "tensors": tuple(d.get("tensors", ())),
                "value": math.nan if value is None else float(value),
            }
        )


NON_FINITE, ZERO = "an infinite or NaN scale", "a zero scale"
FATAL = (NON_FINITE, ZERO)


def _unholdable(enc: Encoding) -> str | None:
    """Why an activation encoding cannot hold its tensor, or None."""
    scale = np.asarray(enc.scale, np.float64)
    lo, hi = np.asarray(enc.min, np.float64), np.asarray(enc.max, np.float64)
    if not np.all(np.isfinite(scale)):
        return NON_FINITE
    if np.any(scale <= 0):
        return ZERO
    width = float(np.max(hi - lo))
    if not math.isfinite(width) or width > MAX_RANGE:
        return (
            f"a range of {width:.3g} (over {MAX_RANGE:.0e}: the real values fall in a step or two)"
        )
    reach = float(np.max(np.maximum(np.abs(lo), np.abs(hi))))
    if float(np.min(scale)) < float(np.spacing(np.float32(reach))):
        return (
            f"a step ({float(np.min(scale)):.3g}) finer than float32 resolves at their values "
            f"(up to {reach:.3g})"
        )
    return None


class _Graph:
    """The float model as a graph to walk back in."""

    def __init__(self, model: onnx.ModelProto):
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consts = constants(model)
        self.inputs = {i.name for i in model.graph.input} - set(self.consts)

    def sentinel(self, name: str) -> float | None:
        """The constant's most extreme value when it is a sentinel, else None."""
        t = self.consts.get(name)
        if t is None or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            return None
        a = numpy_helper.to_array(t).astype(np.float64).ravel()
        if a.size == 0:
            return None
        far = a[np.argmax(np.abs(np.nan_to_num(a, nan=0.0, posinf=np.inf, neginf=-np.inf)))]
        return float(far) if abs(far) >= SENTINEL else None

    def find_sentinel(self, tensor: str) -> tuple[str, float, onnx.NodeProto] | None:
        """The nearest sentinel constant ``tensor``'s values come from, and the node reading
        it (breadth first, up to :data:`TRACE_DEPTH` ops back)."""
        frontier, seen = [tensor], {tensor}
        for _ in range(TRACE_DEPTH):
            nxt = []
            for t in frontier:
                node = self.producer.get(t)
                if node is None:
                    continue
                for i in node.input:
                    if not i or i in seen:
                        continue
                    seen.add(i)
                    v = self.sentinel(i)
                    if v is not None:
                        return i, v, node
                    nxt.append(i)
            frontier = nxt
            if not frontier:
                break
        return None

    def graph_inputs_of(self, tensors: Iterable[str]) -> list[str]:
        """The graph inputs ``tensors`` are computed from."""
        out, stack, seen = [], list(tensors), set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in self.inputs:
                out.append(t)
                continue
            node = self.producer.get(t)
            if node is not None:
                stack.extend(i for i in node.input if i)
        return sorted(out)


def _value_words(v: float) -> str:
    f32 = float(np.finfo(np.float32).max)
    if math.isinf(v):
        return f"{'-' if v < 0 else ''}inf"
    if abs(abs(v) - f32) <= 1e-6 * f32:
        return f"float32 {'min' if v < 0 else 'max'} ({v:.3g})"
    return f"{v:.3g}"


def _mask_source(graph: _Graph, const: str, value: float, reader: onnx.NodeProto) -> str:
    """Where a sentinel goes in, in words: selected or scaled by what, from which input."""
    others = [i for i in reader.input if i and i != const]
    inputs = graph.graph_inputs_of(others)
    by = f" from input {', '.join(repr(i) for i in inputs)}" if inputs else ""
    how = {
        "Where": "put on the positions a condition selects",
        "Mul": "scaled into the tensor",
        "Add": "added",
    }.get(reader.op_type, f"read by {reader.op_type}")
    return f"mask constant {_value_words(value)} {how}{by} ({reader.op_type} {reader.name!r})"


def _activation_bounds(graph: _Graph, node: onnx.NodeProto) -> tuple[float, float]:
    """The interval a Relu/Clip keeps its output in."""
    if node.op_type == "Relu":
        return 0.0, math.inf
    lo, hi = -math.inf, math.inf
    for a in node.attribute:  # opset < 11
        if a.name == "min":
            lo = a.f
        elif a.name == "max":
            hi = a.f
    for k, attr in ((1, "lo"), (2, "hi")):
        if len(node.input) > k and node.input[k] in graph.consts:
            v = float(numpy_helper.to_array(graph.consts[node.input[k]]).ravel()[0])
            lo, hi = (v, hi) if attr == "lo" else (lo, v)
    return lo, hi


def _dropped(
    float_model: onnx.ModelProto, qdq: onnx.ModelProto, encs: Mapping[str, Encoding]
) -> list[Defect]:
    """Relu/Clip nodes the quantizer removed whose output's encoding does not clamp as they did."""
    graph = _Graph(float_model)
    kept = {n.name for n in qdq.graph.node}
    out = []
    for node in float_model.graph.node:
        if node.op_type not in ACTIVATIONS or not node.name or node.name in kept:
            continue
        enc = encs.get(node.output[0])
        if enc is None or enc.kind != ACTIVATION or not enc.scale:
            continue
        lo, hi = _activation_bounds(graph, node)
        step = float(max(enc.scale))
        e_lo, e_hi = float(min(enc.min)), float(max(enc.max))
        below, above = e_lo < lo - step / 2, e_hi > hi + step / 2
        if not (below or above):
            continue
        bound = f"starts at {e_lo:.4g}" if below else f"ends at {e_hi:.4g}"
        keeps = f"[{lo:g}, {hi:g}]" if node.op_type == "Clip" else "0 and above"
        out.append(
            Defect(
                DROPPED,
                (node.output[0],),
                f"has an encoding that {bound}, while the {node.op_type} kept its values in "
                f"{keeps}: the values it would {'zero' if node.op_type == 'Relu' else 'clip'} "
                "pass through",
                f"{node.op_type} {node.name!r} removed by onnxruntime's quantizer (folded into "
                f"the encoding of {node.output[0]})",
                f"make the encoding of {node.output[0]} {'start' if below else 'end'} at "
                f"{lo if below else hi:g} (the -qo encoding), or keep the {node.op_type} "
                "(onnxruntime's QDQKeepRemovableActivations)",
                node=node.name,
                extra={"bounds": [lo, hi], "encoding": [e_lo, e_hi]},
            )
        )
    return out


def write_defects(path, defects: Iterable[Defect]) -> None:
    """``defects.json`` of an engine run (this module owns the format)."""
    from accdbg.core.run_dir import write_json_atomic

    write_json_atomic(path, [d.as_dict() for d in defects])


def read_defects(path) -> list[Defect]:
    """The defects an engine run found; none when it wrote no file (an older run)."""
    import json

    p = Path(path)
    if not p.is_file():
        return []
    return [Defect.from_dict(d) for d in json.loads(p.read_text(encoding="utf-8"))]


def _clamp(graph: _Graph, names: Iterable[str], encs: Mapping[str, Encoding]) -> float | None:
    """A mask value the encodings can hold: :data:`MASK_MARGIN` below the lowest score over
    the highest, the scores being what the Adds carrying the mask add it to (their other
    input's calibrated range). None when no such Add has a calibrated other input."""
    group = set(names)
    lo, hi = math.inf, -math.inf
    for t in group:
        node = graph.producer.get(t)
        if node is None or node.op_type != "Add":
            continue
        for other in node.input:
            e = encs.get(other)
            if other in group or e is None or e.kind != ACTIVATION or not e.scale:
                continue
            if _unholdable(e) is None:
                lo, hi = min(lo, float(min(e.min))), max(hi, float(max(e.max)))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return float(math.floor(lo - hi - MASK_MARGIN))


def find_defects(float_model: onnx.ModelProto, qdq: onnx.ModelProto) -> list[Defect]:
    """Every group of activation encodings of ``qdq`` that cannot hold its tensor, and every
    activation the quantizer dropped without its encoding clamping as it did (``float_model``:
    the model ``qdq`` was quantized from)."""
    try:
        encs = qdq_encodings(qdq)
    except Exception:  # not a QDQ model (fp16): nothing quantized, nothing to hold
        return []
    order = {n: i for i, n in enumerate(o for n in qdq.graph.node for o in n.input)}
    bad = {n: why for n, e in encs.items() if e.kind == ACTIVATION and (why := _unholdable(e))}
    graph = _Graph(float_model)
    groups: dict[str, list[str]] = {}
    found: dict[str, tuple[str, float, onnx.NodeProto]] = {}
    for name in sorted(bad, key=lambda n: order.get(n, math.inf)):
        hit = graph.find_sentinel(name)
        key = hit[0] if hit else f"tensor:{name}"
        groups.setdefault(key, []).append(name)
        if hit:
            found[key] = hit
    defects = []
    for key, names in groups.items():
        why = bad[names[0]]
        if key in found:
            const, value, reader = found[key]
            defects.append(
                Defect(
                    MASK,
                    tuple(names),
                    f"carry it: their encodings have {why}",
                    _mask_source(graph, const, value, reader),
                    f"clamp the constant {const!r} to a value the encodings can hold (as much "
                    "below the scores as needed to mask them), or keep these tensors in float",
                    constant=const,
                    value=value,
                    fatal=why in FATAL,
                    extra={"clamp": _clamp(graph, names, encs)},
                )
            )
        else:
            defects.append(
                Defect(
                    UNHOLDABLE,
                    tuple(names),
                    f"have encodings with {why}",
                    "values out of any encoding's reach",
                    "keep these tensors in float, or bound their values in the model",
                    fatal=why in FATAL,
                )
            )
    return defects + _dropped(float_model, qdq, encs)
