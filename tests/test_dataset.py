"""Dataset mode: many inputs streamed through golden and QNN, scored, dropped.

The QNN tests run the bundled example (tiny_cnn) on four inputs made from its image (a flip,
noise, a gain) with the in-process ``serial`` executor, and compare with what the normal
oneshot writes for the same input list, and with numpy on the tensors the run kept.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import numpy_helper

from accdbg.algorithms.dataset import AUTO_THRESHOLD, run_dataset, wants_dataset_mode
from accdbg.algorithms.dataset import worker as dataset_worker
from accdbg.algorithms.dataset.keep import KeepSet, rank_key
from accdbg.algorithms.dataset.stats import BINS, RunningStats, encoding_edges, partial
from accdbg.cli.main import main
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "tiny_cnn" / "model.onnx"
IMAGE = REPO / "examples" / "tiny_cnn" / "input.raw"
SHAPE = (1, 3, 32, 32)
SERIAL = ExecutorConfig(name="serial")


def _inputs(folder: Path, n: int = 4) -> Path:
    """``n`` inputs made from the example's image, and their input list."""
    x = np.fromfile(IMAGE, np.float32).reshape(SHAPE)
    rng = np.random.default_rng(7)
    variants = [
        x,
        x[..., ::-1],
        x + rng.normal(0, 0.3, SHAPE),
        x * 1.6,
        x[..., ::-1, :],
        x * 0.5,
    ]
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        path = folder / f"in{i}.raw"
        np.ascontiguousarray(variants[i % len(variants)], dtype=np.float32).tofile(path)
        lines.append(str(path))
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    return folder / "list.txt"


def _image_tensor():
    return parse_input_tensor(["image", "1,3,32,32", str(IMAGE)])


def _on_example(run, lst, root: Path, **kwargs):
    """``run`` (oneshot or dataset mode) on the bundled example over ``lst``, on QNN HTP."""
    return run(
        "onnx",
        MODEL,
        [_image_tensor()],
        input_list=lst,
        engine_kwargs={"runtime": "htp"},
        working_dir=root / "wd",
        **kwargs,
    )


def _run(lst, root: Path, **kwargs):
    """Dataset mode on the bundled example (serial executor unless told)."""
    return _on_example(run_dataset, lst, root, **{"executor": SERIAL, "keep_worst": 2, **kwargs})


# ---------------------------------------------------------------- statistics, no backend


def test_running_stats_are_exact_and_the_same_in_any_order():
    """Merged in three different orders, the layer table is the same bytes; its mean, std and
    extremes are numpy's over all inputs' errors, and the clipped share is the count of golden
    values outside the encoding range (half a step beyond each end) over all values."""
    rng = np.random.default_rng(3)
    scale, zp, dtype = 0.01, 128, "uint8"
    lo, hi = (0 - zp) * scale - scale / 2, (255 - zp) * scale + scale / 2
    edges = [encoding_edges(scale, zp, dtype), None]
    goldens, targets, parts = [], [], []
    for _ in range(7):
        g = rng.normal(0, 0.8, 500) * rng.uniform(0.5, 2)
        t = g + rng.normal(0, 0.01, 500)
        goldens.append(g)
        targets.append(t)
        rows, hists = zip(partial(g, t, edges[0]), partial(g * 2, t * 2, None), strict=True)
        parts.append((np.vstack(rows), np.vstack(hists)))
    tables = []
    for seed in (0, 1, 2):
        order = list(range(len(parts)))
        random.Random(seed).shuffle(order)
        stats = RunningStats(["a", "b"])
        for i in order:
            stats.add(*parts[i])
        tables.append(stats.table(edges))
    assert tables[0].to_csv() == tables[1].to_csv() == tables[2].to_csv()
    row = tables[0].iloc[0]
    err = np.concatenate(targets) - np.concatenate(goldens)
    g_all = np.concatenate(goldens)
    assert row["elements"] == err.size and row["inputs"] == 7
    assert row["error_mean"] == pytest.approx(err.mean(), rel=1e-12, abs=1e-15)
    assert row["error_std"] == pytest.approx(err.std(), rel=1e-9)
    assert row["golden_min"] == g_all.min() and row["golden_max"] == g_all.max()
    clipped = 100 * ((g_all < lo) | (g_all > hi)).sum() / g_all.size
    assert clipped > 0  # the data was made to spill over the range
    assert row["clipped_%"] == pytest.approx(clipped)
    assert len(row["histogram"].split()) == BINS + 2
    assert math.isnan(tables[0].iloc[1].get("clipped_%", math.nan))  # no encoding, no histogram


def test_keep_set_ends_with_exactly_the_k_worst_whatever_the_arrival_order(tmp_path):
    """Items are told the K-th worst known when sent and arrive later, out of order; each
    writes a folder when the worker's rule says so. At the end exactly the K worst (plus the
    named input) have folders, and at no time more than K + in flight + named."""
    rng = random.Random(5)
    n, k, in_flight = 30, 3, 4
    badness = [rng.uniform(0, 10) for _ in range(n)]
    badness[7] = badness[11]  # a tie: the earlier line ranks first

    def folders(i):
        return [tmp_path / f"Result_{i}"]

    keep = KeepSet(k, [20], folders)
    pending: list[tuple[int, dict]] = []
    order = list(range(n))
    rng.shuffle(order)
    most = 0
    for i in order + [None] * in_flight:
        if i is not None:
            pending.append((i, keep.item_fields(i)))
        if len(pending) >= in_flight or (i is None and pending):
            j, fields = pending.pop(rng.randrange(len(pending)))
            item = {"index": j, **fields}
            kept = dataset_worker.DatasetWorker._may_keep(item, badness[j])
            if kept:
                (tmp_path / f"Result_{j}").mkdir()
            keep.add(j, badness[j], kept)
            most = max(most, len(list(tmp_path.iterdir())))
    worst = sorted(range(n), key=lambda i: rank_key(badness[i], i))[:k]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"Result_{i}" for i in {*worst, 20})
    assert most <= k + in_flight + 1


def test_auto_threshold(tmp_path):
    """Dataset mode is automatic above AUTO_THRESHOLD lines, not at it."""
    raw = tmp_path / "x.raw"
    raw.write_bytes(b"\0" * 4)
    (tmp_path / "few.txt").write_text(f"{raw}\n" * AUTO_THRESHOLD)
    (tmp_path / "many.txt").write_text(f"{raw}\n" * (AUTO_THRESHOLD + 1))
    assert not wants_dataset_mode(tmp_path / "few.txt", False)
    assert wants_dataset_mode(tmp_path / "many.txt", False)
    assert wants_dataset_mode(tmp_path / "few.txt", True)
    assert not wants_dataset_mode(None, False)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--dataset_mode", "--keep_worst", "-1"], "--keep_worst -1: expected 0 or a positive"),
        (["--dataset_mode", "--keep_input", "9"], "--keep_input 9: expected an input-list line"),
        (["--dataset_mode", "--keep_input", "0"], "--keep_input 0: expected an input-list line"),
        (["--dataset_mode", "--workers", "0"], "--workers 0: expected at least 1"),
        (["--dataset_mode", "--executor", "nope"], "--executor"),
        (["--dataset_mode", "--ray_address", "h:1"], "--ray_address is for --executor ray"),
        (["--keep_worst", "3"], "--keep_worst applies in dataset mode"),
        (["--dataset_mode", "--enable_tensor_inspection"], "--enable_tensor_inspection does not"),
        (["--dataset_mode", "--debugging_algorithm", "layerwise"], "--dataset_mode runs oneshot"),
        (["--dataset_mode", "--verifier_config", "v.json"], "--verifier_config is not supported"),
    ],
)
def test_bad_flags_are_one_line_errors_and_write_nothing(tmp_path, capsys, extra, expected):
    lst = _inputs(tmp_path / "data", 2)
    argv = ["-f", "onnx", "-m", str(MODEL), "-i", "image", "1,3,32,32", str(IMAGE)]
    argv += ["-l", str(lst), "-r", "htp", "-w", str(tmp_path / "wd")]
    if "--executor" not in extra:
        argv += ["--executor", "serial"]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "wd").exists()


def test_other_frameworks_and_missing_list_are_refused(tmp_path, capsys):
    argv = ["-f", "onnx", "-m", str(MODEL), "-i", "image", "1,3,32,32", str(IMAGE), "-r", "htp"]
    argv += ["-w", str(tmp_path / "wd"), "--dataset_mode", "--executor", "serial"]
    assert main(argv) == 2
    assert "--dataset_mode needs -l/--input_list" in capsys.readouterr().err
    tfl = tmp_path / "m.tflite"
    tfl.write_bytes(b"x")
    lst = _inputs(tmp_path / "data", 2)
    argv2 = ["-f", "tflite", "-m", str(tfl), "-i", "image", "1,32,32,3", str(IMAGE), "-l", str(lst)]
    argv2 += ["-r", "htp", "-w", str(tmp_path / "wd"), "--dataset_mode", "--executor", "serial"]
    assert main(argv2) == 2
    err = capsys.readouterr().err
    assert (
        "--dataset_mode runs ONNX models; -f tflite" in err and len(err.strip().splitlines()) == 1
    )
    assert not (tmp_path / "wd").exists()


# ---------------------------------------------------------------- on QNN HTP


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The normal oneshot and a dataset run (K = 2) on the same four inputs."""
    from accdbg.algorithms.oneshot import run_oneshot

    root = tmp_path_factory.mktemp("dataset")
    lst = _inputs(root / "data", 4)
    one = _on_example(run_oneshot, lst, root, model_explorer=False)
    ds = _run(lst, root, output_dirname="full")
    return root, lst, one, ds


def _engine_run(one) -> Path:
    return Path(one.engine_run)


@pytest.mark.slow
def test_streamed_scores_equal_the_oneshot_per_input_summaries(runs):
    """Every input's every layer: the same verifier values (and per-channel scores) as the
    normal oneshot's per-input verification summary of the same input."""
    _, _, one, ds = runs
    compared = 0
    for i in range(4):
        ref = pd.read_csv(Path(one.verification_run) / f"Result_{i}" / "summary.csv")
        # the layers: the graph input's row (its encoding against the file) is verification's
        ref = ref[ref["LayerType"] != "graph input"].set_index("Name")
        mine = ds.scores[ds.scores["Input"] == f"Result_{i}"].set_index("Name")
        assert set(mine.index) == set(ref.index)
        for col in ("CosineSimilarity", "SQNR", "SQNR ch_median", "CosineSimilarity ch_worst"):
            np.testing.assert_allclose(
                mine.loc[ref.index, col].to_numpy(float), ref[col].to_numpy(float), rtol=1e-12
            )
            compared += len(ref)
        assert list(mine.loc[ref.index, "Status"]) == list(ref["Status"])
    assert compared >= 4 * 4 * 8


@pytest.mark.slow
def test_sqnr_recomputed_with_numpy_from_the_kept_tensors(runs):
    """For each kept input, 10 log10(sum g^2 / sum (g - t)^2) of its golden and QNN files is
    the table's SQNR, layer by layer."""
    _, _, _, ds = runs
    assert ds.kept
    for key in ds.kept:
        gold = TensorFolder(ds.run_dir / "golden" / key)
        target = TensorFolder(ds.run_dir / "target" / key)
        rows = ds.scores[ds.scores["Input"] == key]
        for _, row in rows.iterrows():
            g = gold.load(row["Golden_name"]).astype(np.float64).ravel()
            t = target.load(row["Name"]).astype(np.float64).ravel()
            expected = 10 * np.log10(np.sum(g * g) / np.sum((g - t) ** 2))
            assert row["SQNR"] == pytest.approx(expected, rel=1e-9), row["Name"]


@pytest.mark.slow
def test_encodings_are_the_engines_on_the_whole_list(runs):
    """The dataset run's QDQ model holds the normal engine run's initializers, every one equal
    (same pre-processing, same calibration on all four lines)."""
    _, _, one, ds = runs
    engine = onnx.load(str(_engine_run(one) / "model.qdq.onnx"))
    mine = onnx.load(str(ds.run_dir / "model.qdq.onnx"))
    a = {t.name: numpy_helper.to_array(t) for t in engine.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in mine.graph.initializer}
    assert a.keys() == b.keys()
    scales = [n for n in a if n.endswith("_scale")]
    assert len(scales) > 8
    for name, arr in a.items():
        np.testing.assert_array_equal(arr, b[name], err_msg=name)


@pytest.mark.slow
def test_keep_worst_two_keeps_exactly_the_two_worst(runs):
    """Two inputs' folders under golden/ and target/, and they are the two whose output cosine,
    recomputed from the normal oneshot's golden and engine dumps, is lowest."""
    root, _, one, ds = runs
    for side in ("golden", "target"):
        assert sorted(p.name for p in (ds.run_dir / side).iterdir()) == sorted(ds.kept)
    assert len(ds.kept) == 2
    cos = {}
    for i in range(4):
        g = TensorFolder(Path(one.golden_dir) / f"Result_{i}").load("probs").ravel()
        t = TensorFolder(_engine_run(one) / "output" / f"Result_{i}").load("probs").ravel()
        g, t = g.astype(np.float64), t.astype(np.float64)
        cos[f"Result_{i}"] = float(g @ t / np.linalg.norm(g) / np.linalg.norm(t))
    assert sorted(ds.kept) == sorted(sorted(cos, key=cos.get)[:2])
    assert ds.worst_input == min(cos, key=cos.get)
    report = (ds.run_dir / "dataset_report.html").read_text()
    for key in ds.kept:
        assert f'href="golden/{key}/tensors.json"' in report
    assert "5-95 % of inputs" in report and "<script src=" not in report  # offline


@pytest.mark.slow
def test_findings_ranking_and_per_input_table(runs):
    """The culprit ranking on the worst kept input finds the planted layer, says how stable
    it is across inputs; the per-input table has final-output scores and top-1 agreement."""
    _, _, _, ds = runs
    assert ds.culprits and ds.culprits[0].name == "block1/conv/relu"
    assert any(
        f.startswith("culprit #1 block1/conv/relu is the top contributor on") for f in ds.findings
    )
    assert len(ds.inputs) == 4 and ds.inputs["top1_agreement"].between(0, 1).all()
    assert {"probs SQNR", "probs CosineSimilarity"} <= set(ds.inputs.columns)
    layers = ds.layers.set_index("Name")
    assert layers["top_contributor_inputs"].sum() == 4
    assert (layers["SQNR_p5"] <= layers["SQNR_median"]).all()
    assert (layers["SQNR_median"] <= layers["SQNR_p95"]).all()
    on_disk = pd.read_csv(ds.run_dir / "scores.csv")
    assert len(on_disk) == 4 * len(layers)


@pytest.mark.slow
def test_an_interrupted_run_resumes_and_scores_only_the_missing_items(runs, monkeypatch):
    """Interrupted after two items, the rerun into the same folder scores the other two, and
    the tables are those of the uninterrupted run."""
    root, lst, _, full = runs
    real = dataset_worker.DatasetWorker.__call__
    calls: list[int] = []

    def interrupted(self, item):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(item["index"])
        return real(self, item)

    kwargs = dict(output_dirname="resumed")
    monkeypatch.setattr(dataset_worker.DatasetWorker, "__call__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(lst, root, **kwargs)
    assert (
        len((root / "wd" / "dataset" / "resumed.failed" / "items.jsonl").read_text().splitlines())
        == 2
    )
    calls.clear()

    def counted(self, item):
        calls.append(item["index"])
        return real(self, item)

    monkeypatch.setattr(dataset_worker.DatasetWorker, "__call__", counted)
    again = _run(lst, root, **kwargs)
    assert sorted(calls) == [2, 3] and again.scored_now == 2
    pd.testing.assert_frame_equal(again.scores, full.scores)
    assert again.layers.drop(columns=[]).to_csv() == full.layers.to_csv()
    assert sorted(again.kept) == sorted(full.kept)
    lines = (again.run_dir / "items.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["index"] for x in lines) == [0, 1, 2, 3]
    calls.clear()
    third = _run(lst, root, **kwargs)  # finished: nothing to do
    assert calls == [] and third.scored_now == 0
    assert (third.run_dir / "scores.csv").read_bytes() == (full.run_dir / "scores.csv").read_bytes()
    from accdbg.errors import AccdbgError

    with pytest.raises(AccdbgError, match="holds a run with another keep_worst"):
        _run(lst, root, **{**kwargs, "keep_worst": 1})


@pytest.mark.slow
def test_a_failing_item_is_reported_and_the_run_finishes(runs, monkeypatch):
    root, lst, _, _ = runs
    real = dataset_worker.DatasetWorker.__call__

    def failing(self, item):
        if item["index"] == 1:
            raise RuntimeError("planted failure on this input")
        return real(self, item)

    monkeypatch.setattr(dataset_worker.DatasetWorker, "__call__", failing)
    ds = _run(lst, root, keep_worst=1)
    assert ds.failed == {"Result_1": "planted failure on this input"}
    assert "Result_1 failed, not scored: planted failure on this input" in ds.findings
    assert any("3 of 4 inputs scored" in f and "1 failed" in f for f in ds.findings)
    assert set(ds.scores["Input"]) == {"Result_0", "Result_2", "Result_3"}
    row = ds.inputs.set_index("Input").loc["Result_1"]
    assert row["error"] == "planted failure on this input"
    assert len(ds.kept) == 1
    shutil.rmtree(ds.run_dir)


def test_report_escapes_names_and_links_the_kept_tensors(tmp_path):
    """A layer or file name holding HTML is text on the page; the kept input links to its
    golden and QNN manifests; the page needs no network."""
    from accdbg.reports.dataset_report import write_dataset_report

    evil = "<script>alert(1)</script>"
    layers = pd.DataFrame(
        {
            "Name": [evil, "b"],
            "Order": [0, 1],
            "SQNR_median": [20.0, 30.0],
            "SQNR_p5": [18.0, 29.0],
            "SQNR_p95": [22.0, 31.0],
            "top_contributor_inputs": [2, 0],
        }
    )
    inputs = pd.DataFrame(
        {"Input": ["Result_0", "Result_1"], "Line": [1, 2], "Files": [evil, "x.raw"]}
    )
    page = write_dataset_report(
        tmp_path / "r.html",
        title=f"t {evil}",
        findings=[f"culprit #1: {evil}"],
        layers=layers,
        inputs=inputs,
        labels=["SQNR"],
        units={"SQNR": "dB"},
        thresholds={"SQNR": 20.0},
        kept_links={"Result_0": ("golden/Result_0/tensors.json", "target/Result_0/tensors.json")},
    ).read_text()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="golden/Result_0/tensors.json"' in page
    assert 'href="target/Result_0/tensors.json"' in page
    assert "<script src=" not in page


@pytest.mark.slow
@pytest.mark.parametrize("name", ["local", "ray"])
def test_other_executors_write_the_same_bytes(runs, name):
    """Two local worker processes, or two Ray actors, score the same inputs into the same
    score and layer tables, byte for byte, and keep the same inputs."""
    if name == "ray":
        pytest.importorskip(
            "ray", reason="the ray extra is not installed (pip install accdbg[ray])"
        )
    root, lst, _, full = runs
    ds = _run(lst, root, executor=ExecutorConfig(name=name, workers=2), output_dirname=f"by_{name}")
    for table in ("scores.csv", "layers.csv"):
        assert (ds.run_dir / table).read_bytes() == (full.run_dir / table).read_bytes(), table
    assert ds.kept == full.kept


def test_the_band_is_one_polygon_per_run_of_known_layers():
    """A layer without scores breaks the band; +inf (identical tensors) is drawn at the top."""
    from accdbg.reports.dataset_report import band_polygons

    low = pd.Series([1.0, 2.0, np.nan, 3.0, np.inf])
    high = pd.Series([2.0, 3.0, 4.0, 5.0, np.inf])
    assert band_polygons(low, high) == [
        ([0.0, 1.0, 1.0, 0.0], [2.0, 3.0, 2.0, 1.0]),
        ([3.0, 4.0, 4.0, 3.0], [5.0, 5.0, 5.0, 3.0]),
    ]
    assert band_polygons(pd.Series([np.nan]), pd.Series([np.nan])) == []


def test_the_stability_line_counts_where_an_amplified_culprits_error_shows():
    """An input's top contributor is the layer where its error appears: for a rounding a Log
    amplifies, the Log, not the culprit (its input). Those inputs agree with the ranking."""
    from accdbg.algorithms.dataset.tables import stability_line

    top = {"in0": "log", "in1": "log", "in2": "conv", "in3": None}
    assert stability_line("power", top, ("log",)) == (
        "culprit #1 power (its error showing at log) is the top contributor on 2 of 3 inputs (67 %)"
    )
    assert stability_line("power", top) == (
        "culprit #1 power is the top contributor on 0 of 3 inputs (0 %); most often it is log "
        "(2 of 3)"
    )
