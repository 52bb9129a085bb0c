"""Why each node stayed on the CPU, read from QNN's own log; which constants stay unquantized.

The log fixtures in tests/data/qnn_logs/ are excerpts (whole lines, in their order, ANSI codes
kept) of backend_log.txt files written by real runs of onnxruntime-qnn on the HTP backend:

* nms_quantized.txt: a NonMaxSuppression model after onnxruntime's quantizer turned its
  thresholds into DequantizeLinear outputs (the reported bug);
* nms_constant_thresholds.txt: the same model with the thresholds kept as initializers (the
  validation lines of its two graph-I/O Q/DQ nodes are left out on purpose);
* unique.txt: a Unique node, and the Q/DQ around its dynamic-shaped output;
* unique_no_fallback.txt: the same with CPU fallback disabled (the EP's unsupported list);
* onehot_fp16.txt: a float OneHot HTP's op validation refuses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accdbg.engines.native_log import NativeLog, read_log
from accdbg.engines.partitioning import (
    console_line,
    dequantized_constants,
    explain_cpu_nodes,
    partitioning_info,
    unknown_shapes,
)
from accdbg.engines.static_inputs import constant_inputs_to_keep, name_unnamed_nodes

LOGS = Path(__file__).parent / "data" / "qnn_logs"


def _log(name: str) -> NativeLog:
    return read_log(LOGS / name)


def _explained(name: str) -> dict[str, dict]:
    native = _log(name)
    return {r["name"]: r for r in explain_cpu_nodes(native.placement().cpu_nodes, native)}


def _line(name: str, no: int) -> str:
    return (LOGS / name).read_text(encoding="utf-8").splitlines()[no - 1]


def test_every_cpu_node_of_the_quantized_nms_run_has_qnns_reason():
    cpu = _explained("nms_quantized.txt")
    assert list(cpu) == ["scores_in_QuantizeLinear", "boxes_DequantizeLinear", "nms"]
    assert cpu["nms"]["reason"] == (
        "NonMaxSuppression: optional scalar inputs (max_output_boxes_per_class, iou_threshold, "
        "score_threshold) must be constant initializers"
    )
    assert cpu["scores_in_QuantizeLinear"]["reason"] == (
        "QNN EP is configured to not take Q nodes that consume a graph input"
    )
    assert cpu["boxes_DequantizeLinear"]["reason"] == (
        "QNN EP is configured to not take DQ nodes that generate a graph output"
    )
    for rec in cpu.values():
        assert rec["source"] == "qnn_validation"
        header = _line("nms_quantized.txt", rec["log_line"])
        assert "Validation FAILED" in header and f"({rec['type']})" in header


def test_a_unit_reason_applies_to_its_nodes_and_passed_units_are_known():
    native = _log("nms_quantized.txt")
    # the Sigmoid unit passed with its DQ and Q; none of those were refused
    assert {"scores_in_DequantizeLinear", "sig_scores", "scores_QuantizeLinear"} <= (
        native.validated()
    )
    assert not {"sig_scores", "scores_QuantizeLinear"} & set(native.refusals())


def test_verdict_repeated_in_the_reason_is_cut_and_shape_reasons_kept():
    cpu = _explained("unique.txt")
    assert cpu["my_unique"]["reason"] == "Operators of type `Unique` are not supported by QNN EP"
    assert cpu["uniq_QuantizeLinear"]["reason"] == "Cannot get shape"
    assert cpu["uniq_DequantizeLinear"]["reason"] == "Cannot get shape"
    assert cpu["x_QuantizeLinear"]["source"] == "qnn_validation"


def test_a_cpu_node_without_any_verdict_says_so():
    cpu = _explained("nms_constant_thresholds.txt")
    assert cpu["nms"]["reason"] == "Cannot get shape"
    for name in ("scores_in_QuantizeLinear", "boxes_DequantizeLinear"):
        assert cpu[name]["source"] == "none"
        assert "no QNN verdict" in cpu[name]["reason"]


def test_the_backends_op_validation_error_joins_a_generic_reason():
    cpu = _explained("onehot_fp16.txt")
    reason = cpu["op"]["reason"]
    assert reason.startswith("Failed to add node")
    assert (
        "backendValidateOpConfig() failed for node `op` of type `OneHot` with error code 3110"
        in (reason)
    )


def test_unknown_formats_give_the_raw_line_never_an_empty_reason():
    # The EP's unsupported list names nodes without reasons: the line itself is the reason.
    native = _log("unique_no_fallback.txt")
    assert {u["name"] for u in native.unsupported()} == {
        "my_unique",
        "uniq_QuantizeLinear",
        "uniq_DequantizeLinear",
    }
    rec = explain_cpu_nodes([("Unique", "my_unique")], native)[0]
    assert rec["source"] == "log_line" and rec["log_line"] == 1
    assert "Unsupported nodes in QNN EP: { name: my_unique, type: Unique }" in rec["reason"]
    # Without its validation block, the backend's line naming the node still explains it.
    text = (LOGS / "onehot_fp16.txt").read_text(encoding="utf-8").splitlines()
    kept = [t for t in text if "Validation FAILED" not in t and not t.startswith("\t")]
    native = NativeLog("\n".join(kept))
    rec = explain_cpu_nodes(native.placement().cpu_nodes, native)[0]
    assert rec["name"] == "op" and rec["source"] == "log_line"
    assert "backendValidateOpConfig() failed for node `op`" in rec["reason"]


def test_console_line_lists_reasons_groups_them_and_counts_the_rest():
    cpu = [
        {"type": "NonMaxSuppression", "name": "nms", "reason": "Cannot get shape"},
        *[{"type": "QuantizeLinear", "name": f"q{i}", "reason": "graph input"} for i in range(7)],
        {"type": "Unique", "name": "u", "reason": "x" * 500},
    ]
    info = {"placement_counts": {"QNNExecutionProvider": 2}, "cpu_nodes": cpu}
    line = console_line(info, limit=4)
    assert line.startswith("partitioning: 2 QNN partition(s); 9 node(s) on CPU: ")
    # the non-Q/DQ nodes come first; q0..q1 share one reason; 5 are counted, not named
    assert "nms (NonMaxSuppression): Cannot get shape" in line
    assert "u (Unique): " + "x" * 197 + "..." in line
    assert "q0 (QuantizeLinear), q1 (QuantizeLinear): graph input" in line
    assert "q2 (" not in line and line.endswith("and 5 more (all in partitioning.json)")
    assert console_line({"placement_counts": {}, "cpu_nodes": []}) == (
        "partitioning: 0 QNN partition(s); 0 node(s) on CPU"
    )


def _nms_model(n_inputs: int = 5, name: str = "nms", opset: int = 17) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array([5], np.int64), "max_out"),
        numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
        numpy_helper.from_array(np.array([0.3], np.float32), "score_th"),
        numpy_helper.from_array(np.ones((1, 8, 4), np.float32), "anchors"),
    ]
    nms_inputs = ["boxes", "scores", "max_out", "iou", "score_th"][:n_inputs]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["boxes_in", "anchors"], ["boxes"], name="add"),
            helper.make_node("NonMaxSuppression", nms_inputs, ["sel"], name=name),
        ],
        "g",
        [
            helper.make_tensor_value_info("boxes_in", TensorProto.FLOAT, [1, 8, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 8]),
        ],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, ["K", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_nms_float_thresholds_are_kept_constant_by_schema_name():
    kept = constant_inputs_to_keep(_nms_model())
    assert [(k.node, k.op_type, k.inputs, k.positions, k.tensors) for k in kept] == [
        (
            "nms",
            "NonMaxSuppression",
            ("iou_threshold", "score_threshold"),
            (3, 4),
            ("iou", "score_th"),
        )
    ]  # max_output_boxes_per_class is int64: never quantized, nothing to keep
    assert "iou_threshold, score_threshold kept as float initializers" in kept[0].note()
    # without score_threshold only iou_threshold; the Add's float constant is not a threshold
    assert [k.inputs for k in constant_inputs_to_keep(_nms_model(n_inputs=4))] == [
        ("iou_threshold",)
    ]
    assert constant_inputs_to_keep(_nms_model(n_inputs=3)) == []


def test_unnamed_nodes_get_unique_names_so_they_can_be_excluded():
    model = _nms_model(name="")
    model.graph.node[0].name = "NonMaxSuppression_1"  # a name the generator would pick
    assert name_unnamed_nodes(model)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == 2 and all(names)
    assert constant_inputs_to_keep(model)[0].node == names[1]
    assert not name_unnamed_nodes(model)


def test_partitioning_names_dequantized_constants_and_dynamic_shapes():
    model = _nms_model()
    model.graph.initializer.append(numpy_helper.from_array(np.array([77], np.uint8), "iou_q"))
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.0065, np.float32), "s"))
    model.graph.node.insert(
        0, helper.make_node("DequantizeLinear", ["iou_q", "s"], ["iou_dq"], name="dq")
    )
    model.graph.node[2].input[3] = "iou_dq"
    assert dequantized_constants(model) == {"nms": ["iou_dq"]}
    assert unknown_shapes(model, ["nms"]) == {"nms": {"sel": "[?,3]"}}
    info = partitioning_info(
        "QNN",
        {"QNNExecutionProvider": 1, "CPUExecutionProvider": 2},
        [
            {"type": "NonMaxSuppression", "name": "nms", "reason": "must be constant initializers"},
            {"type": "Add", "name": "add", "reason": "Cannot get shape"},
        ],
        [],
        model,
        quantized_by_accdbg=True,
    )
    nms, add = info["cpu_nodes"]
    assert nms["dequantized_constant_inputs"] == ["iou_dq"]
    assert (
        "nms (NonMaxSuppression): must be constant initializers [dequantized constants: iou_dq]"
        in (console_line(info))
    )
    assert "accdbg's quantization" in nms["note"]
    assert "dequantized_constant_inputs" not in add  # its reason is not about constants
    assert "tensors_without_static_shape" not in add  # all its tensors are static
    info["cpu_nodes"][0]["tensors_without_static_shape"] = {"sel": "[?,3]"}
    assert "[no static shape: sel [?,3]]" in console_line(info)
