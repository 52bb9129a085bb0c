"""Small edits of the quantized model so that QNN HTP compiles it, each one said in the run's
pre-processing steps.

onnxruntime's quantizer writes QDQ models that onnxruntime runs; QNN HTP refuses some of them
at graph finalize (``QNN_COMMON_ERROR_MEM_ALLOC``, onnxruntime-qnn 2.7.0, checked on
hand-built models): a ``Where`` computing in float, and a ``Where`` driven by ``IsNaN`` of a
quantized tensor. Transformers exported from Hugging Face carry both (the attention mask's
``Where``, SDPA's guard against fully masked rows). The edits keep what the model computes on
quantized tensors:

* :func:`quantize_where_constants` - a Where whose output is quantized but whose constant
  inputs the quantizer left in float (it quantizes a Where only when both its inputs already
  are) gets those constants in its output's encoding: what a quantized Where reads.
* :func:`drop_nan_guards` - ``IsNaN``/``IsInf`` of a dequantized tensor is always false (no
  integer grid holds NaN or infinity): the Where it drives is its else branch.
* :func:`keep_float` - activations whose encodings no backend takes (an infinite or zero
  scale) lose their Q/DQ pairs and run in float.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from accdbg.core import onnx_model as om

GRAPH_OUTPUT_SUFFIX = "_QuantizeLinear_Input"  # onnxruntime's name for a graph output's producer


class _View:
    """Producers, readers and initializers of a graph, read once per edit."""

    def __init__(self, g: onnx.GraphProto):
        self.producer = {o: n for n in g.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.inits = {i.name: i for i in g.initializer}

    def dequantized(self, tensor: str) -> bool:
        p = self.producer.get(tensor)
        return p is not None and p.op_type == "DequantizeLinear"


def _sorted(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """Replace the graph's nodes by ``nodes``, in topological order."""
    g = model.graph
    graph = helper.make_graph(nodes, g.name, list(g.input), list(g.output), list(g.initializer))
    order = om.topological_nodes(graph)
    del g.node[:]
    g.node.extend(order)


def quantize_where_constants(qdq: onnx.ModelProto) -> list[str]:
    """Give the float constant inputs of each Where whose output is quantized the encoding of
    that output, in place; returns the Where nodes changed."""
    view = _View(qdq.graph)
    changed, added = [], []
    for w in qdq.graph.node:
        if w.op_type != "Where" or len(w.input) != 3:
            continue
        q = next(
            (r for r in view.readers.get(w.output[0], []) if r.op_type == "QuantizeLinear"), None
        )
        if q is None or len(q.input) < 3 or q.input[1] not in view.inits:
            continue
        scale = numpy_helper.to_array(view.inits[q.input[1]]).astype(np.float64)
        zero = numpy_helper.to_array(view.inits[q.input[2]])
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            continue  # an encoding no backend takes (encodings.defects names it)
        info = np.iinfo(zero.dtype)
        for k in (1, 2):
            c = w.input[k]
            t = view.inits.get(c)
            if t is None or t.data_type != onnx.TensorProto.FLOAT:
                continue
            v = numpy_helper.to_array(t).astype(np.float64)
            ints = np.clip(np.round(v / scale) + zero.astype(np.int64), info.min, info.max)
            name = f"{w.name or w.output[0]}__in{k}"
            qdq.graph.initializer.append(
                numpy_helper.from_array(ints.astype(zero.dtype), f"{name}_q")
            )
            added.append(
                helper.make_node(
                    "DequantizeLinear", [f"{name}_q", q.input[1], q.input[2]], [f"{name}_dq"],
                    name=f"{name}_DequantizeLinear",
                )
            )  # fmt: skip
            w.input[k] = f"{name}_dq"
            if w.name not in changed:
                changed.append(w.name or w.output[0])
    if added:
        _sorted(qdq, [*qdq.graph.node, *added])
    return changed


def drop_nan_guards(qdq: onnx.ModelProto) -> list[str]:
    """Remove, in place, each ``Where(IsNaN(t), c, t)`` (``IsInf`` alike) whose ``t`` is a
    dequantized tensor: its readers read ``t``. Returns the Where nodes removed."""
    view = _View(qdq.graph)
    rename: dict[str, str] = {}
    drop: set[int] = set()
    removed = []
    for check in qdq.graph.node:
        if check.op_type not in ("IsNaN", "IsInf") or not view.dequantized(check.input[0]):
            continue
        readers = view.readers.get(check.output[0], [])
        guards = [w for w in readers if w.op_type == "Where" and w.input[0] == check.output[0]]
        if len(guards) != len(readers):
            continue  # its boolean is read elsewhere too: left as it is
        for w in guards:
            rename[w.output[0]] = w.input[2]
            drop.add(id(w))
            removed.append(w.name or w.output[0])
        drop.add(id(check))
    if not removed:
        return []
    outputs = {o.name for o in qdq.graph.output}
    if outputs & set(rename):
        return []  # a guard making a graph output: not worth renaming the output
    kept = [n for n in qdq.graph.node if id(n) not in drop]
    for n in kept:
        n.input[:] = [rename.get(i, i) for i in n.input]
    _sorted(qdq, kept)
    return removed


def keep_float(qdq: onnx.ModelProto, tensors: Iterable[str]) -> list[str]:
    """Remove, in place, the QuantizeLinear/DequantizeLinear pair of each activation in
    ``tensors``: its readers read the float tensor itself. Returns the tensors changed."""
    wanted = set(tensors)
    g = qdq.graph
    outputs = {o.name for o in g.output}
    view = _View(g)
    drop: set[int] = set()
    rename: dict[str, str] = {}  # a DQ output -> the float tensor its readers read instead
    out_rename: dict[str, str] = {}  # a graph output's producer -> the graph output
    changed = []
    for q in g.node:
        if q.op_type != "QuantizeLinear":
            continue
        src = q.input[0]
        name = src.removesuffix(GRAPH_OUTPUT_SUFFIX)
        if name not in wanted:
            continue
        readers = view.readers.get(q.output[0], [])
        if not readers or any(r.op_type != "DequantizeLinear" for r in readers):
            continue  # a Q read by a computing node: not a plain pair
        for dq in readers:
            drop.add(id(dq))
            if dq.output[0] in outputs:
                out_rename[src] = dq.output[0]
            else:
                rename[dq.output[0]] = src
        drop.add(id(q))
        changed.append(name)
    kept = [n for n in g.node if id(n) not in drop]
    for n in kept:
        n.input[:] = [out_rename.get(rename.get(i, i), rename.get(i, i)) for i in n.input]
        n.output[:] = [out_rename.get(o, o) for o in n.output]
    del g.node[:]
    g.node.extend(kept)
    used = {i for n in g.node for i in n.input}
    for i in [i for i in g.initializer if i.name not in used]:
        g.initializer.remove(i)
    return changed


def legalize(qdq: onnx.ModelProto) -> list[str]:
    """Every edit QNN HTP needs, in place; returns the steps to report (none: unchanged)."""
    steps = []
    wheres = quantize_where_constants(qdq)
    if wheres:
        steps.append(
            f"{len(wheres)} Where node(s) given their constants in their output's encoding "
            f"(QNN HTP cannot finalize a Where computing in float): {', '.join(wheres[:3])}"
            + (" and more" if len(wheres) > 3 else "")
        )
    guards = drop_nan_guards(qdq)
    if guards:
        steps.append(
            f"{len(guards)} NaN guard(s) on quantized tensors removed (IsNaN of a quantized "
            f"tensor is always false; QNN HTP cannot finalize the Where it drives): "
            f"{', '.join(guards[:3])}" + (" and more" if len(guards) > 3 else "")
        )
    return steps


def clamp_constants(model: onnx.ModelProto, clamps: dict[str, float]) -> None:
    """In a float model, in place: each named constant's sentinel values (a mask's -inf or
    float32 minimum, :data:`~accdbg.encodings.defects.SENTINEL` and beyond) set to its clamp."""
    from accdbg.encodings.defects import SENTINEL

    def clamped(t: onnx.TensorProto, value: float) -> onnx.TensorProto:
        a = numpy_helper.to_array(t)
        far = ~(np.abs(a.astype(np.float64)) < SENTINEL)
        out = np.where(far, np.sign(a) * abs(value), a).astype(a.dtype)
        return numpy_helper.from_array(out, t.name)

    for i, t in enumerate(model.graph.initializer):
        if t.name in clamps:
            model.graph.initializer[i].CopyFrom(clamped(t, clamps[t.name]))
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] in clamps:
            for a in n.attribute:
                if a.name == "value":
                    a.t.CopyFrom(clamped(a.t, clamps[n.output[0]]))
