"""Imports that leave out what a library would pull in needlessly."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any


@contextmanager
def without(modules: Sequence[str]) -> Iterator[None]:
    """Import with ``modules`` made unimportable, when not loaded yet.

    Some libraries import torch (or IPython) at import time when it is installed, for parts
    accdbg does not use: Model Explorer (its PyTorch adapter, notebooks) and onnxruntime's
    QNN pre-processing (``onnxruntime.tools``' PyTorch export helpers). Loading torch costs
    about 3 s and 180 MB per process - most of a small model's engine run.
    """
    blocked = [m for m in modules if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in blocked:
            if sys.modules.get(m) is None:
                sys.modules.pop(m, None)


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports each exported name from its
    module (``where``: name -> module) on first use: child processes import the package for
    one small part of it and should not pay for the rest (pandas, the quantizer)."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # asked once
        return value

    return __getattr__


@functools.cache
def qnn_quantization() -> ModuleType:
    """onnxruntime's QNN quantization module (its pre-processing, its QDQ config), imported
    with torch left out: its import of ``onnxruntime.tools`` loads torch whenever it is
    installed, for PyTorch export helpers accdbg never calls. Imported once: every later
    call (each quantization, each pre-processing) gets it without hiding torch again - a
    window in which another thread's import of torch would fail."""
    with without(("torch",)):
        return importlib.import_module("onnxruntime.quantization.execution_providers.qnn")
