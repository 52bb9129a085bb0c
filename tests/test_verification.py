"""Verification end to end: real PP-OCRv4 det dumps, several inputs, engine against engine,
tensor mappings, verifier configs, hostile names and bad inputs."""

import csv
import json
import math
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize

from accdbg.core import onnx_model as om
from accdbg.core.imports import qnn_quantization
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder, TensorWriter
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.mapping.qnn_json import qnn_sanitize
from accdbg.verifiers.verification import run_verification
from tests import models
from tests.helpers import one_line_error, run_cli

ALL = [
    "CosineSimilarity",
    "SQNR",
    "MSE",
    "MAE",
    "RtolAtol",
    "AdjustedRtolAtol",
    "ScaledDiff",
    "TopK",
    "L1Error",
]


# ------------------------------------------------------------------ an engine stand-in


class _Feeds(CalibrationDataReader):
    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def quantize_qdq(
    model_path: Path, input_name: str, dims, raws, out: Path, act=QuantType.QUInt8
) -> Path:
    """The model with static dims, onnxruntime's basic fusions, and QNN-style QDQ nodes."""
    model = om.load_model(model_path)
    om.fix_input_shapes(model, {input_name: tuple(dims)})
    static = out.with_suffix(".static.onnx")
    onnx.save(om.infer_shapes(model), str(static))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(out.with_suffix(".opt.onnx"))
    ort.InferenceSession(str(static), so, providers=["CPUExecutionProvider"])
    feeds = [{input_name: np.fromfile(r, np.float32).reshape(dims)} for r in raws]
    cfg = qnn_quantization().get_qnn_qdq_config(
        str(out.with_suffix(".opt.onnx")),
        _Feeds(feeds),
        activation_type=act,
        weight_type=QuantType.QUInt8,
    )
    quantize(str(out.with_suffix(".opt.onnx")), str(out), cfg)
    return out


def fake_quant_dump(qdq: Path, input_name: str, dims, raw: Path, work: Path, dest: Path) -> Path:
    """What an engine dumps: each float activation, dequantized, under its float name, with
    its encoding (scale, offset = -zero point, bitwidth) in the manifest."""
    res = run_framework_diagnosis(
        "onnx",
        qdq,
        [parse_input_tensor([input_name, ",".join(map(str, dims)), str(raw)])],
        working_dir=work,
    )
    dump = TensorFolder(res.run_dir)
    model = onnx.load(str(qdq))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    quant = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    dequant = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    w = TensorWriter(dest)
    for rec in dump:
        q = quant.get(rec.name)
        if (
            rec.op_type in ("QuantizeLinear", "DequantizeLinear")
            or q is None
            or q.output[0] not in dequant
        ):
            continue
        zp = inits[q.input[2]]
        w.write(
            rec.name,
            dump.load(dequant[q.output[0]].output[0]),
            node=rec.node,
            op_type=rec.op_type,
            index=rec.index,
            scale=float(inits[q.input[1]]),
            offset=-int(zp),
            bitwidth=8 * zp.dtype.itemsize,
        )
    w.save_manifest()
    shutil.rmtree(res.run_dir)
    return dest


def graph_struct_of(model_path: Path, dest: Path) -> Path:
    model = onnx.load(str(model_path))
    layers = [
        {
            "index": i,
            "name": n.name,
            "type": n.op_type,
            "inputs": list(n.input),
            "outputs": list(n.output),
        }
        for i, n in enumerate(om.topological_nodes(model.graph))
        if n.op_type != "Constant"
    ]
    dest.write_text(
        json.dumps({"format": "accdbg-graph-struct/1", "model": model_path.stem, "layers": layers})
    )
    return dest


def _raw(folder: Path, name: str) -> np.ndarray:
    rec = TensorFolder(folder).records[name]
    return np.fromfile(folder / rec.file, np.float32).astype(np.float64)


# ------------------------------------------------------------------ PP-OCRv4 det


@pytest.fixture(scope="module")
def det(tmp_path_factory, ppocr_det, ppocr_small_input):
    """Golden: framework diagnosis of the real model. Target: its 8-bit QNN-style QDQ
    version, every activation dequantized (as the inference engine dumps them)."""
    tmp = tmp_path_factory.mktemp("det")
    t0 = time.perf_counter()
    golden = run_framework_diagnosis(
        "onnx",
        ppocr_det,
        [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])],
        working_dir=tmp / "w",
        output_dirname="golden",
    )
    golden_seconds = time.perf_counter() - t0
    qdq = quantize_qdq(ppocr_det, "x", (1, 3, 160, 160), [ppocr_small_input], tmp / "det_qdq.onnx")
    target = fake_quant_dump(
        qdq, "x", (1, 3, 160, 160), ppocr_small_input, tmp / "w", tmp / "target"
    )
    return {
        "tmp": tmp,
        "golden": golden.run_dir,
        "target": target,
        "golden_seconds": golden_seconds,
        "graph_struct": graph_struct_of(ppocr_det, tmp / "ch_PP-OCRv4_det_infer_graph_struct.json"),
    }


def test_ppocr_det_summary_complete_ordered_and_correct(det):
    res = run_verification(
        det["golden"],
        det["target"],
        ALL,
        graph_struct=det["graph_struct"],
        working_dir=det["tmp"] / "w",
        output_dirname="all",
    )
    s = res.summary
    target = TensorFolder(det["target"])
    golden = TensorFolder(det["golden"])
    # every target tensor with a golden counterpart is a row, every verifier filled, in execution order
    shared = [n for n in target.names() if n in golden.records]
    assert sorted(s["Name"]) == sorted(shared) and len(shared) > 250
    assert list(s.columns[:4]) == ["Name", "LayerType", "Size", "Tensor_dims"]
    assert list(s.columns[4 : 4 + len(ALL)]) == ALL
    assert list(s.columns[4 + len(ALL) : 8 + len(ALL)]) == [
        "golden_min",
        "golden_max",
        "target_min",
        "target_max",
    ]
    compared = s["Status"].isin(["ok", "fail"])  # no note: every pair compared in full
    assert compared.all(), s[~compared][["Name", "Status"]]
    assert ((s["Status"] == "fail") == (s["Failed"] != "")).all()
    assert not s[ALL].isna().any().any()
    layers = json.loads(det["graph_struct"].read_text())["layers"]
    position = {o: i for i, layer in enumerate(layers) for o in layer["outputs"]}
    kind = {o: layer["type"] for layer in layers for o in layer["outputs"]}
    assert [position[n] for n in s["Name"]] == sorted(position[n] for n in s["Name"])
    assert list(s["LayerType"]) == [kind[n] for n in s["Name"]]
    # values: recomputed here from the raw files for a sample of rows
    for i in range(0, len(s), 37):
        row = s.iloc[i]
        g, t = _raw(golden.root, row["Name"]), _raw(target.root, row["Name"])
        d = g - t
        assert row["CosineSimilarity"] == pytest.approx(
            g @ t / np.linalg.norm(g) / np.linalg.norm(t), rel=1e-9
        )
        assert row["SQNR"] == pytest.approx(10 * np.log10(np.sum(g * g) / np.sum(d * d)), rel=1e-9)
        assert row["MAE"] == pytest.approx(np.mean(np.abs(d)), rel=1e-9)
        scale = target.records[row["Name"]].extra["scale"]
        assert row["ScaledDiff"] == pytest.approx(np.mean(np.abs(d)) / scale, rel=1e-9)
        assert row["golden_min"] == g.min() and row["target_max"] == t.max()
        assert row["Size"] == g.size and row["Tensor_dims"] == target.records[row["Name"]].shape

    # the files say the same
    out = res.run_dir
    assert (out.parent / "latest").resolve() == out.resolve()
    csv_df = pd.read_csv(out / "summary.csv")
    assert list(csv_df["Name"]) == list(s["Name"])
    np.testing.assert_allclose(csv_df["CosineSimilarity"], s["CosineSimilarity"], rtol=1e-12)
    js = json.loads((out / "summary.json").read_text())
    assert js["columns"] == list(s.columns)
    assert [r["Name"] for r in js["rows"]] == list(s["Name"])
    assert js["rows"][0]["Tensor_dims"] == s["Tensor_dims"].iloc[0]
    assert sorted(js["not_compared"]["target_only"]) == sorted(
        n for n in target.names() if n not in shared
    )
    verdicts = js["passed"]["CosineSimilarity"]
    assert verdicts == [bool(v >= 0.99) for v in s["CosineSimilarity"]]
    html = (out / "summary.html").read_text()
    n_fail = sum(v is False for col in js["passed"].values() for v in col)
    assert html.count('class="fail"') == n_fail and "<script" not in html
    name = s["Name"].iloc[5]
    with open(out / "RtolAtol" / f"{name}.csv") as fh:
        detail = list(csv.DictReader(fh))[0]
    assert float(detail["value"]) == s["RtolAtol"].iloc[5]
    assert detail["Name"] == name and int(detail["elements"]) == s["Size"].iloc[5]
    assert (out / "TopK" / f"{name}.html").is_file()
    opts = json.loads((out / "verification_options.json").read_text())
    assert opts["default_verifier"] == ALL and opts["graph_struct"] == str(det["graph_struct"])


def test_ppocr_det_streams_from_disk(det):
    """Peak memory stays near one tensor pair, far below the dumps' size, and verifying takes
    less time than producing the golden dump alone."""
    golden = TensorFolder(det["golden"])
    total = sum(r.size * 4 for r in golden)
    largest = max(r.size for r in golden) * 8
    tracemalloc.start()
    t0 = time.perf_counter()
    res = run_verification(
        det["golden"],
        det["target"],
        ["CosineSimilarity"],
        working_dir=det["tmp"] / "w",
        output_dirname="mem",
    )
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(res.summary) > 250
    assert peak < 12 * largest, (peak, largest)  # a handful of float64 copies of one pair
    assert peak < total / 4, (peak, total)
    print(
        f"verification {seconds:.2f} s, golden dump {det['golden_seconds']:.2f} s, peak {peak / 1e6:.0f} MB"
    )


def test_ppocr_det_against_itself_is_perfect(det):
    res = run_verification(
        det["golden"],
        det["golden"],
        ["CosineSimilarity", "SQNR", "MSE", "TopK"],
        working_dir=det["tmp"] / "w",
        output_dirname="self",
    )
    s = res.summary
    assert len(s) == len(TensorFolder(det["golden"]))
    assert (
        (s["CosineSimilarity"] == 1.0).all()
        and (s["SQNR"] == math.inf).all()
        and (s["MSE"] == 0).all()
    )
    js = json.loads((res.run_dir / "summary.json").read_text())
    assert {r["SQNR"] for r in js["rows"]} == {"inf"}  # JSON has no infinity: spelled out
    assert "inf" in (res.run_dir / "summary.csv").read_text().splitlines()[1]
    # golden order: the manifest's topological index
    idx = [TensorFolder(det["golden"]).records[n].index for n in s["Name"]]
    assert idx == sorted(idx)


# ------------------------------------------------------------------ several inputs, engines


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small CNN, two inputs, float golden per input and 8-bit and 16-bit engine-like runs."""
    tmp = tmp_path_factory.mktemp("small")
    built = models.conv_net(tmp, channels=6, size=12, layers=3, seed=2)
    rng = np.random.default_rng(11)
    raws = []
    for i in range(2):
        p = tmp / f"x{i}.raw"
        (rng.standard_normal((1, 3, 12, 12)) * (1 + i)).astype(np.float32).tofile(p)
        raws.append(p)
    q8 = quantize_qdq(built.path, "x", (1, 3, 12, 12), raws, tmp / "q8.onnx")
    q16 = quantize_qdq(
        built.path, "x", (1, 3, 12, 12), raws, tmp / "q16.onnx", act=QuantType.QUInt16
    )
    runs = {}
    for tag, qdq in (("q8", q8), ("q16", q16)):
        for i, raw in enumerate(raws):
            fake_quant_dump(
                qdq, "x", (1, 3, 12, 12), raw, tmp / "w", tmp / tag / "output" / f"Result_{i}"
            )
        runs[tag] = tmp / tag
    golden = tmp / "golden" / "output"
    for i, raw in enumerate(raws):
        r = run_framework_diagnosis(
            "onnx",
            built.path,
            [parse_input_tensor(["x", "1,3,12,12", str(raw)])],
            working_dir=tmp / "w",
            output_dirname=f"g{i}",
        )
        shutil.copytree(r.run_dir, golden / f"Result_{i}")
    return {"tmp": tmp, "model": built.path, "golden": golden, **runs, "raws": raws}


def test_several_inputs_verified_each_and_aggregated(small):
    res = run_verification(
        small["golden"],
        small["q8"] / "output",
        ["CosineSimilarity", "MSE"],
        working_dir=small["tmp"] / "w",
        output_dirname="multi",
    )
    assert set(res.per_input) == {"Result_0", "Result_1"}
    for key, df in res.per_input.items():
        saved = pd.read_csv(res.run_dir / key / "summary.csv")
        assert list(saved["Name"]) == list(df["Name"])
        row = df.set_index("Name").loc["relu1"]
        g = _raw(small["golden"] / key, "relu1")
        t = _raw(small["q8"] / "output" / key, "relu1")
        assert row["MSE"] == pytest.approx(np.mean((g - t) ** 2), rel=1e-9)
        assert (res.run_dir / key / "CosineSimilarity" / "relu1.csv").is_file()
    agg = res.aggregate.set_index("Name")
    assert res.summary is res.aggregate
    both = pd.concat([d.set_index("Name") for d in res.per_input.values()])
    for name in agg.index:
        cs, mse = both.loc[name, "CosineSimilarity"], both.loc[name, "MSE"]
        assert agg.loc[name, "CosineSimilarity"] == pytest.approx(cs.min())  # worst: the lowest
        assert agg.loc[name, "CosineSimilarity_mean"] == pytest.approx(cs.mean())
        assert agg.loc[name, "CosineSimilarity_median"] == pytest.approx(np.median(cs.to_numpy()))
        assert agg.loc[name, "MSE_median"] == pytest.approx(np.median(mse.to_numpy()))
        assert agg.loc[name, "MSE"] == pytest.approx(mse.max())  # worst: the highest
        worst = (
            "Result_0"
            if both.loc[name, "MSE"].iloc[0] >= both.loc[name, "MSE"].iloc[1]
            else "Result_1"
        )
        assert agg.loc[name, "MSE_worst_input"] == worst
        assert agg.loc[name, "Inputs"] == 2
    top = pd.read_csv(res.run_dir / "summary.csv")
    assert list(top.columns[:6]) == [
        "Name",
        "LayerType",
        "Size",
        "Tensor_dims",
        "CosineSimilarity",
        "MSE",
    ]
    assert list(top["Name"]) == list(res.per_input["Result_0"]["Name"])


def test_engine_against_engine_exact_names(small):
    # a tensor mapping beside the target run must not be used: engine runs share names
    (small["q16"] / "tensor_mapping.json").write_text(json.dumps({"relu0": "relu1"}))
    res = run_verification(
        small["q8"],
        small["q16"],
        ["CosineSimilarity", "SQNR"],
        working_dir=small["tmp"] / "w",
        output_dirname="engines",
    )
    assert set(res.per_input) == {"Result_0", "Result_1"}
    for key in ("Result_0", "Result_1"):
        df = res.per_input[key].set_index("Name")
        assert (df.index == df["Golden_name"]).all()
        g = _raw(small["q8"] / "output" / key, "relu0")
        t = _raw(small["q16"] / "output" / key, "relu0")
        assert df.loc["relu0", "SQNR"] == pytest.approx(
            10 * np.log10(np.sum(g**2) / np.sum((g - t) ** 2)), rel=1e-9
        )
    assert (
        "tensor_mapping" not in json.loads((res.run_dir / "verification_options.json").read_text())
        or json.loads((res.run_dir / "verification_options.json").read_text())["tensor_mapping"]
        is None
    )
    # 16 bits is closer to float than 8 bits: the engine comparison sees the 8-bit error
    f8 = run_verification(
        small["golden"], small["q8"], ["SQNR"], working_dir=small["tmp"] / "w"
    ).summary
    f16 = run_verification(
        small["golden"], small["q16"], ["SQNR"], working_dir=small["tmp"] / "w"
    ).summary
    assert (f16["SQNR"].to_numpy() > f8["SQNR"].to_numpy()).all()


def test_cli_both_spellings_and_parameter_syntaxes(capsys, small):
    gs = graph_struct_of(small["model"], small["tmp"] / "gs.json")
    code, _, err = run_cli(
        capsys,
        "--verification",
        "--defaultVerifier",
        "CosineSimilarity",
        "--default_verifier",
        "rtolatol,rtolmargin,0.05,atolmargin,0.05",
        "--default_verifier",
        "TopK",
        "k",
        "3",
        "ordered",
        "true",
        "--framework_results",
        small["golden"] / "Result_1",
        "--inferenceResults",
        small["q8"] / "output" / "Result_1",
        "--graphStruct",
        gs,
        "-w",
        small["tmp"] / "cli",
        "--output_dirname",
        "run",
        "-v",
    )
    assert code == 0, err
    out = small["tmp"] / "cli" / "verification" / "run"
    df = pd.read_csv(out / "summary.csv")
    assert list(df.columns[4:7]) == [
        "CosineSimilarity",
        "RtolAtol",
        "TopK",
    ]  # the reference's names
    g, t = (
        _raw(small["golden"] / "Result_1", "relu2"),
        _raw(small["q8"] / "output" / "Result_1", "relu2"),
    )
    row = df.set_index("Name").loc["relu2"]
    assert row.iloc[4] == pytest.approx(100 * np.mean(~np.isclose(t, g, rtol=0.05, atol=0.05)))
    assert (out / "RtolAtol").is_dir() and (out / "TopK" / "relu2.csv").is_file()
    meta = json.loads((out / "summary.json").read_text())["verifiers"]
    assert meta[1]["parameters"] == {"rtolmargin": 0.05, "atolmargin": 0.05}
    assert meta[2]["parameters"] == {"k": 3, "ordered": True}
    opts = json.loads((out / "verification_options.json").read_text())
    assert opts["default_verifier"][2] == ["TopK", "k", "3", "ordered", "true"]
    log = (out / "log.txt").read_text()
    assert "tensor pairs" in log and "graph_struct" in log
    assert "verification:" in err  # the closing line on the console


# ------------------------------------------------------------------ names and mappings


@pytest.fixture
def dotted(tmp_path):
    """A model with Paddle-style dotted names; the target uses QNN's sanitized names."""
    built = models.mlp(
        tmp_path,
        names={"mm": "mm.tmp_0", "add": "add.tmp_1", "relu": "relu.tmp_0", "y": "out.tmp_0"},
    )
    g = run_framework_diagnosis(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "2,4", str(built.input_path)])],
        working_dir=tmp_path / "w",
        output_dirname="g",
    )
    w = TensorWriter(tmp_path / "engine" / "output" / "Result_0")
    golden = TensorFolder(g.run_dir)
    for i, rec in enumerate(golden):
        w.write(qnn_sanitize(rec.name), golden.load(rec.name) * (1 + 0.01 * i), index=rec.index)
    w.save_manifest()
    return built, golden, tmp_path / "engine"


def test_tensor_mapping_file_either_direction(tmp_path, dotted):
    built, golden, engine = dotted
    with pytest.raises(AccdbgError, match="no tensor of .* matches .* pass --tensor_mapping or -m"):
        run_verification(golden.root, engine / "output" / "Result_0", working_dir=tmp_path / "w")
    forward = {qnn_sanitize(n): n for n in golden.names()}
    forward["ghost_0"] = "ghost.0"  # the engine dumped a tensor the framework did not
    del forward["relu_tmp_0"]  # unmapped: not compared
    (tmp_path / "map.json").write_text(json.dumps(forward))
    (tmp_path / "rev.json").write_text(json.dumps({v: k for k, v in forward.items()}))
    for mapping in (tmp_path / "map.json", tmp_path / "rev.json"):
        s = run_verification(
            golden.root,
            engine / "output" / "Result_0",
            ["MAE"],
            tensor_mapping=mapping,
            working_dir=tmp_path / "w",
        ).summary.set_index("Name")
        assert list(s.index) == ["mm_tmp_0", "add_tmp_1", "out_tmp_0"]
        assert s.loc["add_tmp_1", "Golden_name"] == "add.tmp_1"
        g = golden.load("add.tmp_1").astype(np.float64)
        assert s.loc["add_tmp_1", "MAE"] == pytest.approx(np.mean(np.abs(g * 0.01)), rel=1e-5)


def test_tensor_mapping_discovered_beside_the_engine_output(tmp_path, dotted):
    built, golden, engine = dotted
    (engine / "tensor_mapping.json").write_text(
        json.dumps({qnn_sanitize(n): n for n in golden.names()})
    )
    res = run_verification(
        golden.root, engine / "output" / "Result_0", ["MAE"], working_dir=tmp_path / "w"
    )
    assert len(res.summary) == 4
    assert (
        "found beside the inference results"
        in json.loads((res.run_dir / "verification_options.json").read_text())["tensor_mapping"]
    )


def test_tensor_mapping_built_from_the_model(capsys, tmp_path, dotted):
    built, golden, engine = dotted
    code, _, err = run_cli(
        capsys,
        "--verification",
        "--default_verifier",
        "MAE",
        "--golden_output_reference_directory",
        golden.root,
        "--inference_results",
        engine,
        "-m",
        built.path,
        "-f",
        "onnx",
        "-e",
        "QNN",
        "-w",
        tmp_path / "w",
        "--output_dirname",
        "built",
    )
    assert code == 0, err
    out = tmp_path / "w" / "verification" / "built"
    assert json.loads((out / "tensor_mapping.json").read_text()) == {
        qnn_sanitize(n): n for n in golden.names()
    }
    df = pd.read_csv(out / "summary.csv")
    assert list(df["Golden_name"]) == ["mm.tmp_0", "add.tmp_1", "relu.tmp_0", "out.tmp_0"]
    code, _, err = run_cli(
        capsys,
        "--verification",
        "--golden_output_reference_directory",
        golden.root,
        "--inference_results",
        engine,
        "-m",
        built.path,
        "-e",
        "snpe",
        "-w",
        tmp_path / "w",
    )
    assert code == 2 and "-e/--engine 'snpe' is not supported" in one_line_error(err)


def test_graph_struct_orders_rows_and_names_layer_types(tmp_path, dotted):
    built, golden, engine = dotted
    mapping = {qnn_sanitize(n): n for n in golden.names()}
    order = ["out_tmp_0", "mm_tmp_0", "relu_tmp_0", "add_tmp_1"]  # not the golden's order
    gs = tmp_path / "gs.json"
    gs.write_text(
        json.dumps(
            {
                "layers": [
                    {"index": i, "name": f"n{i}", "type": f"Op{i}", "outputs": [o]}
                    for i, o in enumerate(order)
                ]
            }
        )
    )
    s = run_verification(
        golden.root,
        engine,
        ["MAE"],
        tensor_mapping=mapping,
        graph_struct=gs,
        working_dir=tmp_path / "w",
    ).summary
    assert list(s["Name"]) == order and list(s["LayerType"]) == ["Op0", "Op1", "Op2", "Op3"]
    s2 = run_verification(
        golden.root, engine, ["MAE"], tensor_mapping=mapping, working_dir=tmp_path / "w"
    ).summary
    assert list(s2["Name"]) == ["mm_tmp_0", "add_tmp_1", "relu_tmp_0", "out_tmp_0"]  # golden index
    assert list(s2["LayerType"]) == ["MatMul", "Add", "Relu", "MatMul"]  # golden op types


def test_one_golden_against_several_results_warns(tmp_path, small):
    res = run_verification(
        small["golden"] / "Result_0", small["q8"], ["CosineSimilarity"], working_dir=tmp_path / "w"
    )
    assert "every Result_N is compared with it" in (res.run_dir / "log.txt").read_text()
    assert set(res.per_input) == {"Result_0", "Result_1"} and res.aggregate is not None


# ------------------------------------------------------------------ verifier config


def _detections(root: Path, shift: float, scores):
    w = TensorWriter(root)
    boxes = np.array([[[0, 0, 10, 10], [20, 20, 30, 40], [0, 0, 5, 5]]], np.float32)
    boxes[0, 0] += shift
    w.write("boxes", boxes, index=0)
    w.write("classes", np.array([[3, 4, 0]], np.float32), index=1)
    w.write("scores", np.asarray(scores, np.float32), index=2)
    w.save_manifest()
    return root


def test_verifier_config_per_tensor_verifiers(tmp_path):
    g = _detections(tmp_path / "g", 0.0, [[0.1, 0.9, 0.3, 0.8, 0.0, 0.5]])
    t = _detections(tmp_path / "t", 2.0, [[0.9, 0.1, 0.3, 0.8, 0.0, 0.5]])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(
        json.dumps(
            {
                "TopK": {"parameters": {"k": 3, "ordered": False}, "tensors": [["scores"]]},
                "MeanIOU": {
                    "parameters": {"background_classification": 0},
                    "tensors": [["boxes", "classes"]],
                },
            }
        )
    )
    res = run_verification(
        g, t, ["CosineSimilarity"], verifier_config=cfg, working_dir=tmp_path / "w"
    )
    s = res.summary.set_index("Name")
    assert list(s.columns[:7]) == [
        "LayerType",
        "Size",
        "Tensor_dims",
        "CosineSimilarity",
        "TopK",
        "MeanIOU",
        "golden_min",
    ]
    # golden top-3 {1, 3, 5}, target top-3 {0, 3, 5}: one of three missing
    assert s.loc["scores", "TopK"] == pytest.approx(100 / 3)
    assert np.isnan(s.loc["boxes", "TopK"]) and np.isnan(s.loc["scores", "MeanIOU"])
    inter = 8 * 8  # [2,2,12,12] against [0,0,10,10]
    want = (
        inter / (100 + 100 - inter) + 1.0
    ) / 2  # class 3 shifted, class 4 identical, class 0 background
    assert s.loc["boxes", "MeanIOU"] == pytest.approx(want)
    assert (
        s.loc["boxes", "Failed"] == "MeanIOU"
        and s.loc["scores", "Failed"] == "CosineSimilarity, TopK"
    )
    assert (res.run_dir / "TopK" / "scores.csv").is_file()
    assert (res.run_dir / "MeanIOU" / "boxes+classes.csv").is_file()
    assert not (res.run_dir / "TopK" / "boxes.csv").exists()


@pytest.mark.parametrize(
    "config, expect",
    [
        (
            {"TopK": {"tensors": [["scorez"]]}},
            "TopK tensor 'scorez' is in neither the golden nor the target tensors; near matches: scores",
        ),
        (
            {"TopK": {"tensors": ["scores"]}},
            "TopK.tensors must be a list of lists of 1 tensor name",
        ),
        (
            {"MeanIOU": {"tensors": [["boxes"]]}},
            'MeanIOU.tensors must be a list of lists of 2 tensor names, e.g. [["boxes", "classes"]]',
        ),
        (
            {"TopK": {"parameters": {"kk": 1}, "tensors": [["scores"]]}},
            "verifier TopK has no parameter 'kk'; valid parameters: k, ordered, threshold",
        ),
        ({"Top5": {"tensors": [["scores"]]}}, "unknown verifier 'Top5'"),
        ("[1, 2", "is not valid JSON"),
    ],
)
def test_bad_verifier_config(tmp_path, config, expect):
    g = _detections(tmp_path / "g", 0.0, [[0.1, 0.9]])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(AccdbgError) as exc:
        run_verification(g, g, verifier_config=cfg, working_dir=tmp_path / "w")
    assert expect in str(exc.value)
    assert not (tmp_path / "w" / "verification").exists() or not any(
        p for p in (tmp_path / "w" / "verification").iterdir() if not p.name.startswith(".")
    )


# ------------------------------------------------------------------ data problems, names


def test_nan_and_missing_tensors_reported_in_status(tmp_path):
    g, t = TensorWriter(tmp_path / "g"), TensorWriter(tmp_path / "t")
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    g.write("a", a, index=0)
    bad = a.copy()
    bad[0, 0, :3] = np.nan
    t.write("a", bad, index=0)
    g.write("b", a, index=1)
    t.write("b", a.reshape(4, 6), index=1)
    for w in (g, t):
        w.save_manifest()
    (tmp_path / "map.json").write_text(json.dumps({"a": "a", "b": "b", "c": "gone"}))
    s = run_verification(
        g.root,
        t.root,
        ["CosineSimilarity", "MSE"],
        tensor_mapping=tmp_path / "map.json",
        working_dir=tmp_path / "w",
    ).summary.set_index("Name")
    assert s.loc["a", "Status"] == "fail; NaN in target (3 elements)"  # fails, and why
    assert s.loc["a", "Failed"] == "CosineSimilarity, MSE"
    assert s.loc["a", "MSE"] == 0.0  # the 21 finite pairs agree; the NaNs fail the row anyway
    assert s.loc["b", "Status"] == "shape mismatch: golden [2, 3, 4] target [4, 6]"
    assert np.isnan(s.loc["b", "CosineSimilarity"]) and s.loc["b", "Failed"] == ""


def test_status_agrees_with_failed(tmp_path):
    """ok = compared and passing; fail = Failed lists verifiers; anything else is a note."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(64).astype(np.float32)
    noise = rng.standard_normal(64).astype(np.float32)
    # targets built to a known verdict; cosine and MSE recomputed with numpy below
    targets = {
        "same": x,  # cos 1, MSE 0: passes both
        "offset": x + 0.05,  # cos > 0.99, MSE 0.0025 > 1e-3: fails MSE only
        "noisy": x + 0.8 * noise,  # fails both
        "nan": np.where(np.arange(64) == 5, np.nan, x).astype(np.float32),
    }
    inputs = {}
    for k in range(2):  # the second input is clean everywhere: the aggregate keeps the failures
        g, t = (
            TensorWriter(tmp_path / "g" / f"Result_{k}"),
            TensorWriter(tmp_path / "t" / f"Result_{k}"),
        )
        for i, (name, tv) in enumerate(targets.items()):
            g.write(name, x, index=i)
            t.write(name, tv if k == 0 else x, index=i)
        g.write("gone", x, index=len(targets))
        for w in (g, t):
            w.save_manifest()
        inputs[k] = (g.root, t.root)
    mapping = tmp_path / "map.json"  # names a target tensor that was never dumped
    mapping.write_text(json.dumps({"same": "same", "gone_t": "gone"}))
    one = run_verification(
        *inputs[0], ["CosineSimilarity", "MSE"], tensor_mapping=mapping, working_dir=tmp_path / "w"
    ).summary.set_index("Name")
    x64 = x.astype(np.float64)
    for name in ("same", "offset", "noisy"):
        t = targets[name].astype(np.float64)
        cos = x64 @ t / (np.linalg.norm(x64) * np.linalg.norm(t))
        expect = [
            lab
            for lab, bad in (
                ("CosineSimilarity", cos < 0.99),
                ("MSE", np.mean((x64 - t) ** 2) > 1e-3),
            )
            if bad
        ]
        assert one.loc[name, "Failed"] == ", ".join(expect), name
        assert one.loc[name, "Status"] == ("fail" if expect else "ok"), name
    assert (
        one.loc["offset", "Failed"] == "MSE"
        and one.loc["noisy", "Failed"] == "CosineSimilarity, MSE"
    )
    assert one.loc["nan", "Status"] == "fail; NaN in target (1 element)"
    assert one.loc["gone", "Status"] == "missing in target" and one.loc["gone", "Failed"] == ""
    # the rule holds on every row, in the CSV as well
    saved = pd.read_csv(
        tmp_path / "w" / "verification" / "latest" / "summary.csv", keep_default_na=False
    )
    assert ((saved["Status"] == "ok") <= (saved["Failed"] == "")).all()
    assert (saved["Status"].str.startswith("fail") == (saved["Failed"] != "")).all()
    # several inputs: a layer failing on one input fails in the aggregate, the note says where
    for k, (g, t) in inputs.items():
        shutil.copytree(g, tmp_path / "G" / f"Result_{k}")
        shutil.copytree(t, tmp_path / "T" / f"Result_{k}")
    agg = run_verification(
        tmp_path / "G",
        tmp_path / "T",
        ["CosineSimilarity", "MSE"],
        tensor_mapping=mapping,
        working_dir=tmp_path / "w",
    ).summary.set_index("Name")
    assert agg.loc["same", "Status"] == "ok" and agg.loc["noisy", "Status"] == "fail"
    assert agg.loc["nan", "Failed"] == "CosineSimilarity, MSE"
    assert agg.loc["nan", "Status"] == "fail; Result_0: NaN in target (1 element)"
    assert agg.loc["gone", "Status"] == "Result_0: missing in target"


def test_hostile_names_stay_inside_and_are_escaped(tmp_path):
    names = [
        '=HYPERLINK("http://x")',
        "<script>alert(1)</script>",
        "../../escape",
        "/abs/name",
        "+cmd",
    ]
    g, t = TensorWriter(tmp_path / "g"), TensorWriter(tmp_path / "t")
    for i, n in enumerate(names):
        x = np.arange(6, dtype=np.float32) + i
        g.write(n, x, index=i, op_type="@op")
        t.write(n, x * 1.01, index=i)
    g.save_manifest()
    t.save_manifest()
    res = run_verification(g.root, t.root, ["CosineSimilarity"], working_dir=tmp_path / "w")
    out = res.run_dir
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert (
        rows[0]["Name"] == "'" + names[0]
        and rows[4]["Name"] == "'+cmd"
        and rows[0]["LayerType"] == "'@op"
    )
    html = (out / "summary.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    files = [p for p in (out / "CosineSimilarity").rglob("*") if p.is_file()]
    assert len(files) == 2 * len(names)
    assert all(out.resolve() in p.resolve().parents for p in files)
    assert not (tmp_path / "escape.csv").exists() and not Path("/abs/name.csv").exists()
    (page,) = [p for p in files if "alert" in str(p) and p.suffix == ".html"]
    detail = page.read_text()
    assert "&lt;script&gt;" in detail and "<script>" not in detail


@pytest.mark.parametrize(
    "case, expect",
    [
        ("no_golden", "--golden_output_reference_directory"),
        ("empty_target", "holds no tensors"),
        ("bad_mapping", "--tensor_mapping"),
        ("meaniou_default", "name them in --verifier_config"),
        ("missing_flag", "--inference_results"),
        ("unknown_verifier", "unknown verifier 'cosine'; valid verifiers:"),
        ("bad_param", "has no parameter 'param1'"),
        ("model_without_m", "add -m/--model_path"),
    ],
)
def test_bad_inputs_one_line_and_no_run_left(capsys, tmp_path, case, expect):
    g = TensorWriter(tmp_path / "g")
    g.write("a", np.ones(3, np.float32), index=0)
    g.save_manifest()
    args = [
        "--verification",
        "--golden_output_reference_directory",
        g.root,
        "--inference_results",
        g.root,
        "-w",
        tmp_path / "w",
    ]
    if case == "no_golden":
        args[2] = tmp_path / "nope"
    elif case == "empty_target":
        (tmp_path / "empty").mkdir()
        args[4] = tmp_path / "empty"
    elif case == "bad_mapping":
        (tmp_path / "m.json").write_text('{"a": 3}')
        args += ["--tensor_mapping", tmp_path / "m.json"]
    elif case == "meaniou_default":
        args += ["--default_verifier", "MeanIOU"]
    elif case == "missing_flag":
        args = args[:3] + args[5:]
    elif case == "unknown_verifier":
        args += ["--default_verifier", "cosine"]
    elif case == "bad_param":
        args += ["--default_verifier", "CosineSimilarity", "param1", "1"]
    elif case == "model_without_m":
        args += ["-f", "onnx"]
    code, _, err = run_cli(capsys, *args)
    assert code == 2, err
    assert expect in one_line_error(err)
    v = tmp_path / "w" / "verification"
    assert not v.exists() or not [p for p in v.iterdir() if not p.name.startswith(".")]


def test_existing_output_dirname_is_not_touched(capsys, tmp_path):
    g = TensorWriter(tmp_path / "g")
    g.write("a", np.ones(3, np.float32), index=0)
    g.save_manifest()
    args = [
        "--verification",
        "--framework_results",
        g.root,
        "--inference_results",
        g.root,
        "-w",
        tmp_path / "w",
        "--output_dirname",
        "keep",
    ]
    assert run_cli(capsys, *args)[0] == 0
    summary = (tmp_path / "w" / "verification" / "keep" / "summary.csv").read_bytes()
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "already exists" in one_line_error(err)
    assert (tmp_path / "w" / "verification" / "keep" / "summary.csv").read_bytes() == summary


# ------------------------------------------------------------------ the real QNN engine


@pytest.fixture(scope="module")
def qnn_det(tmp_path_factory, ppocr_det, ppocr_small_input):
    """Framework diagnosis and the QNN HTP engine (x86 emulation) on the real model (160x160:
    its every layer, at a quarter of the QNN time)."""
    from accdbg.engines import run_inference_engine

    tmp = tmp_path_factory.mktemp("qnn_det")
    inp = [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])]
    t0 = time.perf_counter()
    golden = run_framework_diagnosis("onnx", ppocr_det, inp, working_dir=tmp / "w")
    t1 = time.perf_counter()
    engine = run_inference_engine(
        ppocr_det, input_tensors=inp, golden_dir_for_mapping=golden.run_dir, working_dir=tmp / "w"
    )
    produced = {"framework_diagnosis": t1 - t0, "inference_engine": time.perf_counter() - t1}
    return {"tmp": tmp, "golden": golden.run_dir, "engine": engine, "produced": produced}


@pytest.mark.slow
def test_ppocr_det_qnn_engine_verification(capsys, qnn_det):
    engine = qnn_det["engine"]
    t0 = time.perf_counter()
    res = run_verification(
        qnn_det["golden"],
        engine.results[0],
        ["CosineSimilarity", "SQNR", "ScaledDiff"],
        tensor_mapping=engine.tensor_mapping,
        graph_struct=engine.graph_struct,
        qnn_model_json_path=engine.model_net_json,
        working_dir=qnn_det["tmp"] / "w",
        output_dirname="qnn",
    )
    seconds = time.perf_counter() - t0
    s = res.summary
    golden = TensorFolder(qnn_det["golden"])
    target = TensorFolder(engine.results[0])
    mapping = json.loads(engine.tensor_mapping.read_text())
    expected = [t for t in target.names() if mapping.get(t, t) in golden.records]
    # the graph input as QNN was fed it, first: the input file against its encoding's grid
    assert list(s["Name"][:1]) == ["x"] and s["LayerType"].iloc[0] == "graph input"
    x = np.fromfile(target.meta["inputs"]["x"]["path"], np.float32).astype(np.float64)
    qdq = onnx.load(str(engine.qdq_model))  # the input's QuantizeLinear, read here
    (quant,) = [n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer}
    scale, zp = float(inits[quant.input[1]]), int(inits[quant.input[2]])
    x_fed = (np.clip(np.rint(x / scale) + zp, 0, 255) - zp) * scale  # uint8
    sqnr = 10 * np.log10(np.sum(x * x) / np.sum((x - x_fed) ** 2))
    assert s["SQNR"].iloc[0] == pytest.approx(sqnr, rel=1e-6)
    s = s.iloc[1:].reset_index(drop=True)
    # every row filled and ok
    assert sorted(s["Name"]) == sorted(expected) and len(s) > 250
    compared = s["Status"].isin(["ok", "fail"])  # no note: every pair compared in full
    assert compared.all(), s[~compared][["Name", "Status"]]
    assert ((s["Status"] == "fail") == (s["Failed"] != "")).all()
    assert (
        not s[["CosineSimilarity", "SQNR", "ScaledDiff", "golden_min", "target_max"]]
        .isna()
        .any()
        .any()
    )
    # in the engine's execution order, with its layer types
    layers = json.loads(engine.graph_struct.read_text())["layers"]
    position = {o: i for i, layer in enumerate(layers) for o in layer["outputs"]}
    kind = {o: layer["type"] for layer in layers for o in layer["outputs"]}
    assert [position[n] for n in s["Name"]] == sorted(position[n] for n in s["Name"])
    assert list(s["LayerType"]) == [kind[n] for n in s["Name"]]
    # values recomputed from the raw files
    for i in range(0, len(s), 41):
        row = s.iloc[i]
        g = _raw(golden.root, mapping.get(row["Name"], row["Name"]))
        t = _raw(target.root, row["Name"])
        if np.any(g):
            assert row["CosineSimilarity"] == pytest.approx(
                g @ t / np.linalg.norm(g) / np.linalg.norm(t), rel=1e-9
            )
        step = target.records[row["Name"]].extra["scale"]
        assert row["ScaledDiff"] == pytest.approx(np.mean(np.abs(g - t)) / step, rel=1e-9)
    # the engine run folder alone: side files found beside output/, same summary
    code, _, err = run_cli(
        capsys,
        "--verification",
        "--default_verifier",
        "CosineSimilarity",
        "--default_verifier",
        "SQNR",
        "--default_verifier",
        "ScaledDiff",
        "--golden_output_reference_directory",
        qnn_det["golden"],
        "--inference_results",
        engine.run_dir,
        "-w",
        qnn_det["tmp"] / "w",
        "--output_dirname",
        "discovered",
    )
    assert code == 0, err
    again = pd.read_csv(qnn_det["tmp"] / "w" / "verification" / "discovered" / "summary.csv")
    again = again.iloc[1:].reset_index(drop=True)  # the graph input's row aside, as above
    assert list(again["Name"]) == list(s["Name"])
    np.testing.assert_allclose(again["CosineSimilarity"], s["CosineSimilarity"], rtol=1e-12)
    opts = json.loads(
        (
            qnn_det["tmp"] / "w" / "verification" / "discovered" / "verification_options.json"
        ).read_text()
    )
    assert opts["inference_results"] == str(engine.run_dir)
    log = (qnn_det["tmp"] / "w" / "verification" / "discovered" / "log.txt").read_text()
    assert "found beside the inference results" in log
    # verifying takes less time than producing the dumps
    produced = sum(qnn_det["produced"].values())
    print(f"verification {seconds:.2f} s; produced in {produced:.1f} s {qnn_det['produced']}")
    assert seconds < produced


# ------------------------------------------------------------------ which input each dump is of


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """One 2-line input list through framework diagnosis and the real QNN HTP engine."""
    from accdbg.engines import run_inference_engine

    tmp = tmp_path_factory.mktemp("listed")
    built = models.planted_chain(tmp, layers=3, bad=1)
    x = np.fromfile(built.input_path, np.float32)
    raws = [tmp / "a.raw", tmp / "b.raw"]
    x.tofile(raws[0])
    (np.roll(x, 37) * 3.0).astype(np.float32).tofile(raws[1])  # a different image
    lst = tmp / "list.txt"
    lst.write_text("".join(f"x:={r}\n" for r in raws))
    given = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    gold = run_framework_diagnosis(
        "onnx", built.path, given, working_dir=tmp / "w", output_dirname="g", input_list=lst
    )
    eng = run_inference_engine(
        built.path, input_list=lst, input_tensors=given, working_dir=tmp / "w", output_dirname="e"
    )
    return {"tmp": tmp, "golden": gold.run_dir, "engine": eng.run_dir, "raws": raws}


@pytest.mark.slow
def test_every_result_is_compared_with_the_golden_of_its_own_input(listed):
    res = run_verification(
        listed["golden"],
        listed["engine"],
        ["CosineSimilarity", "SQNR"],
        working_dir=listed["tmp"] / "w",
        output_dirname="own",
    )
    assert set(res.per_input) == {"Result_0", "Result_1"}
    cos = {}
    for i in range(2):
        g = _raw(listed["golden"] / f"Result_{i}", "layer2")
        for j in range(2):
            t = _raw(listed["engine"] / "output" / f"Result_{j}", "layer2")
            cos[i, j] = float(g @ t / (np.linalg.norm(g) * np.linalg.norm(t)))
        row = res.per_input[f"Result_{i}"].set_index("Name").loc["layer2"]
        assert row["CosineSimilarity"] == pytest.approx(cos[i, i], abs=1e-9)
        for side in ("golden", "engine"):
            folder = listed[side] / ("output" if side == "engine" else "") / f"Result_{i}"
            assert TensorFolder(folder).meta["inputs"]["x"]["path"] == str(listed["raws"][i])
    assert min(cos[0, 0], cos[1, 1]) > 0.95 > max(cos[0, 1], cos[1, 0])  # what a mix-up looks like
    # the golden is a framework diagnosis: the engine's tensor mapping is found and used
    assert "tensor_mapping" in res.run_dir.joinpath("log.txt").read_text()
    # the per-input table: files and final-output scores, linked to each input's own page
    table = res.inputs.set_index("Input")
    for i in range(2):
        key = f"Result_{i}"
        assert table.loc[key, "Files"] == str(listed["raws"][i])
        want = res.per_input[key].set_index("Name").loc["layer2", "SQNR"]
        assert table.loc[key, "layer2 SQNR"] == pytest.approx(want)
        assert (res.run_dir / key / "summary.html").is_file()
    page = (res.run_dir / "summary.html").read_text()
    assert '<a href="Result_1/summary.html">Result_1</a>' in page and str(listed["raws"][1]) in page
    meta = json.loads((res.run_dir / "summary.json").read_text())
    assert meta["inputs"]["Result_1"]["target"]["x"]["path"] == str(listed["raws"][1])


@pytest.mark.slow
def test_forged_pairing_is_refused_naming_both_files(capsys, listed):
    wd = listed["tmp"] / "forged"
    code, _, err = run_cli(
        capsys,
        "--verification",
        "--golden_output_reference_directory",
        listed["golden"] / "Result_0",
        "--inference_results",
        listed["engine"] / "output" / "Result_1",
        "-w",
        wd,
    )
    assert code == 2
    line = one_line_error(err)
    a, b = (str(r) for r in listed["raws"])
    assert f"golden was computed from {a} but the target from {b}" in line, line
    assert not (wd / "verification").exists() or not list((wd / "verification").iterdir())
    # the same with whole runs whose Result_N do not line up (e.g. lists in another order)
    swapped = listed["tmp"] / "swapped" / "output"
    shutil.copytree(listed["engine"] / "output" / "Result_1", swapped / "Result_0")
    shutil.copytree(listed["engine"] / "output" / "Result_0", swapped / "Result_1")
    with pytest.raises(AccdbgError, match="different inputs"):
        run_verification(listed["golden"], swapped, working_dir=wd)


@pytest.mark.slow
def test_one_golden_is_compared_with_the_results_of_its_input_only(listed):
    res = run_verification(
        listed["golden"] / "Result_1",
        listed["engine"],
        ["CosineSimilarity"],
        working_dir=listed["tmp"] / "w",
    )
    assert set(res.per_input) == {"Result_1"} and res.aggregate is None
    assert "not compared (other inputs): Result_0" in (res.run_dir / "log.txt").read_text()


def test_a_file_changed_between_the_runs_is_refused(tmp_path, mlp):
    x = tmp_path / "in.raw"
    shutil.copyfile(mlp.input_path, x)
    inp = [parse_input_tensor(["x", "2,4", str(x)])]
    first = run_framework_diagnosis("onnx", mlp.path, inp, working_dir=tmp_path / "w")
    (np.fromfile(x, np.float32) + 1).astype(np.float32).tofile(x)
    second = run_framework_diagnosis("onnx", mlp.path, inp, working_dir=tmp_path / "w")
    with pytest.raises(AccdbgError, match=r"from .*in\.raw \(sha256 [0-9a-f]{12}\) but"):
        run_verification(first.run_dir, second.run_dir, working_dir=tmp_path / "w")
    # a copy of the same data under another name is the same input
    copy = tmp_path / "copy.raw"
    shutil.copyfile(x, copy)
    third = run_framework_diagnosis(
        "onnx", mlp.path, [parse_input_tensor(["x", "2,4", str(copy)])], working_dir=tmp_path / "w"
    )
    res = run_verification(second.run_dir, third.run_dir, ["MSE"], working_dir=tmp_path / "w")
    assert (res.summary["MSE"] == 0).all()


# ------------------------------------------------------------------ a caller's annotation


def test_annotation_goes_into_the_summary_before_the_run_is_finished(tmp_path):
    """A caller's columns, JSON keys and page (oneshot's) are written once, by verification,
    while the run is still being written: nothing rewrites the finished run."""
    from accdbg.verifiers.verification import SummaryAnnotation

    g, t = TensorWriter(tmp_path / "g"), TensorWriter(tmp_path / "t")
    a = np.linspace(-1, 1, 24, dtype=np.float32)
    for i, name in enumerate(("a", "b")):
        g.write(name, a * (i + 1), index=i)
        t.write(name, a * (i + 1) + 0.01 * i, index=i)
    for w in (g, t):
        w.save_manifest()
    seen = {}

    def annotate(draft):
        seen["dir"], seen["finished"] = draft.run_dir, (draft.run_dir / "summary.csv").exists()
        table = draft.summary.assign(note=[f"row {i}" for i in range(len(draft.summary))])

        def page(path):
            path.write_text("<html>the caller's page</html>", encoding="utf-8")
            return path

        return SummaryAnnotation(table, {"findings": ["x first"]}, page)

    res = run_verification(
        g.root, t.root, ["MSE"], working_dir=tmp_path / "w", output_dirname="v", annotate=annotate
    )
    run = tmp_path / "w" / "verification" / "v"
    assert res.run_dir == run and seen["dir"] != run and not seen["finished"]  # still staging
    csv = pd.read_csv(run / "summary.csv")
    assert list(csv["note"]) == ["row 0", "row 1"] and list(res.summary["note"]) == list(
        csv["note"]
    )
    data = json.loads((run / "summary.json").read_text())
    assert data["findings"] == ["x first"] and data["columns"][-1] == "note"
    assert len(data["passed"]["MSE"]) == 2 and not seen["dir"].exists()  # renamed once, after
    assert (run / "summary.html").read_text() == "<html>the caller's page</html>"
