"""A share of an error, as the tool says it: never a percentage over 100.

A layer quantized alone can cause more error at the outputs than the whole quantized model
(errors of different layers partly cancel): its share is then over one. "256 % of the error"
reads as nonsense; what it means is that it alone makes the outputs that much worse than all
of it together - said in dB, as every other SQNR figure.
"""

from __future__ import annotations

import math


def share_words(x: float) -> str:
    """``0.42`` -> ``"42%"``; ``2.56`` -> ``"all (+4.1 dB)"``; NaN -> ``"?%"``."""
    if math.isnan(x):
        return "?%"
    if x > 1.005:
        return f"all (+{10 * math.log10(x):.1f} dB)"
    return f"{100 * x:.0f}%"
