"""Inference engines: the model on QNN (or a labelled CPU simulation), every tensor dumped.

The run itself (:mod:`.run`: preparation, mapping, the run folder) is imported on first use:
each engine worker (``python -m accdbg.core.isolate ... accdbg.engines.worker``) imports this
package, and should not pay for pandas and the quantizer it never uses (0.3 s per child).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accdbg.core.imports import lazy_exports
from accdbg.engines import qnn, simulation  # noqa: F401  (register the engines)
from accdbg.engines.base import ENGINES, Engine, EngineOptions, get_engine

if TYPE_CHECKING:
    from accdbg.engines.run import EngineResult, run_inference_engine

_LAZY = {"EngineResult": "accdbg.engines.run", "run_inference_engine": "accdbg.engines.run"}
__all__ = [
    "ENGINES",
    "Engine",
    "EngineOptions",
    "EngineResult",
    "get_engine",
    "run_inference_engine",
]
__getattr__ = lazy_exports(__name__, _LAZY)
