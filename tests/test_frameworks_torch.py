"""PyTorch: a small CNN defined here, golden per module call, exported to ONNX with the mapping."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import onnxruntime as ort
import pytest

from accdbg.core import onnx_model as om
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from accdbg.errors import AccdbgError
from accdbg.frameworks.convert import convert_to_onnx
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests.helpers import diagnose_in_child, lazy_import, needs, one_line_error, run_cli

torch = lazy_import("torch")

TORCH_OPTIONAL = "PyTorch is an optional framework: pip install accdbg[torch] (torch==2.13.0 first)"
pytestmark = [pytest.mark.slow, needs("torch", TORCH_OPTIONAL)]  # a big framework (and QNN)

MODEL_SOURCE = '''
import torch
from torch import nn


class Block(nn.Module):
    """A residual block: its output is computed after its last child (add, then ReLU)."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


class Halves(nn.Module):
    """Returns two tensors."""

    def forward(self, x):
        return x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2 :]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.MaxPool2d(2), Block(8), nn.Dropout(0.2),
        )
        self.act = nn.Hardswish()
        self.split = Halves()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.features(x)
        x = self.act(self.act(x) * 0.5)  # the same module twice
        a, b = self.split(x)
        x = torch.cat([b, a], dim=1)
        x = torch.flatten(self.pool(x), 1)
        return torch.softmax(self.fc(x), dim=-1)


def build():
    torch.manual_seed(0)
    model = SmallCNN()
    for m in model.modules():  # non-trivial batch-norm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.3, 0.3)
    return model.eval()
'''

# module outputs, in the order they are computed; Sequential "features" and "features.5"
# (Dropout, the identity at inference) return a tensor already recorded, so they add nothing
EXPECTED = {
    "features.0": "Conv2d", "features.1": "BatchNorm2d", "features.2": "ReLU",
    "features.3": "MaxPool2d", "features.4.conv": "Conv2d", "features.4.bn": "BatchNorm2d",
    "features.4": "Block", "act": "Hardswish", "act@1": "Hardswish", "split:0": "Halves",
    "split:1": "Halves", "pool": "AdaptiveAvgPool2d", "fc": "Linear", "output": "SmallCNN",
}  # fmt: skip


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    src = root / "small_cnn.py"
    src.write_text(MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location("small_cnn_for_tests", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build()
    x = torch.from_numpy(
        np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    )
    x.numpy().tofile(root / "x.raw")
    with torch.no_grad():  # every module's output, step by step, without hooks
        f = model.features
        v = {"features.0": f[0](x)}
        v["features.1"] = f[1](v["features.0"])
        v["features.2"] = torch.relu(v["features.1"])
        v["features.3"] = f[3](v["features.2"])
        v["features.4.conv"] = f[4].conv(v["features.3"])
        v["features.4.bn"] = f[4].bn(v["features.4.conv"])
        v["features.4"] = torch.relu(v["features.4.bn"] + v["features.3"])
        v["act"] = torch.nn.functional.hardswish(v["features.4"])
        v["act@1"] = torch.nn.functional.hardswish(v["act"] * 0.5)
        v["split:0"], v["split:1"] = v["act@1"][:, :4], v["act@1"][:, 4:]
        v["pool"] = v["act@1"][:, [4, 5, 6, 7, 0, 1, 2, 3]].mean(dim=(2, 3), keepdim=True)
        v["fc"] = v["pool"].flatten(1) @ model.fc.weight.T + model.fc.bias
        v["output"] = torch.softmax(v["fc"], dim=-1)
    expected = {k: t.numpy() for k, t in v.items()}
    return root, src, model, x, expected


def test_module_outputs_by_hooks_match_step_by_step(capsys, cnn):
    root, src, _, _, expected = cnn
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "PyTorch", "-m", f"{src}:build",
                           "-i", "x", "1,3,16,16", root / "x.raw", "-o", "fc",
                           "-w", root / "w", "--output_dirname", "eager")  # fmt: skip
    assert code == 0, err
    folder = TensorFolder(root / "w" / "framework_diagnosis" / "eager")
    recs = json.loads((folder.root / "tensors.json").read_text())["tensors"]
    assert [r["name"] for r in recs] == list(EXPECTED)
    assert {r["name"]: r["op_type"] for r in recs} == EXPECTED
    for name, want in expected.items():
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-5, atol=1e-5, err_msg=name)
    # features.1 was dumped before the in-place ReLU overwrote its tensor
    assert (folder.load("features.1") < 0).any() and not (folder.load("features.2") < 0).any()
    assert (folder.root / "act@1.raw").is_file() and (folder.root / "split_0.raw").is_file()


def test_exported_program_gives_the_same_tensors(cnn, tmp_path):
    root, _, model, x, expected = cnn
    pt2 = tmp_path / "small_cnn.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(pt2))
    inp = [parse_input_tensor(["x", "1,3,16,16", str(root / "x.raw")])]
    res = run_framework_diagnosis("pytorch", pt2, inp, working_dir=tmp_path / "w")
    assert dict(zip(res.tensors["name"], res.tensors["op_type"], strict=True)) == EXPECTED
    folder = TensorFolder(res.run_dir)
    for name, want in expected.items():
        np.testing.assert_allclose(folder.load(name), want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("form", ["factory", "pt2"])
def test_onnx_export_maps_every_module_output(cnn, tmp_path, form):
    root, src, model, x, expected = cnn
    if form == "factory":
        spec = f"{src}:build"
    else:
        spec = tmp_path / "small_cnn.pt2"
        torch.export.save(torch.export.export(model, (x,)), str(spec))
    inp = [parse_input_tensor(["x", "1,3,16,16", str(root / "x.raw")])]
    conv = convert_to_onnx("pytorch", spec, inp, tmp_path / "onnx")
    assert conv.unmapped == {}
    assert sorted(conv.tensor_mapping.values()) == sorted(
        EXPECTED
    )  # complete, one ONNX tensor each
    assert conv.permutations == {} and conv.input_names == {"x": "x"}
    onnx_model = om.load_model(conv.onnx_path)
    assert [i.name for i in onnx_model.graph.input] == ["x"]
    sess = ort.InferenceSession(om.with_outputs(onnx_model, list(conv.tensor_mapping)).SerializeToString(),
                                providers=["CPUExecutionProvider"])  # fmt: skip
    got = dict(
        zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x.numpy()}), strict=True)
    )
    for onnx_name, fw_name in conv.tensor_mapping.items():
        np.testing.assert_allclose(
            got[onnx_name], expected[fw_name], rtol=1e-4, atol=1e-5, err_msg=fw_name
        )
    saved = json.loads((tmp_path / "onnx" / "conversion.json").read_text())
    assert saved["tensor_mapping"] == conv.tensor_mapping and saved["framework"] == "pytorch"


def crashing_module(tmp_path, src, monkeypatch, extra: str):
    """``src`` and ``extra``, where ``crash()`` segfaults in any process but the test's own."""
    path = tmp_path / "crashing.py"
    path.write_text(
        src.read_text()
        + "\n\ndef crash():\n    import ctypes, os\n\n"
        + "    if os.getpid() != int(os.environ['ACCDBG_TEST_PARENT']):\n"
        + "        ctypes.string_at(0)  # a native crash, in a child process only\n\n\n"
        + extra
    )
    monkeypatch.setenv("ACCDBG_TEST_PARENT", str(__import__("os").getpid()))
    return path


def test_a_native_crash_while_exporting_is_an_error_and_the_tool_survives(
    cnn, tmp_path, monkeypatch
):
    """torch.onnx runs native code; it exports in a child Python, so a segfault there is a
    one-line error, not the end of the tool (or of this test's worker)."""
    root, src, *_ = cnn
    crashing = crashing_module(
        tmp_path,
        src,
        monkeypatch,
        "def build_then_crash():\n    model = build()\n    crash()\n    return model\n",
    )
    inp = [parse_input_tensor(["x", "1,3,16,16", str(root / "x.raw")])]
    with pytest.raises(AccdbgError) as err:
        convert_to_onnx("pytorch", f"{crashing}:build_then_crash", inp, tmp_path / "onnx")
    assert str(err.value).startswith(
        f"the pytorch converter crashed with SIGSEGV while converting '{crashing}:build_then_crash'"
        " to ONNX; the tool survived"
    )
    assert not (tmp_path / "onnx" / "conversion.json").exists()


def test_a_native_crash_in_the_forward_pass_is_an_error_and_the_tool_survives(
    capsys, cnn, tmp_path, monkeypatch
):
    """Framework diagnosis runs the model's forward passes in a child Python: a segfault in
    them is a one-line error naming the runtime, the tool (and this worker) goes on, and the
    run that died is not taken for a finished one."""
    root, src, *_ = cnn
    crashing = crashing_module(
        tmp_path,
        src,
        monkeypatch,
        "class Crash(__import__('torch').nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.inner = build()\n\n"
        "    def forward(self, x):\n        crash()\n        return self.inner(x)\n",
    )
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "pytorch", "-m", f"{crashing}:Crash",
                           "-i", "x", "1,3,16,16", root / "x.raw", "-w", tmp_path / "w")  # fmt: skip
    assert code != 0
    assert one_line_error(err).endswith(
        f"error: the pytorch runtime crashed with SIGSEGV while running '{crashing}:Crash' for "
        "its golden tensors; the tool survived - see the log (-v)"
    )
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not (fd / "latest").exists()


@pytest.mark.parametrize(
    "case, expect",
    [
        ("torchscript", "is a TorchScript file; per-module outputs need forward hooks"),
        ("no_factory", "name the function that builds the module, e.g."),
        ("missing_factory", "has no 'biuld'; near matches: build"),
        ("not_a_module", "returned int, not a torch.nn.Module"),
        ("state_dict", "a state_dict holds weights, not the network: pass -m model.py:factory"),
        ("wrong_input", "'image' is not an argument of the model's forward; its arguments are: x"),
        ("wrong_dims", "the model's forward failed on the given inputs: RuntimeError"),
        (
            "bad_output",
            "-o/--output_tensor 'features.9' is not a module output of the model; near matches:",
        ),
    ],
)
def test_bad_inputs_one_line(capsys, cnn, tmp_path, monkeypatch, case, expect):
    """Each bad input is one line. ``torchscript`` goes through the child Python framework
    diagnosis runs PyTorch in (its error relayed), the others in this process, where torch is
    loaded already (the same checks, without a torch import per case)."""
    from accdbg.frameworks.torch_runner import TorchRunner

    if case != "torchscript":
        diagnose_in_child(monkeypatch, TorchRunner, False)
    root, src, model, x, _ = cnn
    spec, name, dims, out = f"{src}:build", "x", "1,3,16,16", "fc"
    raw = root / "x.raw"
    if case == "torchscript":
        spec = tmp_path / "scripted.pt"
        torch.jit.trace(model, x).save(str(spec))
    elif case == "no_factory":
        spec = str(src)
    elif case == "missing_factory":
        spec = f"{src}:biuld"
    elif case == "not_a_module":
        (tmp_path / "bad.py").write_text("def build():\n    return 3\n")
        spec = f"{tmp_path / 'bad.py'}:build"
    elif case == "state_dict":
        spec = tmp_path / "weights.pth"
        torch.save(model.state_dict(), str(spec))
    elif case == "wrong_input":
        name = "image"
    elif case == "wrong_dims":
        dims, raw = "1,4,16,12", root / "x.raw"  # same byte count, 4 channels
    elif case == "bad_output":
        out = "features.9"
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "pytorch", "-m", spec,
                           "-i", name, dims, raw, "-o", out, "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert expect in one_line_error(err)
    fd = tmp_path / "w" / "framework_diagnosis"
    assert not fd.exists() or not any(p for p in fd.iterdir() if not p.name.startswith("."))


def test_torch_missing_is_one_line_with_the_install(capsys, cnn, tmp_path, monkeypatch):
    root, src, _, _, _ = cnn
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "pytorch", "-m", f"{src}:build",
                           "-i", "x", "1,3,16,16", root / "x.raw", "-w", tmp_path / "w")  # fmt: skip
    assert code == 2
    assert one_line_error(err).endswith(
        "framework 'pytorch' is not available: pip install accdbg[torch]"
    )
