"""A worker that calls one module-level function per item, for items that need no state
kept between them (a sub-model to run once, a fix candidate to quantize and measure): the
worker processes still pay their start-up (imports, the QNN library) once, not per item."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accdbg.core.executors.base import WorkerSpec, resolve


class FunctionWorker:
    """``fn(item)`` for ``fn`` given as ``"package.module:function"``."""

    def __init__(self, fn: str):
        self.fn = resolve(fn)

    def __call__(self, item: Any) -> Any:
        return self.fn(item)


def function_spec(fn: Callable[[Any], Any]) -> WorkerSpec:
    """The worker spec calling ``fn`` (module-level, importable by the worker processes)."""
    return WorkerSpec(f"{__name__}:FunctionWorker", {"fn": f"{fn.__module__}:{fn.__qualname__}"})
