"""Encodings in one convention: QNN JSON, AIMET files, QDQ export, overrides, matching, Excel.

Expected values come from the formats' own definitions (onnxruntime's DequantizeLinear, QNN's
``real = scale * (q + offset)`` over its storage type), never from the code under test.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import onnx
import onnxruntime as ort
import openpyxl
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.cli.main import setup_logging
from accdbg.core.imports import qnn_quantization
from accdbg.encodings import (
    aimet_dict,
    aimet_to_tensor_quant_overrides,
    compare_encodings,
    load_aimet,
    load_qnn_graph,
    parse_aimet,
    qdq_encodings,
    qnn_encodings,
)
from accdbg.encodings.matching import match_names, sanitize
from accdbg.encodings.model import Encoding, offset_from_zero_point
from accdbg.encodings.qnn_json import QnnGraph
from accdbg.errors import AccdbgError
from accdbg.reports.excel import is_red
from tests import models
from tests.helpers import one_line_error, run_cli


@pytest.fixture(autouse=True)
def _console_logging(capsys):
    """The CLI binds its console handler to the stderr of the test that ran it; rebind it here."""
    setup_logging(False)


def _dequantize(q: np.ndarray, scale: float, zp: np.ndarray) -> np.ndarray:
    """onnxruntime's own DequantizeLinear: the reference for what scale/zero point mean."""
    elem = helper.np_dtype_to_tensor_dtype(q.dtype)
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "dq",
        [helper.make_tensor_value_info("q", elem, list(q.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(q.shape))],
        [
            numpy_helper.from_array(np.array(scale, np.float32), "s"),
            numpy_helper.from_array(zp, "z"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"q": q})[0]


@pytest.mark.parametrize(
    "dtype,zp", [(np.uint8, 37), (np.int8, -5), (np.uint16, 30000), (np.int16, 0), (np.int8, 0)]
)
def test_offset_convention_is_onnx_dequantize_of_the_grid_ends(dtype, zp):
    info = np.iinfo(dtype)
    bits, signed = info.bits, info.min < 0
    scale = float(np.float32(0.0123))
    q = np.array([info.min, info.max], dtype=dtype)
    lo, hi = _dequantize(q, scale, np.array(zp, dtype=dtype))
    enc = Encoding.from_scale_offset(
        "t", "activation", scale, offset_from_zero_point(zp, bits, signed), bits
    )
    assert np.float32(enc.min[0]) == lo and np.float32(enc.max[0]) == hi
    # the offset is where real 0 sits on the unsigned grid: q_unsigned = -offset
    assert -enc.offset[0] == zp - int(info.min)


def _qnn_doc(tensors: dict, nodes: dict | None = None) -> dict:
    return {"model.cpp": "N/A", "graph": {"tensors": tensors, "nodes": nodes or {}}}


def _float_bits_as(i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", i))[0]


def _qnn_variants() -> dict:
    return {
        "act": {
            "type": 3,
            "data_type": 0x0408,
            "dims": [1, 4],
            "quant_params": {
                "definition": 1,
                "encoding": 0,
                "scale_offset": {"scale": 0.5, "offset": -10},
            },
        },
        "w": {
            "type": 4,
            "data_type": 0x0308,
            "dims": [3, 3, 2, 2],
            "quant_params": {
                "definition": 1,
                "encoding": 1,
                "axis_scale_offset": {
                    "axis": 3,
                    "num_scale_offsets": 2,
                    "scale_offsets": [{"scale": 0.125, "offset": 0}, {"scale": 0.25, "offset": 0}],
                },
            },
        },
        "b": {
            "type": 4,
            "data_type": 0x0332,
            "dims": [2],
            "quant_params": {
                "definition": 1,
                "encoding": 0,
                "scale_offset": {"scale": 2.0**-20, "offset": 0},
            },
        },
        "w4": {
            "type": 4,
            "data_type": 0x0308,
            "dims": [4],
            "quant_params": {
                "definition": 1,
                "encoding": 2,
                "bw_scale_offset": {"bitwidth": 4, "scale": 0.5, "offset": 0},
            },
        },
        "wb": {
            "type": 4,
            "data_type": 0x0308,
            "dims": [2, 4],
            "quant_params": {
                "definition": 1,
                "encoding": 3,
                "bw_axis_scale_offset": {
                    "bitwidth": 4,
                    "axis": 0,
                    "num_elements": 2,
                    "scales": [0.5, 0.25],
                    "offsets": [],
                },
            },
        },
        "a16": {
            "type": 1,
            "data_type": 0x0416,
            "dims": [1],
            "quant_params": {
                "definition": 1,
                "encoding": 0,
                "scale_offset": {"scale": 0.001, "offset": -32768},
            },
        },
        "f": {
            "type": 3,
            "data_type": 0x0232,
            "dims": [1],
            "quant_params": {
                "definition": 2147483647,
                "encoding": 2147483647,
                "scale_offset": {"scale": 0.0, "offset": 0},
            },
        },
        "undef": {
            "type": 3,
            "data_type": 0x0408,
            "dims": [1],
            "quant_params": {
                "definition": 2147483647,
                "encoding": 0,
                "scale_offset": {"scale": 0.0, "offset": 0},
            },
        },
        # the QNN EP dump's misprinted per-channel encoding: bits of axis 3 as a float, 8 channels as offset
        "ep_pc": {
            "type": 4,
            "data_type": 0x0308,
            "dims": [3, 3, 3, 8],
            "quant_params": {
                "definition": 1,
                "encoding": 1,
                "scale_offset": {"scale": _float_bits_as(3), "offset": 8},
            },
        },
    }


def test_qnn_json_every_encoding_kind(tmp_path):
    path = tmp_path / "model_net.json"
    path.write_text(json.dumps(_qnn_doc(_qnn_variants())))
    encs = qnn_encodings(load_qnn_graph(path))
    assert set(encs) == {
        "act",
        "w",
        "b",
        "w4",
        "wb",
        "a16",
        "ep_pc",
    }  # float and undefined have no encoding

    def grid(
        scale, qnn_offset, qmin, qmax
    ):  # QNN: real = scale * (q + offset) over the storage range
        return scale * (qmin + qnn_offset), scale * (qmax + qnn_offset)

    act = encs["act"]
    assert act.kind == "activation" and act.bitwidth == 8 and act.offset == (-10,)
    assert (act.min[0], act.max[0]) == grid(0.5, -10, 0, 255)
    w = encs["w"]  # SFIXED_POINT_8, per channel on axis 3
    assert w.kind == "param" and w.axis == 3 and w.channels == 2 and w.is_symmetric
    assert w.offset == (-128, -128)
    assert [(lo, hi) for lo, hi in zip(w.min, w.max, strict=True)] == [
        grid(0.125, 0, -128, 127),
        grid(0.25, 0, -128, 127),
    ]
    b = encs["b"]  # SFIXED_POINT_32 bias
    assert (
        b.bitwidth == 32
        and b.offset == (-(2**31),)
        and (b.min[0], b.max[0]) == grid(2.0**-20, 0, -(2**31), 2**31 - 1)
    )
    w4 = encs["w4"]  # 4-bit values in an 8-bit signed container
    assert w4.bitwidth == 4 and (w4.min[0], w4.max[0]) == grid(0.5, 0, -8, 7) and w4.offset == (-8,)
    wb = encs["wb"]
    assert wb.bitwidth == 4 and wb.scale == (0.5, 0.25) and wb.offset == (-8, -8) and wb.axis == 0
    a16 = encs["a16"]
    assert a16.bitwidth == 16 and (a16.min[0], a16.max[0]) == grid(0.001, -32768, 0, 65535)
    ep = encs["ep_pc"]
    assert (
        not ep.values_known
        and ep.axis == 3
        and ep.channels == 8
        and "QNN EP" in ep.source["unreadable"]
    )


def _legacy(scale, offset, bw=8, sym="False", lo=None, hi=None):
    e = {"bitwidth": bw, "dtype": "int", "is_symmetric": sym, "scale": scale, "offset": offset}
    if lo is not None:
        e.update(min=lo, max=hi)
    return e


def test_aimet_legacy_and_v1_read_the_same_and_write_back(tmp_path):
    legacy = {
        "version": "0.6.1",
        "activation_encodings": {
            "in": [_legacy(0.02, -100, lo=-2.0, hi=3.1)],
            "f16": [{"bitwidth": 16, "dtype": "float"}],
            "mm_only": [
                {"bitwidth": 8, "dtype": "int", "min": -1.0, "max": 2.0, "is_symmetric": "False"}
            ],
        },
        "param_encodings": {
            "conv.weight": [_legacy(0.1, -128.0, sym="True"), _legacy(0.3, -128.0, sym="True")]
        },
    }
    v1 = {
        "version": "1.0.0",
        "activation_encodings": [
            {
                "name": "in",
                "dtype": "INT",
                "enc_type": "PER_TENSOR",
                "bw": 8,
                "is_sym": False,
                "scale": [0.02],
                "offset": [-100],
            },
            {"name": "f16", "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": 16},
        ],
        "param_encodings": [
            {
                "name": "conv.weight",
                "dtype": "INT",
                "enc_type": "PER_CHANNEL",
                "bw": 8,
                "is_sym": True,
                "scale": [0.1, 0.3],
                "offset": [-128, -128],
            },
        ],
    }
    a, b = parse_aimet(legacy), parse_aimet(v1)
    assert (a.form, b.form) == ("legacy", "1.0.0")
    for name in ("conv.weight", "f16"):
        ea, eb = a.all()[name], b.all()[name]
        assert (ea.scale, ea.offset, ea.bitwidth, ea.dtype, ea.is_symmetric) == (
            eb.scale,
            eb.offset,
            eb.bitwidth,
            eb.dtype,
            eb.is_symmetric,
        )
    w = a.params["conv.weight"]
    assert w.channels == 2 and w.offset == (-128, -128) and w.min == (0.1 * -128, 0.3 * -128)
    assert a.activations["in"].min == (-2.0,) and a.activations["in"].max == (
        3.1,
    )  # the file's own min/max kept
    assert b.activations["in"].min == (0.02 * -100,) and b.activations["in"].max == (
        0.02 * 155,
    )  # 1.0.0: derived
    mm = a.activations["mm_only"]  # AIMET rule when only min/max are given
    assert mm.scale == (3.0 / 255,) and mm.offset == (round(-1.0 / (3.0 / 255)),)
    for version in ("0.6.1", "1.0.0"):
        back = parse_aimet(json.loads(json.dumps(aimet_dict(a.all().values(), version))))
        for name, e in a.all().items():
            r = back.all()[name]
            assert (r.scale, r.offset, r.bitwidth, r.dtype, r.kind) == (
                e.scale,
                e.offset,
                e.bitwidth,
                e.dtype,
                e.kind,
            )


@pytest.mark.parametrize(
    "text,expect",
    [
        (
            '{\n  "activation_encodings": {\n    "a": [ {"bitwidth": 8,, } ]\n  }\n}',
            "line 3, column",
        ),
        (
            '{"foo": 1, "bar": []}',
            "expected an AIMET encodings file: 'activation_encodings' and 'param_encodings'",
        ),
        ('{"activation_encodings": {}, "param_encodings": {}}', "holds no encodings"),
        ('{"version": "2.0.0", "encodings": []}', "version 2.0.0"),
        ('{"graph": {"tensors": {}}}', "is a QNN graph JSON"),
        (
            '{"activation_encodings": {"conv1": {"input": {"0": {}}, "output": {"0": {}}}}}',
            "_torch.encodings",
        ),
        (
            '{"activation_encodings": {"t": [{"bitwidth": 8}]}}',
            "'t': needs 'scale' and 'offset', or 'min' and 'max'",
        ),
        (
            '{"param_encodings": [{"name": "w", "dtype": "INT", "bw": 8, "scale": [0.1]}]}',
            "missing 'offset'",
        ),
        ("[1, 2]", "found a JSON list"),
    ],
)
def test_bad_aimet_files_get_one_line_errors(tmp_path, text, expect):
    path = tmp_path / "enc.json"
    path.write_text(text)
    with pytest.raises(AccdbgError) as err:
        load_aimet(path)
    msg = str(err.value)
    assert expect in msg and "\n" not in msg
    assert str(path) in msg


@pytest.mark.parametrize(
    "doc,expect",
    [
        ({"tensors": {}}, "expected the keys 'graph' -> 'tensors'"),
        (
            {"activation_encodings": {}, "param_encodings": {}},
            "is an AIMET encodings file; pass it as --aimet_encodings_json",
        ),
    ],
)
def test_bad_qnn_json_names_the_expected_keys(tmp_path, doc, expect):
    path = tmp_path / "net.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(AccdbgError, match="expected|AIMET") as err:
        load_qnn_graph(path)
    assert expect in str(err.value)


def test_cli_errors_are_one_line(capsys, tmp_path):
    qnn = tmp_path / "model_net.json"
    qnn.write_text(json.dumps(_qnn_doc({"f": _qnn_variants()["f"]})))
    aimet = tmp_path / "a.json"
    aimet.write_text(
        json.dumps({"activation_encodings": {"f": [_legacy(0.1, 0)]}, "param_encodings": {}})
    )
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        qnn,
        "--aimet_encodings_json",
        aimet,
        "-w",
        tmp_path,
    )
    assert code == 2 and "has no quantized tensors" in one_line_error(err)
    broken = tmp_path / "broken.json"
    broken.write_text('{"graph": {"tensors": {\n}')
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        broken,
        "--aimet_encodings_json",
        aimet,
        "-w",
        tmp_path,
    )
    assert code == 2 and "line 2, column 2" in one_line_error(err) and "broken.json" in err
    code, _, err = run_cli(capsys, "--compare_encodings", "--input", qnn, "-w", tmp_path)
    assert code == 2 and "--aimet_encodings_json" in one_line_error(err)
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        qnn,
        "--aimet_encodings_json",
        aimet,
        "--params_only",
        "--activations_only",
    )
    assert code == 2 and "not allowed with argument" in one_line_error(err)
    assert not (tmp_path / "compare_encodings").exists() or not any(
        (tmp_path / "compare_encodings").iterdir()
    )


def test_matching_rules_and_their_names():
    graph = QnnGraph(
        path=None,
        tensors={},
        nodes={
            "/stem/conv/Conv_token_1": {
                "type": "Conv2d",
                "input_names": ["x"],
                "output_names": ["conv_out_q"],
            },
            "Transpose_token_9": {
                "type": "Transpose",
                "input_names": ["y_QuantizeLinear"],
                "output_names": ["QuantizeLinear_token_9_out0"],
            },
            "Transpose_token_10": {
                "type": "Transpose",
                "input_names": ["QuantizeLinear_token_9_out0"],
                "output_names": ["t10"],
            },
        },
    )
    aimet = [
        "x",
        "w",
        "y",
        "/2/22/Conv_output_0",
        "3.weird-name",
        "/stem/conv/Conv_output_0",
        "lonely",
        "a/b",
        "a.b",
    ]
    qnn = [
        "x",
        "w_quantized",
        "y_QuantizeLinear",
        "__2_22_Conv_output_0",
        "3_weird_name",
        "conv_out_q",
        "QuantizeLinear_token_9_out0",
        "t10",
        "extra",
        "a_b",
    ]
    pairs, only_a, only_q = match_names(aimet, qnn, graph)
    got = {(p.aimet_name, p.qnn_name): p.matched_by for p in pairs}
    assert got == {
        ("x", "x"): "exact",
        ("w", "w_quantized"): "qnn_ep_param",
        ("y", "y_QuantizeLinear"): "qnn_ep_activation",
        ("/2/22/Conv_output_0", "__2_22_Conv_output_0"): "sanitized",
        ("3.weird-name", "3_weird_name"): "sanitized_loose",
        ("/stem/conv/Conv_output_0", "conv_out_q"): "graph_producer",
        ("y", "QuantizeLinear_token_9_out0"): "graph_layout_copy",
        ("y", "t10"): "graph_layout_copy",
    }
    # 'a/b' and 'a.b' both sanitize to 'a_b': ambiguous, so neither is paired
    assert set(only_a) == {"lonely", "a/b", "a.b"} and set(only_q) == {"extra", "a_b"}
    assert (
        sanitize("/2/22/Conv_output_0") == "__2_22_Conv_output_0" and sanitize("conv1") == "conv1"
    )


def test_tensor_mapping_beside_the_qnn_json_is_used(tmp_path):
    t = _qnn_variants()["act"]
    (tmp_path / "model_net.json").write_text(json.dumps(_qnn_doc({"qnn_tensor_7": t})))
    (tmp_path / "tensor_mapping.json").write_text(json.dumps({"qnn_tensor_7": "onnx::weird:0"}))
    aimet = tmp_path / "a.json"
    aimet.write_text(
        json.dumps(
            {"activation_encodings": {"onnx::weird:0": [_legacy(0.5, -10)]}, "param_encodings": {}}
        )
    )
    res = compare_encodings(tmp_path / "model_net.json", aimet, working_dir=tmp_path / "w")
    assert res.table[["aimet_name", "qnn_name", "matched_by"]].values.tolist() == [
        ["onnx::weird:0", "qnn_tensor_7", "tensor_mapping"]
    ]
    assert res.table["mismatches"].tolist() == [""]


def _hostile_case(tmp_path):
    names = ['=HYPERLINK("http://x","y")', "+cmd", "-2+3", "@SUM(A1)", "plain"]
    tensors, acts = {}, {}
    for i, n in enumerate(names):
        tensors[n] = {
            "type": 3,
            "data_type": 0x0408,
            "dims": [1],
            "quant_params": {
                "definition": 1,
                "encoding": 0,
                "scale_offset": {"scale": 0.25 * (i + 1), "offset": -i},
            },
        }
        acts[n] = [_legacy(0.25 * (i + 1) * (1.5 if n == "plain" else 1.0), -i)]
    tensors["=only_qnn"] = dict(tensors["plain"])
    acts["-only_aimet"] = [_legacy(0.1, 0)]
    (tmp_path / "model_net.json").write_text(json.dumps(_qnn_doc(tensors)))
    (tmp_path / "a.json").write_text(
        json.dumps({"activation_encodings": acts, "param_encodings": {}})
    )
    return names


def test_workbook_cells_never_become_formulas_and_only_real_differences_are_red(tmp_path):
    names = _hostile_case(tmp_path)
    res = compare_encodings(
        tmp_path / "model_net.json",
        tmp_path / "a.json",
        working_dir=tmp_path / "w",
        output_dirname="r",
    )
    wb = openpyxl.load_workbook(res.run_dir / "encodings_diff.xlsx")
    texts = [c for ws in wb for row in ws.iter_rows() for c in row if isinstance(c.value, str)]
    assert not [
        c.coordinate
        for c in texts
        if c.data_type == "f" or c.value.startswith(("=", "+", "-", "@"))
    ]
    ws = wb["activations"]
    header = [c.value for c in ws[1]]
    rows = {r[0].value: r for r in ws.iter_rows(min_row=2)}
    assert set(rows) == {("'" + n if n[0] in "=+-@" else n) for n in names}
    red = {
        (r[0].value, header[c.column - 1]) for r in ws.iter_rows(min_row=2) for c in r if is_red(c)
    }
    # the AIMET entry gives no min/max, so they follow its (changed) scale and differ too
    assert red == {
        ("plain", f"{f} ({side})") for f in ("scale", "min", "max") for side in ("AIMET", "QNN")
    }
    assert (
        ws.freeze_panes == "C2"
        and ws.auto_filter.ref == f"A1:{openpyxl.utils.get_column_letter(len(header))}{ws.max_row}"
    )
    assert ws.column_dimensions["A"].width >= len('=HYPERLINK("http://x","y")')
    sided = {r[2].value: r[0].value for r in wb["one_sided"].iter_rows(min_row=2)}
    assert sided == {"'=only_qnn": "only in QNN", "'-only_aimet": "only in AIMET"}


def _conv_model(tmp_path):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    return onnx.load(str(built.path))


def test_overrides_types_zero_points_and_axis(tmp_path, capsys):
    model = _conv_model(tmp_path)
    doc = {
        "activation_encodings": {
            "x": [_legacy(0.02, -100)],
            "relu0": [_legacy(0.01, 0)],
            "not_a_tensor": [_legacy(0.1, 0)],
            "conv1": [{"bitwidth": 16, "dtype": "float"}],
        },
        "param_encodings": {
            "w0": [_legacy(s, -128, sym="True") for s in (0.1, 0.2, 0.3, 0.4)],
            "w1": [_legacy(0.05, -77)],
            "b0": [_legacy(1e-6, -(2**31), bw=32, sym="True")],
        },
    }
    ov = aimet_to_tensor_quant_overrides(doc, model)
    warned = capsys.readouterr().err
    from onnxruntime.quantization import QuantType

    assert set(ov) == {"x", "relu0", "w0", "w1"}  # bias, float and unknown names left out
    assert "not_a_tensor" in warned and "conv1 (float)" in warned
    x = ov["x"][0]
    assert (
        x["quant_type"] == QuantType.QUInt8
        and x["zero_point"].dtype == np.uint8
        and int(x["zero_point"]) == 100
    )
    assert x["scale"].dtype == np.float32 and float(x["scale"]) == float(np.float32(0.02))
    w0 = ov["w0"]
    assert len(w0) == 4 and all(e["axis"] == 0 and e["quant_type"] == QuantType.QInt8 for e in w0)
    assert [int(e["zero_point"]) for e in w0] == [0, 0, 0, 0] and w0[0][
        "zero_point"
    ].dtype == np.int8
    assert int(ov["w1"][0]["zero_point"]) == 77 and ov["w1"][0]["quant_type"] == QuantType.QUInt8
    with pytest.raises(AccdbgError, match="offset 300 gives zero point -300"):
        aimet_to_tensor_quant_overrides({"activation_encodings": {"x": [_legacy(0.1, 300)]}}, model)
    with pytest.raises(AccdbgError, match="none of its 1 tensor names"):
        aimet_to_tensor_quant_overrides(
            {"activation_encodings": {"nope": [_legacy(0.1, 0)]}}, model
        )


class _Reader:
    def __init__(self, feeds):
        self.feeds = list(feeds)

    def get_next(self):
        return self.feeds.pop() if self.feeds else None


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_export_matches_initializers_and_round_trips_through_overrides(tmp_path, per_channel):
    from onnxruntime.quantization import QuantType, quantize

    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    wt = QuantType.QInt8 if per_channel else QuantType.QUInt8
    cfg = qnn_quantization().get_qnn_qdq_config(
        str(built.path), _Reader([{"x": x}]), weight_type=wt, per_channel=per_channel
    )
    first = tmp_path / "first.qdq.onnx"
    quantize(str(built.path), str(first), cfg)
    encs = qdq_encodings(first)
    # independently: each DequantizeLinear's scale and zero point, by the ONNX formula
    m = onnx.load(str(first))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for node in (n for n in m.graph.node if n.op_type == "DequantizeLinear"):
        scale, zp = inits[node.input[1]].ravel(), inits[node.input[2]]
        info = np.iinfo(zp.dtype)
        name = node.input[0].removesuffix("_quantized") if node.input[0] in inits else None
        if name is None:
            q = next(n for n in m.graph.node if node.input[0] in n.output)
            name = (
                node.output[0] if node.output[0] in {o.name for o in m.graph.output} else q.input[0]
            )
        e = encs[name]
        assert e.scale == tuple(float(s) for s in scale)
        assert e.offset == tuple(
            int(info.min) - int(z) for z in np.broadcast_to(zp.ravel(), scale.shape)
        )
        assert e.bitwidth == info.bits
    assert any(e.channels == 4 for e in encs.values()) == per_channel
    out = tmp_path / "enc.json"
    from accdbg.encodings import export_qdq_encodings

    export_qdq_encodings(first, out)
    with pytest.raises(AccdbgError, match="already exists"):
        export_qdq_encodings(first, out)
    ov = aimet_to_tensor_quant_overrides(json.loads(out.read_text()), onnx.load(str(built.path)))
    cfg2 = qnn_quantization().get_qnn_qdq_config(
        str(built.path),
        _Reader([{"x": x * 0.1}]),
        weight_type=wt,
        per_channel=per_channel,
        init_overrides=ov,
    )
    second = tmp_path / "second.qdq.onnx"
    quantize(str(built.path), str(second), cfg2)
    again = qdq_encodings(second)
    assert set(again) == set(encs)
    for name, e in encs.items():
        r = again[name]
        assert (r.scale, r.offset, r.bitwidth, r.source["onnx_type"]) == (
            e.scale,
            e.offset,
            e.bitwidth,
            e.source["onnx_type"],
        ), name


def _one_tensor_case(tmp_path, qnn_scale: float, aimet_scale: float) -> None:
    t = {
        "type": 3,
        "data_type": 0x0408,
        "dims": [1],
        "quant_params": {
            "definition": 1,
            "encoding": 0,
            "scale_offset": {"scale": qnn_scale, "offset": -3},
        },
    }
    (tmp_path / "model_net.json").write_text(json.dumps(_qnn_doc({"t": t})))
    aimet = {"activation_encodings": {"t": [_legacy(aimet_scale, -3)]}, "param_encodings": {}}
    (tmp_path / "a.json").write_text(json.dumps(aimet))


@pytest.mark.parametrize("precision,flagged", [(17, True), (7, True), (6, False), (3, False)])
def test_precision_is_decimal_places_of_the_float32_values(tmp_path, precision, flagged):
    # 0.5000001 is a different float32 from 0.5 (ulp 6e-8) and first differs at the 7th decimal
    assert np.float32(0.5000001) != np.float32(0.5)
    _one_tensor_case(tmp_path, 0.5, 0.5000001)
    res = compare_encodings(
        tmp_path / "model_net.json",
        tmp_path / "a.json",
        precision=precision,
        working_dir=tmp_path / "w",
    )
    # (min/max follow the scale: max = 252 * scale differs from the 5th decimal on)
    assert ("scale" in res.table["mismatches"].iloc[0].split(", ")) == flagged
    assert ("max" in res.table["mismatches"].iloc[0].split(", ")) == (precision >= 5)


def test_differences_below_float32_resolution_are_not_disagreements(tmp_path):
    # AIMET writes doubles; QNN holds float32: a double that rounds to QNN's float32 agrees with it
    s32 = float(np.float32(0.0123))
    _one_tensor_case(tmp_path, s32, s32 + 1e-12)
    res = compare_encodings(
        tmp_path / "model_net.json", tmp_path / "a.json", working_dir=tmp_path / "w"
    )
    assert res.table["mismatches"].tolist() == [""]


def test_folder_inputs_and_float_tensors(tmp_path):
    """A folder of EP partition dumps is merged; a float QNN tensor only meets leftover AIMET names."""
    v = _qnn_variants()
    dumps = tmp_path / "qnn_json"
    dumps.mkdir()
    (dumps / "QNNExecutionProvider_a_1_0.json").write_text(json.dumps(_qnn_doc({"act": v["act"]})))
    (dumps / "QNNExecutionProvider_b_2_0.json").write_text(
        json.dumps(_qnn_doc({"x": v["f"], "x_QuantizeLinear": v["a16"]}))
    )
    (dumps / "QNNExecutionProvider_b_2_0_tensor_log.json").write_text("{}")
    aimet = {
        "activation_encodings": {
            "act": [_legacy(0.5, -10)],
            "x": [_legacy(0.001, -32768, bw=16)],
            "f16_wanted": [{"bitwidth": 16, "dtype": "float"}],
        },
        "param_encodings": {},
    }
    (tmp_path / "a.json").write_text(json.dumps(aimet))
    res = compare_encodings(dumps, tmp_path / "a.json", working_dir=tmp_path / "w")
    got = {r.aimet_name: (r.qnn_name, r.matched_by, r.mismatches) for r in res.table.itertuples()}
    # 'x' pairs with the quantized 'x_QuantizeLinear', not with the float graph input 'x'
    assert got == {"act": ("act", "exact", ""), "x": ("x_QuantizeLinear", "qnn_ep_activation", "")}
    assert res.only_aimet["name"].tolist() == ["f16_wanted"] and res.only_qnn.empty
    ext = json.loads((res.run_dir / "extracted_encodings.json").read_text())
    assert set(ext["activation_encodings"]) == {
        "act",
        "x_QuantizeLinear",
    }  # float tensors are not encodings
    with pytest.raises(AccdbgError, match="folder without model_net.json"):
        compare_encodings(tmp_path / "w", tmp_path / "a.json", working_dir=tmp_path / "w")


def test_an_infinite_encoding_is_left_out_of_an_export_with_a_warning(tmp_path):
    """A -inf constant (a mask, a reduction's start) gets an infinite scale from onnxruntime's
    quantizer: no AIMET file holds it. The export leaves it out and says so; the rest is
    written (it stopped with `internal error: non-finite encoding value inf`)."""
    from accdbg.encodings import export_qdq_encodings

    u8 = lambda v, n: numpy_helper.from_array(np.array(v, np.uint8), n)  # noqa: E731
    f32 = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
            helper.make_node("DequantizeLinear", ["c_quantized", "c_scale", "c_zp"], ["c"]),
            helper.make_node("Max", ["xd", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [
            f32(0.1, "x_scale"),
            u8(128, "x_zp"),
            u8([0], "c_quantized"),
            f32(np.inf, "c_scale"),
            u8(255, "c_zp"),
        ],
    )
    path = tmp_path / "inf.qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    out = tmp_path / "enc.json"
    import logging

    seen: list[logging.LogRecord] = []
    catch = logging.Handler(logging.WARNING)
    catch.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("accdbg.encodings").addHandler(catch)
    try:
        export_qdq_encodings(path, out)
    finally:
        logging.getLogger("accdbg.encodings").removeHandler(catch)
    assert [r.getMessage() for r in seen] == [
        "1 encoding(s) not exported, not finite (a constant -inf or +inf): c"
    ]
    doc = json.loads(out.read_text())
    assert set(doc["activation_encodings"]) == {"x"} and doc["param_encodings"] == {}
    assert doc["activation_encodings"]["x"][0]["scale"] == pytest.approx(0.1)
