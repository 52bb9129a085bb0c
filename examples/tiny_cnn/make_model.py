"""Build the bundled example: a small image classifier CNN and one input image.

Deterministic (fixed seed), so the committed ``model.onnx`` and ``input.raw`` can be rebuilt
byte for byte: ``python examples/tiny_cnn/make_model.py``. The second conv block has one
dead output channel (ReLU always zeroes it) whose weights are 40x larger than the rest - the
kind of outlier that per-tensor 8-bit weight quantization pays for with every other channel's
precision, so the debugger has a culprit to find.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def build(out_dir: Path = HERE) -> tuple[Path, Path]:
    rng = np.random.default_rng(2024)
    nodes, inits = [], []

    def conv(name, x, cin, cout, k=3, stride=1, outlier=False):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(
            np.float32
        )
        b = (rng.standard_normal(cout) * 0.05).astype(np.float32)
        if outlier:  # a dead channel with huge weights: ReLU hides it, per-tensor 8-bit pays for it
            w[0] *= 40.0
            b[0] = -1000.0
        inits.extend(
            [
                numpy_helper.from_array(w, f"{name}.weight"),
                numpy_helper.from_array(b, f"{name}.bias"),
            ]
        )
        p = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.weight", f"{name}.bias"],
                [f"{name}/out"],
                pads=[p] * 4,
                strides=[stride] * 2,
                name=name,
            )
        )
        nodes.append(
            helper.make_node("Relu", [f"{name}/out"], [f"{name}/relu"], name=f"{name}_relu")
        )
        return f"{name}/relu"

    x = conv("stem/conv", "image", 3, 16, stride=2)
    x = conv("block1/conv", x, 16, 16, outlier=True)
    x = conv("block2/conv", x, 16, 32, stride=2)
    x = conv("block3/conv", x, 32, 32)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["head/pool"], name="head/pool"))
    nodes.append(helper.make_node("Flatten", ["head/pool"], ["head/flat"], name="head/flatten"))
    fc_w = (rng.standard_normal((32, 10)) * 0.2).astype(np.float32)
    fc_b = np.zeros(10, np.float32)
    inits += [
        numpy_helper.from_array(fc_w, "head.fc.weight"),
        numpy_helper.from_array(fc_b, "head.fc.bias"),
    ]
    nodes.append(
        helper.make_node("MatMul", ["head/flat", "head.fc.weight"], ["head/fc"], name="head/fc")
    )
    nodes.append(
        helper.make_node("Add", ["head/fc", "head.fc.bias"], ["logits_pre"], name="head/bias")
    )
    nodes.append(
        helper.make_node("Softmax", ["logits_pre"], ["probs"], axis=1, name="head/softmax")
    )
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="accdbg-example"
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    model_path = out_dir / "model.onnx"
    onnx.save(model, str(model_path))
    yy, xx = np.mgrid[0:32, 0:32] / 32.0
    image = np.stack([np.sin(8 * xx), np.cos(6 * yy), xx * yy]).astype(np.float32)[None]
    input_path = out_dir / "input.raw"
    image.tofile(input_path)
    (out_dir / "input_list.txt").write_text("image:=input.raw\n")
    return model_path, input_path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    out.mkdir(parents=True, exist_ok=True)
    for p in build(out):
        print(p)
