"""ONNX graph views the planting needs: producers, consumers, constants, weighted layers.

Paddle2onnx models keep their weights in ``Constant`` nodes, converted models in initializers;
:class:`Graph` reads and writes both the same way. A :class:`Layer` is what the quantizer
makes into one quantized layer: a Conv/Gemm/MatMul with constant weights, the
BatchNormalization onnxruntime folds into a Conv, a MatMul's constant bias ``Add`` (fused
into a Gemm when 2-D), and a Relu/Clip that is the sole consumer (onnxruntime's QDQ quantizer
removes such an activation and moves the layer's output quantization after it,
``QDQRemovableActivation``). HardSigmoid/Sigmoid/HardSwish keep their own quantization and
are their own rows in accdbg's tables, so they are not part of the layer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

FUSED_ACTIVATIONS = ("Relu", "Clip")
WEIGHTED = ("Conv", "Gemm", "MatMul")


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class Graph:
    """Index of a model's graph; call :meth:`refresh` after changing its structure."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.refresh()

    def refresh(self) -> None:
        g = self.model.graph
        self.nodes = list(g.node)
        self.position = {n.name or n.output[0]: i for i, n in enumerate(self.nodes)}
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inits = {i.name: i for i in g.initializer}
        self.constant_nodes = {
            n.output[0]: n for n in self.nodes if n.op_type == "Constant" and attr(n, "value")
        }
        self.outputs = {o.name for o in g.output}

    def node(self, name: str) -> onnx.NodeProto:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r}")

    def pos(self, node: onnx.NodeProto) -> int:
        return self.position[node.name or node.output[0]]

    def is_const(self, name: str) -> bool:
        return name in self.inits or name in self.constant_nodes

    def const_derived(self, name: str) -> bool:
        """Computed from constants alone (e.g. a Reshape of an initializer): constant folding
        makes it a constant before quantization."""
        if self.is_const(name):
            return True
        node = self.producer.get(name)
        return node is not None and all(self.const_derived(i) for i in node.input if i)

    def const(self, name: str) -> np.ndarray:
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name]).copy()
        return numpy_helper.to_array(attr(self.constant_nodes[name], "value")).copy()

    def set_const(self, name: str, value: np.ndarray, reshape: bool = True) -> None:
        """Replace a constant's value, in its dtype and (``reshape``) its shape."""
        old = self.const(name)
        value = np.asarray(value, dtype=old.dtype)
        value = value.reshape(old.shape) if reshape else value
        tensor = numpy_helper.from_array(value, name)
        if name in self.inits:
            self.inits[name].CopyFrom(tensor)
        else:
            node = self.constant_nodes[name]
            for a in node.attribute:
                if a.name == "value":
                    a.t.CopyFrom(tensor)

    def add_init(self, name: str, value: np.ndarray) -> str:
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        self.refresh()
        return name

    def sole_consumer(self, tensor: str) -> onnx.NodeProto | None:
        users = self.consumers.get(tensor, [])
        if len(users) == 1 and tensor not in self.outputs:
            return users[0]
        return None

    def private_const(self, name: str) -> bool:
        """A constant only one node reads (changing it changes nothing else)."""
        return self.is_const(name) and len(self.consumers.get(name, [])) == 1


@dataclass
class Layer:
    """One quantized layer around a weighted node."""

    node: onnx.NodeProto
    kind: str  # pointwise | depthwise | conv | dense
    weight: str
    out_axis: int  # axis of the weight holding output channels
    in_axis: int  # axis of the weight holding input channels
    bias: str | None  # a constant added per output channel (Conv input 2, Gemm C, Add after MatMul)
    bn: onnx.NodeProto | None  # BatchNormalization folded into the Conv
    chain: list[str] = field(default_factory=list)  # output tensors, first to last
    channel_axis: int = 1  # axis of the output activation holding channels
    act: str | None = None  # output of the fused Relu/Clip, when there is one
    # a Conv's bias added by a separate Add of a constant-derived tensor: constant folding
    # makes it the Conv's own, and the quantized layer's output takes this tensor's name
    folded_bias: str | None = None

    @property
    def rows(self) -> list[str]:
        """Every tensor the quantized layer's output may be named by (a culprit set)."""
        return self.chain + ([self.folded_bias] if self.folded_bias else [])

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def out(self) -> str:
        return self.chain[-1]

    @property
    def linear_out(self) -> str:
        """The output before a fused activation (where a channel scale or offset shows)."""
        return self.chain[-2] if self.act else self.chain[-1]


def layer_of(g: Graph, node: onnx.NodeProto) -> Layer | None:
    """The layer a weighted node makes, or None (non-constant or shared weights, ...)."""
    if node.op_type not in WEIGHTED or len(node.input) < 2 or not g.private_const(node.input[1]):
        return None
    w = g.const(node.input[1])
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is not None and not g.private_const(bias):
        return None
    if node.op_type == "Conv":
        if w.ndim != 4:
            return None
        group = int(attr(node, "group", 1))
        if group == 1:
            kind = "pointwise" if w.shape[2:] == (1, 1) else "conv"
        elif group == w.shape[0] and w.shape[1] == 1:
            kind = "depthwise"
        else:
            return None
        out_axis, in_axis, ch_axis = 0, 1, 1
    elif node.op_type == "Gemm":
        if attr(node, "transA", 0) or w.ndim != 2 or attr(node, "alpha", 1.0) != 1.0:
            return None
        if attr(node, "beta", 1.0) != 1.0:
            return None
        out_axis = 0 if attr(node, "transB", 0) else 1
        in_axis, kind, ch_axis = 1 - out_axis, "dense", 1
    else:  # MatMul with a constant right operand: x[..., in] @ w[in, out]
        if w.ndim != 2 or g.is_const(node.input[0]):
            return None
        out_axis, in_axis, kind, ch_axis = 1, 0, "dense", -1
    chain = [node.output[0]]
    bn = None
    nxt = g.sole_consumer(chain[-1])
    if node.op_type == "Conv" and nxt is not None and nxt.op_type == "BatchNormalization":
        if all(g.private_const(i) for i in nxt.input[1:5]):
            bn = nxt
            chain.append(nxt.output[0])
            nxt = g.sole_consumer(chain[-1])
    if node.op_type == "MatMul" and bias is None and nxt is not None and nxt.op_type == "Add":
        other = [i for i in nxt.input if i != chain[-1]]
        if len(other) == 1 and g.private_const(other[0]):
            c = g.const(other[0])
            if c.ndim == 1 and c.shape[0] == w.shape[1]:
                bias = other[0]
                chain.append(nxt.output[0])
                nxt = g.sole_consumer(chain[-1])
    folded = None
    if node.op_type == "Conv" and bias is None and nxt is not None and nxt.op_type == "Add":
        other = [i for i in nxt.input if i != chain[-1]]
        if len(other) == 1 and g.const_derived(other[0]):
            folded = nxt.output[0]
    act = None
    if nxt is not None and nxt.op_type in FUSED_ACTIVATIONS:
        act = nxt.output[0]
        chain.append(act)
    return Layer(
        node, kind, node.input[1], out_axis, in_axis, bias, bn, chain, ch_axis, act, folded
    )


def layers(g: Graph) -> list[Layer]:
    """Every weighted layer, in execution order."""
    out = []
    for n in g.nodes:
        layer = layer_of(g, n)
        if layer is not None:
            out.append(layer)
    return out


def activation_after(g: Graph, layer: Layer) -> onnx.NodeProto | None:
    """The fused activation node closing the layer, if any."""
    return g.producer[layer.act] if layer.act else None


def bn_scale(g: Graph, layer: Layer) -> np.ndarray | None:
    """Per-output-channel factor the folded BatchNormalization multiplies the weights by."""
    if layer.bn is None:
        return None
    gamma, _, _, var = (g.const(i).astype(np.float64) for i in layer.bn.input[1:5])
    return gamma / np.sqrt(var + float(attr(layer.bn, "epsilon", 1e-5)))


def effective_weight(g: Graph, layer: Layer) -> np.ndarray:
    """The weights the quantizer sees: with a following BatchNormalization folded in (onnxruntime
    folds it before quantization), so a fault's size is measured where it is quantized."""
    w = g.const(layer.weight).astype(np.float64)
    s = bn_scale(g, layer)
    if s is None:
        return w
    shape = [1] * w.ndim
    shape[layer.out_axis] = -1
    return w * s.reshape(shape)
