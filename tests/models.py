"""Small synthetic ONNX models with numpy reference formulas, for unit tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass
class Built:
    path: Path
    input_path: Path
    input_name: str
    dims: tuple[int, ...]
    expected: dict[str, np.ndarray]  # tensor name -> value computed with numpy
    # the model's other inputs: name -> (dims, file)
    more_inputs: dict[str, tuple[tuple[int, ...], Path]] = field(default_factory=dict)

    def flags(self, framework: bool = True) -> list:
        """The command line's flags for this model and its inputs (``-f onnx -m -i ...``)."""
        dims = ",".join(map(str, self.dims))
        more = [
            x
            for name, (d, p) in self.more_inputs.items()
            for x in ("-i", name, ",".join(map(str, d)), p)
        ]
        return [
            *(("-f", "onnx") if framework else ()),
            *("-m", self.path, "-i", self.input_name, dims, self.input_path),
            *more,
        ]


def save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp(tmp: Path, names: dict[str, str] | None = None, batch_dim: str | int = "N") -> Built:
    """x[N,4] -> MatMul -> Add -> Relu -> MatMul -> y, with a dynamic batch dim.

    ``names`` renames intermediates (to test awkward tensor names).
    """
    n = {"mm": "mm1", "add": "add1", "relu": "relu1", "y": "y"} | (names or {})
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((4, 6)).astype(np.float32)
    b1 = rng.standard_normal(6).astype(np.float32)
    w2 = rng.standard_normal((6, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], [n["mm"]], name="matmul_1"),
            helper.make_node("Add", [n["mm"], "b1"], [n["add"]], name="add_1"),
            helper.make_node("Relu", [n["add"]], [n["relu"]], name="relu_1"),
            helper.make_node("MatMul", [n["relu"], "w2"], [n["y"]], name="matmul_2"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 4])],
        [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [batch_dim, 3])],
        [numpy_helper.from_array(a, k) for k, a in {"w1": w1, "b1": b1, "w2": w2}.items()],
    )
    path = save(graph, tmp / "mlp.onnx")
    x = rng.standard_normal((2, 4)).astype(np.float32)
    x_path = tmp / "x.raw"
    x.tofile(x_path)
    mm = x @ w1
    add = mm + b1
    relu = np.maximum(add, 0)
    y = relu @ w2
    expected = {n["mm"]: mm, n["add"]: add, n["relu"]: relu, n["y"]: y}
    return Built(path, x_path, "x", (2, 4), expected)


def conv_net(tmp: Path, channels: int = 8, size: int = 16, layers: int = 3, seed: int = 0) -> Built:
    """A small CNN (Conv/Relu chain, then global pooling) used for memory-split tests."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, cin = "x", 3
    for i in range(layers):
        w = (rng.standard_normal((channels, cin, 3, 3)) * 0.3).astype(np.float32)
        b = (rng.standard_normal(channels) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(
            helper.make_node(
                "Conv", [prev, f"w{i}", f"b{i}"], [f"conv{i}"], pads=[1, 1, 1, 1], name=f"Conv_{i}"
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"Relu_{i}"))
        prev, cin = f"relu{i}", channels
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["pool"], name="Pool"))
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("pool", TensorProto.FLOAT, [1, channels, 1, 1])],
        inits,
    )
    path = save(graph, tmp / "convnet.onnx")
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    x_path = tmp / "conv_x.raw"
    x.tofile(x_path)
    return Built(path, x_path, "x", (1, 3, size, size), {})


def _relu_chain(
    path: Path,
    x_path: Path,
    layers: int,
    size: int,
    channels: int,
    seed: int,
    bias_shift: float,
    edit,
    x_offset: float = 0.0,
) -> None:
    """A Conv(3x3)+Relu chain with He-initialised weights; ``edit(i, w, b)`` plants a fault in
    layer ``i`` in place. Writes the model and a smooth 1x3xSxS input."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, cin = "x", 3
    for i in range(layers):
        w = (rng.standard_normal((channels, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(
            np.float32
        )
        b = (rng.standard_normal(channels) * 0.05 + bias_shift).astype(np.float32)
        edit(i, w, b)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(
            helper.make_node(
                "Conv", [prev, f"w{i}", f"b{i}"], [f"conv{i}"], pads=[1] * 4, name=f"Conv_{i}"
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"layer{i}"], name=f"Relu_{i}"))
        prev, cin = f"layer{i}", channels
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, channels, size, size])],
        inits,
    )
    save(graph, path)
    yy, xx = np.mgrid[0:size, 0:size] / size
    x = np.stack([np.sin(5 * xx) + x_offset, np.cos(4 * yy), xx * yy]).astype(np.float32)[None]
    x.tofile(x_path)


def planted_chain(
    tmp: Path, layers: int = 6, bad: int = 3, size: int = 16, channels: int = 16
) -> Built:
    """Conv+Relu chain whose layer ``bad`` has a dead channel with 40x weights.

    ReLU always zeroes that channel (bias -1000), so it does not dominate the activation, but
    per-tensor 8-bit weight quantization spends its whole range on it: every other channel of
    that layer loses its precision. ``expected`` holds the planted layer's output name.
    """

    def edit(i, w, b):
        if i == bad:
            w[0] *= 40.0
            b[0] = -1000.0

    path, x_path = tmp / "planted.onnx", tmp / "planted_x.raw"
    _relu_chain(path, x_path, layers, size, channels, 11, 0.0, edit)
    return Built(path, x_path, "x", (1, 3, size, size), {"planted": f"layer{bad}"})


def outlier_chain(
    tmp: Path, layers: int = 6, at: int = 2, scale: float = 0.0, size: int = 16, channels: int = 16
) -> Built:
    """Conv+Relu chain; with ``scale`` > 0, layer ``at`` carries a compensated activation outlier.

    Channel 0 of layer ``at``'s output is multiplied by ``scale`` (its weights and bias), and the
    next conv divides its input-channel-0 weights by ``scale``: ReLU is positively homogeneous,
    so the float function is unchanged, but the per-tensor 8-bit range of that activation is
    spent on one channel and the other channels keep a few levels. The culprit is layer ``at``
    (the producer), not the consumer that receives the crushed tensor.
    """

    def edit(i, w, b):
        if scale and i == at:
            w[0] *= scale
            b[0] *= scale
        if scale and i == at + 1:
            w[:, 0] /= scale

    path, x_path = tmp / f"outlier_{scale:g}.onnx", tmp / "outlier_x.raw"
    _relu_chain(path, x_path, layers, size, channels, 5, 0.05, edit, x_offset=0.5)
    return Built(path, x_path, "x", (1, 3, size, size), {"planted": f"layer{at}"})


def offset_chain(
    tmp: Path,
    layers: int = 5,
    at: int = 2,
    offset: float = 300.0,
    size: int = 16,
    channels: int = 16,
) -> Built:
    """Conv+Relu chain whose layer ``at`` output channel 0 is a constant ``offset`` the next
    conv ignores (its input-channel-0 weights are zero): an activation outlier with no weight
    outlier behind it. The per-tensor 8-bit range of ``layer{at}`` is spent on a channel that
    carries nothing, so its other channels keep a few levels; 16-bit activations on that tensor
    fix it, per-channel weights cannot."""

    def edit(i, w, b):
        if i == at:
            w[0] = 0.0
            b[0] = offset
        if i == at + 1:
            w[:, 0] = 0.0

    path, x_path = tmp / "offset.onnx", tmp / "offset_x.raw"
    _relu_chain(path, x_path, layers, size, channels, 7, 0.05, edit, x_offset=0.5)
    return Built(path, x_path, "x", (1, 3, size, size), {"planted": f"layer{at}"})


def dense_chain(
    tmp: Path,
    layers: int = 8,
    at: int = 3,
    outlier: float = 0.0,
    tokens: int = 12,
    width: int = 16,
    bias: bool = True,
) -> Built:
    """A transformer's feed-forward stack: x[1, tokens, width] through ``layers`` MatMul + Add
    (+ Relu) layers. onnxruntime's QNN pre-processing turns each into Reshape, Gemm, Reshape,
    and only the last reshape's tensor (the Add's or the Relu's name) has a golden value. With
    ``outlier`` > 0, one weight of layer ``at`` (row 5, column 9) is ``outlier`` times its
    tensor's largest: per-tensor 8-bit weights spend their range on it.
    Without ``bias`` each layer is a MatMul (+ Relu), kept as it is.
    Expected: ``planted`` (the row standing for layer ``at``) and ``position`` (the weight)."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    names = []
    for i in range(layers):
        w = (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32)
        if outlier and i == at:
            w[5, 9] = outlier * float(np.abs(w).max())
        b = (0.1 * rng.normal(size=width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}")]
        inits += [numpy_helper.from_array(b, f"b{i}")] if bias else []
        last = i == layers - 1
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}" if bias else f"dense{i}"]),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"dense{i}"]),
        ][: 2 if bias else 1]
        if last:
            nodes[-1].output[0] = "y"
        if not last:
            nodes.append(helper.make_node("Relu", [f"dense{i}"], [f"act{i}"]))
        x = f"act{i}"
        names.append("y" if last else f"act{i}")
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])],
        inits,
    )
    path = save(graph, tmp / f"dense_{outlier:g}{'' if bias else '_nobias'}.onnx")
    x_path = tmp / "dense_x.raw"
    rng.normal(size=(1, tokens, width)).astype(np.float32).tofile(x_path)
    return Built(
        path,
        x_path,
        "x",
        (1, tokens, width),
        {"planted": names[at], "position": [5, 9]},  # type: ignore[dict-item]
    )


def nested_concat(tmp: Path, seed: int = 0) -> Built:
    """A detection head as YOLOX exports it: per-scale ``Concat(boxes, sigmoid, sigmoid)``,
    reshaped, then concatenated with another scale. HTP (QAIRT 2.x, emulated) does not move the
    sigmoids' part of the inner Concat from its encoding to the outer one's: their integers come
    out in the wrong encoding, while onnxruntime's CPU fake-quant of the same QDQ model is right.
    ``expected['out']``: numpy's float output."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    nodes, inits, expected = [], [], {}

    def conv(name: str, src: str, cout: int, bias: float, scale: float) -> None:
        w = (rng.standard_normal((cout, 3, 1, 1)) * scale).astype(np.float32)
        b = np.full(cout, bias, np.float32)
        inits.extend(
            [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        )
        nodes.append(helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [name], name=name))
        expected[name] = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x) + b[None, :, None, None]

    conv("boxes", "x", 4, 0.0, 0.3)
    conv("obj_logit", "x", 1, -6.0, 0.3)  # objectness: nearly 0 after the sigmoid
    conv("cls_logit", "x", 1, 0.3, 0.1)
    for s in ("obj", "cls"):
        nodes.append(helper.make_node("Sigmoid", [f"{s}_logit"], [s], name=f"{s}_sigmoid"))
        expected[s] = 1 / (1 + np.exp(-expected[f"{s}_logit"]))
    conv("other_scale", "x", 6, 0.5, 0.8)  # a wider range: the outer Concat's encoding
    nodes.append(helper.make_node("Concat", ["boxes", "obj", "cls"], ["head"], name="head", axis=1))
    inits.append(numpy_helper.from_array(np.array([1, 6, -1], np.int64), "flat"))
    nodes.append(helper.make_node("Reshape", ["head", "flat"], ["head_flat"], name="head_flat"))
    nodes.append(
        helper.make_node("Reshape", ["other_scale", "flat"], ["other_flat"], name="other_flat")
    )
    nodes.append(
        helper.make_node("Concat", ["other_flat", "head_flat"], ["out"], name="out", axis=2)
    )
    head = np.concatenate([expected["boxes"], expected["obj"], expected["cls"]], 1)
    expected["out"] = np.concatenate(
        [expected["other_scale"].reshape(1, 6, -1), head.reshape(1, 6, -1)], 2
    )
    graph = helper.make_graph(
        nodes,
        "nested_concat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 6, 512])],
        inits,
    )
    path = save(graph, tmp / "nested_concat.onnx")
    x_path = tmp / "nested_x.raw"
    x.tofile(x_path)
    return Built(path, x_path, "x", (1, 3, 16, 16), expected)


def pooled_conv(tmp: Path, seed: int = 0, channels: int = 8) -> Built:
    """Conv -> GlobalAveragePool -> Conv. Averaging 256 values removes the rounding noise of
    the first Conv's output but not a rounding bias: where QNN's requantization rounds one way,
    the pooled value carries it whole. ``expected``: numpy's float tensors."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    w1 = (rng.standard_normal((channels, 3, 3, 3)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((channels, channels, 1, 1)) * 0.4 / np.sqrt(channels)).astype(
        np.float32
    )
    zeros = np.zeros(channels, np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(zeros, "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b"], ["features"], name="features", pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["features"], ["pooled"], name="pooled"),
        helper.make_node("Conv", ["pooled", "w2", "b"], ["scores"], name="scores"),
    ]
    graph = helper.make_graph(
        nodes,
        "pooled_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, channels, 1, 1])],
        inits,
    )
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    features = np.einsum("nchwij,ocij->nohw", windows, w1)
    pooled = features.mean(axis=(2, 3), keepdims=True)
    scores = np.einsum("oi,nihw->nohw", w2[:, :, 0, 0], pooled)
    path = save(graph, tmp / f"pooled_conv_{seed}.onnx")
    x_path = tmp / f"pooled_x_{seed}.raw"
    x.tofile(x_path)
    return Built(
        path,
        x_path,
        "x",
        (1, 3, 16, 16),
        {"features": features, "pooled": pooled, "scores": scores},
    )


def lstm_after_matmul(
    tmp: Path, steps: int = 2, features: int = 4, hidden: int = 8, bias: bool = True
) -> Built:
    """MatMul -> bidirectional LSTM: a model whose LSTM the QNN HTP backend of onnxruntime-qnn
    cannot finalize once quantized (QNN_COMMON_ERROR_MEM_ALLOC, whatever its size), as in
    ddddocr's shipped OCR model. ``expected`` names both layers' outputs. Without ``bias`` the
    LSTM's optional bias input is left empty (``""``), as exporters leave it."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.normal(size=(features, features)),
        "W": 0.3 * rng.normal(size=(2, 4 * hidden, features)),
        "R": 0.3 * rng.normal(size=(2, 4 * hidden, hidden)),
        "B": np.zeros((2, 8 * hidden)),
    }
    if not bias:
        del weights["B"]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    lstm_inputs = ["mm", "W", "R", "B" if bias else ""]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node(
                "LSTM", lstm_inputs, ["y"], hidden_size=hidden, direction="bidirectional"
            ),
        ],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 2, 1, hidden])],
        inits,
    )
    path, x_path = save(graph, tmp / "lstm.onnx"), tmp / "lstm_x.raw"
    rng.normal(size=(steps, 1, features)).astype(np.float32).tofile(x_path)
    return Built(path, x_path, "x", (steps, 1, features), {"matmul": "mm", "lstm": "y"})


def branchy(tmp: Path, n: int = 12, outside: int = 0) -> Built:
    """x[1,n] -> ``outside`` Mul+Relu pairs -> If(sum > 0): Relu(x)*2, else Reshape(x, [5,-1])
    and back: the branch never taken cannot take n = 12 (onnxruntime refuses the model with that
    dim fixed; with n left dynamic it loads), the way silero-vad's 8 kHz branch refuses a 16 kHz
    frame. ``expected["y"]`` is the taken branch's output for the input written."""
    const = lambda v, name: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    then = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Mul", ["r", "two"], ["yt"])],
        "then",
        [],
        [helper.make_tensor_value_info("yt", TensorProto.FLOAT, None)],
        [const(np.float32(2), "two")],
    )
    other = helper.make_graph(
        [
            helper.make_node("Reshape", ["h", "s5"], ["q"]),
            helper.make_node("Reshape", ["q", "s1"], ["ye"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("ye", TensorProto.FLOAT, None)],
        [const(np.array([5, -1], np.int64), "s5"), const(np.array([1, -1], np.int64), "s1")],
    )
    nodes, h = [], "x"
    for i in range(outside):
        nodes += [
            helper.make_node("Mul", [h, "half"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"h{i}"]),
        ]
        h = f"h{i}"
    nodes.append(helper.make_node("Identity", [h], ["h"]))
    nodes += [
        helper.make_node("ReduceSum", ["h"], ["total"], keepdims=1),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node(
            "If", ["cond"], ["y"], then_branch=then, else_branch=other, name="branchy"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
        [const(np.float32(0.5), "half"), const(np.float32(0), "zero")],
    )
    path, x_path = save(graph, tmp / "branchy.onnx"), tmp / "branchy_x.raw"
    x = np.abs(np.random.default_rng(0).normal(size=(1, n))).astype(np.float32) + 0.1
    x.tofile(x_path)
    return Built(path, x_path, "x", (1, n), {"y": 2 * x * 0.5**outside})


def one_hot_dense(tmp: Path, tokens: int = 16, vocab: int = 20, width: int = 8) -> Built:
    """ids[1, tokens] int32 -> one-hot (Equal with a range, Cast) -> MatMul -> Relu -> MatMul, as
    magika reads bytes: the Equal's bool and the ids' int tensors are dumped unquantized."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(np.arange(vocab, dtype=np.int32), "vocab"),
        numpy_helper.from_array(np.array([1, tokens, 1], np.int64), "column"),
        numpy_helper.from_array(rng.normal(size=(vocab, width)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(width, 4)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["ids", "column"], ["ids3"]),
            helper.make_node("Equal", ["ids3", "vocab"], ["hot"]),
            helper.make_node("Cast", ["hot"], ["onehot"], to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["onehot", "w1"], ["embed"]),
            helper.make_node("Relu", ["embed"], ["act"]),
            helper.make_node("MatMul", ["act", "w2"], ["y"]),
        ],
        "one_hot",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, tokens])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, 4])],
        inits,
    )
    path, x_path = save(graph, tmp / "one_hot.onnx"), tmp / "ids.raw"
    rng.integers(0, vocab, size=(1, tokens)).astype(np.int32).tofile(x_path)
    return Built(path, x_path, "ids", (1, tokens), {})


def log_spectrum(tmp: Path, decades: float = 6.0, frames: int = 64, bins: int = 32) -> Built:
    """x[1, frames, bins] -> MatMul (a filter bank) -> Log -> Mul(10): a log spectrum, as an
    audio front end computes it. The filter bank's outputs span ``decades`` powers of ten: an
    8-bit linear encoding gives the small ones no step of their own, and the Log turns that
    rounding into the model's error. With ``decades`` under one the encoding holds them."""
    rng = np.random.default_rng(11)
    bank = np.zeros((bins, 16), np.float32)  # each output sums two neighbouring bins
    for j in range(16):
        bank[(2 * j) % bins : (2 * j) % bins + 2, j] = rng.uniform(0.5, 1.0, size=2)
    x = (10.0 ** rng.uniform(-decades, 0, size=(1, frames, bins))).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "bank"], ["power"]),
            helper.make_node("Log", ["power"], ["logp"]),
            helper.make_node("Mul", ["logp", "ten"], ["y"]),
        ],
        "log_spectrum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, frames, bins])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, frames, 16])],
        [
            numpy_helper.from_array(bank, "bank"),
            numpy_helper.from_array(np.array(10.0, np.float32), "ten"),
        ],
    )
    path, x_path = save(graph, tmp / f"log_spectrum_{decades:g}.onnx"), tmp / "spectrum.raw"
    x.tofile(x_path)
    return Built(path, x_path, "x", (1, frames, bins), {"y": 10 * np.log(x[0] @ bank)})


def floor_clip(tmp: Path, frames: int = 16, bins: int = 8) -> Built:
    """x -> MatMul -> Clip(min = max over all values - 3): a floor computed at run time, as an
    audio front end clips its dB spectrum 80 dB under its peak. The peak is a 0-d tensor (a
    ReduceMax without keepdims), quantized and dumped like any other."""
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["db"]),
            helper.make_node("ReduceMax", ["db"], ["peak"], keepdims=0),
            helper.make_node("Sub", ["peak", "range"], ["floor"]),
            helper.make_node("Clip", ["db", "floor"], ["y"]),
        ],
        "floor_clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, frames, bins])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, frames, bins])],
        [
            numpy_helper.from_array(rng.normal(size=(bins, bins)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(3.0, np.float32), "range"),
        ],
    )
    path, x_path = save(graph, tmp / "floor_clip.onnx"), tmp / "floor_x.raw"
    rng.normal(size=(1, frames, bins)).astype(np.float32).tofile(x_path)
    return Built(path, x_path, "x", (1, frames, bins), {})


def half_island(tmp: Path, size: int = 8) -> Built:
    """x -> Conv -> Cast(float16) -> Unsqueeze -> Transpose -> Cast(float) -> Conv, as
    slovorez's Keras export has a float16 stretch: onnxruntime's quantizer leaves the float16
    tensors unquantized, and QNN dumps them as float16."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((rng.standard_normal((4, 3, 3)) * 0.3).astype(np.float32), "w0"),
        numpy_helper.from_array(np.array([2], np.int64), "axis"),
        numpy_helper.from_array((rng.standard_normal((2, 4, 1, 1)) * 0.3).astype(np.float32), "w1"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1], name="conv0"),
            helper.make_node("Cast", ["c0"], ["half"], to=TensorProto.FLOAT16, name="to_half"),
            helper.make_node("Unsqueeze", ["half", "axis"], ["expanded"], name="expand"),
            helper.make_node("Transpose", ["expanded"], ["moved"], perm=[0, 1, 3, 2], name="move"),
            helper.make_node("Cast", ["moved"], ["back"], to=TensorProto.FLOAT, name="back"),
            helper.make_node("Conv", ["back", "w1"], ["y"], name="conv1"),
        ],
        "half_island",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, size, 1])],
        inits,
    )
    path, x_path = save(graph, tmp / "half_island.onnx"), tmp / "half_x.raw"
    rng.standard_normal((1, 3, size)).astype(np.float32).tofile(x_path)
    return Built(path, x_path, "x", (1, 3, size), {})


def masked_attention(tmp: Path, mask_value: float, seq: int = 8, width: int = 16) -> Built:
    """One self-attention head with the additive mask transformers build: x[1, seq, width]
    and a 0/1 ``mask[1, seq]`` (keys to leave out are 0); ``Where(mask == 0, mask_value, 0)``
    added to the scores before the Softmax, as Hugging Face's extended attention mask does
    (``mask_value`` float32's minimum, or -inf in SDPA exports). The input's last two keys
    are masked. ``expected`` holds the float output and the scores, by numpy."""
    rng = np.random.default_rng(7)
    wq, wk, wv = (rng.standard_normal((width, width)).astype(np.float32) * 0.3 for _ in range(3))
    x = rng.standard_normal((1, seq, width)).astype(np.float32)
    mask = np.ones((1, seq), np.float32)
    mask[0, -2:] = 0
    inits = [
        numpy_helper.from_array(a, k)
        for k, a in {
            "wq": wq,
            "wk": wk,
            "wv": wv,
            "zero": np.array(0.0, np.float32),
            "masked": np.array(mask_value, np.float32),
            "shape": np.array([1, 1, seq], np.int64),
        }.items()
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "wq"], ["q"], name="query"),
            helper.make_node("MatMul", ["x", "wk"], ["k"], name="key"),
            helper.make_node("MatMul", ["x", "wv"], ["v"], name="value"),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="key_t"),
            helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
            helper.make_node("Equal", ["mask", "zero"], ["padded"], name="padded"),
            helper.make_node("Reshape", ["padded", "shape"], ["padded3"], name="padded3"),
            helper.make_node("Where", ["padded3", "masked", "zero"], ["bias"], name="mask_bias"),
            helper.make_node("Add", ["scores", "bias"], ["masked_scores"], name="add_mask"),
            helper.make_node("Softmax", ["masked_scores"], ["probs"], axis=-1, name="softmax"),
            helper.make_node("MatMul", ["probs", "v"], ["y"], name="context"),
        ],
        "masked_attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, seq]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, width])],
        inits,
    )
    path = save(graph, tmp / f"masked_attention_{mask_value:g}.onnx")
    x_path, mask_path = tmp / "attn_x.raw", tmp / "attn_mask.raw"
    x.tofile(x_path)
    mask.tofile(mask_path)
    scores = (x[0] @ wq) @ (x[0] @ wk).T
    s = scores + np.where(mask == 0, -1e30, 0.0)  # what the mask does, whatever its value
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = {"scores": scores[None], "y": (p @ (x[0] @ wv))[None], "mask": mask}
    return Built(path, x_path, "x", (1, seq, width), expected, {"mask": ((1, seq), mask_path)})


def shared_bias(tmp: Path) -> Built:
    """Two Convs sharing one bias initializer ``b``, and an activation named ``b0``: the name
    onnxruntime's quantizer gives the copy of a shared bias (``<bias><k>``, numbered from the
    largest suffix among the initializers). ``y = Neg(Relu(conv1)) + conv2``."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["c1"], ["b0"], name="relu1"),
            helper.make_node("Neg", ["b0"], ["n"], name="neg"),
            helper.make_node("Conv", ["x", "w2", "b"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
            helper.make_node("Add", ["n", "c2"], ["y"], name="add"),
        ],
        "shared_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(a, k) for k, a in {"w1": w1, "w2": w2, "b": b}.items()],
    )
    path, x_path = save(graph, tmp / "shared_bias.onnx"), tmp / "shared_x.raw"
    rng.standard_normal((1, 3, 8, 8)).astype(np.float32).tofile(x_path)
    return Built(path, x_path, "x", (1, 3, 8, 8), {})


def int4_mix(tmp: Path, seed: int = 0, inputs: int = 4) -> Built:
    """x[1,8,8,8] -> Conv 1x1 -> Relu -> Conv 3x3 -> Relu -> Flatten -> Gemm(transB) -> y[1,10]:
    the layers ``-wbw 4`` gives int4 weights (the 1x1 Conv, the Gemm) and one it leaves 8-bit.
    ``inputs`` calibration inputs are written (``x{i}.raw``, listed in ``list.txt``)."""
    rng = np.random.default_rng(seed)

    def f(*shape, k=0.3):
        return (rng.standard_normal(shape) * k).astype(np.float32)

    inits = {"w1x1": f(16, 8, 1, 1), "b1x1": f(16, k=0.1), "w3x3": f(16, 16, 3, 3, k=0.1),
             "b3x3": f(16, k=0.1), "wg": f(10, 16 * 8 * 8, k=0.05), "bg": f(10, k=0.1)}  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1x1", "b1x1"], ["c1"], name="conv1x1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w3x3", "b3x3"], ["c3"], pads=[1, 1, 1, 1], name="conv3x3"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Flatten", ["r3"], ["fl"], name="flat"),
        helper.make_node("Gemm", ["fl", "wg", "bg"], ["y"], transB=1, name="gemm"),
    ]
    graph = helper.make_graph(
        nodes,
        "int4_mix",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    path = save(graph, tmp / "int4_mix.onnx")
    lines = []
    for i in range(inputs):
        rng.standard_normal((1, 8, 8, 8)).astype(np.float32).tofile(tmp / f"x{i}.raw")
        lines.append(str(tmp / f"x{i}.raw"))
    (tmp / "list.txt").write_text("\n".join(lines) + "\n")
    return Built(path, tmp / "x0.raw", "x", (1, 8, 8, 8), {})


def matmul_chain(tmp: Path, seed: int = 5, inputs: int = 4) -> Built:
    """x[1,64] -> MatMul [64,32] -> Relu -> MatMul [32,16] -> y: bias-free 2-D weights, what
    ``--weight_block_size`` runs on (inputs ``bx{i}.raw`` listed in ``bq_list.txt``)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((32, 16)) * 0.2).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
            helper.make_node("Relu", ["m1"], ["r1"], name="relu1"),
            helper.make_node("MatMul", ["r1", "w2"], ["y"], name="fc2"),
        ],
        "matmul_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    path = save(graph, tmp / "matmul_chain.onnx")
    lines = []
    for i in range(inputs):
        rng.standard_normal((1, 64)).astype(np.float32).tofile(tmp / f"bx{i}.raw")
        lines.append(str(tmp / f"bx{i}.raw"))
    (tmp / "bq_list.txt").write_text("\n".join(lines) + "\n")
    return Built(path, tmp / "bx0.raw", "x", (1, 64), {})
