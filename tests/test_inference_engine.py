"""The QNN inference engine on the real HTP backend (x86 emulation), and its failure modes."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.core.inputs import parse_input_tensor
from accdbg.core.isolate import Isolated, run_isolated
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines import run_inference_engine
from accdbg.engines.prepare import check_control_flow
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests import crashers, models
from tests.helpers import one_line_error, run_cli


def _qdq_activations(qdq_path) -> dict[str, tuple[float, int]]:
    """Float activation -> (scale, zero point) of its QuantizeLinear, read from the QDQ model."""
    m = onnx.load(str(qdq_path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    inputs = {i.name for i in m.graph.input}
    out = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inputs:
            out.setdefault(n.input[0], (float(inits[n.input[1]]), int(inits[n.input[2]])))
    return out


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conv")
    built = models.conv_net(tmp, channels=8, size=16, layers=3)
    inp = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    res = run_inference_engine(
        built.path, input_tensors=inp, working_dir=tmp / "w", output_dirname="qnn"
    )
    return built, inp, res, tmp


@pytest.mark.slow
def test_every_activation_comes_from_htp_on_the_quantization_grid(conv):
    built, _, res, _ = conv
    acts = _qdq_activations(res.qdq_model)
    folder = TensorFolder(res.results[0])
    mapping = json.loads(res.tensor_mapping.read_text())
    dumped = {folder.records[n].extra["qdq_tensor"]: n for n in folder.names()}
    assert set(dumped) == set(acts)  # every quantized activation, nothing else
    for qdq_name, name in dumped.items():
        scale, zp = acts[qdq_name]
        v = np.asarray(folder.load(name), np.float64)
        q = v / scale + zp
        np.testing.assert_allclose(q, np.rint(q), atol=1e-3)  # dequantized integers
        assert q.min() >= -1e-3 and q.max() <= 255 + 1e-3
    part = json.loads((res.run_dir / "partitioning.json").read_text())
    assert part["placement_counts"]["QNNExecutionProvider"] >= 1
    assert all(n["type"] in ("QuantizeLinear", "DequantizeLinear") for n in part["cpu_nodes"])
    assert set(mapping) == set(folder.names())


@pytest.mark.slow
def test_htp_is_not_cpu_fake_quant(conv):
    built, inp, res, tmp = conv
    sim = run_inference_engine(
        res.qdq_model,
        input_tensors=inp,
        stage="converted",
        engine="simulation",
        working_dir=tmp / "w",
        output_dirname="sim",
    )
    htp, cpu = TensorFolder(res.results[0]), TensorFolder(sim.results[0])
    assert set(htp.names()) == set(cpu.names())
    differing, steps = 0, []
    for name in htp.names():
        a, b = np.asarray(htp.load(name)), np.asarray(cpu.load(name))
        scale = htp.records[name].extra["scale"]
        diff = np.abs(a - b) / scale  # in quantization steps
        differing += int((diff > 0.5).sum())
        steps.append(diff.max())
        cos = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
        assert cos > 0.99, name  # same model, same encodings: close...
    assert differing > 0  # ...but HTP's integer kernels round differently from CPU fake-quant
    assert (
        "simulation" in json.loads((sim.results[0] / "tensors.json").read_text())["engine"].lower()
    )


@pytest.mark.slow
def test_tensor_mapping_points_at_golden_tensors_of_the_same_shape(conv):
    built, inp, res, tmp = conv
    gold = run_framework_diagnosis(
        "onnx", built.path, inp, working_dir=tmp / "w", output_dirname="gold"
    )
    golden = TensorFolder(gold.run_dir)
    target = TensorFolder(res.results[0])
    mapping = json.loads(res.tensor_mapping.read_text())
    assert mapping
    for inf_name, fw_name in mapping.items():
        assert fw_name in golden, fw_name
        assert golden.records[fw_name].shape == target.records[inf_name].shape
    struct = json.loads(res.graph_struct.read_text())
    assert [layer["outputs"][0] for layer in struct["layers"]] == [
        r.name for r in sorted(target, key=lambda r: r.index)
    ]


@pytest.mark.slow
def test_native_output_and_filters(conv):
    built, inp, res, tmp = conv
    nat = run_inference_engine(
        res.qdq_model,
        input_tensors=inp,
        stage="converted",
        output_data_type="float_and_native",
        skip_layer_types=["GlobalAveragePool"],
        working_dir=tmp / "w",
        output_dirname="nat",
    )
    folder = TensorFolder(nat.results[0])
    native = TensorFolder(nat.results[0] / "native")
    assert all(r.op_type != "GlobalAveragePool" for r in folder)
    for name in folder.names():
        rec = folder.records[name]
        ints = np.asarray(native.load(name))
        assert ints.dtype == np.uint8
        np.testing.assert_allclose(
            (ints.astype(np.float64) - rec.extra["zero_point"]) * rec.extra["scale"],
            folder.load(name),
            rtol=1e-6,
            atol=1e-7,
        )
    only = run_inference_engine(
        res.qdq_model,
        input_tensors=inp,
        stage="converted",
        add_layer_types=["Conv"],
        working_dir=tmp / "w",
        output_dirname="only_conv",
    )
    assert {r.op_type for r in TensorFolder(only.results[0])} == {"Conv"}


@pytest.mark.slow
def test_debug_mode_off_dumps_outputs_only(conv):
    built, inp, res, tmp = conv
    off = run_inference_engine(
        res.qdq_model,
        input_tensors=inp,
        stage="converted",
        debug=False,
        working_dir=tmp / "w",
        output_dirname="off",
    )
    assert TensorFolder(off.results[0]).names() == ["pool"]


@pytest.mark.slow
def test_outputs_named_by_the_list_and_o_are_what_debug_mode_off_dumps(conv, capsys):
    """qnn-net-run writes the outputs an input list's '#' line names; with --debug_mode_off
    so does the engine (with -o's), each as QNN produced it - the same values as the full
    dump of the same model and input."""
    built, inp, res, tmp = conv
    listing = tmp / "named.txt"
    listing.write_text(f"#relu1\nx:={built.input_path}\n")
    work = tmp / "named_w"
    code, _, err = run_cli(
        capsys, "--inference_engine", "-r", "htp", "-m", built.path, "-l", listing,
        "-o", "relu0", "--debug_mode_off", "-w", work, "--output_dirname", "named",
    )  # fmt: skip
    assert code == 0, err
    named = TensorFolder(work / "inference_engine" / "named" / "output" / "Result_0")
    assert sorted(named.names()) == ["relu0", "relu1"]
    full = TensorFolder(res.results[0])
    for name in ("relu0", "relu1"):
        np.testing.assert_allclose(named.load(name), full.load(name), atol=1e-6)
    # a Conv quantized with its Relu has no output of its own on QNN: said, not skipped
    code, _, err = run_cli(
        capsys, "--inference_engine", "-r", "htp", "-m", built.path, "-l", listing,
        "-o", "conv1", "--debug_mode_off", "-w", work,
    )  # fmt: skip
    line = one_line_error(err)
    assert code == 2 and line.startswith("qnn-accuracy-debugger: error: conv1: asked for"), err
    assert "name a layer output instead: relu0, relu1, relu2, pool" in line


@pytest.mark.slow
def test_input_list_several_inferences_and_bad_lines(tmp_path, capsys):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    rng = np.random.default_rng(3)
    for i in range(2):
        rng.standard_normal((1, 3, 8, 8)).astype(np.float32).tofile(tmp_path / f"in{i}.raw")
    good = tmp_path / "list.txt"
    good.write_text("in0.raw\nx:=in1.raw\n")
    res = run_inference_engine(built.path, input_list=good, working_dir=tmp_path / "w")
    assert [p.name for p in res.results] == ["Result_0", "Result_1"]
    a, b = TensorFolder(res.results[0]), TensorFolder(res.results[1])
    assert not np.array_equal(np.asarray(a.load("pool")), np.asarray(b.load("pool")))
    (tmp_path / "short.raw").write_bytes(b"\0" * 12)
    cases = {
        "line2": ("in0.raw\nshort.raw\n", "list.txt:2: input 'x'"),
        "name": ("y:=in0.raw\n", "list.txt:1: 'y' is not an input"),
        "missing": ("in0.raw\nnope.raw\n", "list.txt:2: input file"),
    }
    for text, expect in cases.values():
        good.write_text(text)
        code, _, err = run_cli(
            capsys,
            "--inference_engine",
            "-r",
            "htp",
            "-m",
            built.path,
            "-l",
            good,
            "-w",
            tmp_path / "w2",
        )
        assert code == 2 and expect in one_line_error(err), err


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["-r", "cpu"], "libQnnCpu.so is not shipped"),
        (["-r", "dspv66"], "pre-HTP Hexagon DSP"),
        (["-r", "htp", "-a", "aarch64-android"], "not reachable from this"),
        (["-r", "htp", "-bbw", "8"], "int32"),
        (["-r", "htp", "-qmcpp", "model.cpp"], "converter artefacts"),
        (
            ["-r", "htp", "--add_layer_outputs", "nope"],
            "--add_layer_outputs 'nope' is not a tensor of the",
        ),
        (
            ["-r", "htp", "--skip_layer_outputs", "convv0"],
            "'convv0' is not a tensor of the model; near matches",
        ),
        (["-r", "htp", "--add_layer_types", "Nope"], "no layer output left to dump"),
    ],
)
def test_runtime_and_flag_errors(tmp_path, capsys, argv, expect):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    code, _, err = run_cli(
        capsys,
        "--inference_engine",
        "-m",
        built.path,
        "-i",
        "x",
        "1,3,8,8",
        built.input_path,
        "-w",
        tmp_path / "w",
        *argv,
    )
    assert code == 2
    assert expect in one_line_error(err)


def test_a_model_quantized_for_integer_kernels_is_refused_in_one_line(tmp_path, capsys):
    """onnxruntime's dynamic quantization (MatMulInteger and friends) is neither float nor
    QDQ: the engine says so before anything runs, as does oneshot."""
    from onnxruntime.quantization import quantize_dynamic

    built = models.mlp(tmp_path)
    dyn = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(built.path), str(dyn))
    ops = {n.op_type for n in onnx.load(str(dyn)).graph.node}
    assert "MatMulInteger" in ops  # what onnxruntime made of the MatMuls
    argv = ["-m", dyn, "-i", "x", "2,4", built.input_path, "-w", tmp_path / "w"]
    for component in (["--inference_engine", "-r", "htp"], ["-f", "onnx", "-r", "htp"]):
        code, _, err = run_cli(capsys, *component, *argv)
        line = one_line_error(err)
        assert code == 2 and "is already quantized with integer operators (" in line
        assert "MatMulInteger x2" in line and "give the float model" in line
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").rglob("*.raw"))


@pytest.mark.slow
def test_gpu_backend_that_cannot_start_is_an_error_not_a_cpu_run(tmp_path):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    inp = [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])]
    with pytest.raises(AccdbgError, match="QNN backend did not run here"):
        run_inference_engine(
            built.path, input_tensors=inp, runtime="gpu", working_dir=tmp_path / "w"
        )


def _with_unsupported_op(tmp_path):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    m = onnx.load(str(built.path))
    m.graph.node.append(helper.make_node("Unique", ["pool"], ["uniq"], name="my_unique"))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("uniq", TensorProto.FLOAT, None))
    path = tmp_path / "unique.onnx"
    onnx.save(m, str(path))
    return path, [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])]


@pytest.mark.slow
def test_unsupported_ops_are_listed(tmp_path):
    path, inp = _with_unsupported_op(tmp_path)
    res = run_inference_engine(path, input_tensors=inp, working_dir=tmp_path / "w")
    part = json.loads((res.run_dir / "partitioning.json").read_text())
    assert {"name": "my_unique", "type": "Unique"} in [
        {k: u[k] for k in ("name", "type")} for u in part["unsupported_by_qnn"]
    ]
    cpu = {n["name"]: n for n in part["cpu_nodes"]}
    assert cpu["my_unique"]["type"] == "Unique"
    # QNN's own reason, read from the backend log, for every node left on the CPU
    assert cpu["my_unique"]["reason"] == "Operators of type `Unique` are not supported by QNN EP"
    log_lines = (res.run_dir / "backend_log.txt").read_text(encoding="utf-8").splitlines()
    for n in cpu.values():
        assert n["reason"] and n["source"] == "qnn_validation", n
        assert "Validation FAILED" in log_lines[n["log_line"] - 1]
    with pytest.raises(
        AccdbgError,
        match=r"QNN does not support \d+ node\(s\): my_unique \(Unique\): Operators of type `Unique`",
    ):
        run_inference_engine(
            path, input_tensors=inp, working_dir=tmp_path / "w", disable_cpu_fallback=True
        )


@pytest.mark.slow
def test_missing_onnxruntime_qnn_names_the_package(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    inp = [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])]
    with pytest.raises(AccdbgError, match="onnxruntime-qnn.*--engine simulation"):
        run_inference_engine(built.path, input_tensors=inp, working_dir=tmp_path / "w")


@pytest.mark.slow
def test_native_crash_is_reported_not_fatal():
    assert run_isolated(crashers.answer, 21, what="answering") == 42
    with pytest.raises(
        AccdbgError, match="crashed with SIGSEGV while testing a crash; the tool survived"
    ):
        run_isolated(crashers.segfault, what="testing a crash")
    with pytest.raises(AccdbgError, match="SIGABRT"):
        run_isolated(crashers.abort, what="testing an abort")


def test_a_childs_bug_is_one_line_and_its_traceback_a_note():
    """okay_nabu.tflite made LiteRT raise in the backend process: the console showed the
    child's whole traceback without -v. The error is one line (the message's first); the
    child's traceback is a note, printed with -v."""
    import traceback

    with pytest.raises(RuntimeError) as caught:
        run_isolated(crashers.raise_two_lines, what="raising")
    assert (
        str(caught.value) == "ValueError: Could not read the state tensor (in the backend process)"
    )
    (note,) = caught.value.__notes__
    assert note.startswith("the backend process's traceback:\nTraceback (most recent call last)")
    assert "raise_two_lines" in note and "second line of the message" in note
    assert note in "".join(traceback.format_exception(caught.value))  # what -v prints


def test_a_childs_log_records_are_logged_in_the_parent_as_they_were(caplog):
    """A child's own log records come back with their logger, level and lines; what native
    code prints stays the native log's."""
    with caplog.at_level(logging.INFO, logger="accdbg"):
        assert run_isolated(crashers.log_then_print, "chatter", what="logging") == "chatter"
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert ("accdbg.test_child", logging.WARNING, "first line\nsecond line") in got
    assert ("accdbg.native", logging.INFO, "[logging] chatter") in got
    assert not [m for *_, m in got if "accdbg-log" in m]


@pytest.mark.slow
def test_a_prestarted_child_warms_up_then_waits_for_its_work():
    child = Isolated.prestart("tests.crashers", what="answering")
    time.sleep(0.3)  # warm-up done, now waiting
    assert child._proc.poll() is None
    assert child.submit(crashers.answer, 21).result() == 42
    with pytest.raises(RuntimeError, match="already has its work"):
        child.submit(crashers.answer, 1)
    broken = Isolated.prestart("tests.no_such_module", what="warming up")
    with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
        broken.submit(crashers.answer, 21).result()
    idle = Isolated.prestart("tests.crashers", what="waiting")
    with pytest.raises(RuntimeError, match="no work was submitted"):
        idle.result()
    idle._tmp.cleanup()  # the parent gave up on it: the child leaves by itself
    assert idle._proc.wait(timeout=10) == 0


def test_a_waiting_child_whose_parent_died_leaves_nothing_behind():
    import subprocess
    import sys
    from pathlib import Path

    parent = (
        "import os; from accdbg.core.isolate import Isolated; "
        "c = Isolated.prestart('json', what='waiting'); print(c._tmp.name, flush=True); os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    folder = Path(out.stdout.strip())
    assert folder.name.startswith("accdbg-job-"), out.stderr
    deadline = time.monotonic() + 20
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists()


@pytest.mark.slow
def test_fp16_precision_runs_float_model_on_htp(tmp_path):
    built = models.conv_net(tmp_path, channels=8, size=16, layers=3)
    inp = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    res = run_inference_engine(
        built.path, input_tensors=inp, precision="fp16", working_dir=tmp_path / "w"
    )
    gold = run_framework_diagnosis("onnx", built.path, inp, working_dir=tmp_path / "w")
    g, t = TensorFolder(gold.run_dir), TensorFolder(res.results[0])
    assert not any(r.extra.get("quantized") for r in t)
    for name in t.names():
        a, b = np.asarray(g.load(name), np.float64), np.asarray(t.load(name), np.float64)
        assert np.abs(a - b).max() <= 0.02 * np.abs(a).max() + 1e-3, name
    part = json.loads((res.run_dir / "partitioning.json").read_text())
    assert part["placement_counts"]["QNNExecutionProvider"] >= 1


@pytest.mark.slow
def test_compiled_stage_runs_an_epcontext_model(conv, tmp_path):
    import onnxruntime_qnn as q

    from accdbg.engines.qnn import ensure_registered

    built, inp, res, _ = conv
    ensure_registered()
    ctx = tmp_path / "model_ctx.onnx"
    so = ort.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(ctx))
    so.add_provider_for_devices(
        [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"],
        {"backend_path": q.get_qnn_htp_path()},
    )
    ort.InferenceSession(str(res.qdq_model), so)
    comp = run_inference_engine(
        ctx, input_tensors=inp, stage="compiled", working_dir=tmp_path / "w"
    )
    out = TensorFolder(comp.results[0])
    assert out.names() == ["pool"]
    np.testing.assert_allclose(
        out.load("pool"), TensorFolder(res.results[0]).load("pool"), atol=1e-6
    )
    with pytest.raises(AccdbgError, match="no EPContext node"):
        run_inference_engine(
            res.qdq_model, input_tensors=inp, stage="compiled", working_dir=tmp_path / "w"
        )


@pytest.mark.slow
def test_profiling_output(conv, tmp_path):
    built, inp, res, _ = conv
    prof = run_inference_engine(
        res.qdq_model,
        input_tensors=inp,
        stage="converted",
        profiling_level="basic",
        debug=False,
        working_dir=tmp_path / "w",
    )
    text = (prof.run_dir / "qnn_profiling.csv").read_text()
    assert len(text.splitlines()) > 1


@pytest.fixture(scope="module", params=[8, 16], ids=["a8", "a16"])
def ppocr_run(request, tmp_path_factory, ppocr_det, ppocr_small_input):
    tmp = tmp_path_factory.mktemp(f"ppocr{request.param}")
    inp = [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])]
    res = run_inference_engine(
        ppocr_det, input_tensors=inp, act_bitwidth=request.param, working_dir=tmp / "w"
    )
    return request.param, inp, res, tmp


@pytest.mark.slow
def test_real_ppocr_det_every_quantized_activation_from_htp(ppocr_run, ppocr_det):
    bits, inp, res, tmp = ppocr_run
    acts = _qdq_activations(res.qdq_model)
    folder = TensorFolder(res.results[0])
    assert {r.extra["qdq_tensor"] for r in folder} == set(acts)
    assert len(acts) > 250
    assert {r.extra["bitwidth"] for r in folder} == {bits}
    part = json.loads((res.run_dir / "partitioning.json").read_text())
    assert part["placement_counts"]["QNNExecutionProvider"] == 1
    assert all(n["type"] in ("QuantizeLinear", "DequantizeLinear") for n in part["cpu_nodes"])
    net = json.loads(res.model_net_json.read_text())
    assert sum(1 for r in folder if r.extra.get("qnn_name") in net["graph"]["tensors"]) == len(
        folder
    )
    gold = TensorFolder(
        run_framework_diagnosis("onnx", ppocr_det, inp, working_dir=tmp / "w").run_dir
    )
    mapping = json.loads(res.tensor_mapping.read_text())
    assert set(mapping) == set(folder.names())
    for inf_name, fw_name in mapping.items():
        assert gold.records[fw_name].shape == folder.records[inf_name].shape
    steps = json.loads((res.run_dir / "preprocessing.json").read_text())
    assert any("fixed dynamic input x" in s for s in steps) and any("Constant" in s for s in steps)


def test_qnn_preprocessing_keeps_metadata_and_survives_its_own_failure(
    tmp_path, monkeypatch, caplog
):
    """onnxruntime's QNN pre-processing raises a TypeError on any model with metadata_props
    (PP-OCRv4 rec ships a 'character' table): it gets a copy without, the result gets it back."""
    from accdbg.core.imports import qnn_quantization
    from accdbg.engines.prepare import prepare_float_model

    ort_qnn = qnn_quantization()

    built = models.mlp(tmp_path)
    model = onnx.load(str(built.path))
    model.graph.node[2].name = ""  # the pre-processing names it: the model changes
    props = {"character": "a\nb\nc", "note": "kept"}
    helper.set_model_props(model, props)
    path, steps = prepare_float_model(model, {"x": (2, 4)}, tmp_path)
    assert path.name == "model.qnn_pre.onnx" and any("QNN pre-processing fused" in s for s in steps)
    out = onnx.load(str(path))
    assert {p.key: p.value for p in out.metadata_props}.items() >= props.items()
    assert all(n.name for n in out.graph.node)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.fromfile(built.input_path, np.float32).reshape(2, 4)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], built.expected["y"], rtol=1e-5)

    def broken(*args, **kwargs):
        raise RuntimeError("fusion failed\nsecond line")

    monkeypatch.setattr(ort_qnn, "qnn_preprocess_model", broken)
    work = tmp_path / "again"
    work.mkdir()
    path, steps = prepare_float_model(model, {"x": (2, 4)}, work)
    assert path.name == "model.folded.onnx"
    assert (
        steps[-1]
        == "onnxruntime QNN pre-processing skipped: it failed (RuntimeError: fusion failed)"
    )
    assert "QNN pre-processing failed" in caplog.text


def test_qnn_preprocessing_does_not_load_torch(tmp_path):
    """onnxruntime's QNN pre-processing imports ``onnxruntime.tools``, which imports torch
    whenever it is installed (about 3 s and 180 MB per process, for PyTorch export helpers
    the pre-processing never calls): a fresh Python preparing a model ends without torch, and
    with the pre-processing's fusions made."""
    import subprocess
    import sys

    pytest.importorskip("torch", reason="torch not installed: nothing could load it")
    built = models.mlp(tmp_path)
    code = (
        "import sys, onnx; from pathlib import Path;"
        "from accdbg.engines.prepare import prepare_float_model;"
        f"m = onnx.load({str(built.path)!r}); m.graph.node[2].name = '';"
        f"path, steps = prepare_float_model(m, {{'x': (2, 4)}}, Path({str(tmp_path)!r}));"
        "print(path.name, 'torch' in sys.modules and sys.modules['torch'] is not None)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["model.qnn_pre.onnx", "False"]


@pytest.mark.slow
def test_the_qnn_workers_start_without_pandas_or_the_quantizer(tmp_path, monkeypatch):
    """Each QNN session runs in a child Python (two per engine run, one per fix-search
    candidate): it loads the model and writes tensors, so it starts without pandas and
    onnxruntime's quantizer (0.3 s and 0.2 s of imports each, paid by every child when the
    engine package imported its run). Every child of a real engine run says what it loaded."""
    import os

    hook = tmp_path / "hook"
    hook.mkdir()
    # sitecustomize, found on PYTHONPATH, is imported by every Python a venv's included
    # (usercustomize is not: a venv disables the user site); it then hands over to the
    # sitecustomize it shadows, if the interpreter has one
    (hook / "sitecustomize.py").write_text(
        "import atexit, importlib.machinery, importlib.util, os, sys\n"
        "def _said():\n"
        f"    with open({str(tmp_path / 'loaded.txt')!r}, 'a') as f:\n"
        "        mods = [m for m in ('pandas', 'onnxruntime.quantization') if m in sys.modules]\n"
        "        f.write(' '.join(sys.argv[-2:-1] + mods) + '\\n')\n"
        "atexit.register(_said)\n"
        "_here = os.path.dirname(os.path.abspath(__file__))\n"
        "_rest = [p for p in sys.path if os.path.abspath(p or '.') != _here]\n"
        "_spec = importlib.machinery.PathFinder.find_spec('sitecustomize', _rest)\n"
        "if _spec is not None:\n"
        "    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    inp = [parse_input_tensor(["x", "1,3,8,8", str(built.input_path)])]
    run_inference_engine(built.path, input_tensors=inp, working_dir=tmp_path / "w")
    lines = (tmp_path / "loaded.txt").read_text().splitlines()
    workers = [line for line in lines if line.startswith("accdbg.engines.worker")]
    assert len(workers) == 2, lines  # the plain model and the debug graph
    assert workers == ["accdbg.engines.worker"] * 2, workers


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
@pytest.mark.slow
def test_a_busy_child_dies_within_a_second_of_its_parent(sig):
    """Whatever stops the tool - SIGKILL included, which no handler sees - its backend
    children stop with it, even in the middle of their work."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    parent = (
        "import sys\n"
        "from accdbg.cli.main import stop_signals_and_warnings\n"
        "from accdbg.core.isolate import Isolated\n"
        "from tests import crashers\n"
        "with stop_signals_and_warnings():\n"
        "    child = Isolated(crashers.sleep, 60, what='sleeping')\n"
        "    print(child.pid, flush=True)\n"
        "    child.result()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = int(proc.stdout.readline())
    time.sleep(1.5)  # the child is up and sleeping in its job
    assert Path(f"/proc/{child}").exists()
    proc.send_signal(getattr(signal, sig))
    proc.wait(timeout=20)
    gone = time.monotonic() + 1.0

    def running() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    while running() and time.monotonic() < gone:
        time.sleep(0.02)
    assert not running(), f"the child outlived its parent ({sig})"


def test_job_folders_of_dead_parents_are_swept(monkeypatch, tmp_path):
    """A parent killed by SIGKILL cannot remove its children's job folder: the next run does,
    going by the folder's lock (held only while its parent lives), never by a live one - also
    a folder killed a moment ago (a job folder is locked before it is named, so no age rule
    is needed: the rerun right after a kill leaves none behind). Only a folder still being
    made, not yet locked, is given a minute."""
    import os
    import tempfile

    import accdbg.core.isolate as isolate
    from accdbg.core.folder_lock import LOCK_NAME, FolderLock, holder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(isolate, "_swept", False)
    dead, live, just_dead = (
        tmp_path / f"{isolate.JOB_PREFIX}{n}" for n in ("dead", "live", "just_dead")
    )
    making, stale = (tmp_path / f"{isolate.NEW_JOB_PREFIX}{n}" for n in ("making", "stale"))
    for folder in (dead, live, just_dead, making, stale):
        folder.mkdir()
        (folder / LOCK_NAME).touch()
    held = FolderLock.take(live)
    old = time.time() - 3600
    for folder in (dead, live, stale):
        os.utime(folder / LOCK_NAME, (old, old))
        os.utime(folder, (old, old))
    isolate._sweep_dead_jobs()
    assert not dead.exists() and not just_dead.exists() and not stale.exists()
    assert live.exists() and making.exists()
    held.release()
    # a new job folder: named accdbg-job-*, held from the moment it has that name, gone after
    job = isolate.JobFolder()
    assert job.path.name.startswith(isolate.JOB_PREFIX) and holder(job.path) is not None
    assert [f.name for f in tmp_path.glob(f"{isolate.NEW_JOB_PREFIX}*")] == [making.name]
    job.cleanup()
    assert not job.path.exists()


@pytest.mark.slow  # runs QNN
def test_initializers_listed_as_inputs_stay_constants(tmp_path):
    """An IR 3 model lists its initializers among its inputs. ONNX's own test models make
    their weights and BatchNormalization parameters with ConstantOfShape from such shapes;
    onnxruntime folds them and fuses the BatchNormalization into the Conv, but leaves the used-up
    shapes as graph inputs, which calibration then asks for. They must stay constants."""
    shapes = {"w": [4, 3, 3, 3], "scale": [4], "bias": [4], "mean": [4], "var": [4]}
    values = {"w": 0.02, "scale": 1.5, "bias": 0.1, "mean": 0.05, "var": 1.0}
    inits = [
        numpy_helper.from_array(np.array(d, np.int64), f"{n}__SHAPE") for n, d in shapes.items()
    ]
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            [f"{n}__SHAPE"],
            [n],
            value=numpy_helper.from_array(np.array([values[n]], np.float32)),
        )
        for n in shapes
    ]
    nodes += [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
        + [helper.make_tensor_value_info(i.name, TensorProto.INT64, list(i.dims)) for i in inits],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    path = tmp_path / "ir3.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    x.tofile(tmp_path / "x.raw")
    inp = [parse_input_tensor(["x", "1,3,8,8", str(tmp_path / "x.raw")])]
    res = run_inference_engine(path, input_tensors=inp, working_dir=tmp_path / "w")
    y = TensorFolder(res.results[0]).load("y")
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert np.abs(y - expected).max() < 0.05 * np.abs(expected).max()
    log = (res.run_dir / "log.txt").read_text()
    assert "5 initializers the graph also listed as inputs kept as constants" in log


def test_model_computing_inside_control_flow_is_refused_in_one_line(tmp_path, capsys):
    """silero-vad as shipped: its whole network is inside an If on the sample rate. QNN runs no
    If, the quantizer leaves its branches float: a run would report a model nothing of which is
    quantized. The branch not taken cannot take the fixed dims (onnxruntime refuses the model
    with them): the float run still works (it keeps the model's own dims), the engine refuses."""
    built = models.branchy(tmp_path)  # 4 ops outside (Identity, ReduceSum, Greater, If), 4 in
    code, out, err = run_cli(capsys, *built.flags(), "-w", tmp_path / "w")
    assert code != 0
    assert one_line_error(err).endswith(
        "error: the model computes inside control flow: 4 of its 8 ops are in the branches or "
        "bodies of branchy (If); QNN HTP runs no If/Loop/Scan and neither onnxruntime's "
        "quantizer nor its tensor dumps reach inside them - export the model without control "
        "flow (an If on an input your inputs fix, e.g. a sample rate, can be exported for that "
        "value)"
    )
    inp = [parse_input_tensor(["x", "1,12", str(built.input_path)])]
    golden = run_framework_diagnosis("onnx", built.path, inp, working_dir=tmp_path / "f")
    y = TensorFolder(golden.results[0]).load("y")
    np.testing.assert_allclose(y, built.expected["y"], rtol=1e-6)


def test_few_ops_inside_control_flow_are_a_recorded_step(tmp_path):
    """An If holding a few of the model's ops: pre-processing goes on and records they stay
    float; most of the model inside one is refused."""
    few = onnx.load(str(models.branchy(tmp_path, n=10, outside=4).path))  # 12 outside, 4 in
    steps: list[str] = []
    check_control_flow(few, steps)
    assert steps == [
        "4 ops inside branchy (If) stay float on the CPU, not debugged (no If/Loop/Scan on QNN; "
        "onnxruntime dumps no tensor of a subgraph)"
    ]
    most = onnx.load(str(models.branchy(tmp_path, n=10, outside=0).path))  # 4 outside, 4 in
    check_control_flow(most, steps)  # as many in as out: still a note
    with pytest.raises(AccdbgError, match="4 of its 8 ops are in the branches"):
        check_control_flow(most, steps, failed=True)
    del most.graph.node[0]  # the Identity: 3 ops outside, 4 in
    most.graph.node[0].input[0] = "x"
    with pytest.raises(AccdbgError, match="4 of its 7 ops are in the branches"):
        check_control_flow(most, steps)


@pytest.mark.parametrize("component", [(), ("--inference_engine", "-r", "htp")])
def test_an_input_read_as_another_type_than_the_models_is_a_one_line_error(
    tmp_path, capsys, component
):
    """magika's input is int32 bytes; -i without a dtype reads float32 (qnn-net-run's files
    without --use_native_input_files), which reached onnxruntime as `internal error: ...
    Unexpected input data type`. Now the float32 values are converted to int32, and int32
    bytes read as float32 are no whole numbers: one line names the file and -nif."""
    built = models.one_hot_dense(tmp_path)
    flags = built.flags(framework=not component)
    code, _, err = run_cli(capsys, *component, *flags, "-w", tmp_path / "w")
    assert code == 2
    line = one_line_error(err)
    assert line.startswith(
        f"qnn-accuracy-debugger: error: --input_tensor 'ids': raw file '{built.input_path}' holds "
        "float32 values that are no int32 (the model's input type), first "
    ), line
    assert line.endswith("or the file in int32 with -nif/--use_native_input_files")
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_native_input_files_and_float32_ones_run_the_same(tmp_path, capsys):
    """The int32 input of a magika-like model, given as qnn-net-run gives it: int32 bytes
    with -nif, or float32 whole numbers without. Both runs feed QNN the same ids."""
    built = models.one_hot_dense(tmp_path)
    as_float = tmp_path / "ids_f32.raw"
    np.fromfile(built.input_path, np.int32).astype(np.float32).tofile(as_float)
    runs = {}
    for name, flags in (
        ("native", [*built.flags(framework=False), "-nif"]),
        ("float", ["-m", built.path, "-i", "ids", "1,16", as_float]),
    ):
        code, _, err = run_cli(
            capsys, "--inference_engine", "-r", "htp", *flags, "-w", tmp_path / "w",
            "--output_dirname", name,
        )  # fmt: skip
        assert code == 0, err
        runs[name] = TensorFolder(
            tmp_path / "w" / "inference_engine" / name / "output" / "Result_0"
        )
    assert runs["native"].names() == runs["float"].names() and "y" in runs["native"].names()
    for tensor in runs["native"].names():
        np.testing.assert_array_equal(runs["native"].load(tensor), runs["float"].load(tensor))


def test_a_max_with_minus_infinity_is_an_identity_not_an_infinite_encoding(tmp_path):
    """magika (JAX) starts a max reduction at a constant -inf: onnxruntime's quantizer gave
    that constant an infinite scale, and the fix search's encodings export stopped on it."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Max", ["start", "mm"], ["peak"], name="reduce_start"),
            helper.make_node("Relu", ["peak"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(-np.inf, np.float32), "start"),
        ],
    )
    path = models.save(graph, tmp_path / "max_start.onnx")
    x = rng.normal(size=(1, 8)).astype(np.float32)
    x.tofile(tmp_path / "x.raw")
    res = run_inference_engine(
        path,
        input_tensors=[parse_input_tensor(["x", "1,8", str(tmp_path / "x.raw")])],
        working_dir=tmp_path / "w",
    )
    log = (res.run_dir / "log.txt").read_text()
    assert "1 Max/Min with an infinite constant made an Identity" in log and "reduce_start" in log
    qdq = onnx.load(str(next(res.run_dir.glob("*.qdq.onnx"))))
    scales = [numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name.endswith("_scale")]
    assert scales and all(np.isfinite(s).all() for s in scales)
    y = TensorFolder(res.results[0]).load("y")
    expected = np.maximum(x @ w, 0)
    assert np.abs(y - expected).max() < 0.05 * np.abs(expected).max()


def test_the_quantizers_root_warnings_go_to_the_log_not_the_console(tmp_path, caplog):
    """onnxruntime's quantizer warns on the root logger - for an LSTM's empty optional inputs,
    "failed to infer the type of tensor: ." once per input - which a console shows as a bare
    ``WARNING:root:`` line among accdbg's own. Quantized by accdbg, each is a debug record of
    accdbg's log (the run's log, ``-v``) and none reaches the root logger's handlers."""
    from accdbg.engines.quantize import FeedsReader, quantize_for_qnn

    built = models.lstm_after_matmul(tmp_path, bias=False)
    reader = FeedsReader([{"x": (str(built.input_path), built.dims, "float32", "float32")}])
    caplog.set_level(logging.DEBUG)
    quantize_for_qnn(built.path, tmp_path / "q.onnx", reader)
    assert (tmp_path / "q.onnx").is_file()
    assert not [x for x in caplog.records if x.name == "root"]
    moved = [x for x in caplog.records if "failed to infer the type of tensor" in x.getMessage()]
    assert moved and all(x.name.startswith("accdbg") and x.levelno == logging.DEBUG for x in moved)
