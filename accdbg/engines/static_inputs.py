"""Constant inputs QNN needs as initializers: quantization must leave them so.

onnxruntime's quantizer gives every float initializer input of an op it has no specific rule
for a DequantizeLinear. QNN folds that DequantizeLinear back into a constant when the op forms
a QDQ node unit with it; for the ops listed below it does not, and the QNN execution provider,
which takes those inputs only as constant initializers, refuses the quantized node although it
takes the float one (NonMaxSuppression: "optional scalar inputs (max_output_boxes_per_class,
iou_threshold, score_threshold) must be constant initializers").

After quantization those inputs are pointed back at their float initializers (the orphaned
DequantizeLinear nodes go); everything else of the QDQ model is left as the quantizer made it.
The quantizer's own ``nodes_to_exclude`` would keep the constants too, but it also leaves the
node's activation inputs unquantized whenever their producer quantizes its output only on the
consumer's request (a Relu on a graph input feeding NMS stayed float), which can send *other*
nodes off QNN; the repair here changes nothing but the constants.

Checked on HTP with this onnxruntime-qnn, the other constant inputs need nothing:

* integer initializers (Reshape's shape, Slice's starts, Pad's pads, TopK's K, axes...) are
  never quantized;
* Resize's ``roi``/``scales`` and Clip's ``min``/``max`` are left float by the quantizer's own
  rules for those ops;
* Pad's ``constant_value``, Pow's exponent, PRelu's slope, Max's and Greater's constant
  operand, GridSample's grid, Instance/LayerNormalization's scale are dequantized, and QNN folds
  them into the op's QDQ unit: the node stays on QNN.

OneHot's ``values`` are refused when dequantized too, but HTP refuses the float OneHot as well
(backend op validation), so keeping them float would not bring it to QNN. Any constant QNN
still refuses is shown with QNN's reason in ``partitioning.json``, its dequantized inputs named.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import uses_external_data

log = logging.getLogger("accdbg.inference_engine")

# op type (default ONNX domain) -> its inputs (schema names) that QNN takes only as constants,
# for ops QNN does not group into QDQ node units with their DequantizeLinear inputs.
QNN_CONSTANT_INPUTS: dict[str, tuple[str, ...]] = {
    "NonMaxSuppression": ("max_output_boxes_per_class", "iou_threshold", "score_threshold"),
}
_QUANTIZABLE = {TensorProto.FLOAT, TensorProto.FLOAT16}


@dataclass(frozen=True)
class KeptFloat:
    """Constant inputs of one node that must reach QNN as initializers."""

    node: str
    op_type: str
    inputs: tuple[str, ...]  # schema names
    positions: tuple[int, ...]  # their positions in node.input
    tensors: tuple[str, ...]  # the float initializers feeding them

    def note(self) -> str:
        return (
            f"{self.op_type} {self.node!r}: constant input(s) {', '.join(self.inputs)} kept as "
            "float initializers (QNN takes them only as constants; onnxruntime's quantizer had "
            "made them DequantizeLinear outputs, which sends the node to the CPU)"
        )


def _opset(model: onnx.ModelProto) -> int:
    return next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        onnx.defs.onnx_opset_version(),
    )


def constant_inputs_to_keep(model: onnx.ModelProto) -> list[KeptFloat]:
    """Nodes whose QNN-constant inputs are float initializers the quantizer would dequantize.

    Input positions come from the node's ONNX schema at the model's opset, so versions that
    moved an input are handled."""
    floats = {i.name for i in model.graph.initializer if i.data_type in _QUANTIZABLE}
    opset = _opset(model)
    kept: list[KeptFloat] = []
    for node in model.graph.node:
        wanted = QNN_CONSTANT_INPUTS.get(node.op_type)
        if not wanted or node.domain not in ("", "ai.onnx"):
            continue
        try:
            formal = [p.name for p in onnx.defs.get_schema(node.op_type, opset).inputs]
        except onnx.defs.SchemaError:
            continue
        hits = [
            i
            for i, tensor in enumerate(node.input)
            if i < len(formal) and tensor and formal[i] in wanted and tensor in floats
        ]
        if hits:
            kept.append(
                KeptFloat(
                    node.name,
                    node.op_type,
                    tuple(formal[i] for i in hits),
                    tuple(hits),
                    tuple(node.input[i] for i in hits),
                )
            )
    return kept


def restore_constants(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto, kept: list[KeptFloat], base_dir: str = ""
) -> list[KeptFloat]:
    """Point each kept input of the QDQ model back at its float initializer (read from
    ``float_model``, whose external data lives in ``base_dir``); drop the DequantizeLinear
    nodes and initializers nothing uses any more. Returns what changed."""
    by_name = {n.name: n for n in qdq.graph.node if n.name}
    floats = {i.name: i for i in float_model.graph.initializer}
    present = {i.name for i in qdq.graph.initializer}
    changed: list[KeptFloat] = []
    replaced: set[str] = set()
    for k in kept:
        node = by_name.get(k.node)
        if node is None or node.op_type != k.op_type:
            continue
        moved = [
            (pos, tensor)
            for pos, tensor in zip(k.positions, k.tensors, strict=True)
            if pos < len(node.input) and node.input[pos] != tensor
        ]
        for pos, tensor in moved:
            replaced.add(node.input[pos])
            node.input[pos] = tensor
            if tensor not in present:
                init = floats[tensor]
                if uses_external_data(init):  # inline it: the QDQ model lives elsewhere
                    init = numpy_helper.from_array(numpy_helper.to_array(init, base_dir), tensor)
                qdq.graph.initializer.append(init)
                present.add(tensor)
        if moved:
            changed.append(k)
    _drop_unused_dequantize(qdq, replaced)
    return changed


def _drop_unused_dequantize(model: onnx.ModelProto, tensors: set[str]) -> None:
    """Remove the DequantizeLinear nodes producing ``tensors`` once nothing reads them, then
    the initializers only they used."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    used = {t for n in graph.node for t in n.input} | outputs
    dead = [
        n
        for n in graph.node
        if n.op_type == "DequantizeLinear"
        and set(n.output) <= tensors
        and not any(o in used for o in n.output)
    ]
    freed = {t for n in dead for t in n.input}
    for n in dead:
        graph.node.remove(n)
    still = {t for n in graph.node for t in n.input} | outputs
    for init in [i for i in graph.initializer if i.name in freed and i.name not in still]:
        graph.initializer.remove(init)


def name_unnamed_nodes(model: onnx.ModelProto) -> bool:
    """Give every unnamed node a unique name (the kept inputs are found again by it)."""
    taken = {n.name for n in model.graph.node if n.name}
    changed = False
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
            changed = True
    return changed
