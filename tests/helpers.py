"""Running the command in-process and reading what it printed."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from accdbg.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def fresh_python(code: str) -> str:
    """What ``code`` prints in a new Python (for what importing, or crashing, would change in
    this one); a failure raises with its output."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def diagnose_in_child(monkeypatch, runner: type, child: bool) -> None:
    """Framework diagnosis of ``runner``'s models in a child Python (``child``) or in this
    process: where the test has the framework loaded already, the child only adds its import."""
    monkeypatch.setattr(runner, "isolated", classmethod(lambda cls, options: child))


class _Lazy:
    """A module imported at its first public attribute read (pytest's collection asks every
    module-level object for private ones - ``__test__``, its fixture marker - which must not
    import it)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def lazy_import(name: str) -> Any:
    """``name``, imported when a test first reads it. Every xdist worker imports every test
    module to collect it: importing TensorFlow (6 s) or Model Explorer with torch (4 s) there
    costs each worker, where only one runs those tests. A module of an optional framework
    marks its tests :func:`needs` instead of ``pytest.importorskip``."""
    return _Lazy(name)


def needs(package: str, reason: str) -> pytest.MarkDecorator:
    """Skip when ``package`` is not installed (found without importing it): the mark of a test
    module of an optional framework."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=reason)


def one_line_error(err: str) -> str:
    """The CLI's error: exactly one line starting with the program name."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, err
    assert "Traceback" not in err, err
    return errors[0]


def converted_matches_golden(conv, golden, feeds: dict) -> int:
    """Run a converted ONNX model (``conv``: a Conversion) on onnxruntime's CPU with every mapped
    tensor exposed and check each, brought back to the framework's layout, against its golden
    tensor (``golden``: a TensorFolder; 1e-3 of the tensor's largest value). Returns how many
    tensors had to be transposed back (the converter moved them to NCHW)."""
    import onnxruntime as ort

    from accdbg.core import onnx_model as om

    exposed = om.with_outputs(om.load_model(conv.onnx_path), list(conv.tensor_mapping))
    sess = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, feeds), strict=True))
    moved = 0
    for onnx_name, fw_name in conv.tensor_mapping.items():
        value = got[onnx_name]
        if onnx_name in conv.permutations:
            value = value.transpose(conv.permutations[onnx_name])
            moved += 1
        want = np.asarray(golden.load(fw_name))
        np.testing.assert_allclose(
            value, want, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(want).max()), err_msg=fw_name
        )
    return moved
