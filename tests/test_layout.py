"""Layouts: a NHWC target is compared with a NCHW golden element for element, never flattened."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.core import onnx_model as om
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder, TensorWriter
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.mapping.layout import layout_permutation, normalize_layout, reconcile
from accdbg.mapping.qnn_json import QnnGraph, qnn_sanitize
from accdbg.verifiers.verification import run_verification
from tests import models

TO_LAST = {3: (0, 2, 1), 4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}


@pytest.mark.parametrize(
    "rank, first, last", [(3, "NCF", "NFC"), (4, "NCHW", "NHWC"), (5, "NCDHW", "NDHWC")]
)
def test_recorded_and_inferred_channel_moves_restore_the_data(rank, first, last):
    shape = (2, 3, 4, 5, 6)[:rank]
    x = np.arange(np.prod(shape)).reshape(shape)
    moved = x.transpose(TO_LAST[rank])
    for gl, tl, how in ((first, last, "recorded"), (None, None, "from shapes")):
        a = reconcile(x.shape, moved.shape, gl, tl)
        assert a.kind == "transpose" and how in a.note, a
        np.testing.assert_array_equal(a.apply(moved), x)
    # and the other way round (golden channel-last, target channel-first)
    b = reconcile(moved.shape, x.shape, last, first)
    np.testing.assert_array_equal(b.apply(x), moved)


def test_cubic_shapes_need_the_recorded_layout():
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 4))
    nhwc = x.transpose(0, 2, 3, 1)
    blind = reconcile(x.shape, nhwc.shape)  # same shape: nothing says they differ
    assert blind.kind == "same"
    told = reconcile(x.shape, nhwc.shape, "NCHW", "NHWC")
    assert told.kind == "transpose" and told.note == "NHWC->NCHW (recorded)"
    np.testing.assert_array_equal(told.apply(nhwc), x)
    # the QNN JSON's src_axis_format/axis_format spelling is understood too
    assert normalize_layout("QNN_TENSOR_AXIS_FORMAT_NHWC") == "NHWC"
    assert normalize_layout("NOT_YET_DEFINED") is None and normalize_layout("NONTRIVIAL") is None
    assert normalize_layout("NHWC", rank=3) is None  # a layout of the wrong rank is ignored
    assert layout_permutation("NHWC", "NCHW") == (0, 3, 1, 2)
    assert layout_permutation("NF", "NC") is None


@pytest.mark.parametrize(
    "golden, target, gl, tl, kind, text",
    [
        (
            (1, 4, 8, 8),
            (1, 256),
            None,
            None,
            "mismatch",
            "shape mismatch: golden [1, 4, 8, 8] target [1, 256]",
        ),
        (
            (1, 4, 8, 8),
            (1, 8, 8, 5),
            None,
            None,
            "mismatch",
            "size mismatch: golden [1, 4, 8, 8] target [1, 8, 8, 5]",
        ),
        (
            (1, 4, 6, 8),
            (1, 6, 4, 8),
            None,
            None,
            "mismatch",
            "shape mismatch",
        ),  # no channel move explains it
        ((1, 4, 8, 8), (1, 8, 8, 4), "NCHW", "NCHW", "mismatch", "both recorded NCHW"),
        ((1, 4, 6, 6), (1, 4, 6, 6), "NCHW", "NHWC", "mismatch", "layout mismatch"),
        ((4, 10), (1, 4, 1, 10), None, None, "reshape", "reshape [1, 4, 1, 10]->[4, 10]"),
        ((1, 8, 1, 1), (1, 1, 1, 8), None, None, "reshape", "reshape"),
        (
            (1, 4, 8, 8),
            (1, 8, 8, 4),
            None,
            "NCHW",
            "mismatch",
            "shape mismatch",
        ),  # record contradicts shapes
        ((2, 3), (2, 3), "NF", "NC", "same", ""),
    ],
)
def test_reconcile_statuses(golden, target, gl, tl, kind, text):
    a = reconcile(golden, target, gl, tl)
    assert a.kind == kind and text in a.note, a


# ------------------------------------------------------------------ through verification


@pytest.fixture(scope="module")
def cubic_golden(tmp_path_factory):
    """A CNN whose activations are [1, 8, 8, 8]: NCHW and NHWC have the same shape."""
    tmp = tmp_path_factory.mktemp("cubic")
    built = models.conv_net(tmp, channels=8, size=8, layers=2)
    res = run_framework_diagnosis(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])],
        working_dir=tmp / "w",
        output_dirname="golden",
    )
    return TensorFolder(res.run_dir)


def _dump_nhwc(golden: TensorFolder, root, record_layout: bool):
    w = TensorWriter(root)
    for rec in golden:
        x = golden.load(rec.name)
        t = x.transpose(0, 2, 3, 1) if x.ndim == 4 else x
        w.write(
            rec.name,
            t,
            node=rec.node,
            op_type=rec.op_type,
            index=rec.index,
            layout=("NHWC" if x.ndim == 4 else None) if record_layout else None,
        )
    w.save_manifest()
    return root


def test_nhwc_dump_against_nchw_golden(tmp_path, cubic_golden):
    target = _dump_nhwc(cubic_golden, tmp_path / "nhwc", record_layout=True)
    res = run_verification(
        cubic_golden.root,
        target,
        ["CosineSimilarity", "MSE"],
        working_dir=tmp_path / "w",
        output_dirname="told",
    )
    s = res.summary.set_index("Name")
    assert list(s["Status"].unique()) == ["ok"]
    assert (s["CosineSimilarity"] == 1.0).all() and (s["MSE"] == 0.0).all()
    assert s.loc["conv0", "Layout"] == "NHWC->NCHW (recorded)"
    assert s.loc["conv0", "Tensor_dims"] == [1, 8, 8, 8]
    # pool [1, 8, 1, 1] dumped as [1, 1, 1, 8]: recorded NHWC, transposed back
    assert s.loc["pool", "CosineSimilarity"] == 1.0

    # the same data without the layout record: the shapes cannot tell, so the comparison is
    # the flattened one Qualcomm's tool makes, and it shows why that one raises false alarms
    blind = _dump_nhwc(cubic_golden, tmp_path / "blind", record_layout=False)
    res2 = run_verification(
        cubic_golden.root,
        blind,
        ["CosineSimilarity"],
        working_dir=tmp_path / "w",
        output_dirname="blind",
    )
    s2 = res2.summary.set_index("Name")
    g = cubic_golden.load("conv0").astype(np.float64).ravel()
    t = g.reshape(1, 8, 8, 8).transpose(0, 2, 3, 1).ravel()
    flat = g @ t / (np.linalg.norm(g) * np.linalg.norm(t))
    assert s2.loc["conv0", "CosineSimilarity"] == pytest.approx(flat) and flat < 0.9


def test_non_cubic_nhwc_is_inferred_from_shapes(tmp_path):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    g = run_framework_diagnosis(
        "onnx",
        built.path,
        [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])],
        working_dir=tmp_path / "w",
        output_dirname="g",
    )
    golden = TensorFolder(g.run_dir)
    target = _dump_nhwc(golden, tmp_path / "t", record_layout=False)
    w = TensorWriter(tmp_path / "t2")
    for rec in golden:  # plus a tensor flattened by the target: not comparable, says so
        x = golden.load(rec.name)
        w.write(
            rec.name,
            x.reshape(1, -1) if rec.name == "conv0" else x.transpose(0, 2, 3, 1),
            index=rec.index,
            op_type=rec.op_type,
        )
    w.save_manifest()
    res = run_verification(golden.root, target, ["CosineSimilarity"], working_dir=tmp_path / "w")
    s = res.summary.set_index("Name")
    assert (s["CosineSimilarity"] == 1.0).all()
    assert s.loc["relu0", "Layout"] == "NHWC->NCHW (from shapes)"
    res2 = run_verification(
        golden.root, tmp_path / "t2", ["CosineSimilarity"], working_dir=tmp_path / "w"
    )
    s2 = res2.summary.set_index("Name")
    assert s2.loc["conv0", "Status"] == "shape mismatch: golden [1, 4, 8, 8] target [1, 256]"
    assert np.isnan(s2.loc["conv0", "CosineSimilarity"])
    assert s2.loc["relu0", "CosineSimilarity"] == 1.0
    # the not-compared tensor has no per-tensor file, the others do
    assert not (res2.run_dir / "CosineSimilarity" / "conv0.csv").exists()
    assert (res2.run_dir / "CosineSimilarity" / "relu0.csv").is_file()


def test_bare_raw_target_takes_shape_layout_and_scale_from_qnn_json(tmp_path, cubic_golden):
    """Qualcomm-style output: bare .raw files named as QNN names them, NHWC, plus model_net.json."""
    target = tmp_path / "Result_0"
    target.mkdir()
    tensors = {}
    rng = np.random.default_rng(5)
    scale = 0.05
    for rec in cubic_golden:
        x = cubic_golden.load(rec.name)
        noisy = x + rng.uniform(-scale / 2, scale / 2, x.shape).astype(np.float32)
        t = noisy.transpose(0, 2, 3, 1)
        name = qnn_sanitize(rec.name)
        t.astype(np.float32).tofile(target / f"{name}.raw")
        tensors[name] = {
            "dims": list(t.shape),
            "axis_format": "NHWC",
            "src_axis_format": "NCHW",
            "data_type": 0x0408,
            "quant_params": {
                "definition": 1,
                "encoding": 0,
                "scale_offset": {"scale": scale, "offset": 0},
            },
        }
    qnn_json = tmp_path / "model_net.json"
    qnn_json.write_text(json.dumps({"graph": {"tensors": tensors, "nodes": {}}}))
    assert QnnGraph(qnn_json).find("conv0").encoding.scale == scale

    # without the JSON the flat target cannot be shaped: a status, not a flattened comparison
    res0 = run_verification(
        cubic_golden.root, target, ["CosineSimilarity"], working_dir=tmp_path / "w"
    )
    s0 = res0.summary.set_index("Name")
    assert s0.drop("pool")["Status"].str.contains("target shape unknown").all()
    assert s0.drop("pool")["CosineSimilarity"].isna().all()
    assert s0.loc["pool", "Status"] == "ok"  # [1, 8, 1, 1]: one non-unit axis, order cannot differ

    res = run_verification(
        cubic_golden.root,
        target,
        ["CosineSimilarity", "ScaledDiff"],
        qnn_model_json_path=qnn_json,
        working_dir=tmp_path / "w",
    )
    s = res.summary.set_index("Name")
    assert (s["Status"] == "ok").all() and (s["Layout"] == "NHWC->NCHW (recorded)").all()
    for rec in cubic_golden:
        g = cubic_golden.load(rec.name).astype(np.float64)
        t = np.fromfile(target / f"{rec.name}.raw", np.float32).reshape(
            g.transpose(0, 2, 3, 1).shape
        )
        t = t.transpose(0, 3, 1, 2).astype(np.float64)
        assert s.loc[rec.name, "ScaledDiff"] == pytest.approx(
            np.mean(np.abs(g - t)) / scale, rel=1e-9
        )
        if rec.size >= 512:  # uniform noise over one step: 0.25 step on average
            assert 0.2 < s.loc[rec.name, "ScaledDiff"] < 0.3


def _qdq_conv(tmp_path):
    """A QDQ Conv+Relu model that the QNN HTP backend runs channel-last."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((5, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "sw", "zw"], ["wq"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("QuantizeLinear", ["relu", "sr", "zr"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "sr", "zr"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(0.03, np.float32), "sx"),
        numpy_helper.from_array(np.array(128, np.uint8), "zx"),
        numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
        numpy_helper.from_array(np.array(128, np.uint8), "zw"),
        numpy_helper.from_array(np.array(0.02, np.float32), "sr"),
        numpy_helper.from_array(np.array(0, np.uint8), "zr"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 6, 10])],
        inits,
    )
    return models.save(graph, tmp_path / "qdq.onnx", opset=17)


@pytest.mark.slow
def test_real_qnn_graph_json_dims_are_channel_last(tmp_path):
    """The QNN execution provider's own graph JSON: the Conv output is [1, 6, 10, 5] (NHWC)
    with axis_format NOT_YET_DEFINED, so the layout comes from the shapes; its encoding is
    read for ScaledDiff."""
    import onnxruntime_qnn

    path = _qdq_conv(tmp_path)
    from accdbg.engines.qnn import ensure_registered

    ensure_registered()  # once per process, shared with the engine
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_provider_for_devices(
        devices[:1],
        {
            "backend_path": onnxruntime_qnn.get_qnn_htp_path(),
            "dump_json_qnn_graph": "1",
            "json_qnn_graph_dir": str(tmp_path),
        },
    )
    sess = ort.InferenceSession(str(path), sess_options=so)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 6, 10)).astype(np.float32)
    y = sess.run(None, {"x": x})[0]
    del sess
    (qnn_json,) = [p for p in tmp_path.glob("*.json") if not p.name.endswith("_tensor_log.json")]
    graph = QnnGraph(qnn_json)
    # QNN renames tensors; the Conv(+Relu) output is the one whose producer is the Conv2d op
    data = json.loads(qnn_json.read_text())["graph"]
    (conv,) = [n for n in data["nodes"].values() if n["type"] == "Conv2d"]
    qnn_name = conv["output_names"][0]
    out = graph.find(qnn_name)
    assert out.dims == (1, 6, 10, 5) and normalize_layout(out.axis_format) is None
    assert out.encoding.scale == pytest.approx(0.02) and out.encoding.bitwidth == 8

    golden = TensorWriter(tmp_path / "golden")
    exposed = om.with_outputs(onnx.load(str(path)), ["relu"])
    cpu = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    golden.write("relu", cpu.run(None, {"x": x})[0], index=0, op_type="Relu")
    golden.save_manifest()
    target = TensorWriter(tmp_path / "target")  # an engine that dumps as QNN holds the tensor
    target.write("relu", y.transpose(0, 2, 3, 1), index=0, qnn_name=qnn_name)
    target.save_manifest()
    res = run_verification(
        golden.root,
        target.root,
        ["CosineSimilarity", "ScaledDiff"],
        qnn_model_json_path=qnn_json,
        working_dir=tmp_path / "w",
    )
    row = res.summary.iloc[0]
    assert row["Status"] == "ok" and row["Layout"] == "NHWC->NCHW (from shapes)"
    assert row["Tensor_dims"] == [1, 6, 10, 5]
    assert row["CosineSimilarity"] > 0.999
    g = TensorFolder(golden.root).load("relu").astype(np.float64)
    assert row["ScaledDiff"] == pytest.approx(np.mean(np.abs(g - y)) / out.encoding.scale, rel=1e-6)
    assert row["ScaledDiff"] < 0.5  # within one rounding of the output's own 8-bit step


def test_bare_raw_golden_is_never_flattened_against_a_shaped_target(tmp_path, cubic_golden):
    bare_g, bare_t = tmp_path / "bare_g", tmp_path / "bare_t"
    for d in (bare_g, bare_t):
        d.mkdir()
    for rec in cubic_golden:  # as Qualcomm's framework diagnosis writes them: no manifest
        cubic_golden.load(rec.name).tofile(bare_g / f"{rec.name}.raw")
        cubic_golden.load(rec.name).tofile(bare_t / f"{rec.name}.raw")
    s = run_verification(
        bare_g, cubic_golden.root, ["CosineSimilarity"], working_dir=tmp_path / "w"
    ).summary
    s = s.set_index("Name")
    assert s.loc["conv0", "Status"] == (
        "golden shape unknown (bare .raw without tensors.json) for target [1, 8, 8, 8]: its layout cannot be told"
    )
    assert np.isnan(s.loc["conv0", "CosineSimilarity"]) and s.loc["pool", "CosineSimilarity"] == 1.0
    both = run_verification(
        bare_g, bare_t, ["CosineSimilarity"], working_dir=tmp_path / "w"
    ).summary
    assert (both["CosineSimilarity"] == 1.0).all()
    assert (both["Layout"] == "flat (no shapes recorded on either side)").all()
