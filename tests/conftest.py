"""Shared fixtures: synthetic models built with onnx.helper, and the real PP-OCR models."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")

from tests import models  # noqa: E402


def _rapidocr_model(name: str) -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "rapidocr-onnxruntime==1.4.4 is not installed; the test command installs it "
            "(pip install --no-deps rapidocr-onnxruntime==1.4.4)"
        )
    path = Path(spec.submodule_search_locations[0]) / "models" / name
    assert path.is_file(), path
    return path


# Fixtures that start the QNN backend, a browser or a big framework: a test using one is in the
# slow tier (``pytest -m "not slow"`` leaves it out). Tests that start them themselves carry
# ``@pytest.mark.slow``.
SLOW_FIXTURES = {
    "ppocr_det",
    "ppocr_cls",
    "ppocr_rec",
    "example_run",
    "blocks_run",
    "weight_outlier",
}
# fixtures of those names that run QNN in these modules only (``planted`` is cheap elsewhere)
SLOW_MODULE_FIXTURES = {("test_binary", "planted"), ("test_dissection", "planted")}
# a module marked slow as a whole: ``pytestmark = pytest.mark.slow`` or a list starting with it
SLOW_MODULE = re.compile(r"^pytestmark = (\[\s*)?pytest\.mark\.slow\b", re.M)


def pytest_ignore_collect(collection_path, config):
    """In the fast tier, a module marked slow as a whole is not even imported (importing
    TensorFlow or PyTorch alone takes seconds)."""
    if config.getoption("markexpr", "").replace(" ", "") != "notslow":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if SLOW_MODULE.search(collection_path.read_text(encoding="utf-8")):
            return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if SLOW_FIXTURES & names or any((module, f) in SLOW_MODULE_FIXTURES for f in names):
            item.add_marker(pytest.mark.slow)


# modules one of whose tests failed: their temporary folders stay for the post-mortem
_FAILED_MODULES: set[str] = set()
# a session-scoped fixture's folder outlives the module that happened to create it first
SESSION_DIR_PREFIX = "session-"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _FAILED_MODULES.add(item.nodeid.split("::")[0])
    return report


@pytest.fixture(scope="module", autouse=True)
def _module_folders_go_with_the_module(request, tmp_path_factory):
    """The suite runs real models and dumps every tensor: left until the session ends, its
    folders peak at several GB (a CI disk that ran full failed the whole suite). Each module's
    folders go when it ends (with ``--dist loadfile`` a worker runs one module at a time)."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.node.nodeid in _FAILED_MODULES:
        return
    for folder in set(base.iterdir()) - before:
        if not folder.name.startswith(SESSION_DIR_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)


# the logger as the test session found it: a module-scoped fixture that runs the CLI sets it up
# before any per-test fixture could save it, so the state to restore is this one
_ACCDBG = logging.getLogger("accdbg")
_LOGGER_AT_START = (list(_ACCDBG.handlers), _ACCDBG.propagate, _ACCDBG.level)


@pytest.fixture(autouse=True)
def _restore_accdbg_logger():
    """The CLI installs a console handler and stops propagation; give every test a clean logger
    (whatever ran before it in this process, in whichever order the workers take the tests)."""
    _reset_logger()
    yield
    _reset_logger()


def _reset_logger() -> None:
    handlers, propagate, level = _LOGGER_AT_START
    _ACCDBG.handlers[:] = handlers
    _ACCDBG.propagate, _ACCDBG.level = propagate, level


@pytest.fixture(scope="session")
def ppocr_det() -> Path:
    return _rapidocr_model("ch_PP-OCRv4_det_infer.onnx")


@pytest.fixture(scope="session")
def ppocr_cls() -> Path:
    return _rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx")


@pytest.fixture(scope="session")
def ppocr_rec() -> Path:
    return _rapidocr_model("ch_PP-OCRv4_rec_infer.onnx")


def _text_page(tmp_path_factory, side: int) -> Path:
    """A deterministic 1x3xSIDExSIDE page of printed text, as a raw float32 file."""
    from tests.images import text_image

    path = tmp_path_factory.mktemp(f"{SESSION_DIR_PREFIX}ppocr{side}") / f"x{side}.raw"
    text_image(side, side, seed=7).tofile(path)
    return path


@pytest.fixture(scope="session")
def ppocr_input(tmp_path_factory) -> Path:
    """A 1x3x320x320 page of printed text for the det model (its output is a real text map,
    not all zero)."""
    return _text_page(tmp_path_factory, 320)


@pytest.fixture(scope="session")
def ppocr_small_input(tmp_path_factory) -> Path:
    """The same kind of page at 1x3x160x160: the det model's every layer at a quarter of the
    QNN time, for tests of structure (completeness, mapping, partitions), not of values."""
    return _text_page(tmp_path_factory, 160)


@pytest.fixture
def mlp(tmp_path) -> models.Built:
    return models.mlp(tmp_path)
