"""A NonMaxSuppression model through the real inference engine on QNN HTP.

onnxruntime's quantizer used to turn NMS's constant thresholds into DequantizeLinear outputs;
QNN then refused the node ("must be constant initializers") and partitioning.json listed no
reason. Now the thresholds stay initializers, and a node QNN still refuses is listed with QNN's
own reason.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.core.inputs import parse_input_tensor
from accdbg.engines import run_inference_engine
from tests.helpers import run_cli

N = 16
MAX_OUT, IOU, SCORE_TH = 5, 0.5, 0.3


def _nms_model(tmp_path, static_output: bool):
    """boxes -> Relu, scores -> Sigmoid, then NMS with its three constants as initializers."""
    nodes = [
        helper.make_node("Relu", ["boxes_in"], ["boxes"], name="relu_boxes"),
        helper.make_node("Sigmoid", ["scores_in"], ["scores"], name="sig_scores"),
        helper.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "max_out", "iou", "score_th"],
            ["selected"],
            name="nms",
        ),
    ]
    inits = [
        numpy_helper.from_array(np.array([MAX_OUT], np.int64), "max_out"),
        numpy_helper.from_array(np.array([IOU], np.float32), "iou"),
        numpy_helper.from_array(np.array([SCORE_TH], np.float32), "score_th"),
    ]
    # An exported model does not know how many boxes NMS keeps: [?, 3]. The static variant
    # declares [MAX_OUT, 3], true for the input below (more than MAX_OUT boxes survive).
    rows = MAX_OUT if static_output else "K"
    graph = helper.make_graph(
        nodes,
        "nms",
        [
            helper.make_tensor_value_info("boxes_in", TensorProto.FLOAT, [1, N, 4]),
            helper.make_tensor_value_info("scores_in", TensorProto.FLOAT, [1, 1, N]),
        ],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, [rows, 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = tmp_path / f"nms_{'static' if static_output else 'dynamic'}.onnx"
    onnx.save(model, str(path))
    return path


def _inputs(tmp_path):
    """Boxes far apart on a grid except pairs that overlap (IoU 0.68): NMS must drop the
    lower-scored one of a pair. Scores spaced far beyond 8-bit steps, some under SCORE_TH."""
    boxes = np.zeros((1, N, 4), np.float32)
    for i in range(N):
        x, y = 20.0 * (i % 4), 20.0 * (i // 4)
        if i % 2:  # the odd box overlaps its even neighbour
            x, y = 20.0 * ((i - 1) % 4) + 1.0, 20.0 * ((i - 1) // 4) + 1.0
        boxes[0, i] = [y, x, y + 10.0, x + 10.0]
    logits = np.linspace(3.0, -3.0, N).astype(np.float32)[np.random.default_rng(5).permutation(N)]
    scores = logits.reshape(1, 1, N)
    b, s = tmp_path / "boxes.raw", tmp_path / "scores.raw"
    boxes.tofile(b)
    scores.tofile(s)
    return (
        boxes,
        scores,
        [
            parse_input_tensor(["boxes_in", f"1,{N},4", str(b)]),
            parse_input_tensor(["scores_in", f"1,1,{N}", str(s)]),
        ],
    )


def _float_reference(path, boxes, scores) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["selected"], {"boxes_in": boxes, "scores_in": scores})[0]


def _nms_inputs_in_qdq(qdq_path) -> tuple[list[str], dict[str, np.ndarray], set[str]]:
    m = onnx.load(str(qdq_path))
    nms = next(n for n in m.graph.node if n.op_type == "NonMaxSuppression")
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    dq_outputs = {o for n in m.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return list(nms.input), inits, dq_outputs


@pytest.mark.slow
def test_nms_thresholds_stay_constant_and_cpu_nodes_carry_qnns_reason(tmp_path, capsys):
    path = _nms_model(tmp_path, static_output=False)
    boxes, scores, inputs = _inputs(tmp_path)
    argv = ["--inference_engine", "-m", path, "-r", "htp", "-w", tmp_path / "w"]
    for t in inputs:
        argv += ["-i", t.name, ",".join(map(str, t.dims)), t.path]
    code, out, err = run_cli(capsys, *argv, "--output_dirname", "run", "--debug_mode_off")
    assert code == 0, err
    run = tmp_path / "w" / "inference_engine" / "run"

    # The quantized model keeps NMS's thresholds as the float initializers they were.
    nms_inputs, inits, dq_outputs = _nms_inputs_in_qdq(run / "nms_dynamic.qdq.onnx")
    for i, expected in ((2, MAX_OUT), (3, IOU), (4, SCORE_TH)):
        assert nms_inputs[i] in inits and nms_inputs[i] not in dq_outputs
        assert inits[nms_inputs[i]].item() == np.float32(expected)  # exact, not requantized
    assert nms_inputs[0] in dq_outputs and nms_inputs[1] in dq_outputs  # activations quantized
    steps = json.loads((run / "preprocessing.json").read_text())
    assert any("'nms'" in s and "iou_threshold, score_threshold" in s for s in steps), steps

    # Either QNN runs the NMS or partitioning.json says why, in QNN's words from its log.
    part = json.loads((run / "partitioning.json").read_text())
    log_lines = (run / "backend_log.txt").read_text(encoding="utf-8").splitlines()
    by_name = {r["name"]: r for r in part["cpu_nodes"]}
    assert all(r["reason"] for r in part["cpu_nodes"])  # never an empty reason
    if "nms" in by_name:
        rec = by_name["nms"]
        assert rec["source"] == "qnn_validation"
        header = log_lines[rec["log_line"] - 1]
        assert "Validation FAILED" in header and "(NonMaxSuppression)" in header
        following = "\n".join(log_lines[rec["log_line"] : rec["log_line"] + 4])
        assert f"REASON : {rec['reason']}" in following
        assert "constant initializers" not in rec["reason"]  # not the quantization's doing
        if "shape" in rec["reason"].lower():
            assert rec["tensors_without_static_shape"] == {"selected": "[?,3]"}
        # ... and on the console, with its reason
        console = out + err
        assert f"nms (NonMaxSuppression): {rec['reason']}" in console, console
    else:
        assert part["placement_counts"]["QNNExecutionProvider"] >= 1


@pytest.mark.slow
def test_nms_with_a_static_output_runs_on_qnn_and_selects_like_the_float_model(tmp_path):
    path = _nms_model(tmp_path, static_output=True)
    boxes, scores, inputs = _inputs(tmp_path)
    expected = _float_reference(path, boxes, scores)
    assert expected.shape == (MAX_OUT, 3)  # the declared static shape holds for this input
    res = run_inference_engine(
        path, input_tensors=inputs, working_dir=tmp_path / "w", output_dirname="run", debug=False
    )
    part = json.loads((res.run_dir / "partitioning.json").read_text())
    assert "nms" not in {r["name"] for r in part["cpu_nodes"]}, part["cpu_nodes"]
    assert part["placement_counts"]["QNNExecutionProvider"] >= 1
    got = np.fromfile(res.results[0] / "selected.raw", np.float32).reshape(MAX_OUT, 3)
    np.testing.assert_array_equal(got, expected.astype(np.float32))
