"""``--compare_encodings`` on the real PP-OCRv4 det model quantized for QNN HTP.

The QNN side is the ``model_net.json`` of an inference-engine run (QNN EP graph dump); the
AIMET side is written here straight from the QDQ model's DequantizeLinear initializers by the
ONNX formula, then edited on purpose. The workbook must flag exactly the edited cells.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import openpyxl
import pytest
from onnx import numpy_helper

from accdbg.cli.main import setup_logging
from accdbg.core.imports import qnn_quantization
from accdbg.core.inputs import parse_input_tensor
from accdbg.encodings import compare_encodings, fill_per_channel_from_qdq, qdq_encodings
from accdbg.reports.excel import is_red
from tests.helpers import one_line_error, run_cli


@pytest.fixture(autouse=True)
def _console_logging(capsys):
    """The CLI binds its console handler to the stderr of the test that ran it; rebind it here."""
    setup_logging(False)


def hand_aimet(qdq_path: Path) -> dict:
    """AIMET legacy encodings of a QDQ model, by the ONNX formula (independent of accdbg.encodings).

    real = scale * (q - zero_point); AIMET: real = scale * (q_unsigned + offset), so
    offset = storage_min - zero_point (0 for unsigned types, -2**(bits-1) for signed ones).
    Names: initializers without onnxruntime's '_quantized' suffix; activations by the
    QuantizeLinear input (or the graph output the DequantizeLinear restores).
    """
    m = onnx.load(str(qdq_path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    outputs = {o.name for o in m.graph.output}
    doc = {"version": "0.6.1", "activation_encodings": {}, "param_encodings": {}}
    for node in m.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        scale, zp = inits[node.input[1]].ravel(), inits[node.input[2]]
        info = np.iinfo(zp.dtype)
        zps = np.broadcast_to(zp.ravel(), scale.shape)
        if node.input[0] in inits:
            section, name = "param_encodings", node.input[0].removesuffix("_quantized")
        else:
            q = producer[node.input[0]]
            section = "activation_encodings"
            name = node.output[0] if node.output[0] in outputs else q.input[0]
        entries = []
        for s, z in zip(scale, zps, strict=True):
            off = int(info.min) - int(z)
            entries.append(
                {
                    "bitwidth": info.bits,
                    "dtype": "int",
                    "is_symmetric": str(info.min < 0 and z == 0),
                    "scale": float(s),
                    "offset": off,
                    "min": float(s) * off,
                    "max": float(s) * (off + 2**info.bits - 1),
                }
            )
        doc[section][name] = entries
    return doc


@pytest.fixture(scope="module")
def det_run(ppocr_det, ppocr_small_input, tmp_path_factory):
    """PP-OCRv4 det quantized (A8W8, per tensor) and run on QNN HTP by the inference engine."""
    from accdbg.engines import run_inference_engine

    work = tmp_path_factory.mktemp("det_engine")
    res = run_inference_engine(
        ppocr_det,
        input_tensors=[parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])],
        working_dir=work,
        output_dirname="det",
        debug=False,
    )
    assert res.model_net_json is not None and res.model_net_json.is_file()
    return res


@pytest.fixture(scope="module")
def det_files(det_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("det_files")
    aimet = hand_aimet(det_run.qdq_model)
    path = tmp / "aimet.json"
    path.write_text(json.dumps(aimet, indent=1))
    qnn = json.loads(det_run.model_net_json.read_text())["graph"]["tensors"]
    return {"dir": tmp, "aimet": aimet, "aimet_path": path, "qnn": qnn}


@pytest.fixture(scope="module")
def baseline(det_run, det_files):
    return compare_encodings(
        det_run.model_net_json,
        det_files["aimet_path"],
        working_dir=det_files["dir"] / "w",
        output_dirname="baseline",
    )


@pytest.mark.slow
def test_same_encodings_pair_up_and_nothing_is_flagged(det_files, baseline):
    qnn, aimet = det_files["qnn"], det_files["aimet"]
    t = baseline.table
    n_aimet = len(aimet["activation_encodings"]) + len(aimet["param_encodings"])
    assert len(t) > 500 and (t["mismatches"] == "").all()
    assert set(t["matched_by"]) <= {
        "exact",
        "qnn_ep_param",
        "qnn_ep_activation",
        "graph_layout_copy",
    }
    # whatever stays one-sided really has no counterpart under any rule
    for name in baseline.only_aimet["name"]:
        assert not {name, name + "_quantized", name + "_QuantizeLinear"} & set(qnn)
    assert len(set(t["aimet_name"])) + len(baseline.only_aimet) == n_aimet
    quantized = {n for n, v in qnn.items() if v["quant_params"]["definition"] == 1}
    assert set(t["qnn_name"]) | set(baseline.only_qnn["name"]) == quantized
    assert all("_token_" in n for n in baseline.only_qnn["name"])  # tensors QNN made itself
    # extracted_encodings.json holds QNN's values in the AIMET convention
    ext = json.loads((baseline.run_dir / "extracted_encodings.json").read_text())
    assert len(ext["activation_encodings"]) + len(ext["param_encodings"]) == len(quantized)
    for name in quantized:
        raw = qnn[name]
        entry = (ext["param_encodings"] if raw["type"] == 4 else ext["activation_encodings"])[name][
            0
        ]
        so = raw["quant_params"]["scale_offset"]
        signed_shift = (
            2**31 if raw["data_type"] == 0x0332 else 0
        )  # SFIXED_POINT_32 stores the signed-domain offset
        assert entry["scale"] == so["scale"] and entry["offset"] == so["offset"] - signed_shift
        assert entry["bitwidth"] == {0x0408: 8, 0x0332: 32}[raw["data_type"]]


def _edits(det_files):
    """The deliberate changes: a scale, an offset, a bitwidth, one missing and one extra tensor."""
    aimet = json.loads(json.dumps(det_files["aimet"]))
    qnn = det_files["qnn"]
    acts = sorted(n for n in aimet["activation_encodings"] if n + "_QuantizeLinear" in qnn)
    params = sorted(n for n, e in aimet["param_encodings"].items() if e[0]["bitwidth"] == 8)
    a_scale, a_offset, a_missing = acts[3], acts[10], acts[20]
    p_bits = params[5]
    aimet["activation_encodings"][a_scale][0]["scale"] *= 1.25
    aimet["activation_encodings"][a_offset][0]["offset"] += 3
    aimet["param_encodings"][p_bits][0]["bitwidth"] = 16
    del aimet["activation_encodings"][a_missing]
    aimet["param_encodings"]["ghost.weight"] = [
        {
            "bitwidth": 8,
            "dtype": "int",
            "is_symmetric": "False",
            "scale": 0.01,
            "offset": -3,
            "min": -0.03,
            "max": 2.52,
        }
    ]
    return aimet, a_scale, a_offset, a_missing, p_bits


@pytest.mark.slow
def test_deliberate_changes_are_exactly_the_red_cells(capsys, det_run, det_files, baseline):
    aimet, a_scale, a_offset, a_missing, p_bits = _edits(det_files)
    path = det_files["dir"] / "edited.json"
    path.write_text(json.dumps(aimet))
    work = det_files["dir"] / "w"
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        det_run.model_net_json,
        "--aimet_encodings_json",
        path,
        "-w",
        work,
        "--output_dirname",
        "edited",
    )
    assert code == 0, err
    run = work / "compare_encodings" / "edited"
    assert (work / "compare_encodings" / "latest").resolve() == run.resolve()
    assert sorted(p.name for p in run.iterdir()) == [
        "compare_encodings_options.json",
        "encodings_diff.xlsx",
        "extracted_encodings.json",
        "log.txt",
    ]
    wb = openpyxl.load_workbook(run / "encodings_diff.xlsx")
    red = set()
    for ws in wb:
        header = [c.value for c in ws[1]]
        for row in ws.iter_rows(min_row=2):
            red.update((ws.title, row[0].value, header[c.column - 1]) for c in row if is_red(c))
    both = ("AIMET", "QNN")
    assert red == (
        {("activations", a_scale, f"scale ({s})") for s in both}
        | {("activations", a_offset, f"offset ({s})") for s in both}
        | {("params", p_bits, f"bitwidth ({s})") for s in both}
    )
    for title in ("params", "activations"):  # unchanged tensors are not flagged
        ws = wb[title]
        col = [c.value for c in ws[1]].index("mismatches")
        flagged = {r[0].value: r[col].value for r in ws.iter_rows(min_row=2) if r[col].value}
        assert flagged == (
            {a_scale: "scale", a_offset: "offset"}
            if title == "activations"
            else {p_bits: "bitwidth"}
        )
    sided = {(r[0].value, r[2].value) for r in wb["one_sided"].iter_rows(min_row=2)}
    base = {
        (s, n)
        for s, n in zip(
            list(baseline.only_qnn["side"]) + list(baseline.only_aimet["side"]),
            list(baseline.only_qnn["name"]) + list(baseline.only_aimet["name"]),
            strict=True,
        )
    }
    assert sided == base | {
        ("only in QNN", a_missing + "_QuantizeLinear"),
        ("only in AIMET", "ghost.weight"),
    }
    summary = {r[0].value: r[3].value for r in wb["summary"].iter_rows(min_row=2) if r[0].value}
    assert (
        summary["scale mismatch"],
        summary["offset mismatch"],
        summary["bitwidth mismatch"],
    ) == (1, 1, 1)
    assert (
        summary["tensors with a mismatch"] == 3
        and summary["min mismatch"] == summary["max mismatch"] == 0
    )
    assert summary["only in AIMET"] == len(baseline.only_aimet) + 1
    log = (run / "log.txt").read_text()
    assert (
        "in QNN but not in AIMET" in log
        and a_missing + "_QuantizeLinear" in log
        and "ghost.weight" in log
    )
    assert "ghost.weight" in err and "WARNING" in log
    opts = json.loads((run / "compare_encodings_options.json").read_text())
    assert opts["aimet_encodings_json"] == str(path) and opts["precision"] == 17


@pytest.mark.slow
def test_specific_node_prints_both_sides_and_the_difference(capsys, det_run, det_files):
    aimet, a_scale, _, a_missing, _ = _edits(det_files)
    path = det_files["dir"] / "edited_node.json"
    path.write_text(json.dumps(aimet))
    work = det_files["dir"] / "w"
    qnn_scale = det_files["qnn"][a_scale + "_QuantizeLinear"]["quant_params"]["scale_offset"][
        "scale"
    ]
    code, out, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        det_run.model_net_json,
        "--aimet_encodings_json",
        path,
        "-w",
        work,
        "--specific_node",
        a_scale,
    )
    assert code == 0, err
    lines = {ln.split()[0]: ln for ln in out.splitlines()[2:] if ln.startswith("  ") and ln.split()}
    assert repr(qnn_scale) in lines["scale"] and repr(qnn_scale * 1.25) in lines["scale"]
    assert lines["scale"].endswith("<-- differs") and not lines["offset"].endswith("<-- differs")
    assert "differences: scale" in out and a_scale + "_QuantizeLinear" in out
    code, out, _ = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        det_run.model_net_json,
        "--aimet_encodings_json",
        path,
        "-w",
        work,
        "--specific_node",
        a_missing + "_QuantizeLinear",
    )
    assert code == 0 and "only in QNN" in out
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        det_run.model_net_json,
        "--aimet_encodings_json",
        path,
        "-w",
        work,
        "--specific_node",
        a_scale + "x",
    )
    assert code == 2 and "near matches" in one_line_error(err) and a_scale in err


@pytest.mark.parametrize(
    "flag,kept,dropped",
    [("--params_only", "params", "activations"), ("--activations_only", "activations", "params")],
)
@pytest.mark.slow
def test_params_only_and_activations_only(
    capsys, det_run, det_files, baseline, flag, kept, dropped
):
    work = det_files["dir"] / "w"
    # --input takes the engine's run folder too (its model_net.json, and tensor_mapping.json beside it)
    qnn_input = det_run.run_dir if flag == "--activations_only" else det_run.model_net_json
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--input",
        qnn_input,
        "--aimet_encodings_json",
        det_files["aimet_path"],
        "-w",
        work,
        flag,
        "--output_dirname",
        flag.strip("-"),
    )
    assert code == 0, err
    wb = openpyxl.load_workbook(
        work / "compare_encodings" / flag.strip("-") / "encodings_diff.xlsx"
    )
    assert kept in wb.sheetnames and dropped not in wb.sheetnames
    section = "param_encodings" if kept == "params" else "activation_encodings"
    aimet_names = {r[0].value for r in wb[kept].iter_rows(min_row=2)}
    assert aimet_names == set(det_files["aimet"][section]) - set(baseline.only_aimet["name"])
    summary = {r[0].value: r for r in wb["summary"].iter_rows(min_row=2) if r[0].value}
    assert summary["tensors compared"][1 if kept == "activations" else 2].value == 0
    assert summary["tensors compared"][3].value == wb[kept].max_row - 1
    assert {r[1].value for r in wb["one_sided"].iter_rows(min_row=2)} <= {kept.rstrip("s")}


@pytest.mark.slow
def test_round_trip_qdq_to_aimet_to_overrides_to_qdq(
    capsys, det_run, det_files, ppocr_det, ppocr_small_input
):
    """Export the engine's QDQ encodings, quantize again with them as -qo: every scale/offset is kept."""
    from accdbg.engines import run_inference_engine

    out = det_files["dir"] / "exported_v1.json"
    code, _, err = run_cli(
        capsys,
        "--compare_encodings",
        "--export_qdq_encodings",
        det_run.qdq_model,
        "-o",
        out,
        "--encoding_version",
        "1.0.0",
    )
    assert code == 0, err
    assert json.loads(out.read_text())["version"] == "1.0.0"
    code, _, err = run_cli(
        capsys, "--compare_encodings", "--export_qdq_encodings", det_run.qdq_model, "-o", out
    )
    assert code == 2 and "already exists" in one_line_error(err)
    again = run_inference_engine(
        ppocr_det,
        input_tensors=[parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])],
        working_dir=det_files["dir"] / "engine",
        output_dirname="rt",
        debug=False,
        quantization_overrides=out,
    )
    first, second = hand_aimet(det_run.qdq_model), hand_aimet(again.qdq_model)
    for section in ("activation_encodings", "param_encodings"):
        assert set(first[section]) == set(second[section])
        for name, entries in first[section].items():
            got = second[section][name]
            assert [(e["scale"], e["offset"], e["bitwidth"]) for e in entries] == [
                (e["scale"], e["offset"], e["bitwidth"]) for e in got
            ], name
    res = compare_encodings(
        again.model_net_json, out, working_dir=det_files["dir"] / "w", output_dirname="rt"
    )
    assert len(res.table) > 500 and (res.table["mismatches"] == "").all()


def _quantize_and_dump(float_model: Path, x: np.ndarray, work: Path) -> tuple[Path, Path]:
    """Per-channel int8 weights (opset 13+ needed for per-axis Q/DQ), QNN EP graph JSON dump."""
    import onnxruntime as ort
    import onnxruntime_qnn as q
    from onnx import version_converter
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from accdbg.core.onnx_model import fix_input_shapes

    m = onnx.load(str(float_model))
    fix_input_shapes(m, {"x": x.shape})
    onnx.save(m, str(work / "fixed.onnx"))
    quant_pre_process(str(work / "fixed.onnx"), str(work / "pre.onnx"))
    onnx.save(
        version_converter.convert_version(onnx.load(str(work / "pre.onnx")), 13),
        str(work / "pre13.onnx"),
    )

    class Reader:
        feeds = [{"x": x}]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    cfg = qnn_quantization().get_qnn_qdq_config(
        str(work / "pre13.onnx"), Reader(), weight_type=QuantType.QInt8, per_channel=True
    )
    qdq = work / "pc.qdq.onnx"
    quantize(str(work / "pre13.onnx"), str(qdq), cfg)
    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        ort.register_execution_provider_library("QNNExecutionProvider", q.get_library_path())
    devs = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    dump = work / "dump"
    dump.mkdir()
    so.add_provider_for_devices(
        devs,
        {
            "backend_path": q.get_qnn_htp_path(),
            "dump_json_qnn_graph": "1",
            "json_qnn_graph_dir": str(dump),
        },
    )
    ort.InferenceSession(str(qdq), sess_options=so)
    graphs = [p for p in dump.glob("*.json") if not p.name.endswith("_tensor_log.json")]
    assert len(graphs) == 1
    shutil.copyfile(graphs[0], work / "model_net.json")
    return qdq, work / "model_net.json"


@pytest.mark.slow
def test_per_channel_weights_from_the_qnn_ep_dump(tmp_path, ppocr_det, ppocr_small_input):
    x = np.fromfile(ppocr_small_input, dtype=np.float32).reshape(1, 3, 160, 160)
    qdq, net = _quantize_and_dump(ppocr_det, x, tmp_path)
    aimet = hand_aimet(qdq)
    per_channel = {n for n, e in aimet["param_encodings"].items() if len(e) > 1}
    assert len(per_channel) > 50
    (tmp_path / "aimet.json").write_text(json.dumps(aimet))
    # the EP dump has no per-channel values: those pairs are reported as not compared, never as mismatches
    res = compare_encodings(
        net, tmp_path / "aimet.json", working_dir=tmp_path / "w", output_dirname="dump"
    )
    unknown = res.table[res.table["note"].str.contains("not in this JSON")]
    assert set(unknown["aimet_name"]) == per_channel
    assert (res.table["mismatches"] == "").all()
    assert (
        unknown["channels_qnn"] == unknown["channels_aimet"]
    ).all()  # channel count decoded from the dump
    # filled from the QDQ model the EP was given, the values compare channel by channel
    doc = json.loads(net.read_text())
    assert fill_per_channel_from_qdq(doc, onnx.load(str(qdq))) == len(per_channel)
    filled = tmp_path / "filled.json"
    filled.write_text(json.dumps(doc))
    name = sorted(n for n in per_channel if n.endswith(".w_0"))[0]  # a conv weight
    aimet["param_encodings"][name][2]["scale"] *= 2
    (tmp_path / "aimet2.json").write_text(json.dumps(aimet))
    res = compare_encodings(
        filled, tmp_path / "aimet2.json", working_dir=tmp_path / "w", output_dirname="filled"
    )
    bad = res.table[res.table["mismatches"] != ""]
    assert bad["aimet_name"].tolist() == [name] and bad["mismatches"].tolist() == ["scale"]
    wb = openpyxl.load_workbook(res.run_dir / "encodings_diff.xlsx")
    ws = wb["per_channel"]
    header = [c.value for c in ws[1]]
    red = {
        (r[1].value, r[3].value, header[c.column - 1])
        for r in ws.iter_rows(min_row=2)
        for c in r
        if is_red(c)
    }
    assert red == {(name, 2, "scale (AIMET)"), (name, 2, "scale (QNN)")}
    assert ws.max_row - 1 == len(aimet["param_encodings"][name])
    # the exporter reads the same per-channel values (and axis) from the QDQ model
    m = onnx.load(str(qdq))
    dq = next(
        n
        for n in m.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] == name + "_quantized"
    )
    axis = next(a.i for a in dq.attribute if a.name == "axis")
    enc = qdq_encodings(qdq)[name]
    assert enc.axis == axis and list(enc.scale) == [
        e["scale"] for e in hand_aimet(qdq)["param_encodings"][name]
    ]
