"""Verifiers that measure the error in the tensor's own units (or its quantization step)."""

from __future__ import annotations

import numpy as np

from accdbg.verifiers.base import (
    NOT_APPLICABLE,
    Param,
    TensorPair,
    Verifier,
    VerifierResult,
    register,
)


def _error_details(pair: TensorPair) -> dict:
    return {
        "max_abs_error": float(pair.abs_diff.max()),
        "sum_abs_error": pair.abs_diff_sum,
        "elements": int(pair.golden.size),
    }


@register
class MSE(Verifier):
    """mean((g−t)²), in the tensor's units squared.

    Pass: <= 1e-3, a mark for activations of order 1 (an 8-bit step of a 0..6 range gives
    about 5e-5 from rounding alone); set ``threshold`` for tensors on another scale.
    """

    name = "MSE"
    threshold = 1e-3
    unit = "units²"

    def compute(self, pair: TensorPair):
        return pair.sq_diff_sum / pair.golden.size, _error_details(pair)

    def per_channel(self, pair):
        return pair.dd / pair.golden.shape[1]


@register
class MAE(Verifier):
    """mean|g−t|, in the tensor's units.

    Pass: <= 0.02, a mark for activations of order 1 (about one 8-bit step of a 0..6 range);
    set ``threshold`` for tensors on another scale.
    """

    name = "MAE"
    threshold = 0.02
    unit = "units"

    def compute(self, pair: TensorPair):
        return pair.abs_diff_sum / pair.golden.size, _error_details(pair)

    def per_channel(self, pair):
        return np.abs(pair.diff).mean(axis=1)


@register
class L1Error(Verifier):
    """Σ|g−t| · multiplier · scale: the total absolute error (it grows with the tensor's size).

    No default pass mark, because a sum has none that holds across sizes: give ``threshold``
    (with ``multiplier``/``scale`` to put it in your units) to get a verdict.
    """

    name = "L1Error"
    params = {
        "multiplier": Param(1.0, "factor applied to the sum"),
        "scale": Param(1.0, "second factor applied to the sum"),
    }
    threshold = None
    unit = "units"

    def compute(self, pair: TensorPair):
        value = pair.abs_diff_sum * self.values["multiplier"] * self.values["scale"]
        return value, {
            "mean_abs_error": pair.abs_diff_sum / pair.golden.size,
            **_error_details(pair),
        }


@register
class ScaledDiff(Verifier):
    """mean|g−t| / step, step = the target tensor's quantization scale (per axis if so encoded).

    Says how many quantization steps of its own encoding the target is off, so a tensor
    quantized to 8 bits and one left in float are judged on their own terms. Tensors without
    an encoding get the status "not applicable". Pass: <= 1 step on average (rounding alone
    gives 0.25).
    """

    name = "ScaledDiff"
    threshold = 1.0
    unit = "quantization steps"
    needs_scale = True

    def compute(self, pair: TensorPair):
        scale = pair.scale
        if scale is None:
            return VerifierResult(
                np.nan, None, f"{NOT_APPLICABLE}: target has no quantization encoding"
            )
        steps = np.asarray(scale, dtype=np.float64)
        if not np.all(np.isfinite(steps)) or np.any(steps <= 0):
            return VerifierResult(
                np.nan, None, f"{NOT_APPLICABLE}: quantization scale is not a positive number"
            )
        value = (
            float(np.mean(pair.abs_diff / steps))
            if steps.size > 1
            else pair.abs_diff_sum / pair.golden.size / float(steps)
        )
        return value, {
            "scale": float(steps) if steps.size == 1 else "per-axis",
            **_error_details(pair),
        }
