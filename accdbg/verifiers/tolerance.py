"""Verifiers that count the elements outside a tolerance, like numpy.isclose."""

from __future__ import annotations

import numpy as np

from accdbg.verifiers.base import Param, TensorPair, Verifier, register


def _percent_outside(pair: TensorPair, rtol: float, atol: float) -> tuple[float, dict]:
    outside = int(np.count_nonzero(pair.abs_diff > atol + rtol * np.abs(pair.golden)))
    return 100.0 * outside / pair.golden.size, {
        "elements_outside": outside,
        "elements": int(pair.golden.size),
        "rtol": rtol,
        "atol": atol,
    }


@register
class RtolAtol(Verifier):
    """Percent of elements with |t−g| > atol + rtol·|g| (lower is better).

    ``rtolmargin`` and ``atolmargin`` are rtol and atol (0.01 each). Pass: <= 1 % of the
    elements outside the tolerance.
    """

    name = "RtolAtol"
    params = {
        "rtolmargin": Param(0.01, "relative tolerance rtol"),
        "atolmargin": Param(0.01, "absolute tolerance atol"),
    }
    threshold = 1.0
    unit = "% of elements"

    def compute(self, pair: TensorPair):
        return _percent_outside(pair, self.values["rtolmargin"], self.values["atolmargin"])


@register
class AdjustedRtolAtol(Verifier):
    """RtolAtol with atol = levels_num·(max g − min g)/255 and rtol = 0.1 (lower is better).

    The absolute tolerance is ``levels_num`` 8-bit steps of the golden tensor's range, so the
    tolerance follows each tensor's scale. Pass: <= 1 % of the elements outside.
    """

    name = "AdjustedRtolAtol"
    params = {"levels_num": Param(4.0, "how many 8-bit steps of the golden range atol spans")}
    threshold = 1.0
    unit = "% of elements"

    def compute(self, pair: TensorPair):
        lo, hi = pair.golden_range
        atol = self.values["levels_num"] * (hi - lo) / 255.0
        return _percent_outside(pair, 0.1, atol)
