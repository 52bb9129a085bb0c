"""Inference engines: the model on QNN (or a labelled CPU simulation), every tensor dumped."""

from accdbg.engines import qnn, simulation  # noqa: F401  (register the engines)
from accdbg.engines.base import ENGINES, Engine, EngineOptions, get_engine
from accdbg.engines.run import EngineResult, run_inference_engine

__all__ = [
    "ENGINES",
    "Engine",
    "EngineOptions",
    "EngineResult",
    "get_engine",
    "run_inference_engine",
]
