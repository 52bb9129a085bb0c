import filecmp
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests import models
from tests.helpers import one_line_error, run_cli


def _fd(capsys, built, tmp_path, *extra):
    return run_cli(
        capsys,
        "--framework_diagnosis",
        "-f",
        "onnx",
        "-m",
        built.path,
        "-i",
        built.input_name,
        ",".join(map(str, built.dims)),
        built.input_path,
        "-w",
        tmp_path / "w",
        *extra,
    )


def test_every_node_output_matches_numpy(capsys, tmp_path, mlp):
    code, _, err = _fd(capsys, mlp, tmp_path, "-o", "y", "--output_dirname", "run1")
    assert code == 0, err
    folder = TensorFolder(tmp_path / "w" / "framework_diagnosis" / "run1")
    assert set(folder.names()) == set(mlp.expected)
    for name, want in mlp.expected.items():
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-5, atol=1e-5)
    recs = json.loads((folder.root / "tensors.json").read_text())["tensors"]
    assert [r["name"] for r in recs] == ["mm1", "add1", "relu1", "y"]  # topological
    assert [r["op_type"] for r in recs] == ["MatMul", "Add", "Relu", "MatMul"]
    assert recs[0]["shape"] == [2, 4 * 0 + 6]  # dynamic batch fixed from --input_tensor dims
    opts = json.loads((folder.root / "framework_diagnosis_options.json").read_text())
    assert opts["model_path"] == str(mlp.path) and opts["output_tensor"] == ["y"]
    assert "wrote 4 tensors" in (folder.root / "log.txt").read_text()


def test_slashes_and_hostile_names(capsys, tmp_path):
    built = models.mlp(
        tmp_path, names={"mm": "block/mm", "add": "../../escape", "relu": "/abs/relu"}
    )
    code, _, err = _fd(capsys, built, tmp_path, "--output_dirname", "r")
    assert code == 0, err
    root = tmp_path / "w" / "framework_diagnosis" / "r"
    assert (root / "block" / "mm.raw").is_file()
    assert not (tmp_path / "escape.raw").exists() and not os.path.exists("/abs/relu.raw")
    folder = TensorFolder(root)
    for name, want in built.expected.items():
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-5, atol=1e-5)
        assert root.resolve() in folder.path(name).resolve().parents


def test_memory_budget_splits_and_files_are_identical(tmp_path):
    built = models.conv_net(tmp_path, channels=16, size=32, layers=4)
    inp = [parse_input_tensor(["x", "1,3,32,32", str(built.input_path)])]
    whole = run_framework_diagnosis(
        "onnx", built.path, inp, working_dir=tmp_path / "w", output_dirname="whole"
    )
    one_tensor = 16 * 32 * 32 * 4
    split = run_framework_diagnosis(
        "onnx",
        built.path,
        inp,
        working_dir=tmp_path / "w",
        output_dirname="split",
        memory_budget_mb=2.5 * one_tensor / 2**20,
    )
    assert whole.batches == 1
    assert split.batches >= 4
    names = list(whole.tensors["file"])
    assert names == list(split.tensors["file"]) and len(names) == 9
    match, mismatch, errors = filecmp.cmpfiles(whole.run_dir, split.run_dir, names, shallow=False)
    assert mismatch == [] and errors == [] and len(match) == 9


def test_output_tensor_not_in_graph_lists_near_matches(capsys, tmp_path, mlp):
    code, _, err = _fd(capsys, mlp, tmp_path, "-o", "relu")
    assert code == 2
    line = one_line_error(err)
    assert "'relu'" in line and "relu1" in line
    assert not list((tmp_path / "w" / "framework_diagnosis").glob("*"))


@pytest.mark.parametrize(
    "case, expect",
    [
        ("missing_model", "does not exist"),
        ("not_onnx", "not a valid ONNX model"),
        ("wrong_input_name", "'nope' is not an input of the model; its inputs are: x [N,4]"),
        ("wrong_size", "has 32 bytes, expected 48"),
        ("bad_dtype", "unknown --input_tensor 'x' dtype 'float99'"),
        ("unwritable", "not writable"),
        ("wrong_rank", "rank 3"),
    ],
)
def test_bad_inputs_one_line_and_nothing_written(capsys, tmp_path, mlp, case, expect):
    model, name, dims, raw, extra, wd = mlp.path, "x", "2,4", mlp.input_path, [], tmp_path / "w"
    if case == "missing_model":
        model = tmp_path / "missing.onnx"
    elif case == "not_onnx":
        model = tmp_path / "junk.onnx"
        model.write_bytes(b"this is not protobuf \xff\xfe")
    elif case == "wrong_input_name":
        name = "nope"
    elif case == "wrong_size":
        dims = "3,4"
    elif case == "bad_dtype":
        extra = ["float99"]
    elif case == "unwritable":
        wd = tmp_path / "blocker"
        wd.write_text("a file, not a folder")
    elif case == "wrong_rank":
        dims = "1,2,4"
    code, _, err = run_cli(
        capsys,
        "--framework_diagnosis",
        "-f",
        "onnx",
        "-m",
        model,
        "-i",
        name,
        dims,
        raw,
        *extra,
        "-w",
        wd,
    )
    assert code == 2
    line = one_line_error(err)
    assert expect in line, line
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not fd.exists() or not any(p for p in fd.iterdir() if not p.name.startswith(".write"))


def test_custom_op_lib_missing(capsys, tmp_path, mlp):
    code, _, err = _fd(capsys, mlp, tmp_path, "--onnx_custom_op_lib", tmp_path / "libnope.so")
    assert code == 2 and "--onnx_custom_op_lib" in one_line_error(err)


def test_disable_graph_optimization_keeps_unfused_values(tmp_path):
    """Conv followed by BatchNormalization: with optimizations off both outputs are the
    unfused float values; numerically equal to the optimized run within float tolerance."""
    from accdbg.frameworks.onnx_runner import session_options

    assert (
        session_options(True).graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    assert (
        session_options(False).graph_optimization_level
        == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )


def test_real_ppocr_det_every_node_output(tmp_path, ppocr_det, ppocr_input):
    inp = [parse_input_tensor(["x", "1,3,320,320", str(ppocr_input)])]
    res = run_framework_diagnosis(
        "onnx", ppocr_det, inp, output_tensors=["sigmoid_0.tmp_0"], working_dir=tmp_path / "w"
    )
    model = onnx.load(str(ppocr_det))
    expected = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o]
    folder = TensorFolder(res.run_dir)
    assert sorted(folder.names()) == sorted(expected)
    # topological: each tensor's producer inputs were dumped earlier (or are inputs/constants)
    producers = {o: n for n in model.graph.node for o in n.output}
    order = {
        r["name"]: i
        for i, r in enumerate(json.loads((res.run_dir / "tensors.json").read_text())["tensors"])
    }
    for name, pos in order.items():
        for src in producers[name].input:
            if src in order:
                assert order[src] < pos, (src, name)
    # values: the final output equals a plain onnxruntime run of the untouched model,
    # and sampled intermediates equal the outputs of sub-models cut with onnx.utils
    x = np.fromfile(ppocr_input, np.float32).reshape(1, 3, 320, 320)
    plain = ort.InferenceSession(str(ppocr_det), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        folder.load("sigmoid_0.tmp_0"), plain.run(None, {"x": x})[0], atol=1e-4
    )
    for name in expected[5::60]:
        sub = tmp_path / "sub.onnx"
        onnx.utils.extract_model(str(ppocr_det), str(sub), ["x"], [name], check_model=False)
        want = ort.InferenceSession(str(sub), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-3, atol=1e-3, err_msg=name)
        assert list(want.shape) == folder.records[name].shape
