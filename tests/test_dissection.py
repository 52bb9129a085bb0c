"""Model dissection (deep analyzer) on the real QNN HTP backend: a Conv chain with one planted
layer, dissected back from a later tensor; the cuts derived by hand, scores recomputed with
numpy from the dumped tensors; the wrapper and standalone CLI forms, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accdbg.algorithms.dissection import run_dissection
from accdbg.core.tensor_store import TensorFolder
from accdbg.reports import model_explorer as me
from tests import models
from tests.helpers import one_line_error, run_cli
from tests.test_binary import chain
from tests.test_layerwise import cosine
from tests.test_model_explorer import load_overlay, overlay_files, producers_by_onnx

LAYERS, BAD = 8, 5
PROBLEM = "layer7"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    m = chain(tmp_path_factory.mktemp("dissection"))
    m.result = run_dissection(
        m.engine.qdq_model,
        m.golden,
        problem_inference_tensor=PROBLEM,
        working_dir=m.tmp / "w",
    )
    return m


def test_dissection_walks_back_the_chain_and_ends_on_the_planted_layer(planted):
    r = planted.result
    s = r.summary
    # iteration k feeds layer(7-k) golden: the chain, by hand; 7 iterations by default
    assert list(s["Iteration"]) == list(range(1, 8))
    assert [json.loads(x) for x in s["Inputs"]] == [[f"layer{PROBLEM_I - k}"] for k in range(1, 8)]
    assert list(s["Nodes"]) == list(range(1, 8))
    assert [json.loads(x) for x in s["Added nodes"]] == [
        [f"layer{PROBLEM_I + 1 - k}"] for k in range(1, 8)
    ]
    assert r.suspects[0] == planted.planted == f"layer{BAD}"
    assert r.findings[0].startswith(f"culprit #1: layer{BAD} (Conv)")
    ranked = r.report.dropna(subset=["culprit_rank"])
    assert ranked.iloc[0]["O/P Name"] == f"layer{BAD}" and int(ranked.iloc[0]["culprit_rank"]) == 1
    assert r.sessions == 1  # every iteration's sub-model in one QNN session
    # before the planted layer joins, layer7 is near-perfect; from then on it is not
    before = s[s["Iteration"] < PROBLEM_I - BAD + 1]
    after = s[s["Iteration"] >= PROBLEM_I - BAD + 1]
    assert (before["CosineSimilarity"] > 0.999).all() and (after["CosineSimilarity"] < 0.99).all()


PROBLEM_I = 7


def test_scores_follow_from_each_iterations_dump(planted):
    """Each iteration's verification is written; its cosine and SQNR recomputed with numpy."""
    r = planted.result
    golden = np.asarray(TensorFolder(planted.golden).load(PROBLEM), np.float64)
    for _, row in r.summary.iterrows():
        folder = r.run_dir / f"iteration_{int(row['Iteration']):02d}"
        target = np.asarray(TensorFolder(folder).load(PROBLEM), np.float64)
        assert row["CosineSimilarity"] == pytest.approx(cosine(golden, target), abs=1e-9)
        noise = np.sum((golden - target) ** 2)
        assert row["SQNR"] == pytest.approx(10 * np.log10(np.sum(golden**2) / noise), abs=1e-6)
        assert row["Error (NSR)"] == pytest.approx(noise / np.sum(golden**2), rel=1e-6)
        one = pd.read_csv(folder / "summary.csv", keep_default_na=False)
        assert one["Name"].tolist() == [PROBLEM]
        assert one["Status"].tolist() == ["fail" if row["CosineSimilarity"] < 0.99 else "ok"]
        assert json.loads(one["Golden inputs"].iloc[0]) == json.loads(row["Inputs"])
    assert (r.run_dir / "dissection_summary.html").is_file()
    csv = pd.read_csv(r.csv)
    assert {"Inputs", "Outputs", "SQNR", "culprit_rank", "cause"} <= set(csv.columns)


def test_overlays_on_the_engines_float_model_put_the_planted_layer_worst(planted):
    """dissection_nodes.csv on the float model the engine run started from: each node's
    added error, the planted layer ranked #1 in the worst colour, the problem tensor marked."""
    r = planted.result
    folder = r.run_dir / "model_explorer"
    manifest = json.loads((folder / me.MANIFEST).read_text())
    assert Path(manifest["model"]) == planted.built.path.absolute()
    files = overlay_files(folder)
    assert set(files) == {"Error added", "culprit ranking", "marks"}
    graph = manifest["graph"]
    by_onnx = producers_by_onnx(planted.built.path)
    err = load_overlay(files["Error added"]["path"])[graph]
    for name, value in zip(r.report["O/P Name"], r.report["Error added"], strict=True):
        assert err.results[by_onnx[name]].value == pytest.approx(value), name
    planted_node = by_onnx[planted.planted]
    # the added error is an error (lower is better): the planted layer's is the largest, at
    # the gradient's worst end, the worst colour the ranking gives culprit #1
    assert max(err.results, key=lambda k: err.results[k].value) == planted_node
    worst = next(g.bgColor for g in err.gradient if g.stop == 1)
    ranking = load_overlay(files["culprit ranking"]["path"])[graph].results
    assert ranking[planted_node].bgColor == worst == me.WORST
    assert ranking[planted_node].value.startswith("#1: joined the sub-model")
    marks = load_overlay(files["marks"]["path"])[graph].results
    assert marks[by_onnx[PROBLEM]].value.startswith("problem tensor: dissected back from")
    assert marks[planted_node].value.startswith("culprit #1")
    html = r.html.read_text()
    assert 'href="model_explorer/Error_added.json"' in html and "--model_explorer_view" in html


@pytest.mark.slow  # runs QNN
def test_partition_override_and_auto_stop(planted):
    r = run_dissection(
        planted.engine.qdq_model,
        planted.golden,
        problem_inference_tensor=PROBLEM,
        partition_override=json.dumps([["layer4"], ["layer1"]]),
        working_dir=planted.tmp / "w",
    )
    assert [json.loads(x) for x in r.summary["Inputs"]] == [["layer4"], ["layer1"]]
    assert list(r.summary["Nodes"]) == [3, 6]
    assert r.suspects[0] == f"layer{BAD}"
    # after the planted layer joins (iteration 3) the score barely moves: two still
    # iterations stop the search at iteration 5
    auto = run_dissection(
        planted.engine.qdq_model,
        planted.golden,
        problem_inference_tensor=PROBLEM,
        auto_stop_iterations=2,
        working_dir=planted.tmp / "w",
    )
    err = list(planted.result.summary["Error (NSR)"])
    still, stop = 0, len(err)
    for k in range(1, len(err)):
        still = still + 1 if abs(err[k] - err[k - 1]) <= 0.01 * abs(err[k - 1]) else 0
        if still >= 2:
            stop = k + 1
            break
    assert len(auto.summary) == stop < len(err)


@pytest.mark.slow  # runs QNN
def test_wrapper_runs_it_after_oneshot_and_standalone_reuses_the_runs(planted, capsys):
    w = planted.tmp / "cli"
    built = planted.built
    code, _, err = run_cli(
        capsys,
        *built.flags(),
        "--deep_analyzer",
        "modelDissectionAnalyzer",
        "-w",
        w,
    )
    assert code == 0, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("report: ") and lines[-1].endswith("dissection_summary.html")
    assert "nodes that may be sources of error: layer5" in err
    # the problem tensor is the first failing one of the oneshot verification
    ver = pd.read_csv(next((w / "verification").glob("2*/summary.csv")), keep_default_na=False)
    first = ver.loc[ver["Status"].str.startswith("fail"), "Name"].iloc[0]
    opts = json.loads(next((w / "deep_analyzer").glob("2*/deep_analyzer_options.json")).read_text())
    assert opts["problem_inference_tensor"] == first
    assert next((w / "deep_analyzer").glob("2*/model_explorer/overlays.json")).is_file()
    code, _, err = run_cli(
        capsys,
        "--deep_analyzer",
        "modelDissectionAnalyzer",
        "--framework_results",
        w / "framework_diagnosis" / "latest",
        "--inference_results",
        w / "inference_engine" / "latest",
        "--problem_inference_tensor",
        PROBLEM,
        "--maximum_dissection_iterations",
        "3",
        "-w",
        w,
        "--output_dirname",
        "alone",
        "--no_model_explorer",
    )
    assert code == 0, err
    assert not (w / "deep_analyzer" / "alone" / "model_explorer").exists()
    summary = pd.read_csv(w / "deep_analyzer" / "alone" / "dissection_summary.csv")
    assert len(summary) == 3 and int(summary["culprit_rank"].min()) == 1
    assert summary.loc[summary["culprit_rank"] == 1, "Iteration"].item() == 3


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--maximum_dissection_iterations", "0"], "--maximum_dissection_iterations 0"),
        (["--auto_stop_iterations", "-1"], "--auto_stop_iterations -1"),
        (["--partition_override", "[1, 2]"], "--partition_override"),
        (["--partition_override", "{not json"], "--partition_override"),
        (["--partition_override", '[["nosuch"]]'], "'nosuch' is not a tensor"),
        (["--problem_inference_tensor", "layerX"], "--problem_inference_tensor 'layerX'"),
    ],
)
def test_bad_flags_are_one_line_errors(planted, capsys, flags, expected):
    w = planted.tmp / "bad"
    code, _, err = run_cli(
        capsys,
        "--deep_analyzer",
        "modelDissectionAnalyzer",
        "--framework_results",
        planted.golden,
        "--inference_results",
        planted.engine.run_dir,
        "--problem_inference_tensor",
        PROBLEM,
        *flags,
        "-w",
        w,
    )
    assert code == 2
    assert expected in one_line_error(err)
    assert not (w / "deep_analyzer").exists()


def test_no_failing_tensor_is_an_error(planted, tmp_path, capsys):
    ver = tmp_path / "ver"
    ver.mkdir()
    pd.DataFrame({"Name": ["layer0", "layer1"], "Status": ["ok", "ok"]}).to_csv(ver / "summary.csv")
    code, _, err = run_cli(
        capsys,
        "--deep_analyzer",
        "modelDissectionAnalyzer",
        "--framework_results",
        planted.golden,
        "--inference_results",
        planted.engine.run_dir,
        "--verification_results",
        ver,
        "-w",
        tmp_path / "w",
    )
    assert code == 2 and "no tensor fails" in one_line_error(err)


@pytest.mark.slow  # runs QNN
def test_first_failing_tensor_of_a_verification_is_the_problem(planted, tmp_path):
    ver = tmp_path / "ver"
    ver.mkdir()
    pd.DataFrame({"Name": ["layer5", "layer6", "layer7"], "Status": ["ok", "fail", "fail"]}).to_csv(
        ver / "summary.csv"
    )
    r = run_dissection(
        planted.engine.qdq_model,
        planted.golden,
        verification_dir=ver,
        maximum_dissection_iterations=2,
        working_dir=tmp_path / "w",
    )
    assert r.problem_tensor == "layer6"
    assert [json.loads(x) for x in r.summary["Inputs"]] == [["layer5"], ["layer4"]]


def test_chain_model_builder_is_what_the_tests_assume(tmp_path):
    built = models.planted_chain(tmp_path, layers=LAYERS, bad=BAD)
    assert built.expected["planted"] == f"layer{BAD}"
