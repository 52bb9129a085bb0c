"""Debugging algorithms: oneshot-layerwise, layerwise and cumulative-layerwise snooping.

Imported lazily, so ``accdbg.algorithms.<module>`` stays cheap and free of import cycles.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SnoopingResult", "run_cumulative_layerwise", "run_layerwise"]


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
    raise AttributeError(f"module 'accdbg.algorithms' has no attribute {name!r}")
