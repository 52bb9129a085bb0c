"""Verifiers that say how alike two tensors are, whatever their scale."""

from __future__ import annotations

import math

import numpy as np

from accdbg.verifiers.base import Param, TensorPair, Verifier, dot, register
from accdbg.verifiers.channels import ChannelPair, sqnr_db


@register
class CosineSimilarity(Verifier):
    """g·t / (‖g‖‖t‖): 1 when the target points the same way as the golden.

    Both tensors all-zero: 1 (they agree); one all-zero: 0 (no direction to share); never NaN.
    Blind to a uniform scale error (t = 2g scores 1): pair it with SQNR or MSE.
    Pass: >= 0.99.
    """

    name = "CosineSimilarity"
    threshold = 0.99
    higher_is_better = True
    perfect = 1.0
    unit = "cosine, -1..1"

    def noise_to_signal(self, value: float) -> float | None:
        """2 (1 - cos): the noise-to-signal power of a small error at equal norms."""
        return 2.0 * (1.0 - value)

    def per_channel(self, pair: ChannelPair):
        gg, tt, gt = pair.gg, pair.tt, pair.gt
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = np.clip(gt / (np.sqrt(gg) * np.sqrt(tt)), -1.0, 1.0)
        cos = np.where((gg == 0) & (tt == 0), 1.0, cos)
        return np.where((gg == 0) ^ (tt == 0), 0.0, cos)

    def compute(self, pair: TensorPair):
        gg, tt = pair.golden_sq_sum, pair.target_sq_sum
        g, t = pair.golden, pair.target
        if not (math.isfinite(gg) and math.isfinite(tt)):  # squares overflowed: rescale
            g, t = g / np.abs(g).max(), t / np.abs(t).max()
            gg, tt = dot(g, g), dot(t, t)
        if gg == 0.0 and tt == 0.0:
            value = 1.0
        elif gg == 0.0 or tt == 0.0:
            value = 0.0
        else:
            gt = dot(g, t)
            value = max(-1.0, min(1.0, gt / (math.sqrt(gg) * math.sqrt(tt))))
            if value != 1.0 and value > 1.0 - 1e-9 and np.array_equal(pair.golden, pair.target):
                value = 1.0  # identical tensors score exactly 1 despite rounding
        return value, {"golden_norm": math.sqrt(gg), "target_norm": math.sqrt(tt)}


@register
class SQNR(Verifier):
    """10·log10(Σg² / Σ(g−t)²) in dB: signal power over the power of the error.

    Identical tensors: +inf. A zero signal with a non-zero error: -inf. Qualcomm's tool takes
    the signal power from the *target* (mean t² over mean error²); ``signal target`` selects
    that variant, which flatters a target that is too loud. Pass: >= 20 dB (error power
    1% of the signal, roughly cosine 0.995).
    """

    name = "SQNR"
    params = {
        "signal": Param(
            "golden",
            "whose power is the signal: golden (default) or target",
            choices=("golden", "target"),
        ),
    }
    threshold = 20.0
    higher_is_better = True
    unit = "dB"

    def linear_error(self, value: float) -> float:
        """Noise-to-signal power, 10^(-SQNR/10): a fall from 35 to 22 dB leaves 0.6 % noise,
        from 8 to 0 dB destroys the signal."""
        if math.isnan(value):
            return math.nan
        if math.isinf(value):
            return 0.0 if value > 0 else math.inf
        return 10.0 ** (-value / 10.0)

    nsr_exact = True

    def noise_to_signal(self, value: float) -> float | None:
        return self.linear_error(value)

    def per_channel(self, pair: ChannelPair):
        signal = pair.gg if self.values["signal"] == "golden" else pair.tt
        return sqnr_db(signal, pair.dd)

    def compute(self, pair: TensorPair):
        signal = pair.golden_sq_sum if self.values["signal"] == "golden" else pair.target_sq_sum
        noise = pair.sq_diff_sum
        if not (math.isfinite(signal) and math.isfinite(noise)):  # squares overflowed: rescale
            ref = pair.golden if self.values["signal"] == "golden" else pair.target
            k = max(float(np.abs(pair.golden).max()), float(np.abs(pair.target).max()))
            signal = dot(ref / k, ref / k)
            noise = dot(pair.diff / k, pair.diff / k)
        if noise == 0.0:
            value = math.inf
        elif signal == 0.0:
            value = -math.inf
        else:
            value = 10.0 * math.log10(signal / noise)
        return value, {"signal_power_sum": signal, "noise_power_sum": noise}
