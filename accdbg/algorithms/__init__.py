"""Debugging algorithms: oneshot-layerwise, layerwise, cumulative-layerwise and binary snooping,
and the model dissection deep analyzer.

Imported lazily, so ``accdbg.algorithms.<module>`` stays cheap and free of import cycles.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BinaryResult",
    "DatasetResult",
    "DissectionResult",
    "SnoopingResult",
    "run_binary",
    "run_cumulative_layerwise",
    "run_dataset",
    "run_dissection",
    "run_layerwise",
]
_MORE = {
    "run_binary": "accdbg.algorithms.binary",
    "BinaryResult": "accdbg.algorithms.binary",
    "run_dissection": "accdbg.algorithms.dissection",
    "DissectionResult": "accdbg.algorithms.dissection",
    "run_dataset": "accdbg.algorithms.dataset",
    "DatasetResult": "accdbg.algorithms.dataset",
}


def __getattr__(name: str) -> Any:
    if name == "run_layerwise":
        from accdbg.algorithms.layerwise import run_layerwise

        return run_layerwise
    if name == "run_cumulative_layerwise":
        from accdbg.algorithms.cumulative import run_cumulative_layerwise

        return run_cumulative_layerwise
    if name == "SnoopingResult":
        from accdbg.algorithms.snooping import SnoopingResult

        return SnoopingResult
    if name in _MORE:
        import importlib

        return getattr(importlib.import_module(_MORE[name]), name)
    raise AttributeError(f"module 'accdbg.algorithms' has no attribute {name!r}")
