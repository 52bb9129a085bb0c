"""One AIMET encoding against one QNN encoding, field by field and channel by channel.

Shared by the comparison (:mod:`accdbg.encodings.compare`) and its workbook
(:mod:`accdbg.encodings.report`): scales, mins and maxes compared as float32 (what QNN stores)
rounded to ``precision`` places; integers as numbers; QNN's symmetry read from its offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from accdbg.encodings.model import Encoding

FIELDS = ("dtype", "bitwidth", "symmetry", "channels", "scale", "offset", "min", "max")
VALUE_FIELDS = ("scale", "offset", "min", "max")


@dataclass
class PairResult:
    """One compared pair; ``diffs`` maps a mismatching field to the channels that differ."""

    kind: str
    aimet: Encoding
    qnn: Encoding
    matched_by: str
    diffs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    note: str = ""


def _f32(x: float) -> float:
    return float(np.float32(x))


def same(a: float, b: float, precision: int, as_float32: bool) -> bool:
    if as_float32:
        a, b = _f32(a), _f32(b)
    return round(float(a), precision) == round(float(b), precision)


def symmetric_offset(e: Encoding) -> bool:
    return bool(e.offset) and all(o == -(2 ** (e.bitwidth - 1)) for o in e.offset)


def compare_pair(a: Encoding, q: Encoding, matched_by: str, precision: int) -> PairResult:
    """Compare an AIMET encoding with a QNN one, field by field and channel by channel."""
    r = PairResult(a.kind, a, q, matched_by)
    if q.source.get("filled_from"):
        r.note = f"QNN values filled from the {q.source['filled_from'].replace('_', ' ')}"
    if a.dtype != q.dtype:
        r.diffs["dtype"] = ()
        return r
    if a.bitwidth != q.bitwidth:
        r.diffs["bitwidth"] = ()
    if a.is_float:
        return r
    if not q.values_known:
        r.note = q.source.get("unreadable", "QNN values unknown")
        if "channels" in q.source and q.source["channels"] != a.channels:
            r.diffs["channels"] = ()
        return r
    if a.channels != q.channels:
        r.diffs["channels"] = ()
        return r
    if a.is_symmetric and not symmetric_offset(q):
        r.diffs["symmetry"] = ()
    for name in VALUE_FIELDS:
        av, qv = getattr(a, name), getattr(q, name)
        bad = tuple(
            i
            for i, (x, y) in enumerate(zip(av, qv, strict=True))
            if not same(x, y, precision, name != "offset")
        )
        if bad:
            r.diffs[name] = bad
    return r
