"""Binary snooping on the real QNN HTP backend: a Conv chain with one planted layer, the
halving derived by hand, the partly quantized models checked on onnxruntime's CPU, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest

from accdbg.algorithms.binary import run_binary
from accdbg.algorithms.checkpoint import JOURNAL
from accdbg.algorithms.fragments import QdqModel
from accdbg.algorithms.mixed import FloatModel, op_list, partly_quantized
from accdbg.core.inputs import parse_input_tensor
from accdbg.engines import run_inference_engine
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.reports import model_explorer as me
from tests import models
from tests.helpers import one_line_error, run_cli
from tests.test_model_explorer import load_overlay, overlay_files, producers_by_onnx

LAYERS, BAD = 8, 5  # layer5 is planted: its op is the 6th of 8 (Conv+Relu fuse into one op)


def chain(tmp: Path, built: models.Built | None = None) -> SimpleNamespace:
    built = built or models.planted_chain(tmp, layers=LAYERS, bad=BAD)
    inputs = [parse_input_tensor(["x", ",".join(map(str, built.dims)), str(built.input_path)])]
    golden = run_framework_diagnosis("onnx", built.path, inputs, working_dir=tmp / "w").run_dir
    engine = run_inference_engine(built.path, input_tensors=inputs, working_dir=tmp / "w")
    return SimpleNamespace(
        built=built,
        inputs=inputs,
        golden=golden,
        engine=engine,
        tmp=tmp,
        planted=built.expected.get("planted"),
    )


def search(m: SimpleNamespace):
    """Binary snooping of the chain's engine run, down to single ops, into ``w/.../run``."""
    return run_binary(
        m.built.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        min_graph_size=1,
        working_dir=m.tmp / "w",
        output_dirname="run",
    )


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    m = chain(tmp_path_factory.mktemp("binary"))
    m.result = search(m)
    return m


def halving(n: int, bad: int, min_size: int) -> list[tuple[int, int]]:
    """The ranges a search with one culprit op scores, by hand: the whole list, then both
    halves of every range holding the culprit, down to ``min_size``."""
    out, first, last = [(0, n)], 0, n
    while last - first > min_size:
        mid = first + (last - first) // 2
        out += [(first, mid), (mid, last)]
        first, last = (first, mid) if bad < mid else (mid, last)
    return out


def test_the_search_halves_down_to_the_planted_layer(planted):
    r = planted.result
    subs = r.subgraphs
    scored = list(zip(subs["First op"], subs["Last op"] + 1, strict=True))
    assert scored == halving(LAYERS, BAD, 1)
    assert r.sessions == len(scored) == 7  # one QNN session per model: 2*log2(8) + 1
    # the search ends on the planted layer, alone, ranked first; nothing else is ranked
    ranked = r.report.dropna(subset=["culprit_rank"])
    assert list(ranked["O/P Name"]) == [planted.planted]
    assert int(ranked["culprit_rank"].iloc[0]) == 1
    leaf = subs[subs["culprit_rank"].notna()]
    assert len(leaf) == 1 and leaf["Ops"].iloc[0] == 1 and leaf["First op"].iloc[0] == BAD
    assert r.findings[0].startswith(f"culprit #1: {planted.planted} (Conv)")
    assert "QNN session" in r.findings[-1]
    # each pair of halves: relative weights are shares of their sum; the half holding the
    # planted op is searched, its sibling dropped
    for _, group in subs[subs["Parent"].notna()].groupby("Parent"):
        assert group["Relative weight"].sum() == pytest.approx(1.0)
        assert group["Relative weight"].tolist() == pytest.approx(
            (group["Score"] / group["Score"].sum()).tolist()
        )
        holds = (group["First op"] <= BAD) & (BAD <= group["Last op"])
        assert set(group.loc[holds, "Decision"]) <= {"split", "leaf"}  # searched further
        assert set(group.loc[~holds, "Decision"]) == {"dropped"}
    # the planted op alone carries most of the whole model's error (output MSE)
    whole = subs.iloc[0]["Score"]
    assert leaf["Score"].iloc[0] > 0.5 * whole


def test_reports_json_csv_html(planted):
    r = planted.result
    data = json.loads(r.json.read_text())
    assert [s["Subgraph"] for s in data["subgraphs"]] == list(r.subgraphs["Subgraph"])
    assert data["sessions"] == r.sessions and data["verifier"] == "MSE"
    assert len(data["iterations"]) == 3  # 8 -> 4 -> 2 -> 1 ops
    csv = pd.read_csv(r.csv)
    assert "culprit_rank" in csv.columns and "cause" in csv.columns
    layers = pd.read_csv(r.run_dir / "binary_snooping_layers.csv")
    assert list(layers["O/P Name"]) == [f"layer{i}" for i in range(LAYERS)]
    html = r.html.read_text()
    assert "culprit #1: " + planted.planted in html and "<script src=" not in html


def test_overlays_rank_and_mark_the_planted_layer(planted):
    """Model Explorer overlays on the float model: the planted layer (the one-op leaf the
    search ended on) is culprit #1 in the worst colour and marked; the page links them."""
    r = planted.result
    folder = r.run_dir / "model_explorer"
    files = overlay_files(folder)
    assert set(files) == {"culprit ranking", "marks"}
    manifest = json.loads((folder / me.MANIFEST).read_text())
    assert Path(manifest["model"]) == planted.built.path.absolute()
    node = producers_by_onnx(planted.built.path)[planted.planted]
    ranking = load_overlay(files["culprit ranking"]["path"])[manifest["graph"]].results
    assert len(ranking) == LAYERS  # every layer of the table on its node
    assert [k for k, v in ranking.items() if v.bgColor == me.WORST] == [node]
    assert ranking[node].value.startswith("#1: quantizing only these 1 op(s)")
    marks = load_overlay(files["marks"]["path"])[manifest["graph"]].results
    assert list(marks) == [node] and marks[node].bgColor == me.WORST
    assert "culprit #1" in marks[node].value
    assert f"search ended here: subgraph {int(r.subgraphs.iloc[-1]['Subgraph'])}" in (
        marks[node].value
    )
    html = r.html.read_text()
    assert 'href="model_explorer/marks.json"' in html
    assert f"--model_explorer_view {r.run_dir}" in html


def test_partly_quantized_models_on_cpu(planted):
    """Independent check of the half models: nothing quantized computes the float model,
    everything quantized the QDQ model, on onnxruntime's CPU."""
    qdq = QdqModel.load(planted.engine.qdq_model)
    prepared = planted.engine.qdq_model.with_name("planted.prepared.onnx")
    fm = FloatModel(onnx.load(str(prepared)))
    x = np.fromfile(planted.built.input_path, np.float32).reshape(planted.built.dims)
    out = qdq.graph_outputs[0]

    def cpu(model) -> np.ndarray:
        return ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        ).run([out], {"x": x})[0]

    float_out = ort.InferenceSession(str(planted.built.path)).run(None, {"x": x})[0]
    none, notes = partly_quantized(qdq, set(), fm)
    assert not notes
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in none.graph.node)
    np.testing.assert_allclose(cpu(none), float_out, rtol=1e-5, atol=1e-5)
    every, _ = partly_quantized(qdq, set(op_list(qdq)), fm)
    np.testing.assert_array_equal(cpu(every), cpu(qdq.model))
    # only the planted op quantized: its error dominates, the float ops around it add none
    alone, _ = partly_quantized(qdq, {op_list(qdq)[BAD]}, fm)
    err_alone = float(np.mean((cpu(alone) - float_out) ** 2))
    err_all = float(np.mean((cpu(qdq.model) - float_out) ** 2))
    assert err_alone > 0.5 * err_all


@pytest.mark.slow  # runs QNN
def test_a_softmax_output_is_scored_at_its_logits(planted, tmp_path):
    """A saturating output hides the error a half brings: the chain with a Softmax over its
    last layer is scored where the chain without it is, at that layer - every subgraph's score
    is the plain chain's, and the search takes the same path to the planted layer."""
    model = onnx.load(str(planted.built.path))
    last = model.graph.output[0].name
    model.graph.node.append(onnx.helper.make_node("Softmax", [last], ["probs"], axis=1))
    del model.graph.output[:]
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, None)
    )
    path = tmp_path / "softmax.onnx"
    onnx.save(model, str(path))
    m = SimpleNamespace(**vars(planted))
    m.built = SimpleNamespace(**vars(planted.built))
    m.built.path, m.tmp = path, tmp_path
    m.golden = run_framework_diagnosis("onnx", path, m.inputs, working_dir=tmp_path / "w").run_dir
    m.engine = run_inference_engine(path, input_tensors=m.inputs, working_dir=tmp_path / "w")
    r, plain = search(m), planted.result.subgraphs
    subs = r.subgraphs.set_index(["First op", "Last op"])["Score"]
    # one op more (the Softmax): the whole model and the ranges both op lists share score the same
    same = plain.set_index(["First op", "Last op"])["Score"]
    shared = [(0, LAYERS - 1), *(k for k in same.index if k in subs.index and k != (0, LAYERS - 1))]
    assert subs.index[0] == (0, LAYERS)
    assert [subs.iloc[0], *(subs[k] for k in shared[1:])] == pytest.approx(
        [same[k] for k in shared], rel=0.01
    )
    assert len(shared) >= 4  # the planted op alone among them
    assert list(r.report.dropna(subset=["culprit_rank"])["O/P Name"]) == [planted.planted]
    assert json.loads(r.json.read_text())["judged"] == {"probs": last}


@pytest.mark.slow  # runs QNN
def test_a_model_without_a_bad_part_has_no_culprit(tmp_path):
    """Halving goes on down a diffuse error too; a part is named only when quantizing it alone
    costs half of the whole model's error, so a clean chain ends with no culprit and says so."""
    built = models.outlier_chain(tmp_path, layers=4)
    m = chain(tmp_path, built)
    r = search(m)
    subs = r.subgraphs
    leaves = subs[subs["Decision"] == "leaf"]
    assert len(leaves) and (leaves["Score"] < 0.5 * subs["Score"].iloc[0]).all()
    assert r.report["culprit_rank"].isna().all() and subs["culprit_rank"].isna().all()
    assert r.findings[0].startswith("no part of the model stands out")


@pytest.mark.slow  # runs QNN
def test_resume_scores_only_what_the_journal_lacks(planted):
    r = planted.result
    journal = r.run_dir / JOURNAL
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    kept = [rec for rec in records if rec["kind"] != "done"][:-2]  # as if killed: 2 models lost
    journal.write_text("".join(json.dumps(rec) + "\n" for rec in kept))
    again = search(planted)
    assert again.new_sessions == 2
    assert again.subgraphs["Score"].tolist() == pytest.approx(
        r.subgraphs["Score"].tolist(), rel=1e-6
    )
    assert list(again.report["culprit_rank"].fillna(0)) == list(r.report["culprit_rank"].fillna(0))


@pytest.mark.slow  # runs QNN
def test_min_graph_size_and_sqnr_through_the_cli(planted, capsys):
    code, _, err = run_cli(
        capsys,
        "-f",
        "onnx",
        "-m",
        planted.built.path,
        "-i",
        "x",
        ",".join(map(str, planted.built.dims)),
        planted.built.input_path,
        "--golden_output_reference_directory",
        planted.golden,
        "--debugging_algorithm",
        "binary",
        "--verifier",
        "sqnr",
        "--min_graph_size",
        "2",
        "-w",
        planted.tmp / "cli",
    )
    assert code == 0, err
    assert "report: " in err and "binary_snooping.html" in err.strip().splitlines()[-1]
    csv = pd.read_csv(
        next((planted.tmp / "cli" / "binary_snooping").glob("2*/binary_snooping.csv"))
    )
    assert list(zip(csv["First op"], csv["Last op"] + 1, strict=True)) == halving(LAYERS, BAD, 2)
    top = csv[csv["culprit_rank"] == 1]
    assert int(top["First op"].iloc[0]) <= BAD <= int(top["Last op"].iloc[0])
    assert "SQNR" in csv.columns and math.isfinite(float(top["SQNR"].iloc[0]))
    # inside the 2-op leaf, the layers are ordered by what their own encodings destroy: the
    # planted layer's per-tensor weight grid is spent on one dead channel
    layers = pd.read_csv(
        next((planted.tmp / "cli" / "binary_snooping").glob("2*/binary_snooping_layers.csv"))
    )
    ranked = layers.dropna(subset=["culprit_rank"]).sort_values("culprit_rank")
    assert list(ranked["O/P Name"]) == [planted.planted, f"layer{BAD - 1}"]
    assert "local SQNR" in ranked["cause"].iloc[0]
    # both layers of the 2-op leaf are marked as where the search ended
    folder = next((planted.tmp / "cli" / "binary_snooping").glob("2*/model_explorer"))
    graph = json.loads((folder / me.MANIFEST).read_text())["graph"]
    marks = load_overlay(folder / "marks.json")[graph].results
    by_onnx = producers_by_onnx(planted.built.path)
    ended = {k for k, v in marks.items() if "search ended here" in v.value}
    assert ended == {by_onnx[planted.planted], by_onnx[f"layer{BAD - 1}"]}


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--verifier", "cos"], "--verifier 'cos'"),
        (["--min_graph_size", "0"], "--min_graph_size 0"),
        (["--subgraph_relative_weight", "1.5"], "--subgraph_relative_weight 1.5"),
        (["--start_layer", "layer1"], "--start_layer/--end_layer"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, flags, expected):
    built = models.planted_chain(tmp_path, layers=2, bad=1)
    code, _, err = run_cli(
        capsys,
        *built.flags(),
        "--debugging_algorithm",
        "binary",
        *flags,
        "-w",
        tmp_path / "w",
    )
    assert code == 2
    assert expected in one_line_error(err)
    assert not (tmp_path / "w").exists()


def test_an_fp16_overflow_of_the_float_part_is_told_apart():
    """magika: a quantized LayerNorm variance rounded to 0 makes the fp16 float part's Rsqrt
    overflow (its outputs at fp16's 65504): that score is fp16's, and the cause says so."""
    from accdbg.algorithms.binary import _times, fp16_overflowed

    golden = [np.array([1.0, -3.0, 2.5])]
    assert fp16_overflowed(golden, [np.array([1.0, 65504.0, 2.5])])
    assert fp16_overflowed(golden, [np.array([1.0, np.inf, 2.5])])
    assert fp16_overflowed(golden, [np.array([np.nan, -3.0, 2.5])])
    assert not fp16_overflowed(golden, [np.array([1.5, -2.0, 3.0])])  # an error, no overflow
    big = [np.array([60000.0, 1.0])]  # float itself near the limit: no telling
    assert not fp16_overflowed(big, [np.array([65504.0, 1.0])])
    # over the whole error: said in dB, never a percentage over 100 (10 log10 1.2776e12)
    assert _times(0.57) == "57% of" and _times(1.2776e12) == "all (+121.1 dB) of"
