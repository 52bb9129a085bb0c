"""A QDQ model with only some of its ops quantized: the others get their float weights back
and lose the Q/DQ pairs on their outputs.

Binary snooping scores one half of the model at a time: the ops of that half keep exactly
the encodings of the full QDQ model (same Q/DQ nodes, same scale and zero-point initializers),
the other ops compute in float. On QNN HTP those float ops run in fp16 (the session is made
with ``enable_htp_fp16_precision``); what QNN does not take runs on the CPU, and the report
counts it. Ownership follows the culprit ranking's rule: a tensor's encoding belongs to the op
that produces it (a model input's to the ops that read it), a weight's to the op that reads it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from accdbg.algorithms.diagnosis.evidence import dequantized_weight
from accdbg.algorithms.fragments import QDQ_OPS, QdqModel
from accdbg.core import onnx_model as om


def op_list(qdq: QdqModel) -> list[int]:
    """Node indices (topological) of the ops that compute: everything but Q/DQ."""
    return [i for i, n in enumerate(qdq.nodes) if n.op_type not in QDQ_OPS]


ACTIVATIONS = ("Relu", "Clip")  # what the quantizer folds into an output's Q (its range)


class FloatModel:
    """The pre-processed float model the QDQ model was quantized from: its weights, and the
    activations the quantizer folded into a Q node's range (they come back with the float)."""

    def __init__(self, model: onnx.ModelProto | None):
        self.weights = {} if model is None else {i.name: i for i in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in [] if model is None else model.graph.node:
            for o in n.output:
                self.producer[o] = n

    def folded(self, tensor: str, op_type: str) -> onnx.NodeProto | None:
        """The Relu/Clip that made ``tensor`` in the float model when the QDQ model makes it
        with ``op_type`` (the quantizer removed it: the Q node's range clips instead)."""
        n = self.producer.get(tensor)
        if n is not None and n.op_type in ACTIVATIONS and op_type not in ACTIVATIONS:
            return n
        return None


def partly_quantized(
    qdq: QdqModel,
    quantized: set[int],
    float_model: FloatModel,
) -> tuple[onnx.ModelProto, list[str]]:
    """The QDQ model where only the ops in ``quantized`` (node indices) stay quantized.

    Returns the model and notes (e.g. a weight whose float original was not found and is
    used dequantized, i.e. still carrying its quantization error)."""
    weights = float_model.weights
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in qdq.nodes]
    producer = qdq.producer
    inits = {i.name: i for i in qdq.model.graph.initializer}
    outputs = set(qdq.graph_outputs)
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            readers.setdefault(t, []).append(i)
    notes: list[str] = []
    new_inits: dict[str, onnx.TensorProto] = {}
    rename: dict[str, str] = {}  # tensor -> tensor its readers read instead
    dropped: set[int] = set()
    added: list[
        onnx.NodeProto
    ] = []  # activations the float ops get back  # DQ nodes whose graph output the float producer now makes
    renamed_outputs: dict[str, str] = {}  # producer-side rename for graph outputs

    def computing_readers(t: str) -> list[int]:
        """Ops reading ``t``, through DQ/Q chains."""
        out = []
        for r in readers.get(t, []):
            if nodes[r].op_type in QDQ_OPS:
                out += computing_readers(nodes[r].output[0])
            else:
                out.append(r)
        return out

    for d_index, d in enumerate(nodes):
        if d.op_type != "DequantizeLinear":
            continue
        src = d.input[0]
        if src in inits:  # a weight or bias: floated for the ops of the float part
            users = [r for r in readers.get(d.output[0], []) if r not in quantized]
            if not users or nodes[users[0]].op_type in QDQ_OPS:
                continue
            name = src.removesuffix("_quantized")
            if name in weights:  # the quantizer names a weight's integers <name>_quantized
                tensor = onnx.TensorProto()
                tensor.CopyFrom(weights[name])
                if name in inits or name in producer:
                    name = tensor.name = f"{name}__float"
            else:
                name = f"{name}__float"
                _, _, w = dequantized_weight(d, inits)
                tensor = numpy_helper.from_array(np.asarray(w, np.float32), name)
                notes.append(
                    f"{src}: float original not found, used dequantized (keeps its weight error)"
                )
            new_inits[name] = tensor
            for r in users:
                nodes[r].input[:] = [name if x == d.output[0] else x for x in nodes[r].input]
            continue
        q_index = producer.get(src)
        if q_index is None or qdq.nodes[q_index].op_type != "QuantizeLinear":
            continue
        t = qdq.nodes[q_index].input[0]
        owner = producer.get(t)
        if owner is not None and qdq.nodes[owner].op_type in QDQ_OPS:
            continue  # a requantization chain: left as it is
        if owner is None:  # a model input: its encoding belongs to the ops reading it
            keep = any(r in quantized for r in computing_readers(d.output[0]))
        else:
            keep = owner in quantized
        if keep:
            continue
        if owner is not None:
            op = qdq.nodes[owner].op_type
            # a graph output's producer writes <name>_QuantizeLinear_Input in the QDQ model
            act = float_model.folded(t, op) or float_model.folded(d.output[0], op)
            if act is not None:  # put back the Relu/Clip the Q node's range stood for
                pre = f"{t}__before_{act.op_type.lower()}"
                nodes[owner].output[:] = [pre if o == t else o for o in nodes[owner].output]
                extra = [x for x in act.input[1:] if x]
                for x in extra:
                    if x in weights:
                        new_inits[x] = weights[x]
                added.append(
                    helper.make_node(
                        act.op_type,
                        [pre, *act.input[1:]],
                        [t],
                        name=f"{t}__float_{act.op_type}",
                        domain=act.domain,
                    )
                )
                added[-1].attribute.extend(act.attribute)
        if d.output[0] in outputs:
            renamed_outputs[t] = d.output[0]
            dropped.add(d_index)
        else:
            rename[d.output[0]] = t

    for n in [*nodes, *added]:
        n.input[:] = [rename.get(x, x) for x in n.input]
        if n.op_type not in QDQ_OPS:
            n.output[:] = [renamed_outputs.get(x, x) for x in n.output]
    for n in [*nodes, *added]:
        n.input[:] = [renamed_outputs.get(x, x) for x in n.input]
    # drop the Q/DQ nodes nobody reads any more (dead chains)
    live = [i not in dropped for i in range(len(nodes))]
    changed = True
    while changed:
        used = {x for i, n in enumerate(nodes) if live[i] for x in n.input} | outputs
        dead = [
            i
            for i, n in enumerate(nodes)
            if live[i] and n.op_type in QDQ_OPS and not any(o in used for o in n.output)
        ]
        for i in dead:
            live[i] = False
        changed = bool(dead)
    kept = [n for i, n in enumerate(nodes) if live[i]] + added
    used = {x for n in kept for x in n.input}
    g = qdq.model.graph
    initializers = [i for i in g.initializer if i.name in used]
    initializers += [t for name, t in new_inits.items() if name in used]
    g = qdq.model.graph
    order = om.topological_nodes(
        helper.make_graph(
            kept, "sort", list(g.input), [], initializer=[*g.initializer, *new_inits.values()]
        )
    )
    graph = helper.make_graph(
        [onnx.NodeProto.FromString(n.SerializeToString()) for n in order],
        g.name,
        list(g.input),
        list(g.output),
        initializer=initializers,
    )
    model = helper.make_model(
        graph, opset_imports=qdq.model.opset_import, ir_version=qdq.model.ir_version
    )
    model.producer_name = "accdbg"
    return model, notes
