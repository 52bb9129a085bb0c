"""Model Explorer overlays: every file read back through Model Explorer's own code (its
node-data dataclasses, its ONNX adapter, its server), the planted culprit in the worst colour,
and the viewer rendering them offline in headless Chromium."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dacite
import numpy as np
import onnx
import pandas as pd
import pytest
import requests

from accdbg.core.inputs import parse_input_tensor
from accdbg.errors import AccdbgError
from accdbg.reports import model_explorer as me
from accdbg.verifiers import get_verifier
from tests import browser, models
from tests.helpers import lazy_import

# Model Explorer's own code (its import loads torch when installed: seconds every xdist worker
# would pay to collect this module)
nb = lazy_import("model_explorer.node_data_builder")
adapter = lazy_import("model_explorer_onnx.main")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny_cnn"
STRICT = dacite.Config(strict=True)


def load_overlay(path: Path) -> dict[str, nb.GraphNodeData]:
    """A node-data file as Model Explorer's own dataclasses, strictly (no unknown field, every
    type checked; text values - ranking, marks - are the builder's label values), and written
    exactly as ``ModelNodeData.to_json_string`` writes those dataclasses."""
    data = json.loads(path.read_text())
    graphs = {}
    for graph, gdata in data.items():
        text_values = any(isinstance(r["value"], str) for r in gdata["results"].values())
        if text_values:
            assert all(isinstance(r["value"], str) for r in gdata["results"].values()), path
        config = dacite.Config(strict=True, check_types=not text_values)
        graphs[graph] = dacite.from_dict(nb.GraphNodeData, gdata, config=config)
    assert json.loads(nb.ModelNodeData(graphsData=graphs).to_json_string()) == data, path
    return graphs


def adapter_graph(model: Path):
    """The graph the viewer shows, from the ONNX adapter Model Explorer loads."""
    return adapter.ONNXAdapter().convert(str(model), {})["graphs"][0]


def producers_by_onnx(model: Path) -> dict[str, str]:
    """tensor -> name of the node producing it, read with onnx (the adapter names an
    unnamed node ``<node_i>``)."""
    m = onnx.load(str(model))
    out = {vi.name: f"[value] {vi.name}" for vi in m.graph.input}
    for i, node in enumerate(m.graph.node):
        for o in node.output:
            out[o] = node.name or f"<node_{i}>"
    return out


def overlay_files(folder: Path) -> dict[str, dict]:
    manifest = json.loads((folder / me.MANIFEST).read_text())
    return {f["name"]: {**f, "path": folder / f["file"]} for f in manifest["files"]}


# ---------------------------------------------------------------- files, no backend


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "Name": [
                "stem/conv/relu",
                "block1/conv/relu",
                "block2/conv/relu",
                "block3/conv/relu",
                "head/fc",
                "not/in/the/model",
            ],
            "SQNR": [41.8, 12.3, math.inf, 11.2, math.nan, 3.0],
            "MSE": [1e-5, 4e-3, 0.0, 5e-3, 2e-3, 1.0],
            "culprit_rank": pd.array([None, 1, None, 2, None, None], dtype="Int64"),
            "cause": ["", "weight range: channel 0", "inherited", "clipping: 4%", "", ""],
        }
    )


def test_every_row_lands_on_its_source_node_and_files_are_model_explorers(tmp_path):
    model = EXAMPLE / "model.onnx"
    table = _table()
    out = me.write_overlays(
        tmp_path,
        model,
        table,
        "Name",
        {"SQNR": get_verifier("SQNR"), "MSE": get_verifier("MSE")},
        marks={"on CPU": {"head/fc": "MatMul: not supported", ("x_Q", "image"): "its Q"}},
    )
    files = overlay_files(tmp_path / "model_explorer")
    assert set(files) == {"SQNR", "MSE", "culprit ranking", "marks"}
    graph = adapter_graph(model)
    node_ids = {n.id for n in graph.nodes}
    by_onnx = producers_by_onnx(model)
    loaded = {name: load_overlay(f["path"]) for name, f in files.items()}
    for name, graphs in loaded.items():
        assert list(graphs) == [graph.id] == [out.graph], name
        assert set(graphs[graph.id].results) <= node_ids, name  # every key is a node shown
    sqnr = loaded["SQNR"][graph.id].results
    # each compared layer (a finite or infinite score) has its value on its producer node
    for row in table.itertuples():
        node = by_onnx.get(row.Name)
        if node is None:
            assert row.Name in out.unmatched
        elif not math.isnan(row.SQNR):
            assert node in sqnr, row.Name
    assert sqnr["block1/conv_relu"].value == pytest.approx(12.3)
    assert sqnr["block2/conv_relu"].value == pytest.approx(41.8)  # inf -> the best finite
    assert "head/fc" not in sqnr  # NaN: not compared, no value
    mse = loaded["MSE"][graph.id]
    assert mse.results["block2/conv_relu"].value == 0.0
    # the colour scales: worst red at the worst end, for either direction
    worst_sqnr = next(g.bgColor for g in loaded["SQNR"][graph.id].gradient if g.stop == 0)
    worst_mse = next(g.bgColor for g in mse.gradient if g.stop == 1)
    assert worst_sqnr == worst_mse
    ranking = loaded["culprit ranking"][graph.id].results
    assert ranking["block1/conv_relu"].bgColor == worst_sqnr
    assert ranking["block1/conv_relu"].value == "#1: weight range: channel 0"
    assert [k for k, r in ranking.items() if r.bgColor == worst_sqnr] == ["block1/conv_relu"]
    assert ranking["block3/conv_relu"].value.startswith("#2") and ranking[
        "block3/conv_relu"
    ].bgColor not in (None, worst_sqnr)
    marks = loaded["marks"][graph.id].results
    assert marks["block1/conv_relu"].value.startswith("culprit #1")
    assert marks["head/fc"].value == "on CPU: MatMul: not supported"
    assert marks["[value] image"].value == "on CPU: its Q"  # the first candidate name fails


def consumers_by_onnx(model: Path) -> dict[str, str]:
    """initializer -> name of the first node reading it, read with onnx."""
    m = onnx.load(str(model))
    inits = {i.name for i in m.graph.initializer}
    out: dict[str, str] = {}
    for node in m.graph.node:
        for i in node.input:
            if i in inits:
                out.setdefault(i, node.name)
    return out


def test_weights_land_on_their_layer_and_a_node_keeps_its_best_rank(tmp_path):
    """A weight or bias row lands on the node using it (the Conv, the MatMul), not on the
    initializer's own node; several ranked rows on one node show the best rank; notes (what
    lands on no node) are kept in overlays.json and shown on the page."""
    model = EXAMPLE / "model.onnx"
    users, by_onnx = consumers_by_onnx(model), producers_by_onnx(model)
    table = pd.DataFrame(
        {
            "Name": ["block1/conv.weight", "block1/conv/out", "head.fc.weight", "stem/conv/relu"],
            "worst SQNR": [4.0, 20.0, 30.0, 35.0],
            "culprit_rank": pd.array([2, 1, None, None], dtype="Int64"),
            "cause": ["weight range", "clipping", "", ""],
        }
    )
    page = tmp_path / "report.html"
    page.write_text("<html><body><h1>t</h1><p>body</p></body></html>")
    out = me.overlay_run(
        tmp_path,
        [page],
        model,
        table,
        "Name",
        {"worst SQNR": get_verifier("SQNR")},
        notes=["the best fix changes every layer: per-channel weights (all layers)"],
    )
    assert out is not None and out.unmatched == []
    files = overlay_files(tmp_path / "model_explorer")
    sqnr = load_overlay(files["worst SQNR"]["path"])[out.graph].results
    conv, fc = users["block1/conv.weight"], users["head.fc.weight"]
    assert (conv, fc) == ("block1/conv", "head/fc") and by_onnx["block1/conv/out"] == conv
    assert sqnr[conv].value == 4.0  # the weight and the Conv's output: the worst of both
    assert sqnr[fc].value == 30.0 and sqnr[by_onnx["stem/conv/relu"]].value == 35.0
    assert not any(k.startswith("[value] ") for k in sqnr)  # no initializer node
    ranking = load_overlay(files["culprit ranking"]["path"])[out.graph].results
    assert ranking[conv].value == "#1: clipping" and ranking[conv].bgColor == me.WORST
    marks = load_overlay(files["marks"]["path"])[out.graph].results
    assert marks[conv].value.count("culprit #") == 2  # both rows named in the mark
    manifest = json.loads((tmp_path / "model_explorer" / me.MANIFEST).read_text())
    assert manifest["notes"] == [
        "the best fix changes every layer: per-channel weights (all layers)"
    ]
    assert me.read_overlays(tmp_path).notes == manifest["notes"]
    html = page.read_text()
    assert html.index("</h1>") < html.index("On the graph") < html.index("<p>body")
    assert "Not on any node: the best fix changes every layer" in html


def test_a_model_inside_the_run_is_recorded_where_the_finished_run_keeps_it(tmp_path):
    """A conversion the run made lives in its staging folder while the overlays are written;
    overlays.json names it in the finished folder, where --model_explorer_view finds it."""
    import shutil

    staging, final = tmp_path / ".run.partial", tmp_path / "run"
    (staging / "conversion").mkdir(parents=True)
    shutil.copyfile(EXAMPLE / "model.onnx", staging / "conversion" / "model.onnx")
    model = staging / "conversion" / "model.onnx"
    me.write_overlays(staging, model, _table(), "Name", {}, final_dir=final)
    staging.rename(final)
    assert me.read_overlays(final).model == final / "conversion" / "model.onnx"


def test_infinite_scores_become_finite_json_values():
    """JSON has no infinity: identical tensors take the best finite score, or the largest
    float when every score is infinite; MSE 0 stays 0; -inf SQNR takes the worst."""
    sqnr = {"a": math.inf, "b": 12.0, "c": 30.0, "d": -math.inf}
    assert me.score_results(sqnr, True) == {"a": 30.0, "b": 12.0, "c": 30.0, "d": 12.0}
    assert me.score_results({"a": math.inf, "b": math.inf}, True) == {
        "a": sys.float_info.max,
        "b": sys.float_info.max,
    }
    assert me.score_results({"a": math.inf, "b": 0.5, "c": 0.0}, False) == {
        "a": 0.5,
        "b": 0.5,
        "c": 0.0,
    }


def test_real_model_keys_are_the_adapters_node_ids(ppocr_det, tmp_path):
    """PP-OCRv4 det: named nodes are keyed by their ONNX names (not their outputs' names);
    its unnamed Constant nodes by the ids the adapter gives them (onnx_ir names them
    ``node``, ``node_1``...), which only the adapter knows."""
    m = onnx.load(str(ppocr_det))
    convs = [n for n in m.graph.node if n.op_type == "Conv" and n.name]
    unnamed = [n for n in m.graph.node if not n.name][:2]
    assert convs[0].name != convs[0].output[0] and len(unnamed) == 2
    picks = [convs[0], unnamed[0], convs[len(convs) // 2], unnamed[1], convs[-1]]
    values = [30.0, 40.0, 5.0, 41.0, 20.0]
    table = pd.DataFrame({"Name": [n.output[0] for n in picks], "SQNR": values})
    t = time.perf_counter()
    out = me.write_overlays(tmp_path, ppocr_det, table, "Name", {"SQNR": get_verifier("SQNR")})
    seconds = time.perf_counter() - t
    results = load_overlay(tmp_path / "model_explorer" / "SQNR.json")[out.graph].results
    assert out.unmatched == [] and len(results) == 5
    for n in picks[::2]:
        assert n.name in results
    shown = {}
    for node in adapter_graph(ppocr_det).nodes:
        for meta in node.outputsMetadata:
            for a in meta.attrs:
                if a.key == "__tensor_tag":
                    shown.setdefault(a.value, (node.id, node.label))
    for n, v in zip(picks, values, strict=True):
        node_id, label = shown[n.output[0]]
        assert label == n.op_type and results[node_id].value == v
    assert seconds < 20, seconds  # measured about 1 s (672 nodes)


def test_a_missing_model_is_a_warning_not_a_failed_run(tmp_path, caplog):
    with pytest.raises(AccdbgError, match="cannot read"):
        me.write_overlays(tmp_path, tmp_path / "nope.onnx", _table(), "Name", {})
    page = tmp_path / "summary.html"
    page.write_text("<html><body><h1>t</h1></body></html>")
    assert me.overlay_run(tmp_path, [page], tmp_path / "nope.onnx", _table(), "Name", {}) is None
    assert "model explorer overlays not written" in caplog.text
    with pytest.raises(AccdbgError, match="no model_explorer/overlays.json"):
        me.read_overlays(tmp_path)


def test_view_needs_a_run_with_overlays(tmp_path, capsys):
    from tests.helpers import run_cli

    code, _, err = run_cli(capsys, "--model_explorer_view", tmp_path)
    assert code == 2 and "no model_explorer/overlays.json" in err and len(err.splitlines()) == 1
    me.write_overlays(tmp_path, EXAMPLE / "model.onnx", _table(), "Name", {})
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli(capsys, "--model_explorer_view", tmp_path, "--port", port)
    assert code == 2 and f"--port {port} is already in use" in err, err


# ---------------------------------------------------------------- runs on the QNN backend


@pytest.fixture(scope="module")
def example_oneshot(tmp_path_factory):
    """The bundled example (block1 is the planted culprit), oneshot on QNN HTP."""
    from accdbg.algorithms.oneshot import run_oneshot

    tmp = tmp_path_factory.mktemp("example")
    res = run_oneshot(
        "onnx",
        EXAMPLE / "model.onnx",
        [parse_input_tensor(["image", "1,3,32,32", str(EXAMPLE / "input.raw")])],
        working_dir=tmp / "w",
        engine_kwargs={"runtime": "htp"},
    )
    return res


@pytest.mark.slow
def test_oneshot_overlays_mark_the_planted_culprit_worst(example_oneshot):
    res = example_oneshot
    folder = res.verification_run / "model_explorer"
    files = overlay_files(folder)
    assert set(files) == {"CosineSimilarity", "SQNR", "culprit ranking", "marks"}
    model = EXAMPLE / "model.onnx"
    by_onnx = producers_by_onnx(model)
    graph = adapter_graph(model)
    loaded = {name: load_overlay(f["path"])[graph.id].results for name, f in files.items()}
    compared = res.summary[res.summary["Status"].isin(["ok", "fail"])]
    compared = compared[compared["LayerType"] != "graph input"]  # on no node: no producer
    assert len(compared) == 8
    for label in ("CosineSimilarity", "SQNR"):
        for name, value in zip(compared["Name"], compared[label], strict=True):
            assert loaded[label][by_onnx[name]].value == pytest.approx(value), (label, name)
    culprit = by_onnx["block1/conv/relu"]
    gradient = load_overlay(files["SQNR"]["path"])[graph.id].gradient
    worst = next(g.bgColor for g in gradient if g.stop == 0)
    ranking = loaded["culprit ranking"]
    assert ranking[culprit].bgColor == worst and ranking[culprit].value.startswith("#1: weight")
    assert [n for n, r in ranking.items() if r.bgColor == worst] == [culprit]
    assert loaded["marks"][culprit].bgColor == worst
    # the input's QuantizeLinear stays on the CPU (partitioning.json): marked on the input
    cpu = json.loads((res.engine_run / "partitioning.json").read_text())["cpu_nodes"]
    assert any(r["name"] == "image_QuantizeLinear" for r in cpu)
    assert loaded["marks"]["[value] image"].value.startswith("on CPU: its QuantizeLinear")
    # the report links each file and shows the one command
    page = res.report.read_text()
    for f in files.values():
        assert f'href="model_explorer/{f["file"]}"' in page
    assert f"--model_explorer_view {res.verification_run}" in page
    assert res.seconds["model explorer overlays"] < 10


@pytest.mark.slow
def test_standalone_verification_finds_the_engines_model(example_oneshot, tmp_path):
    """--verification on an engine run: overlays on the model the engine started from (its
    options JSON), the CPU layers marked from its partitioning.json; linked from the page."""
    from accdbg.verifiers.verification import run_verification

    res = run_verification(
        example_oneshot.golden_dir,
        example_oneshot.engine_run,
        default_verifiers=["SQNR"],
        working_dir=tmp_path / "w",
        output_dirname="v",
    )
    folder = res.run_dir / "model_explorer"
    manifest = json.loads((folder / me.MANIFEST).read_text())
    assert Path(manifest["model"]) == (EXAMPLE / "model.onnx").absolute()
    assert manifest["command"].endswith(f"--model_explorer_view {res.run_dir}")
    files = overlay_files(folder)
    assert set(files) == {"SQNR", "marks"}  # no ranking in a bare verification
    graph = adapter_graph(EXAMPLE / "model.onnx")
    sqnr = load_overlay(files["SQNR"]["path"])[graph.id].results
    by_onnx = producers_by_onnx(EXAMPLE / "model.onnx")
    layers = res.summary[res.summary["LayerType"] != "graph input"]  # inputs have no producer
    for name, value in zip(layers["Name"], layers["SQNR"], strict=True):
        assert sqnr[by_onnx[name]].value == pytest.approx(value)
    marks = load_overlay(files["marks"]["path"])[graph.id].results
    assert set(marks) == {"[value] image", by_onnx["probs"]}  # input Q, output DQ on CPU
    assert 'href="model_explorer/SQNR.json"' in (res.run_dir / "summary.html").read_text()


@pytest.mark.slow
def test_layerwise_overlays_put_the_planted_layer_worst(tmp_path):
    from accdbg.algorithms import run_layerwise

    built = models.planted_chain(tmp_path, layers=4, bad=1)
    res = run_layerwise(
        built.path,
        [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])],
        verifiers=["SQNR"],
        working_dir=tmp_path / "w",
        engine_kwargs={"runtime": "htp"},
    )
    folder = res.run_dir / "model_explorer"
    files = overlay_files(folder)
    graph = adapter_graph(built.path)
    by_onnx = producers_by_onnx(built.path)
    planted = by_onnx[built.expected["planted"]]
    sqnr = load_overlay(files["SQNR"]["path"])[graph.id]
    for name, value in zip(res.report["O/P Name"], res.report["SQNR"], strict=True):
        assert sqnr.results[by_onnx[name]].value == pytest.approx(value)
    # layerwise scores are each layer's own: the planted layer is the lowest SQNR, at the
    # gradient's worst end
    assert min(sqnr.results, key=lambda k: sqnr.results[k].value) == planted
    ranking = load_overlay(files["culprit ranking"]["path"])[graph.id].results
    assert (
        ranking[planted].bgColor
        == me.WORST
        == next(g.bgColor for g in sqnr.gradient if g.stop == 0)
    )
    assert f"--model_explorer_view {res.run_dir}" in res.html.read_text()


@pytest.mark.slow
def test_no_model_explorer_writes_none(tmp_path, capsys):
    from tests.helpers import run_cli

    code, _, err = run_cli(
        capsys,
        "-f",
        "onnx",
        "-m",
        EXAMPLE / "model.onnx",
        "-i",
        "image",
        "1,3,32,32",
        EXAMPLE / "input.raw",
        "--no_model_explorer",
        "-w",
        tmp_path / "w",
        "--output_dirname",
        "run",
    )
    assert code == 0, err
    run = tmp_path / "w" / "verification" / "run"
    assert (run / "summary.html").is_file() and not (run / "model_explorer").exists()
    assert "model-explorer" not in (run / "summary.html").read_text()


# ---------------------------------------------------------------- the viewer, offline


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def viewer(example_oneshot):
    """``--model_explorer_view RUN_DIR`` as a user starts it; yields its address."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accdbg.cli.main",
            "--model_explorer_view",
            str(example_oneshot.verification_run),
            "--port",
            str(port),
            "--no_browser",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    url = None
    end = time.monotonic() + 120
    while url is None and time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(rf"http://127\.0\.0\.1:{port}/\?data=\S+", line)
        url = found.group(0) if found else None
    assert url, "".join(lines)
    try:
        yield url, port
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_viewer_server_hands_the_overlays_to_the_web_app(viewer, example_oneshot):
    """What the page asks the server for: each overlay file as written, and the graph."""
    url, port = viewer
    files = overlay_files(example_oneshot.verification_run / "model_explorer")
    no_proxy = {"http": None, "https": None}
    for f in files.values():
        assert str(f["path"]) in requests.utils.unquote(url)
        got = requests.get(
            f"http://127.0.0.1:{port}/api/v1/read_text_file",
            params={"path": str(f["path"])},
            proxies=no_proxy,
            timeout=30,
        ).json()
        assert got["content"] == f["path"].read_text()
    check = requests.get(
        f"http://127.0.0.1:{port}/api/v1/check_new_version", proxies=no_proxy, timeout=30
    ).json()
    assert check["version"] == ""  # nothing asked of PyPI or GitHub


@pytest.mark.slow
def test_viewer_renders_graph_and_overlays_offline_in_chromium(viewer, tmp_path):
    import matplotlib.image

    url, port = viewer
    page = browser.Cdp(tmp_path, height=1000)
    try:
        page.call("Page.navigate", url=url)
        assert page.wait_for("document.querySelectorAll('webgl-renderer canvas').length"), (
            page.console
        )
        names = page.wait_for(  # the overlays load one by one: wait for all four
            "(() => { const n = Array.from(document.querySelectorAll("
            "'node-data-provider-summary-panel .run-name')).map(e => e.textContent.trim());"
            " return n.length >= 4 ? n : null; })()"
        )
        assert names == ["CosineSimilarity", "SQNR", "culprit ranking", "marks"]
        panel = page.eval("document.querySelector('node-data-provider-summary-panel').innerText")
        assert "Aggregated stats" in panel and "#1: weight range" in panel
        page.eval("document.querySelector('.expand-all').click()")
        page.eval(
            "Array.from(document.querySelectorAll('node-data-provider-summary-panel .index-row'))"
            ".find(r => r.querySelector('.run-name').textContent.trim() == 'culprit ranking')"
            ".querySelector('.visibility').click()"
        )
        page.call("Input.dispatchMouseEvent", type="mouseMoved", x=900, y=900)
        time.sleep(2)
        png = page.screenshot(tmp_path / "model_explorer.png")
    finally:
        page.close()
    local = f"http://127.0.0.1:{port}/"
    outside = {
        re.sub(r"^(\w+://[^/]+).*", r"\1", u) for u in page.requests if not u.startswith(local)
    }
    # the only outside address is the one web font index.html names (blocked: the bundled
    # copy of the same font is used)
    assert outside <= {"https://fonts.gstatic.com"}, outside
    img = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)
    graph_area = img[:, :1000]  # left of the side panel
    red = np.all(graph_area == [0xB7, 0x1C, 0x1C], axis=-1).sum()
    assert red > 50, red  # the culprit's node is painted in the worst colour


@pytest.mark.slow
def test_pytorch_overlays_land_on_the_converted_onnx_model(tmp_path):
    """Other frameworks: the source model is the converted ONNX model, whose tensor names
    the engine's rows carry; every compared row lands on one of its nodes."""
    pytest.importorskip("torch", reason="accdbg[torch] is not installed")
    from accdbg.algorithms.oneshot import run_oneshot
    from tests.test_frameworks_torch import MODEL_SOURCE

    src = tmp_path / "small_cnn.py"
    src.write_text(MODEL_SOURCE)
    x = tmp_path / "x.raw"
    np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32).tofile(x)
    res = run_oneshot(
        "pytorch",
        f"{src}:build",
        [parse_input_tensor(["x", "1,3,16,16", str(x)])],
        working_dir=tmp_path / "w",
    )
    folder = res.verification_run / "model_explorer"
    manifest = json.loads((folder / me.MANIFEST).read_text())
    model = Path(manifest["model"])
    assert model.suffix == ".onnx" and (tmp_path / "w" / "conversion") in model.parents
    by_onnx = producers_by_onnx(model)
    cos = load_overlay(folder / "CosineSimilarity.json")[manifest["graph"]].results
    compared = res.summary[res.summary["Status"].isin(["ok", "fail"])]
    assert len(compared) >= 8 and manifest["unmatched"] == []
    for name, value in zip(compared["Name"], compared["CosineSimilarity"], strict=True):
        assert cos[by_onnx[name]].value == pytest.approx(value), name
