"""The quantizer's own defects, caught before QNN sees the model it wrote.

onnxruntime's QDQ quantizer is a program with bugs of its own, and what it gets wrong would
otherwise surface as a QNN error (or as wrong numbers blamed on HTP):

* **a generated name that already exists.** A bias shared by several Conv/Gemm nodes is copied
  once per node as ``<bias><k>`` (:meth:`QDQQuantizer._dup_initializer` counts only
  initializers), which can be the name of an activation of the model: tf2onnx's
  ``...conv1d_25`` bias copied as ``...conv1d_252``, an existing tensor, after which a Neg
  reads the bias. :func:`own_biases` gives every such node its own bias before quantizing, so
  the quantizer never invents a name.
* **a node wired to another tensor than in the float model**: :func:`check_wiring` follows each
  input of every computing node of the QDQ model back through its Q/DQ pair to the float
  tensor it stands for, against the same node's input in the float model.
* **a model onnxruntime's own CPU cannot run**: :func:`check_runs_on_cpu` builds a CPU session
  (no optimisation: the model as written) and runs one input.

Each failure is an :class:`~accdbg.errors.AccdbgError` that says the quantized model is broken,
and by what - not a QNN error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from accdbg.errors import AccdbgError

BIASED = ("Conv", "ConvTranspose", "Gemm")  # ops whose input 2 onnxruntime quantizes as a bias
QDQ = ("QuantizeLinear", "DequantizeLinear")
QUANT_SUFFIX = "_quantized"  # onnxruntime's name for a quantized initializer's integers
OWN_BIAS = "__bias"  # the copies own_biases makes: <bias>__bias<k>


def own_biases(model: onnx.ModelProto) -> list[str]:
    """Give each Conv/Gemm that shares its bias initializer with another one a copy of its own
    (``<bias>__bias<k>``, a name no tensor has), in place; returns the biases copied."""
    inits = {i.name: i for i in model.graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        if n.op_type in BIASED and len(n.input) > 2 and n.input[2] in inits:
            users.setdefault(n.input[2], []).append(n)
    taken = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    taken |= {o for n in model.graph.node for o in n.output}
    copied = []
    for bias, nodes in users.items():
        if len(nodes) < 2:
            continue
        copied.append(bias)
        k = 0
        for node in nodes[1:]:
            while f"{bias}{OWN_BIAS}{k}" in taken:
                k += 1
            name = f"{bias}{OWN_BIAS}{k}"
            taken.add(name)
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[bias])
            copy.name = name
            model.graph.initializer.append(copy)
            node.input[2] = name
    return copied


def _source(
    tensor: str, producer: Mapping[str, onnx.NodeProto], inits: set[str], outputs: set[str]
) -> str:
    """The float tensor a QDQ model's tensor stands for: back through DequantizeLinear and
    QuantizeLinear (a requantization chain too), a quantized initializer's suffix removed."""
    seen = 0
    while seen < 8:
        node = producer.get(tensor)
        if node is None or node.op_type not in QDQ:
            break
        tensor = node.input[0]
        seen += 1
    if tensor in inits and tensor.endswith(QUANT_SUFFIX):
        tensor = tensor.removesuffix(QUANT_SUFFIX)
    # a graph output's producer writes <output>_QuantizeLinear_Input
    base = tensor.removesuffix("_QuantizeLinear_Input")
    return base if base in outputs else tensor


def check_wiring(float_model: onnx.ModelProto, qdq: onnx.ModelProto) -> None:
    """Every computing node of ``qdq`` reads, through its Q/DQ pairs, the tensors the node of
    the same name reads in ``float_model``; a one-line error for the first that does not.

    Nodes onnxruntime removes (a Relu folded into its input's encoding) or adds (Convert
    pairs of mixed precision) have no counterpart and are not compared; a removed node's
    output is taken over by its producer, so its readers still match."""
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    inits = {i.name for i in qdq.graph.initializer}
    outputs = {o.name for o in qdq.graph.output}
    removed_outputs = {
        n.output[0]: n.input[0]
        for n in float_model.graph.node
        if n.name and n.name not in {m.name for m in qdq.graph.node} and n.input and n.output
    }
    for node in qdq.graph.node:
        if node.op_type in QDQ or node.name not in float_nodes:
            continue
        ref = float_nodes[node.name]
        if ref.op_type != node.op_type:
            continue
        for k, (got, want) in enumerate(zip(node.input, ref.input, strict=False)):
            if not got or not want:
                continue
            src = _source(got, producer, inits, outputs)
            if src == want or removed_outputs.get(src) == want or src.startswith(want + OWN_BIAS):
                continue
            if removed_outputs.get(want) == src:  # read before a node the quantizer removed
                continue
            raise AccdbgError(
                f"the quantized model is broken: onnxruntime's quantizer connected input {k} of "
                f"{node.op_type} {node.name!r} to {src!r}, where the float model reads {want!r} "
                "(a name the quantizer generated collides with a tensor of the model) - the "
                "quantizer's output is at fault, not QNN"
            )


def check_runs_on_cpu(qdq_path: Path, feed: Mapping[str, np.ndarray] | None) -> None:
    """onnxruntime's CPU builds the QDQ model as written and runs ``feed`` (when given)
    through it; a one-line error saying the quantized model is broken when it cannot."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(str(qdq_path), so, providers=["CPUExecutionProvider"])
        if feed is not None:
            sess.run(None, dict(feed))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AccdbgError(
            f"the quantized model {qdq_path.name} is broken: onnxruntime's CPU cannot run it "
            f"either ({first}) - the quantizer's output is at fault, not QNN"
        ) from None
