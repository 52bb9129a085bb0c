"""Oneshot-layerwise end to end on the real QNN backend: marks, report, wrapper layout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import numpy_helper

from accdbg.algorithms.oneshot import run_oneshot
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from tests import browser, models
from tests.helpers import one_line_error, run_cli

REPO = Path(__file__).resolve().parents[1]


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.slow
def test_planted_layer_is_first_crossing_and_largest_drop(tmp_path):
    built = models.planted_chain(tmp_path, layers=6, bad=3)
    planted = built.expected["planted"]
    res = run_oneshot(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])],
        working_dir=tmp_path / "w",
    )
    for mark in res.marks:
        assert mark.first_crossing == planted, mark
        assert mark.largest_drops[0][0] == planted, mark
    row = res.summary.set_index("Name").loc[planted]
    assert "CosineSimilarity" in row["first_crossing"] and "SQNR #1" in row["largest_drop"]
    # one culprit, the planted layer, blamed on its weights
    ranked = res.summary.dropna(subset=["culprit_rank"])
    assert list(ranked["Name"]) == [planted] and row["culprit_rank"] == 1
    assert row["cause"].startswith("weight range") and "output channel 0" in row["cause"]
    assert f"culprit #1: {planted} (Conv)" in "\n".join(res.findings)
    # the numbers behind the marks, recomputed from the dumped files with numpy
    golden, target = (
        TensorFolder(res.golden_dir),
        TensorFolder(res.engine_run / "output" / "Result_0"),
    )
    before = f"layer{int(planted[-1]) - 1}"
    cos_planted = _cos(golden.load(planted), target.load(planted))
    cos_before = _cos(golden.load(before), target.load(before))
    assert row["CosineSimilarity"] == pytest.approx(cos_planted, abs=1e-6)
    assert row["CosineSimilarity drop"] == pytest.approx(cos_before - cos_planted, abs=1e-6)
    assert cos_before > 0.99 > cos_planted


@pytest.mark.slow  # a whole oneshot run
def test_a_cpu_simulation_run_names_no_backend_and_no_kernels(tmp_path):
    """``--engine simulation`` runs onnxruntime's CPU fake-quant of the QDQ model: the backend
    comparison would compare it with itself. The ranking names the planted layer for its
    weights, and no finding speaks of QNN's kernels or names a layer as the backend's."""
    from accdbg.engines.options import EngineConfig

    built = models.planted_chain(tmp_path, layers=6, bad=3)
    res = run_oneshot(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])],
        engine_kwargs=EngineConfig.from_keywords(engine="simulation"),
        working_dir=tmp_path / "w",
    )
    ranked = res.summary.dropna(subset=["culprit_rank"])
    assert list(ranked["Name"]) == [built.expected["planted"]]
    assert not any("kernels" in f or "backend" in f for f in res.findings), res.findings


@pytest.fixture(scope="module")
def ppocr_planted(tmp_path_factory, ppocr_det, ppocr_input):
    """PP-OCRv4 det with a dead, 1000x-weighted channel planted in a layer halfway through."""
    tmp = tmp_path_factory.mktemp("planted")
    m = onnx.load(str(ppocr_det))
    conv = next(n for n in m.graph.node if n.name == "p2o.Conv.38")  # feeds relu_2.tmp_0
    consts = {n.output[0]: n.attribute[0].t for n in m.graph.node if n.op_type == "Constant"}
    tensors = {i.name: i for i in m.graph.initializer} | consts
    w, b = tensors[conv.input[1]], tensors[conv.input[2]]
    wa, ba = numpy_helper.to_array(w).copy(), numpy_helper.to_array(b).copy()
    wa[0] *= 1000.0
    ba[0] = -1e6  # ReLU always zeroes channel 0: golden barely changes, 8-bit weights do
    w.CopyFrom(numpy_helper.from_array(wa, w.name))
    b.CopyFrom(numpy_helper.from_array(ba, b.name))
    path = tmp / "det_planted.onnx"
    onnx.save(m, str(path))
    inp = [parse_input_tensor(["x", "1,3,320,320", str(ppocr_input)])]
    return run_oneshot("onnx", path, inp, working_dir=tmp / "w"), "relu_2.tmp_0"


@pytest.mark.slow
def test_real_model_planted_layer_among_three_largest_drops(ppocr_planted):
    res, planted = ppocr_planted
    names = list(res.summary["Name"])
    i = names.index(planted)
    assert i > 100  # deep inside
    earlier = res.summary["SQNR"].iloc[:i]
    assert (earlier < 20).sum() > i // 2  # the absolute threshold already fails most earlier layers
    for mark in res.marks:
        assert planted in [n for n, _ in mark.largest_drops], mark
    # ranked first by the CPU measures, but the device barely feels it: at 320x320 the model
    # keeps 12 dB at its outputs, and the planted layer's per-channel fix (or the layer in
    # fp16) gains under a dB on QNN - so it is not named, and nothing else is in its place
    ranked = res.summary.dropna(subset=["culprit_rank"])
    assert ranked.empty, ranked[["Name", "cause"]]
    cause = res.summary.set_index("Name").loc[planted, "cause"]
    assert cause.startswith("weight range") and "not confirmed on QNN HTP" in cause
    dropped = [f for f in res.findings if f.startswith("not a culprit on QNN:")]
    assert len(dropped) == 1 and dropped[0].startswith(
        f"not a culprit on QNN: {planted} - ranked #1"
    )


@pytest.fixture(scope="module")
def ppocr_oneshot(tmp_path_factory, ppocr_det, ppocr_small_input):
    tmp = tmp_path_factory.mktemp("ppocr_oneshot")
    inp = [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])]
    return run_oneshot("onnx", ppocr_det, inp, working_dir=tmp / "w", enable_tensor_inspection=True)


@pytest.mark.slow
def test_real_model_summary_is_complete(ppocr_oneshot):
    res = ppocr_oneshot
    dumped = TensorFolder(res.engine_run / "output" / "Result_0")
    mapping = json.loads((res.engine_run / "tensor_mapping.json").read_text())
    # every dumped tensor has a row: the layers (mapped to the golden), the graph input as fed
    fed = set(res.summary.loc[res.summary["LayerType"] == "graph input", "Name"])
    assert fed == {"x"} and set(res.summary["Name"]) - fed == set(mapping) == set(dumped.names())
    csv = pd.read_csv(res.verification_run / "summary.csv", keep_default_na=False)
    assert list(csv.columns[:4]) == ["Name", "LayerType", "Size", "Tensor_dims"]
    for col in ("CosineSimilarity", "SQNR", "golden_min", "golden_max", "target_min", "target_max"):
        assert (csv[col].astype(str) != "").all(), col
    order = [dumped.records[n].index for n in csv["Name"] if n not in fed]
    assert order == sorted(order)  # execution order
    assert csv["Status"].isin(["ok", "fail"]).all()  # every pair compared, no note
    assert ((csv["Status"] == "fail") == (csv["Failed"] != "")).all()
    # tensor inspection ran for every layer
    insp = res.verification_run / "tensor_inspection"
    assert len(pd.read_csv(insp / "summary.csv")) == len(csv) - len(fed)  # no golden tensor


@pytest.mark.slow
def test_clean_real_model_names_no_culprit(ppocr_oneshot):
    """The shipped model, nothing planted: the verdict is a diffuse error, not a layer."""
    res = ppocr_oneshot
    assert res.summary["culprit_rank"].isna().all(), res.findings
    assert any(line.startswith("no single layer stands out") for line in res.findings)
    # the per-channel scores are there, and never better than the worst channel's
    s = res.summary.dropna(subset=["SQNR ch_median"])
    assert len(s) > 200 and (s["SQNR ch_worst"] <= s["SQNR ch_median"] + 1e-9).all()


@pytest.mark.slow
def test_real_model_report_reads_at_1400_px(ppocr_oneshot, tmp_path):
    """PP-OCRv4 det's report: the layer adding the most error and the score columns are in
    view at 1400 px without scrolling the page sideways; one legend entry per kind of mark."""
    res = ppocr_oneshot
    top = res.marks[0].largest_drops[0][0]
    seen, errors = browser.layout(res.report, tmp_path, top)
    assert errors == []
    assert seen["viewport"] == browser.WIDTH and seen["page"] <= seen["viewport"]
    right = min(seen["viewport"], seen["wrap"]["right"])
    assert (
        seen["name"]["text"] == top and 0 <= seen["name"]["left"] < seen["name"]["right"] <= right
    )
    for col in ("CosineSimilarity", "SQNR", "CosineSimilarity drop", "SQNR drop"):
        head = seen["heads"][col]
        assert 0 <= head["left"] and head["right"] <= right, (col, head, right)
    assert len(seen["legend"]) == len(set(seen["legend"])) >= 3, seen["legend"]


def external_references(html: str) -> list[str]:
    """src/href attributes of the page's tags that point at the network (script bodies excluded)."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            for key, value in attrs:
                if key in ("src", "href") and value and re.match(r"^(https?:)?//", value):
                    found.append(f"<{tag} {key}={value}>")

    Tags().feed(html)
    return found


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """The README's first command, run as written (minus the install) in a scratch folder."""
    tmp = tmp_path_factory.mktemp("readme")
    text = (REPO / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", text, re.S).group(1).strip()
    assert first.startswith("pip install -e . && ")
    cmd = first.removeprefix("pip install -e . && ")
    (tmp / "examples").symlink_to(REPO / "examples")
    proc = subprocess.run(
        cmd,
        shell=True,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ACCDBG_NO_PROGRESS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = re.search(r"report: (\S+summary\.html)", proc.stderr).group(1)
    return tmp, Path(report), proc.stderr


VERDICT_HEADING = "## The example's verdict"
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}")


def readme_verdict() -> list[str]:
    """The lines of the README's example verdict: the first fenced block after its heading."""
    text = (REPO / "README.md").read_text()
    assert VERDICT_HEADING in text, f"the README has no {VERDICT_HEADING!r} section"
    after = text[text.index(VERDICT_HEADING) :]
    block = re.search(r"```[a-z]*\n(.*?)\n```", after, re.S).group(1)
    return block.splitlines()


def printed_verdict(err: str, folder: Path) -> list[str]:
    """The verdict as the command printed it, from "the outputs meet..." (or "outputs
    failing...") to "report:", with the scratch folder's absolute paths made relative and the
    run folders' timestamps made ``<timestamp>``: nothing else is changed."""
    lines = err.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.startswith(("the outputs meet their thresholds", "outputs failing"))
    )
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("report: "))
    out = []
    for line in lines[start : end + 1]:
        for root in dict.fromkeys((str(folder.resolve()), str(folder))):
            line = line.replace(root + "/", "")
        out.append(TIMESTAMP.sub("<timestamp>", line))
    return out


@pytest.mark.slow
def test_readme_example_verdict_is_what_the_command_prints(example_run):
    """The README shows the example's verdict exactly as the first command prints it (progress
    lines off, as ACCDBG_NO_PROGRESS=1 does): each line, in order. A verdict word changed in
    the code is a change of the README's block, nothing else."""
    tmp, _, err = example_run
    assert printed_verdict(err, tmp) == readme_verdict()


@pytest.mark.slow
def test_readme_command_finds_the_planted_layer(example_run):
    tmp, report, err = example_run
    assert "culprit #1: block1/conv/relu (Conv) - weight range" in err
    summary = json.loads((report.parent / "summary.json").read_text())
    for mark in summary["attribution"]:
        assert mark["first_crossing"] == "block1/conv/relu"
        assert mark["largest_drops"][0][0] == "block1/conv/relu"
    wrapper = tmp / "working_directory" / "wrapper" / "latest"
    assert "report:" in (wrapper / "log.txt").read_text()
    opts = json.loads((wrapper / "wrapper_options.json").read_text())
    assert opts["debugging_algorithm"] == "oneshot-layerwise" and opts["runtime"] == "htp"
    for comp in ("framework_diagnosis", "inference_engine", "verification"):
        assert (tmp / "working_directory" / comp / "latest").is_dir()


@pytest.mark.slow
def test_report_renders_offline_in_chromium(example_run, tmp_path):
    _, report, _ = example_run
    html = report.read_text()
    assert external_references(html) == []  # nothing is fetched from the network
    dom, console = browser.render(report, tmp_path)
    assert 'class="main-svg"' in dom  # plotly drew the chart
    assert "9 of 9 layers" in dom  # the table script ran
    assert dom.count('<tr id="row-') == 9  # the graph input and the 8 layer outputs
    errors = [
        line
        for line in console.splitlines()
        if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)
    ]
    assert errors == []


@pytest.mark.slow
def test_hostile_names_are_escaped_in_html_and_csv(tmp_path):
    evil = '<img src=x onerror="alert(1)">'
    # MatMul+Add are fused into a Gemm before quantization: the names go on tensors that survive
    built = models.mlp(
        tmp_path, names={"mm": "../../m", "relu": evil, "y": '=HYPERLINK("http://x")'}
    )
    res = run_oneshot(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "2,4", str(built.input_path)])],
        working_dir=tmp_path / "w",
    )
    html = res.report.read_text()
    assert evil not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    dom, _ = browser.render(res.report, tmp_path)
    assert '<img src="x"' not in dom
    cells = pd.read_csv(res.verification_run / "summary.csv")["Name"].tolist()
    assert evil in cells and '\'=HYPERLINK("http://x")' in cells
    assert not any(str(c).startswith(("=", "+", "-", "@")) for c in cells)


@pytest.mark.slow
def test_config_file_with_command_line_override(tmp_path, capsys):
    built = models.planted_chain(tmp_path, layers=3, bad=1)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"framework: [onnx]\nmodel_path: {built.path}\ninput_tensor:\n  - [x, '1,3,16,16', {built.input_path}]\n"
        f"runtime: htp\ndefault_verifier: [[CosineSimilarity]]\nworking_dir: {tmp_path / 'w'}\noutput_dirname: fromfile\n"
    )
    code, _, err = run_cli(
        capsys, "--config", cfg, "--output_dirname", "fromcli", "--default_verifier", "SQNR"
    )
    assert code == 0, err
    opts = json.loads((tmp_path / "w" / "wrapper" / "fromcli" / "wrapper_options.json").read_text())
    assert opts["runtime"] == "htp" and opts["output_dirname"] == "fromcli"
    assert opts["default_verifier"] == [["SQNR"]]
    assert (
        "SQNR" in pd.read_csv(tmp_path / "w" / "verification" / "fromcli" / "summary.csv").columns
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"runtime": "htp", "no_such_option": 1}')
    code, _, err = run_cli(capsys, "--config", bad)
    assert code == 2 and "unknown option 'no_such_option'" in one_line_error(err)
    broken = tmp_path / "broken.json"
    broken.write_text('{"runtime": ')
    code, _, err = run_cli(capsys, "--config", broken)
    assert code == 2 and "line 1" in one_line_error(err)


@pytest.mark.slow
def test_golden_directory_skips_framework_diagnosis(tmp_path, capsys):
    built = models.planted_chain(tmp_path, layers=3, bad=1)
    args = [
        *built.flags(),
        "-w",
        tmp_path / "w",
    ]
    assert run_cli(capsys, *args, "--output_dirname", "first")[0] == 0
    golden = tmp_path / "w" / "framework_diagnosis" / "first"
    code, _, err = run_cli(
        capsys, *args, "--output_dirname", "second", "--golden_output_reference_directory", golden
    )
    assert code == 0, err
    assert not (tmp_path / "w" / "framework_diagnosis" / "second").exists()
    assert (
        len(pd.read_csv(tmp_path / "w" / "verification" / "second" / "summary.csv")) == 4
    )  # the graph input and the 3 layers


@pytest.mark.slow
def test_every_example_script_runs(tmp_path):
    out = tmp_path / "tiny"
    out.mkdir()
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "tiny_cnn" / "make_model.py"), str(out)],
        check=True,
    )
    for name in ("model.onnx", "input.raw", "input_list.txt"):
        assert (out / name).read_bytes() == (REPO / "examples" / "tiny_cnn" / name).read_bytes(), (
            name
        )
    scripts = sorted(p for p in (REPO / "examples").glob("*.py"))
    printed = {}
    for script in scripts:
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path / script.stem)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "ACCDBG_NO_PROGRESS": "1"},
        )
        assert proc.returncode == 0, (script, proc.stderr[-2000:])
        printed[script.stem] = proc.stdout
    # the fix search's example returns the candidates, the verified best first
    assert "best fix (verified on QNN HTP)" in printed["fix_search"]
    assert "per-channel weights: block1/conv.weight" in printed["fix_search"]


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").iterdir()))
@pytest.mark.slow
def test_sample_configs_run(config, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, _, err = run_cli(capsys, "--config", f"configs/{config}", "-w", tmp_path / "w")
    assert code == 0, err
    summary = next((tmp_path / "w" / "verification").glob("*/summary.csv"))
    assert len(pd.read_csv(summary)) == 9  # the graph input and every layer of the example


@pytest.mark.parametrize(
    "algorithm, folder, report",
    [
        ("layerwise", "layerwise_snooping", "layerwise.csv"),
        ("cumulative-layerwise", "cumulative_layerwise_snooping", "cumulative_layerwise.csv"),
    ],
)
@pytest.mark.slow
def test_wrapper_runs_the_snooping_algorithms(tmp_path, capsys, algorithm, folder, report):
    built = models.planted_chain(tmp_path, layers=4, bad=1)
    code, _, err = run_cli(
        capsys,
        *built.flags(),
        "-r",
        "htp",
        "--debugging_algorithm",
        algorithm,
        "-w",
        tmp_path / "w",
        "--output_dirname",
        "run",
    )
    assert code == 0, err
    table = pd.read_csv(tmp_path / "w" / folder / "run" / report, keep_default_na=False)
    assert list(table["O/P Name"]) == [f"layer{i}" for i in range(4)]
    # with the earlier error removed, only the planted layer is far off
    bad = table[table["CosineSimilarity"].astype(float) < 0.99]["O/P Name"].tolist()
    assert bad == ["layer1"]
    assert algorithm.split("-")[0] in (tmp_path / "w" / "wrapper" / "run" / "log.txt").read_text()
    assert (tmp_path / "w" / "framework_diagnosis" / "latest" / "tensors.json").is_file()


# ------------------------------------------------------------------ every input-list line


def _lines(tmp: Path, base: Path, n: int) -> list[Path]:
    """``n`` different images from ``base`` (shifted, rescaled, noisier)."""
    x = np.fromfile(base, np.float32)
    rng = np.random.default_rng(3)
    raws = []
    for i in range(n):
        p = tmp / f"in{i}.raw"
        (np.roll(x, 29 * i) * (1 + 0.7 * i) + rng.standard_normal(x.size) * 0.2 * i).astype(
            np.float32
        ).tofile(p)
        raws.append(p)
    return raws


def _run_with_list(capsys, tmp: Path, model: Path, raws: list[Path], i_file: Path):
    """Oneshot on QNN HTP of a 1x3x16x16 model with ``raws`` as the input list and ``i_file``
    as ``-i``: (exit code, stderr, working directory)."""
    lst = tmp / "list.txt"
    lst.write_text("".join(f"{r}\n" for r in raws))
    w = tmp / "w"
    code, _, err = run_cli(
        capsys,
        *("-f", "onnx", "-m", model, "-i", "x", "1,3,16,16", i_file),
        *("-l", lst, "-r", "htp", "-w", w, "--output_dirname", "run"),
    )
    return code, err, w


@pytest.mark.slow
def test_every_input_list_line_is_debugged_against_its_own_golden(tmp_path, capsys):
    built = models.planted_chain(tmp_path, layers=4, bad=1)
    raws = _lines(tmp_path, built.input_path, 3)
    code, err, w = _run_with_list(capsys, tmp_path, built.path, raws, built.input_path)
    assert code == 0, err
    # -i is not a list line: said once, and nothing is compared with its golden
    assert err.count("are not a line of -l") == 1
    golden, engine, ver = (
        w / c / "run" for c in ("framework_diagnosis", "inference_engine", "verification")
    )
    keys = [f"Result_{i}" for i in range(3)]
    assert sorted(p.name for p in golden.glob("Result_*")) == keys
    per = {}
    for i, key in enumerate(keys):
        g, t = TensorFolder(golden / key), TensorFolder(engine / "output" / key)
        assert g.meta["inputs"]["x"]["path"] == t.meta["inputs"]["x"]["path"] == str(raws[i])
        per[key] = pd.read_csv(ver / key / "summary.csv").set_index("Name")
        # one layer's score, recomputed from the dumped files of that same input
        assert per[key].loc["layer2", "CosineSimilarity"] == pytest.approx(
            _cos(g.load("layer2"), t.load("layer2")), abs=1e-6
        )
    # the aggregate: worst, median and worst input per layer, over the per-input summaries
    agg = pd.read_csv(ver / "summary.csv").set_index("Name")
    for label, worst_is_min in (("CosineSimilarity", True), ("SQNR", True)):
        values = pd.DataFrame({k: per[k][label] for k in keys})
        pick = values.min(axis=1) if worst_is_min else values.max(axis=1)
        np.testing.assert_allclose(agg.loc[values.index, label], pick, rtol=1e-12)
        np.testing.assert_allclose(
            agg.loc[values.index, f"{label}_median"], np.median(values.to_numpy(), axis=1)
        )
        assert list(agg.loc[values.index, f"{label}_worst_input"]) == list(values.idxmin(axis=1))
    # the culprit ranking looked at the input whose final output scores worst, and says so
    final = pd.Series({k: per[k].loc["layer3", "CosineSimilarity"] for k in keys})
    worst = final.idxmin()
    data = json.loads((ver / "summary.json").read_text())
    assert data["culprit_ranking_input"] == worst
    line = next(f for f in data["findings"] if "the culprit ranking is on the worst" in f)
    assert f"worst of 3 inputs: {worst} ({raws[keys.index(worst)]})" in line
    assert data["findings"][-1].startswith("fix: ")  # the best change measured on QNN, last
    assert "culprit #1: layer1 (Conv)" in "\n".join(data["findings"])
    # the report: a table of inputs linking to each input's own summary page
    html = (ver / "summary.html").read_text()
    for i, key in enumerate(keys):
        assert f'<a href="{key}/summary.html">{key}</a>' in html and str(raws[i]) in html
        assert (ver / key / "summary.html").is_file()
    assert f'href="{agg.loc["layer2", "SQNR_worst_input"]}/SQNR/layer2.html"' in html


@pytest.mark.slow
def test_an_input_whose_every_layer_loses_its_information_is_not_the_one_ranked(tmp_path, capsys):
    """Three inputs of the planted chain without biases, one of them 300 times dimmer (the
    same image, smaller): its values use a small part of the ranges the encodings were
    calibrated for, so its outputs score worst, and on it every layer fails 20 dB (its
    per-input summary). No layer can stand out there: the ranking is on the next worst input,
    names the planted layer, and says why."""

    def edit(i, w, b):  # no biases: a dimmer input is the same image, smaller
        b[:] = 0.0
        if i == 1:  # the planted chain's dead channel with 40x weights
            w[0] *= 40.0
            b[0] = -1000.0

    path, x_path = tmp_path / "m.onnx", tmp_path / "x.raw"
    models._relu_chain(path, x_path, 4, 16, 16, 11, 0.0, edit)
    raws = _lines(tmp_path, x_path, 3)
    dim = raws[1]
    (np.fromfile(dim, np.float32) / 300).tofile(dim)
    code, err, w = _run_with_list(capsys, tmp_path, path, raws, raws[0])
    assert code == 0, err
    ver = w / "verification" / "run"
    per = {
        k: pd.read_csv(ver / k / "summary.csv").set_index("Name")
        for k in ("Result_0", "Result_1", "Result_2")
    }
    final = pd.Series({k: t.loc["layer3", "SQNR"] for k, t in per.items()})
    assert final.idxmin() == "Result_1"  # the dim input scores worst...
    assert float(np.median(per["Result_1"]["SQNR"].dropna())) < 20  # ...and every layer fails there
    data = json.loads((ver / "summary.json").read_text())
    second = final.drop("Result_1").idxmin()
    assert data["culprit_ranking_input"] == second
    line = next(f for f in data["findings"] if f.startswith("the culprit ranking is on"))
    assert f"the culprit ranking is on {second} (" in line
    assert "whose layers keep their information: on the worst, Result_1, the median layer" in line
    assert "culprit #1: layer1 (Conv)" in "\n".join(data["findings"])


@pytest.mark.slow
def test_example_with_an_input_list_and_a_golden_of_one_input(tmp_path, capsys):
    """The tiny example: -i is one of the list's lines; a given golden of one input is
    compared with that input's result only."""
    example = REPO / "examples" / "tiny_cnn"
    raws = [example / "input.raw", *_lines(tmp_path, example / "input.raw", 3)[1:]]
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"image:={r}\n" for r in reversed(raws)))  # -i's file is line 3
    w = tmp_path / "w"
    base = ("-f", "onnx", "-m", example / "model.onnx", "-i", "image", "1,3,32,32", raws[0])
    code, _, err = run_cli(capsys, *base, "-l", lst, "-w", w, "--output_dirname", "all")
    assert code == 0, err
    assert "not a line of -l" not in err
    assert "culprit #1: block1/conv/relu (Conv) - weight range" in err
    data = json.loads((w / "verification" / "all" / "summary.json").read_text())
    assert data["aggregate_of"] == ["Result_0", "Result_1", "Result_2"]
    # a golden of the -i input alone: only its own result (line 3, Result_2) is compared
    code, _, err = run_cli(
        capsys, "--framework_diagnosis", *base, "-w", w, "--output_dirname", "one"
    )
    assert code == 0, err
    code, _, err = run_cli(
        capsys,
        *base,
        *("-l", lst, "-w", w, "--output_dirname", "given"),
        *("--golden_output_reference_directory", w / "framework_diagnosis" / "one"),
    )
    assert code == 0, err
    assert "not compared (other inputs): Result_0" in err
    ver = w / "verification" / "given"
    summary = json.loads((ver / "summary.json").read_text())
    assert summary["target_inputs"]["image"]["path"] == str(raws[0])
    assert summary["target"].endswith("Result_2")


def text_line(text: str, path: Path) -> Path:
    """A 1x3x48x320 text-line image as PP-OCR's recognizer takes it: black text on white,
    rendered by matplotlib's bundled font, scaled to [-1, 1]."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2, 0.48), dpi=100)
    canvas = FigureCanvasAgg(fig)
    fig.text(0.03, 0.5, text, fontsize=22, va="center", family="DejaVu Sans")
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[..., :3].astype(np.float32) / 255
    assert rgb.shape == (48, 320, 3)
    ((rgb - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32).tofile(path)
    return path


def ctc_decode(probs: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC: best class per time step, repeats merged, blanks (class 0) dropped."""
    best = probs.reshape(-1, probs.shape[-1]).argmax(-1)
    keep = [b for i, b in enumerate(best) if b != 0 and (i == 0 or b != best[i - 1])]
    return "".join(characters[b] for b in keep)


@pytest.fixture(scope="module")
def ppocr_rec_oneshot(tmp_path_factory, ppocr_rec):
    """PP-OCRv4 rec exactly as rapidocr-onnxruntime ships it (its metadata made onnxruntime's
    QNN pre-processing crash), oneshot on two text lines, the first the -i file."""
    import hashlib

    import onnxruntime as ort

    tmp = tmp_path_factory.mktemp("ppocr_rec")
    digest = hashlib.sha256(ppocr_rec.read_bytes()).hexdigest()
    lines = [text_line("HELLO 2024", tmp / "hello.raw"), text_line("QNN 48x320", tmp / "qnn.raw")]
    lst = tmp / "list.txt"
    lst.write_text("".join(f"{p}\n" for p in lines))
    inp = [parse_input_tensor(["x", "1,3,48,320", str(lines[0])])]
    res = run_oneshot("onnx", ppocr_rec, inp, input_list=lst, working_dir=tmp / "w")
    sess = ort.InferenceSession(str(ppocr_rec), providers=["CPUExecutionProvider"])
    references = [  # the float model on onnxruntime's CPU, per list line
        sess.run(None, {"x": np.fromfile(p, np.float32).reshape(1, 3, 48, 320)})[0] for p in lines
    ]
    model = onnx.load(str(ppocr_rec))
    meta = {p.key: p.value for p in model.metadata_props}
    # PaddleOCR's class list: blank, the dictionary, space
    characters = ["", *meta["character"].split("\n"), " "]
    return res, model, meta, references, characters, digest


@pytest.mark.slow
def test_real_rec_model_with_metadata_runs_as_shipped(ppocr_rec_oneshot, ppocr_rec):
    import hashlib

    res, model, meta, references, characters, digest = ppocr_rec_oneshot
    assert hashlib.sha256(ppocr_rec.read_bytes()).hexdigest() == digest  # the user's file untouched
    assert [r.shape for r in references] == [(1, 40, 6625)] * 2 and len(characters) == 6625
    texts = [ctc_decode(r, characters) for r in references]
    assert texts == ["HELLO 2024", "QNN 48x320"]  # the inputs are what they claim
    # framework diagnosis: one golden per list line, every non-Constant node output, the final
    # one the float model's
    outputs = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output]
    for i, reference in enumerate(references):
        line = TensorFolder(res.golden_dir / f"Result_{i}")
        assert set(line.names()) == set(outputs)
        np.testing.assert_allclose(line.load("softmax_11.tmp_0"), reference, atol=1e-5)
    golden = TensorFolder(res.golden_dir / "Result_0")
    # the engine: every quantized activation of its QDQ model dumped, for both list lines
    qdq = onnx.load(str(next(res.engine_run.glob("*.qdq.onnx"))))
    inputs = {i.name for i in qdq.graph.input}
    acts = {n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"} - inputs
    assert {p.key: p.value for p in qdq.metadata_props}.items() >= meta.items()  # kept
    steps = json.loads((res.engine_run / "preprocessing.json").read_text())
    assert any("QNN pre-processing fused" in s for s in steps)
    assert any("2 calibration input(s)" in s for s in steps)
    results = sorted((res.engine_run / "output").glob("Result_*"))
    assert [r.name for r in results] == ["Result_0", "Result_1"]
    for result, reference, text in zip(results, references, texts, strict=True):
        target = TensorFolder(result)
        assert {r.extra["qdq_tensor"] for r in target} == acts and len(acts) > 300
        # the final output from QNN HTP: a softmax of the float model's shape that reads the
        # same text (8-bit noise moves probabilities, not most of the best classes)
        out = np.asarray(target.load("softmax_11.tmp_0"), np.float64)
        assert out.shape == reference.shape
        assert out.min() >= 0 and out.max() <= 1
        np.testing.assert_allclose(out.sum(-1), 1, atol=0.1)
        assert (out.argmax(-1) == reference.argmax(-1)).mean() >= 0.75
        assert ctc_decode(out, characters).strip() == text
    # verification: one row per dumped tensor that has a golden, all compared
    first = TensorFolder(results[0])
    rows = res.summary[res.summary["LayerType"] != "graph input"]
    assert set(rows["Name"]) <= set(first.names()) & set(golden.names())
    assert len(res.summary) > 300 and res.summary["CosineSimilarity"].notna().all()


def test_int_and_bool_tensors_feed_the_backend_comparison_as_they_are(tmp_path, caplog):
    """magika reads bytes as a one-hot (int ids, an Equal's bool, a Cast): those tensors are
    dumped unquantized and fed to the CPU fake-quant of each layer as the graph holds them, not
    as float (which onnxruntime refused: the whole backend comparison was lost)."""
    built = models.one_hot_dense(tmp_path)
    inp = [parse_input_tensor(["ids", "1,16", str(built.input_path), "int32"])]
    with caplog.at_level("INFO"):
        res = run_oneshot("onnx", built.path, inp, working_dir=tmp_path / "w")
    assert "CPU fake-quant failed" not in caplog.text
    kernels = [f for f in res.findings if f.startswith("QNN's kernels add")]
    assert kernels and "in onnxruntime's CPU fake-quant of the same QDQ model" in kernels[0]
    s = res.summary.set_index("Name")
    assert s.loc["hot", "CosineSimilarity"] == pytest.approx(1.0)  # the flags are exact


def test_float16_tensors_feed_the_backend_comparison_as_float16(tmp_path, caplog):
    """slovorez computes part of its graph in float16, which the quantizer leaves as it is:
    those dumps were fed to the CPU fake-quant of each layer as float32, which onnxruntime
    refused (the whole backend comparison was lost)."""
    built = models.half_island(tmp_path)
    inp = [parse_input_tensor(["x", "1,3,8", str(built.input_path)])]
    with caplog.at_level("INFO"):
        res = run_oneshot("onnx", built.path, inp, working_dir=tmp_path / "w")
    assert "CPU fake-quant failed" not in caplog.text
    kernels = [f for f in res.findings if f.startswith("QNN's kernels add")]
    assert kernels and "in onnxruntime's CPU fake-quant of the same QDQ model" in kernels[0]


def test_a_scalar_tensor_and_a_clip_with_computed_bounds_keep_the_cpu_comparisons(tmp_path, caplog):
    """openWakeWord's mel front end: its peak is a 0-d tensor (numpy made the re-quantized dump
    a scalar, which onnxruntime refused as a feed: no backend comparison) and its Clip's floor is
    computed (the sensitivity read it as a constant: no output sensitivity)."""
    built = models.floor_clip(tmp_path)
    inp = [parse_input_tensor(["x", "1,16,8", str(built.input_path)])]
    with caplog.at_level("INFO"):
        res = run_oneshot("onnx", built.path, inp, working_dir=tmp_path / "w")
    assert "CPU fake-quant failed" not in caplog.text
    assert "CPU simulation failed" not in caplog.text
    assert any(f.startswith("QNN's kernels add") for f in res.findings), res.findings
    assert "peak" in set(res.summary["Name"])  # the scalar was compared


def test_a_clip_with_computed_bounds_is_no_folded_activation(tmp_path):
    """The sensitivity keeps a Relu/Clip the quantizer folded into an encoding; a Clip whose
    floor is computed is never folded (it read the floor as a constant: KeyError, and the model
    lost its output sensitivity)."""
    from onnx import helper

    from accdbg.algorithms.diagnosis.sensitivity import folded_activations

    model = onnx.load(str(models.floor_clip(tmp_path).path))
    made_by_dq = {"y": helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])}
    assert folded_activations(model, made_by_dq) == {}
    relu = helper.make_node("Relu", ["db"], ["r"])
    model.graph.node.append(relu)
    assert folded_activations(model, {"r": made_by_dq["y"]}) == {"r": (0.0, None)}


@pytest.mark.slow
def test_the_outputs_an_input_list_names_are_the_ones_judged(tmp_path, capsys):
    """The input list's '#' line (qnn-net-run's convention, with -o's) names the outputs the
    end-to-end run judges: the verdict and the table of inputs are about logits_pre (the
    logits the example's softmax hides; they fail SQNR where probs pass), not the graph's."""
    example = REPO / "examples" / "tiny_cnn"
    listing = tmp_path / "list.txt"
    listing.write_text(f"#logits_pre\nimage:={example / 'input.raw'}\n")
    code, _, err = run_cli(
        capsys, "-f", "onnx", "-m", example / "model.onnx", "-i", "image", "1,3,32,32",
        example / "input.raw", "-l", listing, "-r", "htp", "-w", tmp_path / "w",
        "--no_model_explorer",
    )  # fmt: skip
    assert code == 0, err
    assert "outputs failing their threshold: logits_pre SQNR" in err, err
    summary = pd.read_csv(tmp_path / "w" / "verification" / "latest" / "summary.csv")
    row = summary[summary["Name"] == "logits_pre"].iloc[0]
    assert f"logits_pre SQNR {row['SQNR']:.4g}" in err  # the verdict is that row's score
