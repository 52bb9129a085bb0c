"""The quantization checker: every quantizer variant, every weight, bias and activation,
checked against its float values before anything runs on a device (see :mod:`.run`)."""

from __future__ import annotations

from typing import Any

__all__ = ["QuantCheckerResult", "run_quant_checker"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from accdbg.algorithms.quant_checker import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
