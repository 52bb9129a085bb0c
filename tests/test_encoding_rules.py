"""Encoding rules over hand-built QDQ models (accdbg.encodings.rules): each rule flags what it
states and nothing else; a rule file turns rules off and sets their parameters."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.encodings.rules import RuleConfig, check_rules
from accdbg.errors import AccdbgError


def _qdq(name: str, scale: float, bits: int, nodes: list, inits: list) -> str:
    """``name`` through a QuantizeLinear/DequantizeLinear pair; returns the DQ output."""
    zp_type = TensorProto.UINT16 if bits == 16 else TensorProto.UINT8
    inits += [
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
        helper.make_tensor(f"{name}_zp", zp_type, [], [0]),
    ]
    nodes += [
        helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_zp"], [f"{name}_q"]),
        helper.make_node(
            "DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_zp"], [f"{name}_dq"]
        ),
    ]
    return f"{name}_dq"


def _model(nodes, inits, inputs) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "rules",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _concat(scale_b: float) -> onnx.ModelProto:
    nodes, inits = [], []
    a, b = _qdq("a", 0.01, 8, nodes, inits), _qdq("b", scale_b, 8, nodes, inits)
    nodes.append(helper.make_node("Concat", [a, b], ["y"], axis=1, name="cat"))
    return _model(nodes, inits, ["a", "b"])


def test_concat_inputs_on_ranges_apart_are_flagged_with_both_tensors():
    (flag,) = check_rules(_concat(0.2))  # 20x apart
    assert flag.rule == "concat-one-range" and flag.tensors == ("a", "b")
    assert "20x apart" in flag.what and "one range" in flag.change
    assert check_rules(_concat(0.02)) == []  # 2x: under the default 4x


def test_a_rule_file_turns_rules_off_and_sets_their_parameters(tmp_path):
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"disable": ["concat-one-range"]}))
    assert check_rules(_concat(0.2), RuleConfig.load(off)) == []
    wide = tmp_path / "wide.yaml"
    wide.write_text("params:\n  concat-one-range:\n    ratio: 50\n")
    assert check_rules(_concat(0.2), RuleConfig.load(wide)) == []
    assert len(check_rules(_concat(0.8), RuleConfig.load(wide))) == 1  # 80x
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"disable": ["no-such-rule"]}))
    with pytest.raises(AccdbgError, match="unknown rule.*no-such-rule"):
        RuleConfig.load(bad)


def _norm(bits: int) -> onnx.ModelProto:
    nodes, inits = [], []
    x = _qdq("x", 0.01, bits, nodes, inits)
    zp_type = TensorProto.UINT16 if bits == 16 else TensorProto.UINT8
    inits += [
        helper.make_tensor("g_quantized", zp_type, [4], [10, 20, 30, 40]),
        numpy_helper.from_array(np.array(0.05, np.float32), "g_s"),
        helper.make_tensor("g_zp", zp_type, [], [0]),
        numpy_helper.from_array(np.zeros(4, np.float32), "beta"),
    ]
    nodes += [
        helper.make_node("DequantizeLinear", ["g_quantized", "g_s", "g_zp"], ["g_dq"]),
        helper.make_node("LayerNormalization", [x, "g_dq", "beta"], ["y"], name="ln"),
    ]
    return _model(nodes, inits, ["x"])


def test_a_norm_at_8_bits_is_flagged_and_at_16_bits_is_not():
    (flag,) = check_rules(_norm(8))
    assert flag.rule == "norm-16bit" and set(flag.tensors) == {"x", "g"}
    assert "LayerNormalization ln at 8 bits" == flag.what
    assert check_rules(_norm(16)) == []


def _int4_conv(kernel: int) -> onnx.ModelProto:
    nodes, inits = [], []
    x = _qdq("x", 0.01, 8, nodes, inits)
    w = np.ones((2, 4, kernel, kernel), np.int8)
    inits += [
        helper.make_tensor("w_quantized", TensorProto.INT4, list(w.shape), w.ravel().tolist()),
        numpy_helper.from_array(np.array(0.1, np.float32), "w_s"),
        helper.make_tensor("w_zp", TensorProto.INT4, [], [0]),
    ]
    nodes += [
        helper.make_node("DequantizeLinear", ["w_quantized", "w_s", "w_zp"], ["w_dq"]),
        helper.make_node("Conv", [x, "w_dq"], ["y"], name="conv"),
    ]
    return _model(nodes, inits, ["x"])


def test_int4_weights_are_flagged_off_the_ops_htp_runs_them_on():
    (flag,) = check_rules(_int4_conv(3))
    assert flag.rule == "int4-supported" and flag.tensors == ("w",)
    assert "8-bit weights" in flag.change
    assert check_rules(_int4_conv(1)) == []  # a 1x1 Conv runs int4 weights


def test_a_float_model_has_nothing_to_check():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    assert check_rules(helper.make_model(graph)) == []


def test_the_quant_checker_refuses_a_bad_rule_file_in_one_line(tmp_path, capsys, monkeypatch):
    from tests.helpers import one_line_error, run_cli
    from tests.models import mlp

    built = mlp(tmp_path)
    bad = tmp_path / "rules.json"
    bad.write_text("{not json")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "--quant_checker", "-m", built.path, "--encoding_rules", bad)
    assert code == 2 and "--encoding_rules" in one_line_error(err) and "rules.json" in err
    assert not (tmp_path / "working_directory").exists()  # refused before anything is written


def test_the_quantizer_s_own_layernorm_at_8_bits_is_flagged(tmp_path):
    """onnxruntime's quantizer (the engine's pipeline) on a LayerNormalization: at A8W8 its
    input and weight are flagged; at A16W8 only the weight is left at 8 bits."""
    from accdbg.core.inputs import InputTensor
    from accdbg.engines.options import QuantOptions
    from accdbg.engines.pipeline import Calibration, prepare_float, quantize_prepared
    from tests.models import save

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], name="ln", axis=-1),
        ],
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [
            numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.uniform(0.5, 2, 16).astype(np.float32), "g"),
            numpy_helper.from_array(np.zeros(16, np.float32), "b"),
        ],
    )
    path = save(graph, tmp_path / "ln.onnx")
    x = tmp_path / "x.raw"
    rng.normal(size=(1, 8, 16)).astype(np.float32).tofile(x)
    model = onnx.load(str(path))
    calib = Calibration.from_inputs(
        model, None, [InputTensor("x", (1, 8, 16), x, np.dtype("float32"))]
    )
    prepared = prepare_float(model, "ln", calib, tmp_path / "p")
    flagged = {}
    for abw in (8, 16):
        q = quantize_prepared(
            prepared.path, "ln", calib, QuantOptions(act_bitwidth=abw), tmp_path / f"q{abw}"
        )
        flags = [f for f in check_rules(q.load()) if f.rule == "norm-16bit"]
        flagged[abw] = set(flags[0].tensors) if flags else set()
    assert flagged[8] == {"h", "g"} and flagged[16] == {"g"}


def test_a_bias_added_to_its_matmul_is_no_add_on_two_ranges():
    """A quantized bias (a parameter, ~1e-4 steps) added to an activation (1.0 steps): HTP folds
    it into the MatMul, so the add-one-range rule compares activations only; two activations on
    ranges 200x apart are flagged."""
    nodes, inits = [], []
    a = _qdq("a", 1.0, 8, nodes, inits)
    inits += [
        helper.make_tensor("b_quantized", TensorProto.INT32, [4], [1, 2, 3, 4]),
        numpy_helper.from_array(np.array(1e-4, np.float32), "b_s"),
        helper.make_tensor("b_zp", TensorProto.INT32, [], [0]),
    ]
    nodes += [
        helper.make_node("DequantizeLinear", ["b_quantized", "b_s", "b_zp"], ["b_dq"]),
        helper.make_node("Add", [a, "b_dq"], ["y"], name="add"),
    ]
    assert check_rules(_model(nodes, inits, ["a"])) == []
    nodes, inits = [], []
    a, c = _qdq("a", 1.0, 8, nodes, inits), _qdq("c", 0.005, 8, nodes, inits)
    nodes.append(helper.make_node("Add", [a, c], ["y"], name="add"))
    (flag,) = check_rules(_model(nodes, inits, ["a", "c"]))
    assert flag.rule == "add-one-range" and flag.tensors == ("a", "c")
