"""Stand-ins for the ranking's measures: evidence with a given local SQNR, and an impact
measure whose answers a test sets (it records what it was asked)."""

from __future__ import annotations

import math

import numpy as np

from accdbg.algorithms.diagnosis.evidence import Evidence
from accdbg.algorithms.diagnosis.sensitivity import Share


def evidence(name: str, db: float, inputs=(), owner: str = "weights") -> Evidence:
    """A Conv whose weights (or output) keep ``db`` of SQNR."""
    nsr = 10 ** (-db / 10)
    if owner == "weights":
        return Evidence(name, "Conv", list(inputs), weight_nsr=nsr, weight_note="w")
    return Evidence(name, "Conv", list(inputs), output_nsr=nsr, output_note="range")


def chain(seed: int, n: int = 40) -> tuple[list[str], dict[str, Evidence]]:
    """A chain of ``n`` layers whose weights keep 36 dB give or take 2 (seeded): a noise floor
    for a test to plant its standouts in."""
    rng = np.random.default_rng(seed)
    names = [f"l{i}" for i in range(n)]
    ev = {
        x: evidence(x, 36 + rng.normal(0, 2), inputs=[names[i - 1]] if i else [])
        for i, x in enumerate(names)
    }
    return names, ev


class Impact:
    """``shares``: a layer name or a tuple of names -> its share (a float or a Share);
    anything else costs 1 %."""

    def __init__(self, shares):
        self.shares = shares
        self.asked = []

    def __call__(self, names, enough=math.inf):
        key = names if isinstance(names, str) else tuple(names)
        self.asked.append(key)
        share = self.shares.get(key, 0.01)
        return share if isinstance(share, Share) else Share(share)
