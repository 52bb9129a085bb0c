"""``-f FRAMEWORK [VERSION]``: case-insensitive, the version checked against the installed one."""

from __future__ import annotations

import importlib.metadata

import pytest

from accdbg.errors import AccdbgError
from accdbg.frameworks import versions
from tests.helpers import fresh_python, one_line_error, run_cli


@pytest.mark.parametrize(
    "wanted, installed, ok",
    [
        ("2.21", "2.21.0", True),
        ("2.21.0", "2.21.0", True),
        ("2", "2.21.0", True),
        ("2.13", "2.13.0+cpu", True),
        ("2.13.0", "2.13.0+cpu", True),
        ("2.1", "2.13.0", False),  # not a string prefix: 2.1 is not 2.13
        ("2.21.1", "2.21.0", False),
        ("1.17", "1.23.2", False),
        ("2.21.0.0", "2.21", True),
        ("2.3.0", "2.3.0rc1", True),
    ],
)
def test_version_matching(wanted, installed, ok):
    assert versions.version_matches(wanted, installed) is ok


def _fd(capsys, mlp, tmp_path, *framework):
    return run_cli(capsys, "--framework_diagnosis", "-f", *framework, "-m", mlp.path,
                   "-i", mlp.input_name, ",".join(map(str, mlp.dims)), mlp.input_path,
                   "-w", tmp_path / "w")  # fmt: skip


def test_matching_version_runs(capsys, tmp_path, mlp):
    onnx_version = importlib.metadata.version("onnx")
    major_minor = ".".join(onnx_version.split(".")[:2])
    code, _, err = _fd(capsys, mlp, tmp_path, "ONNX", major_minor)
    assert code == 0, err


def test_onnxruntime_version_is_accepted_for_onnx(capsys, tmp_path, mlp):
    code, _, err = _fd(capsys, mlp, tmp_path, "onnx", importlib.metadata.version("onnxruntime"))
    assert code == 0, err


def test_mismatch_names_both_versions_and_writes_nothing(capsys, tmp_path, mlp):
    code, _, err = _fd(capsys, mlp, tmp_path, "onnx", "0.1")
    assert code == 2
    line = one_line_error(err)
    onnx_version = importlib.metadata.version("onnx")
    assert f"-f/--framework onnx 0.1: the installed version is onnx {onnx_version}" in line
    assert "not 0.1" in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "component",
    [["--framework_diagnosis"], ["--inference_engine", "-r", "htp"], []],
    ids=["framework_diagnosis", "inference_engine", "wrapper"],
)
def test_every_path_refuses_a_wrong_version_alike(capsys, tmp_path, mlp, component):
    """The same one line from each command that takes -f, before anything is written."""
    code, _, err = run_cli(capsys, *component, "-f", "onnx", "0.1", "-m", mlp.path,
                           "-i", mlp.input_name, ",".join(map(str, mlp.dims)), mlp.input_path,
                           "-w", tmp_path / "w")  # fmt: skip
    assert code == 2, err
    onnx_version = importlib.metadata.version("onnx")
    line = one_line_error(err)
    assert f"-f/--framework onnx 0.1: the installed version is onnx {onnx_version}" in line
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "framework, dist",
    [("tflite", "ai-edge-litert"), ("TensorFlow", "tensorflow-cpu"), ("pytorch", "torch")],
)
def test_other_frameworks_check_their_own_package(framework, dist):
    installed = importlib.metadata.version(dist)
    assert versions.check_framework([framework, installed.split("+")[0]]) == framework.lower()
    with pytest.raises(AccdbgError) as info:
        versions.check_framework([framework, "0.0.1"])
    assert f"{dist} {installed}" in str(info.value) and "0.0.1" in str(info.value)


@pytest.mark.parametrize(
    "values, expect",
    [
        (
            ["caffe"],
            "-f/--framework 'caffe' is not supported; expected one of: onnx, pytorch, tensorflow, tflite",
        ),
        (["onnx", "v1.17"], "version 'v1.17' must be numbers separated by dots"),
        (["onnx", "1.17", "extra"], "takes a framework and an optional version"),
    ],
)
def test_bad_framework_flags(values, expect):
    with pytest.raises(AccdbgError) as info:
        versions.check_framework(values)
    assert expect in str(info.value)
    assert "\n" not in str(info.value)


def test_version_of_a_missing_framework_says_what_to_install(monkeypatch):
    monkeypatch.setitem(
        versions.FRAMEWORK_PACKAGES, "tensorflow",
        versions.FrameworkPackage(("no-such-tensorflow-dist",), "no_such_tensorflow_module", "tensorflow"),
    )  # fmt: skip
    with pytest.raises(AccdbgError) as info:
        versions.check_framework(["tensorflow", "1.15"])
    assert (
        str(info.value) == "framework 'tensorflow' is not available: pip install accdbg[tensorflow]"
    )
    with pytest.raises(AccdbgError) as info:
        versions.require("tensorflow")
    assert (
        str(info.value) == "framework 'tensorflow' is not available: pip install accdbg[tensorflow]"
    )


def test_registry_does_not_import_the_frameworks():
    """Listing the runners must stay cheap: TensorFlow, PyTorch and LiteRT load on use only."""
    code = (
        "import sys, accdbg.frameworks as f; "
        "print(sorted(f.FRAMEWORKS), [m for m in ('tensorflow', 'torch', 'ai_edge_litert', 'tf2onnx') if m in sys.modules])"
    )
    assert fresh_python(code).strip() == "['onnx', 'pytorch', 'tensorflow', 'tflite'] []"
