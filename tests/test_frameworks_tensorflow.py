"""TensorFlow 1.x frozen graphs: a hand-built graph checked against numpy, and a Keras
MobileNetV2 (random weights, real architecture) frozen to a .pb, through diagnosis and tf2onnx."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from accdbg.core import onnx_model as om
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from accdbg.frameworks.convert import DEFAULT_OPSET, _convert, convert_to_onnx
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests.helpers import (
    converted_matches_golden,
    diagnose_in_child,
    lazy_import,
    needs,
    one_line_error,
    run_cli,
)

tf = lazy_import("tensorflow")

TF_OPTIONAL = "TensorFlow is an optional framework: pip install accdbg[tensorflow]"
pytestmark = [pytest.mark.slow, needs("tensorflow", TF_OPTIONAL)]  # a big framework (and QNN)

tf1 = lazy_import("tensorflow.compat.v1")
EPS = 0.001


def conv_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Conv2D, stride 1, SAME padding, in numpy: x [1,H,W,C], w [kh,kw,C,O] (TF layout)."""
    kh, kw = w.shape[:2]
    xp = np.pad(x.astype(np.float64), ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    h, wd = x.shape[1:3]
    out = np.zeros((1, h, wd, w.shape[3]))
    for ky in range(kh):
        for kx in range(kw):
            out += np.einsum(
                "nhwc,co->nhwo", xp[:, ky : ky + h, kx : kx + wd, :], w[ky, kx].astype(np.float64)
            )
    return out


@pytest.fixture(autouse=True)
def tensorflow_in_this_process(monkeypatch):
    """Framework diagnosis runs TensorFlow in a child Python (a native crash must not take the
    tool down), which imports TensorFlow again for each run (about 8 s). Here TensorFlow is
    loaded already: the runs are made in this process - the same runner, without the
    transport, which ``test_bad_inputs_one_line[not_pb]`` and the oneshot tests take."""
    from accdbg.frameworks.tensorflow_runner import TensorFlowRunner

    diagnose_in_child(monkeypatch, TensorFlowRunner, False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tf_tiny"))


def build_tiny(root):
    """A TF1-style frozen graph (``input:0``, ``weights/read`` Identity nodes) and the numpy
    value of each of its activations."""
    rng = np.random.default_rng(0)
    w = (0.3 * rng.standard_normal((3, 3, 3, 8))).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    beta = rng.standard_normal(8).astype(np.float32)
    mean = (0.1 * rng.standard_normal(8)).astype(np.float32)
    var = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    fw = (0.05 * rng.standard_normal((8 * 8 * 8, 5))).astype(np.float32)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 16, 16, 3], name="input")
        wr = tf.identity(tf.constant(w, name="conv1/weights"), name="conv1/weights/read")
        y = tf.nn.conv2d(x, wr, [1, 1, 1, 1], "SAME", name="conv1/Conv2D")
        y = tf.nn.bias_add(y, tf.constant(b, name="conv1/biases"), name="conv1/BiasAdd")
        y = tf.nn.relu(y, name="conv1/Relu")
        y = tf.nn.max_pool2d(y, 2, 2, "VALID", name="pool1/MaxPool")
        y = tf1.nn.fused_batch_norm(y, gamma, beta, mean, var, epsilon=EPS, is_training=False,
                                    name="bn1/FusedBatchNorm")[0]  # fmt: skip
        y = tf.reshape(y, [1, -1], name="flatten/Reshape")
        y = tf.matmul(y, tf.constant(fw, name="fc/weights"), name="fc/MatMul")
        tf.nn.softmax(y, name="Predictions/Softmax")
    path = root / "tiny_frozen.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    xin = rng.standard_normal((1, 16, 16, 3)).astype(np.float32)
    raw = root / "input.raw"
    xin.tofile(raw)
    conv = conv_same(xin, w)
    bias = conv + b
    relu = np.maximum(bias, 0)
    pool = relu.reshape(1, 8, 2, 8, 2, 8).max(axis=(2, 4))
    bn = (pool - mean) / np.sqrt(var + EPS) * gamma + beta
    flat = bn.reshape(1, -1)
    logits = flat @ fw
    soft = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    expected = {
        "conv1/Conv2D:0": conv, "conv1/BiasAdd:0": bias, "conv1/Relu:0": relu,
        "pool1/MaxPool:0": pool, "bn1/FusedBatchNorm:0": bn, "flatten/Reshape:0": flat,
        "fc/MatMul:0": logits, "Predictions/Softmax:0": soft,
    }  # fmt: skip
    return path, raw, root, expected


def test_frozen_graph_every_activation_matches_numpy(capsys, tiny):
    path, raw, root, expected = tiny
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "TensorFlow", "-m", path,
                           "-i", "input:0", "1,16,16,3", raw, "-o", "Predictions/Softmax:0",
                           "-w", root / "w", "--output_dirname", "tiny")  # fmt: skip
    assert code == 0, err
    folder = TensorFolder(root / "w" / "framework_diagnosis" / "tiny")
    # activations only, in topological order: no Const, no weights/read Identity, no BN side outputs
    assert folder.names() == list(expected)
    assert (folder.root / "conv1" / "Conv2D_0.raw").is_file()  # "/" makes folders, ":" is sanitized
    for name, want in expected.items():
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-4, atol=1e-4, err_msg=name)
        rec = folder.records[name]
        assert rec.layout == ("NHWC" if want.ndim == 4 else None)
    assert folder.records["bn1/FusedBatchNorm:0"].op_type == "FusedBatchNormV3"
    assert folder.records["conv1/Conv2D:0"].node == "conv1/Conv2D"


def test_input_name_without_index_and_constants_on_request(tiny, tmp_path):
    path, raw, _, expected = tiny
    inp = [parse_input_tensor(["input", "1,16,16,3", str(raw)])]  # as ONNX users would write it
    res = run_framework_diagnosis(
        "tensorflow", path, inp, working_dir=tmp_path, include_constants=True
    )
    names = list(res.tensors["name"])
    assert "conv1/weights:0" in names and "conv1/weights/read:0" in names
    assert [n for n in names if n in expected] == list(expected)
    np.testing.assert_allclose(
        TensorFolder(res.run_dir).load("conv1/weights/read:0").shape, (3, 3, 3, 8)
    )


def test_frozen_graph_converts_with_mapping(tiny):
    path, raw, root, expected = tiny
    inp = [parse_input_tensor(["input:0", "1,16,16,3", str(raw)])]
    conv = convert_to_onnx("tensorflow", path, inp, root / "onnx")
    # tf2onnx fuses Conv2D with its BiasAdd: the bare convolution has no ONNX tensor
    assert set(conv.unmapped) == {"conv1/Conv2D:0"}
    assert sorted(conv.tensor_mapping.values()) == sorted(set(expected) - {"conv1/Conv2D:0"})
    # 4-D activations are NCHW in ONNX, including the (8,8,8) ones whose shape cannot tell
    assert conv.permutations["pool1/MaxPool:0"] == [0, 2, 3, 1]
    assert conv.permutations["bn1/FusedBatchNorm:0"] == [0, 2, 3, 1]
    assert "flatten/Reshape:0" not in conv.permutations
    model = om.load_model(conv.onnx_path)
    sess = ort.InferenceSession(om.with_outputs(model, list(conv.tensor_mapping)).SerializeToString(),
                                providers=["CPUExecutionProvider"])  # fmt: skip
    x = np.fromfile(raw, np.float32).reshape(1, 16, 16, 3)
    got = dict(
        zip(
            [o.name for o in sess.get_outputs()],
            sess.run(None, {conv.input_names["input:0"]: x}),
            strict=True,
        )
    )
    for onnx_name, fw_name in conv.tensor_mapping.items():
        value = got[onnx_name]
        if onnx_name in conv.permutations:
            value = value.transpose(conv.permutations[onnx_name])
        np.testing.assert_allclose(value, expected[fw_name], rtol=1e-4, atol=1e-4, err_msg=fw_name)


def test_keras_mobilenet_frozen_graph(tmp_path):
    """MobileNetV2 (alpha 0.35, 96x96, random weights and batch-norm statistics) frozen the
    TF2 way; 210 activations; tf2onnx fuses each Conv2D with its batch norm."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    net = tf.keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10
    )
    for layer in net.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            shapes = [v.shape for v in layer.get_weights()]
            layer.set_weights([rng.uniform(0.5, 1.5, shapes[0]), rng.normal(0, 0.2, shapes[1]),
                               rng.normal(0, 0.2, shapes[2]), rng.uniform(0.5, 1.5, shapes[3])])  # fmt: skip
    spec = tf.TensorSpec([1, 96, 96, 3], tf.float32, name="image")
    frozen = convert_variables_to_constants_v2(
        tf.function(lambda image: net(image, training=False)).get_concrete_function(spec)
    )
    path = tmp_path / "mobilenet_v2.pb"
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    x = rng.random((1, 96, 96, 3), dtype=np.float32)
    x.tofile(tmp_path / "x.raw")
    inp = [parse_input_tensor(["image:0", "1,96,96,3", str(tmp_path / "x.raw")])]
    res = run_framework_diagnosis("tensorflow", path, inp, working_dir=tmp_path / "w")
    golden = TensorFolder(res.run_dir)
    ops = set(res.tensors["op_type"])
    assert {"Conv2D", "DepthwiseConv2dNative", "Relu6", "AddV2"} <= ops and "Const" not in ops
    assert (res.tensors["op_type"] == "Identity").sum() == 1  # the output; 263 weight reads skipped
    np.testing.assert_allclose(
        golden.load(frozen.outputs[0].name), net(x, training=False).numpy(), rtol=1e-4, atol=1e-5
    )
    conv = convert_to_onnx("tensorflow", path, inp, tmp_path / "onnx")
    assert len(conv.tensor_mapping) + len(conv.unmapped) == len(golden)
    assert len(conv.tensor_mapping) >= 90
    relu6 = [n for n in golden.names() if golden.records[n].op_type == "Relu6"]
    assert all(n in conv.tensor_mapping.values() for n in relu6)  # every block output lines up
    converted_matches_golden(conv, golden, {"image:0": x})


@pytest.mark.parametrize(
    "case, expect",
    [
        ("saved_model_dir", "is a folder (a SavedModel?)"),
        ("not_pb", "is not a TensorFlow GraphDef"),
        (
            "wrong_input",
            "'data:0' is not an input (Placeholder) of the model; its inputs are: input:0 [?,16,16,3]",
        ),
        ("wrong_dims", "dim 2 is 8, the model fixes it to 16"),
        ("wrong_rank", "rank 3"),
        ("wrong_dtype", "is int32, the model input 'input' is float32"),
        (
            "bad_output",
            "'Predictions/Softmax:1' is not a tensor of the model; near matches: Predictions/Softmax:0",
        ),
    ],
)
def test_bad_inputs_one_line(capsys, tiny, tmp_path, monkeypatch, case, expect):
    """Each bad input is one line. A folder is refused before TensorFlow loads; ``not_pb``
    goes through the child Python framework diagnosis runs TensorFlow in (its error relayed),
    the others in this process (the same checks, without a TensorFlow import per case)."""
    from accdbg.frameworks import diagnosis
    from accdbg.frameworks.tensorflow_runner import TensorFlowRunner

    if case in ("saved_model_dir", "not_pb"):
        diagnose_in_child(monkeypatch, TensorFlowRunner, True)
    if case == "saved_model_dir":  # no child Python is started for it

        def no_child(*args, **kwargs):
            raise AssertionError("a child Python was started for a folder")

        monkeypatch.setattr(diagnosis, "run_isolated", no_child)
    path, raw, _, _ = tiny
    name, dims, extra, out = "input:0", "1,16,16,3", [], "Predictions/Softmax:0"
    if case == "saved_model_dir":
        path = tmp_path
    elif case == "not_pb":
        path = tmp_path / "junk.pb"
        path.write_bytes(b"\xff\xfe not a protobuf at all \x00\x01")
    elif case == "wrong_input":
        name = "data:0"
    elif case == "wrong_dims":
        dims = "1,16,8,6"
    elif case == "wrong_rank":
        dims = "16,16,3"
    elif case == "wrong_dtype":
        extra = ["int32"]
    elif case == "bad_output":
        out = "Predictions/Softmax:1"
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "tensorflow", "-m", path,
                           "-i", name, dims, raw, *extra, "-o", out, "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert expect in one_line_error(err)
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not fd.exists() or not any(p for p in fd.iterdir() if not p.name.startswith("."))


def test_tensorflow_missing_is_one_line_with_the_install(capsys, tiny, tmp_path, monkeypatch):
    path, raw, _, _ = tiny
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as on a platform without a TF wheel
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "tensorflow", "-m", path,
                           "-i", "input:0", "1,16,16,3", raw, "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert one_line_error(err).endswith(
        "framework 'tensorflow' is not available: pip install accdbg[tensorflow]"
    )


def test_conversion_without_tf2onnx_says_what_to_install(tiny, tmp_path, monkeypatch):
    import importlib.util

    path, raw, _, _ = tiny
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tf2onnx" else real(name, *a)
    )
    inp = [parse_input_tensor(["input:0", "1,16,16,3", str(raw)])]
    with pytest.raises(Exception) as info:  # in this process: the patch does not reach a child
        _convert("tensorflow", Path(path), inp, tmp_path / "onnx", [], DEFAULT_OPSET)
    assert str(info.value) == (
        "converting tensorflow models to ONNX needs tf2onnx and TensorFlow (tf2onnx missing): "
        "pip install accdbg[tensorflow]"
    )
    assert not (tmp_path / "onnx" / "tiny_frozen.onnx").exists()
