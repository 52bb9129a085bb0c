"""4-bit weights: ``-wbw 4`` (int4 on Conv 1x1, Gemm and MatMul), ``--weight_block_size``,
4-bit parameters in ``-qo``, the ``weight_bitwidth`` summary column and the ``w8`` fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from accdbg.core.inputs import parse_input_tensor
from accdbg.engines.options import EngineConfig
from accdbg.engines.pipeline import Calibration, prepare_model
from tests import models
from tests.helpers import one_line_error, run_cli

INT4_LINE = (
    "int4 weights on 2 layers (Conv 1x1, Gemm, MatMul); 1 other weighted layers keep 8-bit "
    "weights: Qualcomm documents HTP's int4 weights for those only"
)


def weight_dq(path: Path) -> dict[str, tuple[int, dict]]:
    """Read independently with onnx: each weight initializer's DequantizeLinear, by the float
    weight's name -> (its input's element type, its attributes)."""
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            out[n.input[0].removesuffix("_quantized")] = (inits[n.input[0]].data_type, attrs)
    return out


def _prepare(tmp_path: Path, built: models.Built, **quant) -> object:
    model = onnx.load(str(built.path))
    x = parse_input_tensor(
        [built.input_name, ",".join(map(str, built.dims)), str(built.input_path)]
    )
    calib = Calibration.from_inputs(model, None, [x])
    config = EngineConfig.from_keywords(**quant)
    return prepare_model(model, "net", calib, config, tmp_path / "q")


def test_wbw4_gives_int4_weights_to_the_1x1_conv_and_the_gemm_only(tmp_path):
    built = models.int4_mix(tmp_path)
    prepared = _prepare(tmp_path, built, act_bitwidth=16, weights_bitwidth=4)
    dq = weight_dq(prepared.path)
    assert dq["w1x1"][0] == TensorProto.INT4 and dq["w1x1"][1].get("axis") == 0
    assert dq["wg"][0] == TensorProto.INT4 and dq["wg"][1].get("axis") == 0  # transB: [N, K]
    assert dq["w3x3"][0] == TensorProto.UINT8  # a 3x3 kernel keeps the run's 8-bit weights
    assert INT4_LINE in prepared.steps and any("A16W4" in s for s in prepared.steps)
    # the int4 integers are symmetric: zero point 0, values within -8..7
    m = onnx.load(str(prepared.path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    q = inits["w1x1_quantized"]
    assert inits["w1x1_zero_point"].max() == 0 and q.min() >= -8 and q.max() <= 7


def test_int4_plan_keeps_shared_grouped_and_given_weights_8_bit():
    from onnx import helper

    from accdbg.engines.int4 import int4_plan

    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    mm = numpy_helper.from_array(np.ones((4, 4), np.float32), "m")
    nd = numpy_helper.from_array(np.ones((2, 4, 4), np.float32), "n")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="c1"),
        helper.make_node("Conv", ["a", "w"], ["b"], name="c2", group=2),  # shares w, grouped
        helper.make_node("MatMul", ["f", "m"], ["g"], name="mm"),
        helper.make_node("MatMul", ["g", "n"], ["h"], name="mm3d"),  # a 3-D weight
    ]
    graph = helper.make_graph(nodes, "g", [], [], [w, mm, nd])
    plan = int4_plan(helper.make_model(graph))
    assert set(plan.overrides) == {"m"} and plan.overrides["m"][0]["axis"] == 1
    assert (plan.layers, plan.others) == (1, 3)
    assert int4_plan(helper.make_model(graph), given={"m"}).overrides == {}


def _sqnr(built: models.Built, out_dir: Path, inputs: int) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(built.path), providers=["CPUExecutionProvider"])
    signal = noise = 0.0
    for i in range(inputs):
        x = np.fromfile(built.path.parent / f"x{i}.raw", np.float32).reshape(built.dims)
        ref = sess.run(None, {"x": x})[0].astype(np.float64)
        y = np.fromfile(out_dir / f"Result_{i}" / "y.raw", np.float32).reshape(ref.shape)
        signal += float(np.sum(ref**2))
        noise += float(np.sum((y - ref) ** 2))
    return 10 * np.log10(signal / noise)


def _engine(capsys, tmp_path: Path, built: models.Built, name: str, *flags) -> Path:
    work = tmp_path / name
    code, out, err = run_cli(
        capsys, "--inference_engine", "-r", "htp", "-m", built.path,
        "-l", built.path.parent / "list.txt", "-w", work, "--debug_mode_off", *flags,
    )  # fmt: skip
    assert code == 0, err
    return work / "inference_engine" / "latest"


@pytest.mark.slow
def test_w4a16_and_w4a8_run_on_htp_and_lose_to_w8(tmp_path, capsys):
    """On QNN HTP: W4A16 and W4A8 run (no CPU fallback of a layer), their outputs' SQNR
    against onnxruntime's CPU float run is finite and below W8A16's."""
    built = models.int4_mix(tmp_path)
    w8 = _engine(capsys, tmp_path, built, "w8", "-abw", "16")
    w4 = _engine(capsys, tmp_path, built, "w4", "-abw", "16", "-wbw", "4")
    w4a8 = _engine(capsys, tmp_path, built, "w4a8", "-wbw", "4")
    s8, s4, s4a8 = (_sqnr(built, run / "output", 4) for run in (w8, w4, w4a8))
    assert np.isfinite(s4) and np.isfinite(s4a8) and 0 < s4 < s8, (s8, s4, s4a8)
    assert weight_dq(next(w4.glob("*.qdq.onnx")))["w1x1"][0] == TensorProto.INT4
    part = json.loads((w4 / "partitioning.json").read_text())
    on_cpu = [n for n in json.dumps(part).split('"') if n in ("conv1x1", "gemm", "conv3x3")]
    assert not on_cpu, part
    assert INT4_LINE in (w4 / "log.txt").read_text()


@pytest.mark.parametrize(
    "flags, error",
    [
        (["-wbw", "2"], "argument -wbw/--weights_bitwidth: invalid choice: 2"),
        (["--weight_block_size", "16"], "--weight_block_size 16: blocks are for int4 weights; expected -wbw 4"),
        (["-wbw", "4", "--weight_block_size", "16"], "no block-quantized int4 for QNN HTP with 8-bit activations; expected -abw 16"),
        (["-wbw", "4", "-abw", "16", "--weight_block_size", "0"], "--weight_block_size 0: expected a whole number"),
        (["-wbw", "4", "-abw", "16", "--weight_block_size", "16"], "has no block-quantized int4 for QNN on Conv (layer 'conv1x1'"),
    ],
)  # fmt: skip
def test_bad_int4_flags_are_one_line_errors(tmp_path, capsys, flags, error):
    built = models.int4_mix(tmp_path, inputs=1)
    code, _, err = run_cli(capsys, "--inference_engine", "-r", "htp", *built.flags(False),
                           "-w", tmp_path / "w", *flags)  # fmt: skip
    assert code == 2 and error in one_line_error(err), err


def test_block_size_needs_whole_blocks(tmp_path):
    from accdbg.engines.int4 import block_axis
    from accdbg.errors import AccdbgError

    built = models.matmul_chain(tmp_path, inputs=1)
    model = onnx.load(str(built.path))
    assert block_axis(model, 16) == {"w1": 0, "w2": 0}
    with pytest.raises(AccdbgError, match="'fc2' has 32 input channels .* not a multiple of 64"):
        block_axis(model, 64)


@pytest.mark.slow
def test_block_quantized_int4_matmuls_run_on_htp(tmp_path, capsys):
    """--weight_block_size 16 on bias-free MatMuls at A16: opset-21 blocked DequantizeLinear
    in the QDQ model, the provider option that makes HTP take them, and outputs that match."""
    built = models.matmul_chain(tmp_path)
    (tmp_path / "list.txt").write_text((tmp_path / "bq_list.txt").read_text())
    for i in range(4):
        (tmp_path / f"x{i}.raw").write_bytes((tmp_path / f"bx{i}.raw").read_bytes())
    run = _engine(capsys, tmp_path, built, "b16", "-abw", "16", "-wbw", "4",
                  "--weight_block_size", "16")  # fmt: skip
    dq = weight_dq(next(run.glob("*.qdq.onnx")))
    assert dq["w1"][0] == TensorProto.INT4 and dq["w1"][1] == {"axis": 0, "block_size": 16}
    options = json.loads((run / "inference_engine_options.json").read_text())
    assert options.get("weight_block_size") == 16
    assert np.isfinite(_sqnr(built, run / "output", 4)) and _sqnr(built, run / "output", 4) > 10


def _aimet_w1x1(built: models.Built, per_channel: bool) -> dict:
    """AIMET encodings putting the 1x1 Conv's weight in 4 bits, symmetric (offset -8)."""
    w = numpy_helper.to_array(
        next(i for i in onnx.load(str(built.path)).graph.initializer if i.name == "w1x1")
    )
    peaks = np.abs(w).reshape(w.shape[0], -1).max(axis=1) if per_channel else [np.abs(w).max()]
    encs = []
    for peak in peaks:
        scale = float(peak) / 7
        encs.append({"bitwidth": 4, "dtype": "int", "is_symmetric": "True", "offset": -8,
                     "scale": scale, "min": -8 * scale, "max": 7 * scale})  # fmt: skip
    return {"activation_encodings": {}, "param_encodings": {"w1x1": encs}}


def test_a_per_tensor_4_bit_conv_weight_in_qo_is_refused_naming_it(tmp_path, capsys):
    built = models.int4_mix(tmp_path, inputs=1)
    qo = tmp_path / "enc.json"
    qo.write_text(json.dumps(_aimet_w1x1(built, per_channel=False)))
    code, _, err = run_cli(capsys, "--inference_engine", "-r", "htp", *built.flags(False),
                           "-w", tmp_path / "w", "-qo", qo)  # fmt: skip
    line = one_line_error(err)
    assert code == 2 and "parameter 'w1x1' has one 4-bit encoding" in line, err
    assert "Conv 'conv1x1'" in line and "per channel only" in line


@pytest.mark.slow
def test_a_per_channel_4_bit_weight_in_qo_runs_on_htp(tmp_path, capsys):
    built = models.int4_mix(tmp_path)
    qo = tmp_path / "enc.json"
    qo.write_text(json.dumps(_aimet_w1x1(built, per_channel=True)))
    run = _engine(capsys, tmp_path, built, "qo", "-abw", "16", "-qo", qo)
    dq = weight_dq(next(run.glob("*.qdq.onnx")))
    assert dq["w1x1"][0] == TensorProto.INT4 and dq["wg"][0] == TensorProto.UINT8
    assert np.isfinite(_sqnr(built, run / "output", 4))


def test_weight_bitwidth_column_from_the_qdq_model(tmp_path):
    import pandas as pd

    from accdbg.encodings.qdq import weight_bitwidths
    from accdbg.verifiers.verification import Plan, _engine_qdq, _weight_bits, with_weight_bitwidth

    built = models.int4_mix(tmp_path, inputs=1)
    prepared = _prepare(tmp_path, built, act_bitwidth=16, weights_bitwidth=4)
    bits = weight_bitwidths(prepared.path)
    # the Relus are folded into the Convs: a Conv's output is the Relu's name
    assert bits["r1"] == 4 and bits["r3"] == 8 and bits["y"] == 4 and "fl" not in bits
    run = tmp_path / "engine_run"
    run.mkdir()
    (run / "net.qdq.onnx").write_bytes(prepared.path.read_bytes())
    plan = Plan([], None, {}, None, weight_bits=_weight_bits(_engine_qdq(run)))
    df = with_weight_bitwidth(pd.DataFrame({"Name": ["r1", "fl", "r3", "y"]}), plan)
    assert df["weight_bitwidth"].tolist()[0] == 4 and pd.isna(df["weight_bitwidth"][1])
    assert df["weight_bitwidth"].tolist()[2:] == [8, 4]
    empty = with_weight_bitwidth(pd.DataFrame({"Name": ["c1"]}), Plan([], None, {}, None))
    assert "weight_bitwidth" not in empty.columns  # a float run: no column


def test_an_int4_layer_gets_8_bit_weights_as_its_first_fix(tmp_path):
    from accdbg.algorithms.diagnosis.culprit import WEIGHT, Culprit
    from accdbg.algorithms.fixes import candidates as C

    built = models.int4_mix(tmp_path, inputs=1)
    model = onnx.load(str(built.path))
    int4 = C.int4_weights(model, 4)
    assert int4 == {"w1x1", "wg"} and C.int4_weights(model, 8) == frozenset()
    c1 = Culprit(1, "r1", "Relu", "weight range", kind=WEIGHT)
    changes, _ = C.changes_for(model, c1, False, 16, int4=int4)
    assert changes[0].kind == "w8" and changes[0].target == "w1x1"
    assert "per_channel" not in {c.kind for c in changes}  # int4 weights are per channel
    assert changes[0].label == "8-bit weights: w1x1 (int4 in the run)"
    c3 = Culprit(2, "r3", "Relu", "weight range", kind=WEIGHT)
    assert C.changes_for(model, c3, False, 16, int4=int4)[0][0].kind == "per_channel"
    st = C.settings([changes[0]], False, 16, "tf", "QUInt8", {"w1x1": 0})
    assert st["overrides"]["w1x1"] == [{"quant_type": "QUInt8"}]
    assert st["landed"] == [("w8", "w1x1")]
    assert not C.compatible([changes[0]], C.Change("w16", "w1x1", "r1"))


def test_a_w4_run_tries_8_bit_weights_everywhere_first_among_the_global_knobs(tmp_path):
    from accdbg.algorithms.fixes import candidates as C

    built = models.int4_mix(tmp_path, inputs=1)
    model = onnx.load(str(built.path))
    cands, _ = C.propose(model, [], False, 16, "tf", C.int4_weights(model, 4))
    assert cands[0].kind == "w8_all" and cands[0].is_global
    assert "w8_all" not in {c.kind for c in C.propose(model, [], False, 16, "tf")[0]}
    st = C.settings([cands[0]], False, 16, "tf", "QUInt8", {})
    assert st["weights_bitwidth"] == 8
