import filecmp
import hashlib
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


@pytest.mark.slow
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


# ------------------------------------------------------------------ input lists


def _mlp_numpy(model_path, x):
    """The mlp test model's tensors from its own initializers, with numpy."""
    w = {
        i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(model_path)).graph.initializer
    }
    mm = x @ w["w1"]
    add = mm + w["b1"]
    relu = np.maximum(add, 0)
    return {"mm1": mm, "add1": add, "relu1": relu, "y": relu @ w["w2"]}


def test_input_list_one_golden_per_line_recording_its_files(capsys, tmp_path, mlp):
    rng = np.random.default_rng(5)
    xs, lines = [], []
    for i in range(3):
        x = (rng.standard_normal((2, 4)) * (i + 1)).astype(np.float32)
        x.tofile(tmp_path / f"x{i}.raw")
        xs.append(x)
        lines.append(f"x:=x{i}.raw" if i != 1 else f"{tmp_path / 'x1.raw'}")  # named or plain
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    code, _, err = _fd(capsys, mlp, tmp_path, "-l", tmp_path / "list.txt", "--output_dirname", "l")
    assert code == 0, err
    root = tmp_path / "w" / "framework_diagnosis" / "l"
    assert sorted(p.name for p in root.glob("Result_*")) == ["Result_0", "Result_1", "Result_2"]
    assert not (root / "tensors.json").exists()
    for i, x in enumerate(xs):
        folder = TensorFolder(root / f"Result_{i}")
        for name, want in _mlp_numpy(mlp.path, x).items():
            np.testing.assert_allclose(folder.load(name), want, rtol=1e-5, atol=1e-5)
        rec = folder.meta["inputs"]["x"]
        data = (tmp_path / f"x{i}.raw").read_bytes()
        assert rec["path"] == str(tmp_path / f"x{i}.raw")
        assert rec["sha256"] == hashlib.sha256(data).hexdigest() and rec["bytes"] == len(data)
        assert folder.meta["result"] == i
    # -i alone: one folder, recording the -i file
    code, _, err = _fd(capsys, mlp, tmp_path, "--output_dirname", "single")
    assert code == 0, err
    single = TensorFolder(tmp_path / "w" / "framework_diagnosis" / "single")
    assert single.meta["inputs"]["x"]["path"] == str(mlp.input_path)


def _two_inputs(tmp_path):
    """d = a - 2 b: swapping the inputs changes every value."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["b", "two"], ["b2"], name="mul"),
            helper.make_node("Sub", ["a", "b2"], ["d"], name="sub"),
        ],
        "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 4])],
        [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    return models.save(graph, tmp_path / "two.onnx")


def test_input_list_plain_paths_follow_the_model_input_order(tmp_path):
    model = _two_inputs(tmp_path)
    fa, fb = tmp_path / "fa.raw", tmp_path / "fb.raw"
    a, b = np.arange(4, dtype=np.float32)[None], np.full((1, 4), 10, np.float32)
    a.tofile(fa), b.tofile(fb)
    lst = tmp_path / "list.txt"
    lst.write_text(f"{fa} {fb}\nb:={fa} a:={fb}\n")
    # -i given b first: plain paths still go to a, b (the model's order), as the engine reads them
    given = [parse_input_tensor([n, "1,4", str(fb)]) for n in ("b", "a")]
    res = run_framework_diagnosis("onnx", model, given, working_dir=tmp_path / "w", input_list=lst)
    assert [p.name for p in res.results] == ["Result_0", "Result_1"]
    r0, r1 = (TensorFolder(p) for p in res.results)
    np.testing.assert_allclose(r0.load("d"), a - 2 * b)
    np.testing.assert_allclose(r1.load("d"), b - 2 * a)
    assert r0.meta["inputs"]["a"]["path"] == str(fa) and r1.meta["inputs"]["a"]["path"] == str(fb)


@pytest.mark.parametrize(
    "line, expect",
    [
        ("y:={x}", "'y' is not one of the -i/--input_tensor names (x)"),
        ("{x} {x}", "2 file(s) for 1 input(s) (x)"),
        ("{short}", "input 'x'"),
    ],
)
def test_input_list_bad_lines_one_line_and_nothing_written(capsys, tmp_path, mlp, line, expect):
    short = tmp_path / "short.raw"
    short.write_bytes(b"\0" * 8)
    lst = tmp_path / "list.txt"
    lst.write_text(f"{mlp.input_path}\n" + line.format(x=mlp.input_path, short=short) + "\n")
    code, _, err = _fd(capsys, mlp, tmp_path, "-l", lst)
    assert code == 2
    msg = one_line_error(err)
    assert f"{lst}:2" in msg and expect in msg, msg
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not fd.exists() or not any(p for p in fd.iterdir() if not p.name.startswith(".write"))
