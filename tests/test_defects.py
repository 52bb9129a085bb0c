"""The quantizer's defects and encodings that cannot hold their tensors, found before QNN runs.

Hand-built models: an attention head with transformers' additive mask (float32's minimum, or
-inf), two Convs sharing a bias beside an activation named as the quantizer would name its
copy, a Relu whose output's encoding is given through overrides starting below zero.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.core.inputs import InputTensor
from accdbg.encodings.defects import DROPPED, MASK, MASK_MARGIN, find_defects
from accdbg.engines import integrity
from accdbg.engines.legalize import drop_nan_guards, keep_float, quantize_where_constants
from accdbg.engines.options import QuantOptions
from accdbg.engines.pipeline import Calibration, prepare_float, quantize_prepared
from accdbg.errors import AccdbgError
from tests import models

F32_MIN = float(np.finfo(np.float32).min)


def _inputs(built: models.Built) -> list[InputTensor]:
    more = [
        InputTensor(n, tuple(d), p, np.dtype(np.float32)) for n, (d, p) in built.more_inputs.items()
    ]
    return [
        InputTensor(built.input_name, built.dims, built.input_path, np.dtype(np.float32)),
        *more,
    ]


def _quantized(built: models.Built, tmp_path, quant: QuantOptions | None = None, overrides=None):
    model = onnx.load(str(built.path))
    calib = Calibration.from_inputs(model, None, _inputs(built))
    prepared = prepare_float(model, "m", calib, tmp_path / "p")
    return prepared, quantize_prepared(
        prepared.path, "m", calib, quant or QuantOptions(), tmp_path / "q", overrides
    )


def _encoding(qdq: onnx.ModelProto, tensor: str) -> tuple[float, int]:
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return float(inits[q.input[1]]), int(inits[q.input[2]])


@pytest.mark.parametrize("value", [F32_MIN, -math.inf])
def test_a_mask_constant_is_named_with_its_tensors_and_its_source(tmp_path, value):
    """Float32's minimum on the masked keys gives the mask and the score Add encodings over
    3.4e38 (one step for the real scores); -inf an infinite scale, which no backend takes:
    the run clamps the mask for itself, MASK_MARGIN under the scores' calibrated range."""
    built = models.masked_attention(tmp_path, value)
    prepared, q = _quantized(built, tmp_path)
    masks = [d for d in q.defects if d.kind == MASK]
    assert len(masks) == 1
    d = masks[0]
    assert set(d.tensors) == {"bias", "masked_scores"}
    assert "'mask'" in d.source and "Where" in d.source  # the input and how it goes in
    assert d.constant == "masked" and d.value == value
    assert d.fatal == math.isinf(value)
    # the clamp: the scores' own range (numpy, over the calibration input) and the margin
    scores = built.expected["scores"]
    lo, hi = min(0.0, float(scores.min())), max(0.0, float(scores.max()))
    assert d.extra["clamp"] == pytest.approx(math.floor(lo - hi - MASK_MARGIN), abs=1.0)
    qdq = q.load()
    if d.fatal:  # quantized again with the mask clamped: a finite, modest range
        assert any("clamped to" in s for s in q.steps)
        scale, _ = _encoding(qdq, "masked_scores")
        assert math.isfinite(scale) and scale * 255 < 4 * (hi - lo + MASK_MARGIN)
    else:
        scale, _ = _encoding(qdq, "masked_scores")
        assert scale * 255 > 1e38  # the whole float32 range, as quantized
    assert json.loads(json.dumps(d.as_dict()))["tensors"] == list(d.tensors)


def test_a_shared_bias_is_copied_before_the_quantizer_can_take_an_activations_name(
    tmp_path, monkeypatch
):
    """Without its own copies the quantizer's copy of ``b`` is named ``b0``, the Relu's output:
    the second Conv then reads the Relu's output as its bias. The wiring check names that node;
    with the copies made first the Neg reads the Relu's output, as in the float model."""
    built = models.shared_bias(tmp_path)
    _, q = _quantized(built, tmp_path / "ok")
    qdq = q.load()
    neg = next(n for n in qdq.graph.node if n.name == "neg")
    producer = {o: n for n in qdq.graph.node for o in n.output}
    assert producer[producer[neg.input[0]].input[0]].input[0] == "b0"  # DQ <- Q <- b0
    monkeypatch.setattr("accdbg.engines.quantize.own_biases", lambda model: [])
    with pytest.raises(
        AccdbgError, match=r"quantized model is broken.*input 2 of Conv 'conv2' to 'b0'.*reads 'b'"
    ):
        _quantized(built, tmp_path / "broken")


def test_a_quantized_model_the_cpu_cannot_run_is_broken_not_a_qnn_error(tmp_path):
    """A QDQ model whose Add reads tensors of shapes that do not broadcast: onnxruntime's CPU
    refuses it too, and the error says so."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )
    path = tmp_path / "bad.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    with pytest.raises(AccdbgError, match="bad.onnx is broken: onnxruntime's CPU cannot run it"):
        integrity.check_runs_on_cpu(path, {"x": np.zeros((1, 4), np.float32)})


def test_a_relu_the_quantizer_drops_is_named_when_its_encoding_starts_below_zero(tmp_path):
    """An override (as -qo gives) for the Relu's output starting at -2: the quantizer removes
    the Relu and lets that encoding clamp - the negative values pass."""
    built = models.mlp(tmp_path)
    scale = 6.0 / 255
    zero = round(2.0 / scale)  # the grid's 0.0: its minimum is -zero * scale = -2
    overrides = {"relu1": [{"scale": scale, "zero_point": zero, "quant_type": "QUInt8"}]}
    _, q = _quantized(built, tmp_path, overrides=overrides)
    assert not any(n.op_type == "Relu" for n in q.load().graph.node)
    dropped = [d for d in q.defects if d.kind == DROPPED]
    assert [d.node for d in dropped] == ["relu_1"]
    assert dropped[0].tensors == ("relu1",)
    assert dropped[0].extra["encoding"][0] == pytest.approx(-zero * scale, rel=1e-4)
    assert "pass through" in dropped[0].what
    # the same model, its Relu's encoding starting at 0: nothing dropped wrongly
    _, plain = _quantized(built, tmp_path / "plain")
    assert not [d for d in plain.defects if d.kind == DROPPED]


def _qdq_where(tmp_path, guard: bool):
    """x -> Q/DQ -> [IsNaN ->] Where(.., 0, x or c) -> Q/DQ -> y, as the quantizer leaves it."""
    s, z = np.array(1 / 255, np.float32), np.array(0, np.uint8)
    inits = [
        numpy_helper.from_array(s, "s"),
        numpy_helper.from_array(z, "z"),
        numpy_helper.from_array(np.array([0.5], np.float32), "half"),
        numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
    ]
    cond = (
        [helper.make_node("IsNaN", ["xd"], ["c"], name="isnan")]
        if guard
        else [helper.make_node("Greater", ["xd", "half"], ["c"], name="greater")]
    )
    data = ["c", "zero", "xd"] if guard else ["c", "half", "zero"]
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            *cond,
            helper.make_node("Where", data, ["w"], name="where"),
            helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"]),
            helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["y"]),
        ],
        "w",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_a_where_computing_in_float_gets_its_constants_in_its_outputs_encoding(tmp_path):
    model = _qdq_where(tmp_path, guard=False)
    x = np.linspace(0, 1, 8, dtype=np.float32)[None]
    before = _run(model, x)
    assert quantize_where_constants(model) == ["where"]
    where = next(n for n in model.graph.node if n.op_type == "Where")
    producer = {o: n for n in model.graph.node for o in n.output}
    assert all(producer[i].op_type == "DequantizeLinear" for i in where.input[1:])
    # 0.5 and 0 put on the output's grid (its float32 scale, as stored): numpy's rounding
    step = float(np.float32(1 / 255))
    expected = np.where(x > 0.5, np.round(0.5 / step) * step, 0.0)
    np.testing.assert_allclose(_run(model, x), expected, atol=1e-6)
    np.testing.assert_allclose(before, expected, atol=1 / 255)


def test_a_nan_guard_on_a_quantized_tensor_is_its_else_branch(tmp_path):
    model = _qdq_where(tmp_path, guard=True)
    x = np.linspace(0, 1, 8, dtype=np.float32)[None]
    before = _run(model, x)
    assert drop_nan_guards(model) == ["where"]
    assert not any(n.op_type in ("IsNaN", "Where") for n in model.graph.node)
    np.testing.assert_array_equal(_run(model, x), before)


def test_kept_float_tensors_lose_their_pairs_and_compute_in_float(tmp_path):
    model = _qdq_where(tmp_path, guard=False)
    assert keep_float(model, ["w", "y"]) == ["w"]  # y is a graph output made by the DQ
    assert [n.op_type for n in model.graph.node].count("QuantizeLinear") == 1
    x = np.linspace(0, 1, 8, dtype=np.float32)[None]
    np.testing.assert_allclose(_run(model, x), np.where(x > 0.5, 0.5, 0.0), atol=1e-6)


def test_the_float_model_of_a_mask_is_unchanged_and_its_defect_found_before_a_run(tmp_path):
    """find_defects reads only the two models: no session, no run."""
    built = models.masked_attention(tmp_path, F32_MIN)
    prepared, q = _quantized(built, tmp_path)
    float_model = onnx.load(str(prepared.path))
    masked = next(i for i in float_model.graph.initializer if i.name == "masked")
    assert float(numpy_helper.to_array(masked)) == F32_MIN
    again = find_defects(float_model, q.load())
    assert [d.tensors for d in again] == [d.tensors for d in q.defects]


@pytest.mark.slow
def test_an_attention_with_an_infinite_mask_runs_on_qnn_with_the_mask_named(tmp_path):
    """-inf on the masked keys: as quantized no backend takes it; the engine clamps the mask
    for its run, QNN HTP runs the model, and the defects beside the QDQ model name the mask and its tensors."""
    from accdbg.core.inputs import parse_input_tensor
    from accdbg.core.tensor_store import TensorFolder
    from accdbg.encodings.defects import defects_path, read_defects
    from accdbg.engines import run_inference_engine

    built = models.masked_attention(tmp_path, -math.inf)
    (mask_dims, mask_path) = built.more_inputs["mask"]
    res = run_inference_engine(
        built.path,
        input_tensors=[
            parse_input_tensor(["x", ",".join(map(str, built.dims)), str(built.input_path)]),
            parse_input_tensor(["mask", ",".join(map(str, mask_dims)), str(mask_path)]),
        ],
        working_dir=tmp_path / "w",
    )
    found = read_defects(defects_path(res.qdq_model))
    assert [d.kind for d in found] == [MASK] and found[0].fatal
    assert "clamped to" in (res.run_dir / "log.txt").read_text()
    y = TensorFolder(res.results[0]).load("y")
    expected = built.expected["y"]  # numpy: the masked keys get no weight
    err = np.sum((y - expected) ** 2) / np.sum(expected**2)
    assert 10 * np.log10(1 / err) > 15  # an 8-bit attention head, not garbage


@pytest.mark.slow  # oneshot on QNN
def test_oneshot_keeps_a_mask_it_clamped_as_culprit_one_with_the_clamp_as_its_fix(tmp_path):
    """The model as given does not run on QNN (-inf: infinite scales); the run clamps the mask,
    so its region in fp16 gains nothing over the clamped run - it stays culprit #1, confirmed
    by that, its fix the clamp (the clamped model written for -m), said without a gain."""
    from accdbg.algorithms.oneshot import run_oneshot
    from accdbg.core.inputs import parse_input_tensor

    built = models.masked_attention(tmp_path, -math.inf)
    (mask_dims, mask_path) = built.more_inputs["mask"]
    res = run_oneshot(
        "onnx",
        built.path,
        [
            parse_input_tensor(["x", ",".join(map(str, built.dims)), str(built.input_path)]),
            parse_input_tensor(["mask", ",".join(map(str, mask_dims)), str(mask_path)]),
        ],
        working_dir=tmp_path / "w",
    )
    first = res.culprits[0]
    assert first.kind == MASK and first.rank == 1, res.findings
    v = first.verified
    assert v.confirmed and v.fix.startswith("mask") and math.isnan(v.gain_db), v
    line = next(f for f in res.findings if f.startswith("culprit #1:"))
    assert "the model as given does not run" in line and "this run applies the fix" in line
    clamped = res.verification_run / "fixes"
    assert any(p.suffix == ".onnx" for p in clamped.iterdir()) and "-m " in v.command


@pytest.mark.parametrize(
    "section, bits, kind",
    [("activation_encodings", 4, "activation"), ("param_encodings", 2, "parameter")],
)
def test_bitwidths_htp_cannot_run_are_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch, section, bits, kind
):
    """A 4-bit activation in -qo: the quantizer takes it and QNN refuses the model later
    (``tensor(uint4)``); refused up front in one line naming the tensor, nothing written."""
    from tests.helpers import run_cli

    built = models.mlp(tmp_path)
    name = "relu1" if kind == "activation" else "w1"
    enc = {"bitwidth": bits, "dtype": "int", "is_symmetric": "False", "max": 1.0, "min": 0.0}
    enc |= {"offset": 0, "scale": 1.0 / (2**bits - 1)}
    qo = tmp_path / "enc.json"
    other = "param_encodings" if section == "activation_encodings" else "activation_encodings"
    qo.write_text(json.dumps({section: {name: [enc]}, other: {}}))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *built.flags(), "-r", "htp", "-qo", str(qo))
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert f"{kind} '{name}' has bitwidth {bits}" in line and "HTP takes" in line
    assert not (tmp_path / "working_directory").exists()


def test_a_share_over_the_whole_error_is_said_in_db_not_as_a_percentage():
    from accdbg.core.shares import share_words

    assert share_words(0.42) == "42%" and share_words(1.0) == "100%"
    assert share_words(2.56) == f"all (+{10 * math.log10(2.56):.1f} dB)" == "all (+4.1 dB)"
    assert share_words(math.nan) == "?%"


def test_the_debug_graph_parting_from_a_plain_run_is_one_record_per_output_worst_input():
    """Two inputs, two outputs: the first output's debug values part from the plain run's on
    both inputs (the worst, by SQNR between them, is kept), the second only rounds otherwise."""
    from accdbg.engines.run import OBSERVER_DB, _apart, observer_effects

    rng = np.random.default_rng(0)
    plain = rng.normal(size=1000)
    off = plain + rng.normal(size=1000) * 0.2  # ~14 dB apart
    close = plain + rng.normal(size=1000) * 1e-4  # ~80 dB apart: rounding
    worse = plain + rng.normal(size=1000) * 0.5  # ~6 dB apart
    diffs = [
        [_apart(plain, off), _apart(plain, close)],
        [_apart(plain, worse), _apart(plain, close)],
    ]
    effects = observer_effects(diffs, ["scores", "boxes"])
    assert [e.output for e in effects] == ["scores"] and effects[0].inputs == 2
    expected = 10 * np.log10(np.dot(plain, plain) / np.dot(plain - worse, plain - worse))
    assert effects[0].sqnr_db == pytest.approx(expected) and effects[0].sqnr_db < OBSERVER_DB
    assert effects[0].max_diff == pytest.approx(np.max(np.abs(plain - worse)))


def test_an_input_its_encodings_were_not_calibrated_for_names_the_calibration(tmp_path):
    """Encodings calibrated on an input ten times dimmer: the debugged input is clipped at the
    graph input (numpy: its share beyond the input encoding's range) and at the layers after."""
    from accdbg.algorithms.diagnosis.coverage import coverage_culprit, input_clipping
    from accdbg.algorithms.diagnosis.culprit import CALIBRATION

    built = models.conv_net(tmp_path, layers=3)
    x = np.fromfile(built.input_path, np.float32).reshape(built.dims)
    dim = tmp_path / "dim.raw"
    (x / 10).tofile(dim)
    model = onnx.load(str(built.path))
    dim_in = [InputTensor(built.input_name, built.dims, dim, np.dtype(np.float32))]
    calib = Calibration.from_inputs(model, None, dim_in)
    prepared = prepare_float(model, "m", calib, tmp_path / "p")
    qdq = quantize_prepared(prepared.path, "m", calib, QuantOptions(), tmp_path / "q").load()
    clipped = input_clipping(qdq, {built.input_name: x})
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    scale, zp = float(inits[q.input[1]]), int(inits[q.input[2]])
    lo, hi = -zp * scale, (255 - zp) * scale
    expected = float(np.mean((x < lo - scale / 2) | (x > hi + scale / 2)))
    assert clipped == {"x": pytest.approx(expected)} and expected > 0.5
    c = coverage_culprit(qdq, {}, {built.input_name: x}, rank=1)
    assert c is not None and c.kind == CALIBRATION and c.region[0] == "x"
    assert "input x:" in c.cause and "not calibrated on inputs like this one" in c.cause
    # the inputs it was calibrated on: nothing clipped, nothing named
    assert coverage_culprit(qdq, {}, {built.input_name: x / 10}, rank=1) is None


@pytest.mark.slow
def test_oneshot_names_a_calibration_that_misses_the_input_and_measures_recalibration(tmp_path):
    """-qo encodings calibrated on a dim input, a normal one debugged: the calibration is
    culprit #1 and its fix, recalibration on the debugged input, gains on QNN."""
    from accdbg.algorithms.oneshot import run_oneshot
    from accdbg.core.inputs import parse_input_tensor
    from accdbg.encodings.qdq import export_qdq_encodings

    built = models.conv_net(tmp_path, layers=3)
    x = np.fromfile(built.input_path, np.float32).reshape(built.dims)
    dim = tmp_path / "dim.raw"
    (x / 10).tofile(dim)
    model = onnx.load(str(built.path))
    calib = Calibration.from_inputs(
        model, None, [InputTensor(built.input_name, built.dims, dim, np.dtype(np.float32))]
    )
    prepared = prepare_float(model, "m", calib, tmp_path / "p")
    q = quantize_prepared(prepared.path, "m", calib, QuantOptions(), tmp_path / "q")
    enc = export_qdq_encodings(q.path, tmp_path / "dim.encodings")
    dims = ",".join(map(str, built.dims))
    res = run_oneshot(
        "onnx",
        built.path,
        [parse_input_tensor([built.input_name, dims, str(built.input_path)])],
        working_dir=tmp_path / "w",
        engine_kwargs={"quantization_overrides": str(enc)},
    )
    first = res.culprits[0]
    assert first.kind == "calibration coverage" and first.rank == 1, res.findings
    v = first.verified
    assert v is not None and v.confirmed and v.fix.startswith("recalibrated") and v.gain_db > 3
    assert res.findings[-1].startswith("fix: recalibrated") and "-qo" not in res.findings[-1]
    # the graph input has a row: the file against what QNN was fed, its clipping said
    row = res.summary.set_index("Name").loc[built.input_name]
    assert row["LayerType"] == "graph input" and res.summary["Name"].iloc[0] == built.input_name
    x_dim = x / 10
    lo, hi = x_dim.min(), x_dim.max()  # the range min/max calibration gives the dim input
    share = float(np.mean((x < lo) | (x > hi)))  # ~ what falls outside it (the grid aside)
    said = float(re.search(r"clips (\d+\.\d)% of the input", row["Status"]).group(1)) / 100
    assert share > 0.5 and said == pytest.approx(share, abs=0.02)
    fed = np.clip(x, lo, hi)
    sqnr = 10 * np.log10(np.sum(x**2) / np.sum((x - fed) ** 2))
    assert float(row["SQNR"]) == pytest.approx(sqnr, abs=0.5)
    assert float(row["target_max"]) == pytest.approx(hi, rel=0.02)


def test_tensors_the_preprocessing_renamed_are_found_again_by_their_values(tmp_path):
    """A tf2onnx-style model (names ending in ``:0``) and the same computation built otherwise
    with new names (as onnxruntime's folding and fusions leave it): each renamed tensor maps to
    the one source tensor of its shape and values; a tensor two source tensors equal (a value
    with an Identity copy) and one no source tensor holds stay unmapped."""
    from accdbg.engines.renamed import match_by_value

    w = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32)
    src = helper.make_graph(
        [
            helper.make_node("MatMul", ["x:0", "w:0"], ["dense/MatMul:0"]),
            helper.make_node("Relu", ["dense/MatMul:0"], ["dense/Relu:0"]),
            helper.make_node("Identity", ["dense/Relu:0"], ["copy:0"]),
            helper.make_node("Neg", ["copy:0"], ["y:0"]),
        ],
        "src",
        [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y:0", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "w:0")],
    )
    prep = helper.make_graph(
        [
            helper.make_node("Gemm", ["x:0", "w:0"], ["gemm_out_token_3"]),
            helper.make_node("Relu", ["gemm_out_token_3"], ["relu_token_4"]),
            helper.make_node("Neg", ["relu_token_4"], ["y:0"]),
            helper.make_node("Abs", ["y:0"], ["nowhere"]),
        ],
        "prep",
        [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y:0", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "w:0")],
    )
    make = lambda g: helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])  # noqa: E731
    x = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    found = match_by_value(
        make(prep), make(src), ["gemm_out_token_3", "relu_token_4", "nowhere"], {"y:0"}, {"x:0": x}
    )
    # the Relu's value is in dense/Relu:0 and its Identity copy: ambiguous, not guessed
    assert found == {"gemm_out_token_3": "dense/MatMul:0"}
