"""Which tensors of a QDQ model to expose so QNN itself produces every activation.

In a QDQ model each quantized activation ``a`` appears as ``layer -> a -> QuantizeLinear ->
a_q -> DequantizeLinear``. QNN fuses ``DQ -> layer -> Q`` into one integer kernel whose
output *is* ``a_q``. Exposing ``a_q`` as a graph output therefore returns the integers the
backend computed, which we dequantize with the Q node's own scale and zero point. Exposing the
float ``a`` instead would ask for a tensor the backend never materialises.

A quantized activation that feeds a graph output is read through that output instead: the
QNN execution provider offloads the graph-output DequantizeLinear to the CPU and fails when the
same integer tensor is also exposed (measured with onnxruntime-qnn 2.7).

Each exposed tensor is dumped under the float model's name for that activation when there is
one (``a``, or the name of a DQ output that the float model knows, as for graph outputs), so
golden and target files line up; the QDQ names stay in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from accdbg.core import onnx_model as om

if TYPE_CHECKING:
    from accdbg.engines.options import LayerFilter

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


@dataclass
class Exposed:
    """One tensor to expose and dump."""

    name: str  # dump name (framework name when known)
    graph_tensor: str  # the tensor exposed as a graph output
    node: str
    op_type: str
    index: int
    qdq_tensor: str  # the float activation name inside the QDQ model
    scale: float | None = None
    zero_point: int | None = None
    native_dtype: str | None = None
    framework_name: str | None = None
    inputs: list[str] = field(default_factory=list)
    graph_is_dequantized: bool = False  # exposed through a graph output's (CPU) DequantizeLinear
    q_output: str | None = None  # the QuantizeLinear output holding the backend's integers

    @property
    def quantized(self) -> bool:
        return self.scale is not None

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        if not self.quantized:
            return values
        if self.graph_is_dequantized:  # the graph output's DequantizeLinear already did it
            return values.astype(np.float32, copy=False)
        return ((values.astype(np.int32) - self.zero_point) * np.float32(self.scale)).astype(
            np.float32
        )

    def native(self, values: np.ndarray) -> np.ndarray:
        """The backend's integers (re-quantized exactly when exposed through a graph output)."""
        if not self.graph_is_dequantized:
            return values
        return self.quantize(values)

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """Dequantized values back to the integers they came from (exact: they lie on the
        encoding's grid)."""
        info = np.iinfo(self.native_dtype)
        q = np.rint(np.asarray(values, np.float64) / self.scale) + self.zero_point
        # an array also for a 0-d tensor (numpy's ufuncs make those scalars; onnxruntime
        # refuses a scalar feed)
        return np.asarray(np.clip(q, info.min, info.max), dtype=self.native_dtype)

    def encoding(self) -> dict:
        if not self.quantized:
            return {"quantized": False}
        bits = np.dtype(self.native_dtype).itemsize * 8
        return {
            "quantized": True,
            "scale": self.scale,
            "zero_point": self.zero_point,
            "offset": -self.zero_point,  # QNN convention
            "bitwidth": bits,
            "native_dtype": self.native_dtype,
            "qdq_tensor": self.qdq_tensor,
            "exposed_as": self.graph_tensor,
        }


def _scalar(inits: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    t = inits.get(name)
    return None if t is None else numpy_helper.to_array(t)


def select(
    model: onnx.ModelProto,
    framework_names: set[str] | None = None,
    layers: LayerFilter | None = None,
) -> list[Exposed]:
    """Every layer output of the QDQ (or float) model, in execution order, that ``layers``
    keeps (all of them without a filter)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    graph_outputs = {o.name for o in graph.output}
    nodes = om.topological_nodes(graph)
    producer: dict[str, tuple[int, onnx.NodeProto]] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            producer[o] = (i, n)
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    known = framework_names or set()

    def float_name(t: str) -> str:
        """The activation behind a DQ output (weights and chains resolved to their source)."""
        seen = 0
        while t in producer and producer[t][1].op_type in QDQ_OPS and seen < 4:
            t = producer[t][1].input[0]
            seen += 1
        return t

    chosen: dict[str, Exposed] = {}
    for i, n in enumerate(nodes):
        if n.op_type in QDQ_OPS or n.op_type == "Constant":
            continue
        for out in n.output:
            if not out or out in chosen:
                continue
            qs = [c for c in consumers.get(out, []) if c.op_type == "QuantizeLinear"]
            ex = Exposed(
                name=out,
                graph_tensor=out,
                node=om.node_name(n, i),
                op_type=n.op_type,
                index=i,
                qdq_tensor=out,
                inputs=[float_name(x) for x in n.input if x and x not in inits],
            )
            if qs:
                q = qs[0]
                scale = _scalar(inits, q.input[1]) if len(q.input) > 1 else None
                zp = _scalar(inits, q.input[2]) if len(q.input) > 2 and q.input[2] else None
                if scale is not None and scale.size == 1:
                    zp_dtype = zp.dtype if zp is not None else np.dtype(np.uint8)
                    ex.graph_tensor = ex.q_output = q.output[0]
                    ex.scale = float(scale.reshape(()))
                    ex.zero_point = int(zp.reshape(())) if zp is not None else 0
                    ex.native_dtype = str(zp_dtype)
                    # a graph output is the DQ's output name; prefer whichever the float model has
                    dq_outs = [
                        c.output[0]
                        for c in consumers.get(q.output[0], [])
                        if c.op_type == "DequantizeLinear"
                    ]
                    if out not in known:  # graph outputs and float-model names are what users know
                        for cand in [c for c in dq_outs if c in known] + [
                            c for c in dq_outs if c in graph_outputs
                        ]:
                            ex.name = cand
                            break
                    # The QNN EP fails ("Inconsistent output sizes") when a Q tensor feeding a graph
                    # output's DQ is exposed too; that DQ output carries the same integers, exactly.
                    for cand in dq_outs:
                        if cand in graph_outputs:
                            ex.graph_tensor = cand
                            ex.graph_is_dequantized = True
                            break
            if ex.name in known:
                ex.framework_name = ex.name
            chosen[out] = ex
    exposed = list(chosen.values())
    # graph inputs are given, not computed
    exposed = [e for e in exposed if e.qdq_tensor not in graph_inputs]
    if layers is not None:
        exposed = [
            e for e in exposed if layers.skip_reason((e.name, e.qdq_tensor), e.op_type) is None
        ]
    # two QDQ tensors can claim the same framework name (e.g. re-quantization): keep the first
    seen: set[str] = set()
    unique = []
    for e in exposed:
        if e.name in seen:
            e.name = e.qdq_tensor
            e.framework_name = e.name if e.name in known else None
        seen.add(e.name)
        unique.append(e)
    return unique
