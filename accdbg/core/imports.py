"""Imports that leave out what a library would pull in needlessly."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


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
