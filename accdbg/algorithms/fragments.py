"""Graph surgery for the deeper algorithms: pieces of the QDQ model, with its own encodings.

Layerwise and cumulative-layerwise both run *parts* of the quantized model fed with golden
values. The parts are cut out of the QDQ model the full run used, never re-quantized: each
golden tensor enters through a copy of the QuantizeLinear/DequantizeLinear pair that tensor
has in the full model (same scale and zero point initializers), weights keep their
DequantizeLinear, and each layer output leaves through its own QuantizeLinear. So a part
computes exactly what the full model computes, given the same inputs.

* :meth:`QdqModel.between` - one layer alone: golden activations in, its integers out
  (``onnx.utils.Extractor`` between the layer's float inputs and its output's Q node).
* :func:`merge` - many fragments side by side in one model (names prefixed per fragment,
  initializers shared), so one QNN session runs them all.
* :meth:`QdqModel.suffix` - everything after a partition point: every float tensor that
  crosses the cut becomes a graph input (it still goes through its Q/DQ).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.compose
import onnx.utils

from accdbg.core import onnx_model as om
from accdbg.engines import exposure
from accdbg.engines.exposure import Exposed

QDQ_OPS = exposure.QDQ_OPS
# ops HTP runs as kernels of their own, which the elementwise and layout ops after them may be
# fused into (layerwise runs the others also after their producers back to these)
KERNELS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum")
# at most this many producers run before a layer in its context, the nearest first
CONTEXT_OPS = 6


def context_walk(
    start: Iterable[Hashable],
    producers: Callable[[Hashable], Iterable[Hashable]],
    is_kernel: Callable[[Hashable], bool],
) -> list[Hashable]:
    """What runs before a layer in its context (nodes for layerwise, rows for the ranking):
    from its producers ``start``, back through those that are no kernel to the nearest
    kernels (included), breadth first, the nearest ``CONTEXT_OPS`` at most."""
    inside: list[Hashable] = []
    todo = list(start)
    while todo:
        x = todo.pop(0)
        if x in inside or len(inside) == CONTEXT_OPS:
            continue
        inside.append(x)
        if not is_kernel(x):
            todo += producers(x)
    return inside


class SurgeryError(Exception):
    """A part of the model could not be cut out (reported as ``err_part``)."""


@dataclass
class Layer:
    """One reported layer output, in execution order."""

    position: int
    exposed: Exposed
    inputs: list[str] = field(default_factory=list)  # float activations the node reads

    @property
    def name(self) -> str:
        return self.exposed.name

    @property
    def op_type(self) -> str:
        return self.exposed.op_type

    @property
    def node_index(self) -> int:
        return self.exposed.index

    @property
    def output(self) -> str:
        """The tensor a fragment exposes for this layer: the backend's integers when quantized."""
        return self.exposed.q_output or self.exposed.qdq_tensor

    @property
    def suffix_output(self) -> str:
        """The tensor a suffix exposes: as the inference engine does (a graph output's DQ
        output rather than its Q output, which the QNN EP cannot expose twice)."""
        return self.exposed.graph_tensor

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        """Float values of what a part returned for this layer (integers or already float)."""
        if np.issubdtype(values.dtype, np.floating) or not self.exposed.quantized:
            return np.asarray(values, dtype=np.float32)
        return (
            (values.astype(np.int32) - self.exposed.zero_point) * np.float32(self.exposed.scale)
        ).astype(np.float32)


@dataclass
class Part:
    """A model cut out of the QDQ model, and what its inputs and outputs stand for."""

    model: onnx.ModelProto
    inputs: dict[str, str]  # graph input -> float tensor of the QDQ model whose golden feeds it
    outputs: dict[str, Layer]  # graph output -> the layer it holds
    finals: list[str] = field(
        default_factory=list
    )  # graph outputs that are the model's own outputs


class QdqModel:
    """The QDQ model seen as layers in execution order, with the cuts the algorithms need."""

    def __init__(self, model: onnx.ModelProto, framework_names: set[str] | None = None):
        self.model = om.infer_shapes(model)
        graph = self.model.graph
        self.nodes = om.topological_nodes(graph)
        self.initializers = {i.name for i in graph.initializer}
        self.graph_inputs = [i.name for i in om.real_inputs(self.model)]
        self.graph_outputs = [o.name for o in graph.output]
        self.producer: dict[str, int] = {}
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
        self.values = {vi.name: vi for vi in [*graph.value_info, *graph.input, *graph.output]}
        self.layers: list[Layer] = []
        for e in exposure.select(self.model, framework_names):
            self.layers.append(
                Layer(len(self.layers), e, self.activation_inputs(self.nodes[e.index]))
            )
        # each layer by the float tensor it outputs in the QDQ model
        self.layer_at = {layer.exposed.qdq_tensor: layer for layer in self.layers}
        self._extractor = onnx.utils.Extractor(self.model)

    @classmethod
    def load(cls, path: str | Path, framework_names: set[str] | None = None) -> QdqModel:
        return cls(om.load_model(path, "QDQ model"), framework_names)

    # ------------------------------------------------------------ tensors

    def float_source(self, tensor: str) -> str:
        """The float tensor behind a Q/DQ chain (itself when it is not quantized)."""
        seen = 0
        while (
            tensor in self.producer
            and self.nodes[self.producer[tensor]].op_type in QDQ_OPS
            and seen < 8
        ):
            tensor = self.nodes[self.producer[tensor]].input[0]
            seen += 1
        return tensor

    def is_activation(self, tensor: str) -> bool:
        """Computed from the model inputs (not a weight, a parameter or a Constant)."""
        if tensor in self.initializers:
            return False
        i = self.producer.get(tensor)
        return i is None or self.nodes[i].op_type != "Constant"

    def activation_inputs(self, node: onnx.NodeProto) -> list[str]:
        """The float activations a node reads, through their Q/DQ (weights excluded) - also
        those its If/Loop bodies read from the graph by name."""
        out = []
        for t in [*node.input, *om.outer_reads(node)]:
            if not t:
                continue
            src = self.float_source(t)
            if self.is_activation(src) and src not in out:
                out.append(src)
        return out

    def aliases(self, tensor: str) -> list[str]:
        """Other names a float tensor has in dumps: the float model's name of its layer output
        (a model output is ``out`` there, ``out_QuantizeLinear_Input`` in the QDQ model)."""
        layer = self.layer_at.get(tensor)
        return [layer.name] if layer is not None and layer.name != tensor else []

    def shape(self, tensor: str) -> tuple[int, ...] | None:
        vi = self.values.get(tensor)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        dims = om.dims_of(vi)
        return (
            tuple(int(d) for d in dims)
            if all(isinstance(d, int) and d >= 0 for d in dims)
            else None
        )

    def dtype(self, tensor: str) -> np.dtype | None:
        vi = self.values.get(tensor)
        return om.elem_dtype(vi) if vi is not None else None

    # ------------------------------------------------------------ parts

    def _extract(self, inputs: Sequence[str], outputs: Sequence[str]) -> onnx.ModelProto:
        missing = [t for t in [*inputs, *outputs] if t not in self.values]
        if missing:
            raise SurgeryError(
                f"tensor {missing[0]!r} has no type in the QDQ model (shape inference failed)"
            )
        try:
            part = self._extractor.extract_model(list(inputs), list(outputs))
        except Exception as exc:  # onnx raises ValueError/KeyError/AssertionError
            raise SurgeryError(f"onnx extraction failed: {type(exc).__name__}: {exc}") from None
        g = part.graph
        known = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
        for n in g.node:
            known.update(n.output)
        for n in g.node:
            for t in n.input:
                if t not in known:
                    raise SurgeryError(
                        f"node {n.name or n.op_type!r} reads {t!r}, which lies before the cut"
                    )
        self._add_outer_constants(part, known)
        return part

    def _add_outer_constants(self, part: onnx.ModelProto, known: set[str]) -> None:
        """onnx's extractor follows node inputs only, not what an If/Loop body reads from the
        graph by name: the weights and Constants it reads are added to the part (its
        activations are the layer's inputs, :meth:`activation_inputs`)."""
        g = part.graph
        inits = {i.name: i for i in self.model.graph.initializer}
        for n in list(g.node):
            for t in om.outer_reads(n):
                if t in known:
                    continue
                i = self.producer.get(t)
                if t in inits:
                    g.initializer.append(inits[t])
                elif i is not None and self.nodes[i].op_type == "Constant":
                    g.node.insert(0, self.nodes[i])
                else:
                    raise SurgeryError(
                        f"the branches of node {n.name or n.op_type!r} read {t!r}, which the "
                        "part cut around it does not hold"
                    )
                known.add(t)

    def between(self, inputs: Sequence[str], layers: Sequence[Layer], prefix: str) -> Part:
        """Everything from the float tensors ``inputs`` (each entering through its Q/DQ) to
        ``layers``' outputs, names prefixed; ``inputs`` must cut every path from the model
        inputs (else :class:`SurgeryError`)."""
        node_inputs = list(inputs)
        part = self._extract(node_inputs, [layer.output for layer in layers])
        # shape inference may type initializers in value_info: renaming those would unshare them
        keep = [vi for vi in part.graph.value_info if vi.name not in self.initializers]
        del part.graph.value_info[:]
        part.graph.value_info.extend(keep)
        onnx.compose.add_prefix_graph(part.graph, prefix, rename_initializers=False, inplace=True)
        return Part(
            part,
            {prefix + t: t for t in node_inputs},
            {prefix + layer.output: layer for layer in layers},
        )

    def cut(self, boundary: int) -> list[str]:
        """Float tensors made before node ``boundary`` (topological index) and read after it."""
        before = set(self.graph_inputs)
        for i in range(min(boundary, len(self.nodes))):
            n = self.nodes[i]
            if n.op_type not in QDQ_OPS:
                before.update(o for o in n.output if o)
        wanted: list[str] = []
        readers = [
            t for n in self.nodes[boundary:] if n.op_type not in QDQ_OPS for t in n.input if t
        ]
        for t in [*readers, *self.graph_outputs]:
            src = self.float_source(t)
            if src in before and self.is_activation(src) and src not in wanted:
                wanted.append(src)
        return wanted

    def suffix(self, boundary: int, layers: Sequence[Layer], finals: bool = True) -> Part:
        """Everything from node ``boundary`` on that ``layers`` (and the model outputs) need."""
        inputs = self.cut(boundary)
        outputs = [layer.suffix_output for layer in layers]
        final = [o for o in self.graph_outputs if o not in outputs] if finals else []
        part = self._extract(inputs, [*outputs, *final])
        return Part(
            part, {t: t for t in inputs}, {layer.suffix_output: layer for layer in layers}, final
        )


def merge(parts: Iterable[Part], source: onnx.ModelProto, name: str = "fragments") -> Part:
    """Parts side by side in one model; initializers shared by name (each copied once)."""
    nodes, inputs, outputs, value_info = [], [], [], []
    init_names: set[str] = set()
    in_map: dict[str, str] = {}
    out_map: dict[str, Layer] = {}
    finals: list[str] = []
    for p in parts:
        g = p.model.graph
        nodes.extend(g.node)
        inputs.extend(g.input)
        outputs.extend(g.output)
        value_info.extend(g.value_info)
        init_names.update(i.name for i in g.initializer)
        in_map.update(p.inputs)
        out_map.update(p.outputs)
        finals.extend(p.finals)
    inits = [i for i in source.graph.initializer if i.name in init_names]
    graph = onnx.helper.make_graph(
        nodes, name, inputs, outputs, initializer=inits, value_info=value_info
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=source.opset_import,
        ir_version=source.ir_version,
        producer_name="accdbg",
    )
    return Part(model, in_map, out_map, finals)
