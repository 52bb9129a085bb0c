"""The fix search, on models whose fault - and so whose cure - is known by construction.

Every search runs the real QNN HTP backend (onnxruntime-qnn). Diagnoses are given as the
tables the culprit ranking writes (``Name``, ``culprit_rank``, ``cause``), naming the planted
layer, except in the end-to-end tests, where oneshot diagnoses.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.algorithms.fixes import candidates as C
from accdbg.algorithms.fixes import run_fix_search, search
from accdbg.algorithms.fixes.equalize import conv_pairs, equalize
from accdbg.algorithms.fixes.outputs import pareto
from accdbg.core.inputs import parse_input_tensor
from accdbg.encodings.qdq import qdq_encodings
from accdbg.errors import AccdbgError
from accdbg.reports import model_explorer as me
from tests import browser, crashers
from tests.helpers import one_line_error, run_cli
from tests.models import offset_chain, outlier_chain, planted_chain
from tests.test_model_explorer import load_overlay, overlay_files

REPO = Path(__file__).resolve().parents[1]


def diagnosis(name: str, cause: str) -> pd.DataFrame:
    return pd.DataFrame({"Name": ["x", name], "culprit_rank": [np.nan, 1], "cause": ["", cause]})


def image(built) -> list:
    return [
        parse_input_tensor(
            [built.input_name, ",".join(map(str, built.dims)), str(built.input_path)]
        )
    ]


def float_output(model: Path, x_path: Path, dims) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.fromfile(x_path, np.float32).reshape(dims)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def sqnr(ref: np.ndarray, out: np.ndarray) -> float:
    ref, out = ref.astype(np.float64), out.astype(np.float64)
    return 10 * math.log10(np.sum(ref**2) / np.sum((out - ref) ** 2))


def rows(result, change_prefix: str) -> pd.DataFrame:
    t = result.candidates
    return t[t["change"].str.startswith(change_prefix)]


def reproduce(result, work: Path, capsys) -> tuple[Path, np.ndarray]:
    """Run the reproduce command as written (its own -w), return the engine run and output."""
    argv = shlex.split(result.reproduce)
    assert argv[:2] == ["qnn-accuracy-debugger", "--inference_engine"]
    code, _, err = run_cli(capsys, *argv[1:], "-w", work)
    assert code == 0, err
    run = (work / "inference_engine" / "latest").resolve()
    manifest = json.loads((run / "output" / "Result_0" / "tensors.json").read_text())
    (rec,) = manifest["tensors"]
    out = np.fromfile(run / "output" / "Result_0" / rec["file"], np.float32)
    return run, out.reshape(rec["shape"])


def same_encodings(a: Path, b: Path) -> None:
    ea, eb = qdq_encodings(a), qdq_encodings(b)
    assert set(ea) == set(eb)
    for name in ea:
        assert (ea[name].bitwidth, list(ea[name].offset)) == (
            eb[name].bitwidth,
            list(eb[name].offset),
        ), name
        np.testing.assert_array_equal(np.float32(ea[name].scale), np.float32(eb[name].scale), name)


# ---------------------------------------------------------------- without the backend


def test_equalization_leaves_the_float_function_and_balances_the_pair(tmp_path):
    built = outlier_chain(tmp_path, scale=1 / 40)  # layer3's input channel 0 weights x40
    model = onnx.load(str(built.path))
    pairs = {p.label: p for p in conv_pairs(model)}
    assert set(pairs) == {f"Conv_{i}->Conv_{i + 1}" for i in range(5)}
    eq, notes = equalize(model, [pairs["Conv_2->Conv_3"]])
    w = {i.name: numpy_helper.to_array(i) for i in eq.graph.initializer}
    r1 = np.abs(w["w2"]).reshape(16, -1).max(1)
    r2 = np.abs(w["w3"]).transpose(1, 0, 2, 3).reshape(16, -1).max(1)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)  # both sides of every channel: one range
    before = np.abs(numpy_helper.to_array(model.graph.initializer[6])).max()
    assert np.abs(w["w3"]).max() < before / 4  # the 40x input channel is gone
    x = np.fromfile(built.input_path, np.float32).reshape(built.dims)
    outs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        for m in (model, eq)
    ]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5 * np.abs(outs[0]).max())
    assert notes and "Conv_2->Conv_3" in notes[0]


def test_no_pair_across_an_op_that_is_not_positively_homogeneous():
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    v = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "v")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["a"], name="A"),
            helper.make_node("Clip", ["a", "lo", "hi"], ["c"], name="Relu6"),
            helper.make_node("Conv", ["c", "v"], ["y"], name="B"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [
            w,
            v,
            numpy_helper.from_array(np.float32(0), "lo"),
            numpy_helper.from_array(np.float32(6), "hi"),
        ],
    )
    assert conv_pairs(helper.make_model(graph)) == []  # Relu6 clips: s*x is not clip(x)*s


def test_the_cause_orders_the_candidates_and_a_backend_culprit_gets_none(tmp_path):
    model = onnx.load(str(planted_chain(tmp_path).path))
    table = pd.DataFrame(
        {
            "Name": ["layer1", "layer3", "layer4"],
            "culprit_rank": [2, 1, 3],
            "cause": [
                "activation range: channel 3 carries 30x the median channel's range",
                "weight range: output channel 0 spans 40x the median output channel's range",
                "backend: run alone on the backend it keeps 3 dB where its quantization explains 30 dB",
            ],
        }
    )
    culprits = C.read_diagnosis(table)
    assert [c.name for c in culprits] == ["layer3", "layer1", "layer4"]
    changes, notes = C.propose(model, culprits, False, 8, "tf")
    local = [c for c in changes if not c.is_global]
    assert local[0] == C.Change("per_channel", "w3", "layer3", local[0].why)  # weight cause first
    firsts = {c.layer: c.kind for c in reversed(local)}
    assert firsts["layer1"] == "act16"  # activation cause: 16-bit activations first
    assert "layer4" not in {c.layer for c in changes}
    assert any(
        n.startswith("layer4") and "backend" in n and "partitioning.json" in n for n in notes
    )
    assert {c.kind for c in changes if c.is_global} == {
        "per_channel_all",
        "calibration",
        "act16_all",
    }


def test_a_backend_concat_that_kept_its_inputs_encoding_gets_that_encoding_as_candidate(tmp_path):
    """A backend cause naming the tensors to give the Concat's encoding: one candidate, whose
    overrides fix those tensors to the baseline's scale and zero point (typed for onnxruntime's
    quantizer), and whose landing is checked against the Concat's QNN encoding."""
    import onnxruntime.quantization as oq

    from accdbg.engines.quantize import overrides_for_ort

    model = onnx.load(str(planted_chain(tmp_path).path))
    cause = (
        "backend: fed the backend's own inputs ...; 8 of its values are layer2's own integers "
        "(scale 0.008, offset -41) kept in this Concat's encoding (scale 0.0129, offset -71), "
        "not requantized: giving layer1 and layer2 this Concat's encoding avoids it"
    )
    culprits = C.read_diagnosis(
        pd.DataFrame({"Name": ["layer3"], "culprit_rank": [1], "cause": [cause]})
    )
    changes, notes = C.propose(model, culprits, False, 8, "tf")
    local = [c for c in changes if not c.is_global]
    assert local == [C.Change("encoding", "layer1,layer2", "layer3", local[0].why)]
    assert local[0].label == "layer1, layer2: the encoding of layer3"
    assert notes == ["layer3: backend; its candidate: layer1, layer2: the encoding of layer3"]
    st = C.settings(
        local, False, 8, "tf", "QUInt8", {}, encodings={"layer3": (0.0129, 71, "QUInt8")}
    )
    entry = {"scale": 0.0129, "zero_point": 71, "quant_type": "QUInt8"}
    assert st["overrides"] == {"layer1": [entry], "layer2": [entry]}
    assert st["landed"] == [("encoding of layer3", "layer1"), ("encoding of layer3", "layer2")]
    ort_form = overrides_for_ort(st["overrides"])["layer1"][0]
    assert ort_form["quant_type"] == oq.QuantType.QUInt8
    assert ort_form["zero_point"].dtype == np.uint8 and ort_form["zero_point"] == 71
    assert ort_form["scale"].dtype == np.float32 and ort_form["scale"] == np.float32(0.0129)
    # the landing check reads both tensors' encodings in the QNN graph JSON
    from accdbg.algorithms.fixes.measure import _landed

    def tensor(scale, offset):
        return {
            "data_type": 0x0408,
            "quant_params": {"encoding": 0, "scale_offset": {"scale": scale, "offset": offset}},
        }

    tensors = {"layer3_QuantizeLinear_Output": tensor(0.0129, -71)}
    tensors["layer1_QuantizeLinear_Output"] = tensor(0.0129, -71)
    tensors["layer2_QuantizeLinear_Output"] = tensor(0.008, -41)
    assert _landed("encoding of layer3", "layer1", tensors, model)["ok"]
    assert not _landed("encoding of layer3", "layer2", tensors, model)["ok"]


def test_a_16bit_activation_covers_both_sides_of_its_layer(tmp_path):
    model = onnx.load(str(offset_chain(tmp_path).path))
    # Conv_2 -> conv2 -> Relu_2 -> layer2 -> Conv_3 -> conv3 -> Relu_3 -> layer3
    assert C.act16_region(model, "layer2") == ["conv2", "layer2", "conv3", "layer3"]


def test_pareto_front():
    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "ok", "refused by QNN"],
            "cost": [0.0, 0.0, 4.0, 9.0, 1.0],
            "SQNR mean": [10.0, 20.0, 30.0, 25.0, np.nan],
        }
    )
    assert pareto(df).tolist() == [False, True, True, False, False]


def test_bad_diagnosis_and_options_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "summary.csv"
    bad.write_text("Name,SQNR\nlayer0,3\n")
    with pytest.raises(AccdbgError, match="culprit_rank"):
        C.read_diagnosis(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AccdbgError, match="holds no summary.csv"):
        C.read_diagnosis(tmp_path / "empty")
    built = planted_chain(tmp_path)
    code, _, err = run_cli(
        capsys, "--fix_search", "-m", built.path, "-i", "x", "1,3,16,16", built.input_path,
        "--target_gap", "2", "-w", tmp_path / "w",
    )  # fmt: skip
    assert code == 2 and "--target_gap 2" in one_line_error(err)
    tflite = tmp_path / "model.tflite"  # a TFLite flatbuffer's header: -f tflite fits it
    tflite.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(56))
    code, _, err = run_cli(
        capsys, "--fix_search", "-f", "tflite", "-m", tflite, "-i", "x", "1,3,16,16",
        built.input_path, "-w", tmp_path / "w",
    )  # fmt: skip
    assert code == 2 and "-f tflite: give -m the ONNX model oneshot converted" in one_line_error(
        err
    )
    assert not (tmp_path / "w").exists()


def test_a_one_value_output_beside_outputs_of_many_is_not_what_a_candidate_is_scored_on():
    """hand_landmark_lite: a presence logit (one value per input) beside 63 landmarks. The
    logit's error is a signed number: a candidate is scored on the landmarks, and on every
    output only when none has a few values more."""
    from accdbg.algorithms.fixes.measure import output_scores

    rng = np.random.default_rng(0)
    marks = [rng.standard_normal(63) for _ in range(2)]
    refs = [[m, np.array([0.1])] for m in marks]
    outs = [[m + 0.01 * rng.standard_normal(63), np.array([-0.2])] for m in marks]
    noise = np.mean(
        [np.sum((r[0] - o[0]) ** 2) / np.sum(r[0] ** 2) for r, o in zip(refs, outs, strict=True)]
    )
    got = output_scores(refs, outs)
    assert got["SQNR mean"] == pytest.approx(-10 * np.log10(noise), abs=1e-9)
    only_few = output_scores([[r[1]] for r in refs], [[o[1]] for o in outs])
    assert only_few["SQNR mean"] == pytest.approx(-10 * np.log10(9.0), abs=1e-9)  # (0.3/0.1)^2


# ---------------------------------------------------------------- on QNN HTP


@pytest.fixture(scope="module")
def weight_outlier(tmp_path_factory):
    """A dead output channel with 40x weights in layer 3: per-tensor weights crush the rest."""
    tmp = tmp_path_factory.mktemp("weight_outlier")
    built = planted_chain(tmp)
    result = run_fix_search(
        built.path,
        image(built),
        diagnosis=diagnosis("layer3", "weight range: output channel 0 spans 40x the median"),
        working_dir=tmp / "w",
        output_dirname="search",
    )
    return tmp, built, result


def test_weight_outlier_per_channel_is_found_and_verified(weight_outlier):
    _, built, result = weight_outlier
    t = result.candidates
    base = t.iloc[0]
    assert base["change"] == "baseline" and base["status"] == "ok"
    first = t[t["accepted"]].iloc[0]
    assert first["kind"] in ("per_channel", "per_channel_all")
    assert first["SQNR mean"] > base["SQNR mean"] + 10
    assert first["gap closed"] > 0.9
    local = rows(result, "per-channel weights: w3").iloc[0]
    assert local["landed"].startswith("per_channel w3: yes") and local["all landed"]
    # a 16-bit activation cannot cure a weight fault: measured, not accepted
    act = rows(result, "16-bit activation: layer3").iloc[0]
    assert not act["accepted"] and act["SQNR mean"] < base["SQNR mean"] + 1
    assert act["16-bit tensors"] >= 1 and act["Convert ops"] >= 1
    # a calibration's landing: the activation encodings it moved (from the QDQ models)
    adjusted = rows(result, "activation calibration adjusted").iloc[0]["landed"]
    moved = re.fullmatch(
        r"calibration adjusted: (\d+) of (\d+) activation encodings changed", adjusted
    )
    assert moved and 1 <= int(moved[1]) <= int(moved[2])
    assert result.findings[0].startswith("cause: culprit #1 layer3 - weight range")
    assert "before: output SQNR" in result.findings[-1] and "-> after:" in result.findings[-1]


def fix_marks(result) -> tuple[dict, dict]:
    """The fix search's overlays read back strictly: {node: mark text} and the manifest."""
    folder = result.run_dir / "model_explorer"
    manifest = json.loads((folder / me.MANIFEST).read_text())
    files = overlay_files(folder)
    marks = load_overlay(files["marks"]["path"])[manifest["graph"]].results
    return {k: v.value for k, v in marks.items()}, manifest


def test_overlays_mark_what_the_best_fix_changed(weight_outlier):
    """The diagnosis' culprit (layer3, Relu_3's output) ranked in the worst colour; the
    per-channel weights of w3 marked on the Conv using them; a global knob on no node but
    named in overlays.json and on the page."""
    _, built, result = weight_outlier
    marks, manifest = fix_marks(result)
    assert Path(manifest["model"]) == built.path.absolute()
    files = overlay_files(result.run_dir / "model_explorer")
    assert set(files) == {"culprit ranking", "marks"}
    ranking = load_overlay(files["culprit ranking"]["path"])[manifest["graph"]].results
    assert list(ranking) == ["Relu_3"] and ranking["Relu_3"].bgColor == me.WORST
    local = [a for a in result.accepted if a.startswith("per-channel weights: ")]
    glob = [a for a in result.accepted if a not in local]
    assert result.accepted and set(local) <= {"per-channel weights: w3"}
    assert set(marks) == {"Relu_3"} | ({"Conv_3"} if local else set())
    assert marks["Relu_3"].startswith("culprit #1: weight range")
    if local:
        assert "changed by fix: per-channel weights: w3" in marks["Conv_3"]
    assert manifest["notes"] == [f"the best fix changes every layer: {g}" for g in glob]
    html = (result.run_dir / "fixes.html").read_text()
    assert 'href="model_explorer/marks.json"' in html
    assert f"--model_explorer_view {result.run_dir}" in html


def test_a_refused_candidate_is_reported_and_the_search_goes_on(weight_outlier):
    _, _, result = weight_outlier
    t = result.candidates
    refused = rows(result, "16-bit weights: w3").iloc[0]
    assert refused["status"] == "refused by QNN"
    assert "session creation failed" in refused["reason"] and "NHWC" in refused["reason"]
    later = t.index[t.index > refused.name]
    assert (t.loc[later, "status"] == "ok").sum() >= 2  # measured after the refusal
    assert t["accepted"].any()


@pytest.mark.slow  # runs QNN
def test_outputs_are_written_and_the_report_is_offline(weight_outlier, tmp_path):
    _, _, result = weight_outlier
    run = result.run_dir
    for name in (
        "fixes.csv",
        "fixes.html",
        "best.encodings",
        "best_overrides.json",
        "reproduce.txt",
    ):
        assert (run / name).is_file(), name
    assert not (run / "best.onnx").exists()  # no weight changed
    csv = pd.read_csv(run / "fixes.csv")
    assert len(csv) == len(result.candidates) and csv["accepted"].sum() == len(result.accepted)
    assert csv["Pareto"].any()
    html = (run / "fixes.html").read_text()
    assert "Pareto front" in html
    dom, _ = browser.render(run / "fixes.html", tmp_path)  # no network: plotly is embedded
    assert 'class="main-svg"' in dom and "16-bit weights: w3" in dom
    overrides = json.loads((run / "best_overrides.json").read_text())
    assert overrides["TensorQuantOverrides"] or overrides["quantizer"]["per_channel"]
    assert (run / "reproduce.txt").read_text().strip() == result.reproduce


@pytest.mark.slow  # runs QNN
def test_best_encodings_reproduce_the_search_result_exactly(weight_outlier, capsys):
    tmp, built, result = weight_outlier
    engine_run, out = reproduce(result, tmp / "again", capsys)
    ref = float_output(built.path, built.input_path, built.dims)
    assert abs(sqnr(ref, out) - result.best["SQNR mean"]) < 0.1
    best_qdq = result.run_dir / "candidates" / result.best["folder"] / "candidate.qdq.onnx"
    same_encodings(best_qdq, next(engine_run.glob("*.qdq.onnx")))


@pytest.mark.slow  # runs QNN
def test_a_softmax_output_is_judged_at_its_logits(weight_outlier, tmp_path):
    """A saturating score hides what a fix does: the search judges a Softmax output at its
    logits, as the ranking does. The same chain with a Softmax over its last layer scores, at
    baseline and fixed, what the chain without it scores at that layer."""
    _, built, plain = weight_outlier
    model = onnx.load(str(built.path))
    last = model.graph.output[0].name
    model.graph.node.append(helper.make_node("Softmax", [last], ["probs"], axis=1))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, None))
    path = tmp_path / "softmax.onnx"
    onnx.save(model, str(path))
    result = run_fix_search(
        path,
        image(built),
        diagnosis=diagnosis("layer3", "weight range: output channel 0 spans 40x the median"),
        working_dir=tmp_path / "w",
    )
    base, plain_base = result.candidates.iloc[0], plain.candidates.iloc[0]
    assert abs(base["SQNR mean"] - plain_base["SQNR mean"]) < 0.1
    local, plain_local = (
        rows(r, "per-channel weights: w3").iloc[0] for r in (result, plain)
    )  # fmt: skip
    assert abs(local["SQNR mean"] - plain_local["SQNR mean"]) < 0.1
    assert local["SQNR mean"] > base["SQNR mean"] + 10


def test_a_rerun_takes_every_measurement_back_from_the_journal(weight_outlier):
    tmp, built, result = weight_outlier
    again = run_fix_search(
        built.path,
        image(built),
        diagnosis=diagnosis("layer3", "weight range: output channel 0 spans 40x the median"),
        working_dir=tmp / "w",
        output_dirname="search",
    )
    assert again.sessions == 0
    pd.testing.assert_series_equal(again.candidates["SQNR mean"], result.candidates["SQNR mean"])


@pytest.mark.slow  # runs QNN
def test_activation_outlier_16bit_activations_on_that_tensor(tmp_path):
    built = offset_chain(tmp_path)
    kwargs = dict(
        diagnosis=diagnosis("layer2", "activation range: channel 0 carries 300x"),
        working_dir=tmp_path / "w",
        output_dirname="s",
    )
    result = run_fix_search(built.path, image(built), target_gap=0.9, **kwargs)
    t = result.candidates
    base = t.iloc[0]
    first = t[t["accepted"]].iloc[0]
    # the cheapest change meeting the target: 16-bit on that tensor, not on all of them
    assert first["change"] == "16-bit activation: layer2"
    assert first["gap closed"] >= 0.9 and first["SQNR mean"] > base["SQNR mean"] + 10
    assert first["landed"].startswith("act16 layer2: yes") and "UFIXED_POINT_16" in first["landed"]
    # on the graph: the tensors set to 16 bits (layer2, the Conv output folded into it, and
    # the consumer layer's outputs, see act16_region) marked on the nodes producing them
    marks, manifest = fix_marks(result)
    assert set(marks) == {"Conv_2", "Relu_2", "Conv_3", "Relu_3"} and manifest["notes"] == []
    assert all("changed by fix: 16-bit activation: layer2" in m for m in marks.values())
    assert marks["Relu_2"].startswith("culprit #1")
    everything = rows(result, "16-bit activations (all layers)").iloc[0]
    assert first["16-bit tensors"] + first["Convert ops"] < everything["16-bit tensors"]
    # per-channel weights cannot fix an activation range
    assert rows(result, "per-channel weights: w2").iloc[0]["SQNR mean"] < base["SQNR mean"] + 1

    # budgets, decided again on the journaled measurements (no new QNN session)
    no16 = run_fix_search(built.path, image(built), max_16bit_tensors=0, **kwargs)
    assert no16.sessions == 0
    assert (
        not no16.candidates["change"]
        .isin(["16-bit activation: layer2"])[no16.candidates["accepted"]]
        .any()
    )
    assert "over --max_16bit_tensors 0" in rows(no16, "16-bit activation: layer2").iloc[0]["note"]
    spent = run_fix_search(built.path, image(built), time_budget=1e-6, **kwargs)
    assert spent.sessions == 0 and len(spent.candidates) == 1 and not spent.accepted
    assert spent.findings[-1].startswith("no candidate raised the output SQNR")


@pytest.mark.slow  # runs QNN
def test_conv_pair_scaled_channel_equalization_is_found(tmp_path, capsys):
    built = outlier_chain(tmp_path, scale=1 / 40)  # Conv_3's input channel 0 weights x40
    result = run_fix_search(
        built.path,
        image(built),
        diagnosis=diagnosis("layer3", "weight range: input channel 0 spans 40x"),
        working_dir=tmp_path / "w",
        target_gap=0.9,
    )
    t = result.candidates
    first = t[t["accepted"]].iloc[0]
    assert first["change"] == "equalize Conv_2->Conv_3"
    assert first["float change"] <= 1e-4 and first["gap closed"] >= 0.9
    assert first["landed"].startswith("equalized Conv_2->Conv_3: channel scales")
    marks, _ = fix_marks(result)  # both Convs of the pair, the culprit's Relu
    assert set(marks) == {"Conv_2", "Conv_3", "Relu_3"}
    for node in ("Conv_2", "Conv_3"):
        assert marks[node] == "changed by fix: equalize Conv_2->Conv_3"
    # per-channel (output channels) does not reach the scaled input channel
    assert rows(result, "per-channel weights: w3").iloc[0]["gap closed"] < 0.5
    assert (result.run_dir / "best.onnx").is_file()
    assert "best.onnx" in result.reproduce
    ref = float_output(built.path, built.input_path, built.dims)
    _, out = reproduce(result, tmp_path / "again", capsys)
    assert abs(sqnr(ref, out) - result.best["SQNR mean"]) < 0.1


@pytest.mark.slow  # runs QNN
def test_a_crashing_candidate_is_pinned_and_the_search_goes_on(tmp_path, monkeypatch, capsys):
    """The --fix_search component, with the diagnosis as a CSV; the 16-bit-weight candidate
    kills its backend process (SIGSEGV)."""
    monkeypatch.setattr(search, "measure_many", crashers.measure_or_crash)
    built = planted_chain(tmp_path)
    csv = tmp_path / "summary.csv"
    diagnosis("layer3", "weight range: output channel 0 spans 40x").to_csv(csv, index=False)
    code, _, err = run_cli(
        capsys, "--fix_search", "-m", built.path, "-i", "x", "1,3,16,16", built.input_path,
        "--diagnosis", csv, "--target_gap", "0.9", "-w", tmp_path / "w", "--output_dirname", "s",
    )  # fmt: skip
    assert code == 0, err
    table = pd.read_csv(tmp_path / "w" / "fix_search" / "s" / "fixes.csv")
    crashed = table[table["change"] == "16-bit weights: w3"].iloc[0]
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["reason"]
    others = table[table["change"] != "16-bit weights: w3"]
    assert (others["status"] == "ok").all() and others["accepted"].any()


@pytest.mark.slow  # runs QNN
def test_suggest_fixes_chains_the_search_after_oneshot(tmp_path, capsys):
    built = planted_chain(tmp_path)
    code, _, err = run_cli(
        capsys, "-f", "onnx", "-m", built.path, "-i", "x", "1,3,16,16", built.input_path,
        "-w", tmp_path / "w", "--suggest_fixes", "--target_gap", "0.9", "--search_workers", "2",
    )  # fmt: skip
    assert code == 0, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert lines[-4].startswith("reproduce: qnn-accuracy-debugger --inference_engine")
    assert lines[-3].startswith("cause: culprit #1 layer3 - weight range")
    assert lines[-2].startswith("best fix (verified on QNN HTP): per-channel")
    assert lines[-1].startswith("before: output SQNR") and "-> after:" in lines[-1]
    table = pd.read_csv(next((tmp_path / "w" / "fix_search").glob("*/fixes.csv")))
    assert table["accepted"].any()
    # the verification run folder is a diagnosis --fix_search takes
    culprits = C.read_diagnosis(tmp_path / "w" / "verification" / "latest")
    assert culprits[0].name == "layer3" and culprits[0].cause.startswith("weight range")


@pytest.mark.slow
def test_real_model_planted_fault_best_encodings_reproduce(tmp_path, capsys):
    """PP-OCR's direction classifier with one output channel's weights blown up 16x: oneshot
    diagnoses, the search fixes, and ``--inference_engine -qo best.encodings`` gives back the
    reported output SQNR."""
    from benchmarks.zoo.runner import build_cases

    # without the harm gate's QNN runs: this planting is felt at its first strength (28.9 dB)
    cases, dropped = build_cases(["cls/weight_channel/mid"], tmp_path / "zoo", gate=False)
    assert cases, dropped
    case = cases[0]
    fault = json.loads((case.folder / "fault.json").read_text())
    listing = Path(fault["input_list"])
    first = listing.read_text().split()[0]
    code, _, err = run_cli(
        capsys, "-f", "onnx", "-m", case.model_path, "-i", "x", "1,3,48,192", first, "-l", listing,
        "-w", tmp_path / "w", "--suggest_fixes", "--target_gap", "0.8",
    )  # fmt: skip
    assert code == 0, err
    run = next((tmp_path / "w" / "fix_search").glob("2*"))
    best = json.loads((run / "best.json").read_text())
    table = pd.read_csv(run / "fixes.csv")
    base = table.iloc[0]
    assert best["SQNR mean"] > base["SQNR mean"] + 10 and best["gap closed"] >= 0.8
    assert base["top-1 agreement"] < 1 and best["top-1 agreement"] == 1  # a 2-class output
    argv = shlex.split((run / "reproduce.txt").read_text())
    code, _, err = run_cli(capsys, *argv[1:], "-w", tmp_path / "again")
    assert code == 0, err
    # the classifier's output is a Softmax: the search, as the ranking, judges it at its logits
    float_model = onnx.load(str(case.model_path))
    (softmax,) = [n for n in float_model.graph.node if n.op_type == "Softmax"]
    logits = softmax.input[0]
    assert f"--add_layer_outputs {logits}" in " ".join(argv)
    float_model.graph.output.append(onnx.ValueInfoProto(name=logits))
    sess = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    engine = (tmp_path / "again" / "inference_engine" / "latest").resolve()
    nsr = []
    for i, line in enumerate(listing.read_text().split()):
        x = np.fromfile(line, np.float32).reshape(1, 3, 48, 192)
        (ref,) = sess.run([logits], {"x": x})
        res = engine / "output" / f"Result_{i}"
        (rec,) = [
            r for r in json.loads((res / "tensors.json").read_text())["tensors"]
            if r["name"] == logits
        ]  # fmt: skip
        out = np.fromfile(res / rec["file"], np.float32).reshape(ref.shape)
        nsr.append(np.sum((out - ref) ** 2) / np.sum(ref**2))
    assert abs(-10 * math.log10(np.mean(nsr)) - best["SQNR mean"]) < 0.1


@pytest.mark.slow  # runs QNN
def test_a_killed_search_resumes_where_it_stopped(tmp_path):
    """SIGTERM mid-search stops it cleanly; the same command with the same --output_dirname
    measures only what the journal does not hold."""
    import os
    import signal
    import time

    built = planted_chain(tmp_path)
    csv = tmp_path / "summary.csv"
    diagnosis("layer3", "weight range: output channel 0 spans 40x").to_csv(csv, index=False)
    cmd = [
        sys.executable, "-m", "accdbg.cli.main", "--fix_search", "-m", str(built.path),
        "-i", "x", "1,3,16,16", str(built.input_path), "--diagnosis", str(csv),
        "-w", str(tmp_path / "w"), "--output_dirname", "r", "--search_workers", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACCDBG_NO_PROGRESS": "1"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    journal = tmp_path / "w" / "fix_search" / ".r.partial" / "progress.jsonl"
    deadline = time.monotonic() + 300
    while not (journal.exists() and journal.read_text().strip()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    done_before = len(journal.read_text().splitlines())
    proc.send_signal(signal.SIGTERM)
    t = time.monotonic()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert time.monotonic() - t < 30  # the measuring children were stopped, not waited for
    assert (tmp_path / "w" / "fix_search" / "r.failed").is_dir()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    sessions = int(re.search(r"fix search: (\d+) QNN session", again.stderr)[1])
    table = pd.read_csv(tmp_path / "w" / "fix_search" / "r" / "fixes.csv")
    assert 1 <= sessions <= len(table) - done_before
    assert table["accepted"].any()
