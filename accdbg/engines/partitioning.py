"""Which nodes stayed on the CPU and QNN's own reason for each, for ``partitioning.json`` and
the console.

onnxruntime says where each node went; the QNN execution provider says why it refused a node
only in its verbose log (:mod:`accdbg.engines.native_log`). Every CPU node gets a reason, never
an empty one: QNN's own words when its log has them, else the raw log line naming the node,
else an explicit statement that the log has no verdict for it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import onnx

from accdbg.core import onnx_model as om
from accdbg.engines.native_log import NativeLog

log = logging.getLogger("accdbg.inference_engine")

CONSOLE_NODES = 6  # CPU nodes named on the console; all of them are in partitioning.json
CONSOLE_REASON_CHARS = 200
RAW_LINE_CHARS = 400
_ABOUT_CONSTANTS = re.compile(r"constant|initializer|static", re.IGNORECASE)
_ABOUT_SHAPES = re.compile(r"shape", re.IGNORECASE)


def explain_cpu_nodes(cpu_nodes: Sequence[tuple[str, str]], native: NativeLog) -> list[dict]:
    """One record per CPU node: type, name, reason, where the reason came from, log line."""
    refusals = native.refusals()
    validated = native.validated()
    unexplained = {n for _, n in cpu_nodes if not (n in refusals and refusals[n].reasons)}
    mentioned = native.mentions(unexplained)
    out = []
    for op_type, name in cpu_nodes:
        ref = refusals.get(name)
        rec = {"type": op_type, "name": name}
        if ref is not None and ref.reasons:
            rec.update(reason=ref.reason, source="qnn_validation", log_line=ref.line)
        elif name in mentioned:
            no, line = mentioned[name]
            rec.update(reason=line[:RAW_LINE_CHARS], source="log_line", log_line=no)
        elif ref is not None:
            rec.update(reason=ref.raw[:RAW_LINE_CHARS], source="log_line", log_line=ref.line)
        elif name in validated:
            rec.update(
                reason="QNN's validation passed this node, yet onnxruntime placed it on the CPU; "
                "the backend log gives no reason",
                source="none",
            )
        else:
            rec.update(
                reason="no QNN verdict for this node in the backend log (QNN's validation "
                "did not name it)",
                source="none",
            )
        out.append(rec)
    return out


def dequantized_constants(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Node name -> its inputs that are DequantizeLinear outputs of constant initializers
    (QNN reads such an input as dynamic unless the DQ folds into the node's QDQ unit)."""
    inits = {i.name for i in model.graph.initializer}
    dq_of_const = {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input and n.input[0] in inits
    }
    return {
        n.name: [t for t in n.input if t in dq_of_const]
        for n in model.graph.node
        if any(t in dq_of_const for t in n.input)
    }


def unknown_shapes(model: onnx.ModelProto, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
    """Node name -> its inputs/outputs whose shape is not fully static in ``model`` (QNN needs
    static shapes; "Cannot get shape" means one of these), as ``[?,3]``-style strings."""
    wanted = set(nodes)
    targets = [n for n in model.graph.node if n.name in wanted]
    if not targets:
        return {}
    inferred = om.infer_shapes(model)
    infos = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.input]}
    infos.update({vi.name: vi for vi in inferred.graph.output})
    consts = om.initializer_names(model)
    out: dict[str, dict[str, str]] = {}
    for node in targets:
        found = {}
        for t in [*node.input, *node.output]:
            if not t or t in consts:
                continue
            vi = infos.get(t)
            dims = om.dims_of(vi) if vi is not None else None
            if dims is None or not vi.type.tensor_type.HasField("shape"):
                found[t] = "unknown"
            elif not all(isinstance(d, int) and d > 0 for d in dims):
                found[t] = (
                    "["
                    + ",".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims)
                    + "]"
                )
        out[node.name] = found
    return out


def partitioning_info(
    label: str,
    placement_counts: dict,
    cpu_reasons: list[dict],
    unsupported: list[dict],
    model: onnx.ModelProto | None,
    quantized_by_accdbg: bool,
) -> dict:
    """The content of ``partitioning.json``."""
    dq = dequantized_constants(model) if model is not None else {}
    about_shape = [r["name"] for r in cpu_reasons if _ABOUT_SHAPES.search(r["reason"])]
    dynamic = unknown_shapes(model, about_shape) if model is not None and about_shape else {}
    cpu = []
    for rec in cpu_reasons:
        rec = dict(rec)
        if dynamic.get(rec["name"]):
            rec["tensors_without_static_shape"] = dynamic[rec["name"]]
        inputs = dq.get(rec["name"])
        if inputs and _ABOUT_CONSTANTS.search(rec["reason"]):
            rec["dequantized_constant_inputs"] = inputs
            rec["note"] = (
                "these inputs are DequantizeLinear outputs of constants"
                + (" (accdbg's quantization made them so)" if quantized_by_accdbg else "")
                + "; QNN reads them as dynamic tensors"
            )
        cpu.append(rec)
    return {
        "engine": label,
        "placement_counts": placement_counts,
        "cpu_nodes": cpu,
        "unsupported_by_qnn": unsupported,
    }


def console_line(info: dict, limit: int = CONSOLE_NODES) -> str:
    """One line: partition count, CPU nodes with their reasons (first ``limit``), the rest
    counted. Nodes sharing a reason are listed together."""
    qnn = info["placement_counts"].get("QNNExecutionProvider", 0)
    cpu = info["cpu_nodes"]
    head = f"partitioning: {qnn} QNN partition(s); {len(cpu)} node(s) on CPU"
    if not cpu:
        return head
    # Nodes that are not graph-I/O Q/DQ first: they are the surprising ones.
    shown = sorted(cpu, key=lambda r: r["type"] in ("QuantizeLinear", "DequantizeLinear"))[:limit]
    groups: dict[str, list[str]] = {}
    for rec in shown:
        reason = rec["reason"]
        if len(reason) > CONSOLE_REASON_CHARS:
            reason = reason[: CONSOLE_REASON_CHARS - 3] + "..."
        if rec.get("tensors_without_static_shape"):
            dims = rec["tensors_without_static_shape"]
            reason += f" [no static shape: {', '.join(f'{t} {d}' for t, d in dims.items())}]"
        if rec.get("dequantized_constant_inputs"):
            reason += f" [dequantized constants: {', '.join(rec['dequantized_constant_inputs'])}]"
        groups.setdefault(reason, []).append(f"{rec['name']} ({rec['type']})")
    body = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in groups.items())
    more = len(cpu) - len(shown)
    tail = f"; and {more} more" if more else ""
    return f"{head}: {body}{tail} (all in partitioning.json)"


def report(info: dict) -> None:
    """Print the partitioning line: a warning when a node other than a Q/DQ stayed on CPU."""
    line = console_line(info)
    surprising = any(
        r["type"] not in ("QuantizeLinear", "DequantizeLinear") for r in info["cpu_nodes"]
    )
    (log.warning if surprising else log.info)("%s", line)
