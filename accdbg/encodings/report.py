"""The ``encodings_diff.xlsx`` layout: summary, params, activations, per_channel, one_sided.

In the params/activations sheets a row is one paired tensor with both sides' values side by
side (``scale (AIMET)`` next to ``scale (QNN)``); both cells of a field that differs are red.
A per-channel field shows its value range there; tensors with a differing channel get one row
per channel in ``per_channel``, where each differing channel's cells are red (all channels'
values are in ``extracted_encodings.json`` and the AIMET file; a sheet of every channel of a
large model would take openpyxl minutes to write).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from accdbg.encodings.model import ACTIVATION, PARAM
from accdbg.encodings.pairs import FIELDS, VALUE_FIELDS, PairResult, symmetric_offset
from accdbg.reports.excel import Sheet, write_workbook

LABEL = {
    "dtype": "dtype",
    "bitwidth": "bitwidth",
    "symmetry": "symmetric",
    "channels": "channels",
    "scale": "scale",
    "offset": "offset",
    "min": "min",
    "max": "max",
}
NOTES = {
    "symmetric (QNN)": "QNN stores no symmetry flag: True when offset == -2^(bitwidth-1). Only an AIMET "
    "symmetric encoding that QNN does not hold symmetric is a mismatch.",
    "offset (AIMET)": "AIMET/QNN convention: real = scale * (q + offset), q unsigned; offset = -zero_point "
    "(unsigned storage) or -zero_point - 2^(bw-1) (signed storage).",
    "offset (QNN)": "QNN offset converted to the AIMET convention: signed QNN types (SFIXED_POINT_n) store "
    "offset + 2^(bw-1).",
    "min (QNN)": "QNN stores no min/max: scale * offset.",
    "max (QNN)": "QNN stores no min/max: scale * (offset + 2^bitwidth - 1).",
    "scale (AIMET)": "Compared as float32 (QNN's scale type), rounded to --precision decimal places.",
    "matched by": "How the AIMET name was paired with the QNN name (rules: accdbg.encodings.matching).",
}


def _cols(field: str) -> tuple[str, str]:
    return f"{LABEL[field]} (AIMET)", f"{LABEL[field]} (QNN)"


def _summary_value(values: tuple, known: bool = True) -> Any:
    if not known:
        return "n/a"
    if len(values) == 1:
        return values[0]
    return f"{len(values)} ch: {min(values):.6g} .. {max(values):.6g}"


def _pair_record(p: PairResult) -> dict[str, Any]:
    a, q = p.aimet, p.qnn
    rec: dict[str, Any] = {
        "AIMET name": a.name,
        "QNN name": q.name,
        "matched by": p.matched_by,
        "mismatches": ", ".join(f for f in FIELDS if f in p.diffs),
    }
    q_sym = symmetric_offset(q) if q.values_known and not q.is_float else None
    q_ch = q.channels if q.values_known or "channels" in q.source else None
    sides = {
        "dtype": (a.dtype, q.dtype),
        "bitwidth": (a.bitwidth, q.bitwidth),
        "symmetry": (a.is_symmetric, q_sym),
        "channels": (a.channels, q_ch),
    }
    for f in VALUE_FIELDS:
        sides[f] = (
            None if a.is_float else _summary_value(getattr(a, f)),
            None if q.is_float else _summary_value(getattr(q, f), q.values_known),
        )
    for f in FIELDS:
        ca, cq = _cols(f)
        rec[ca], rec[cq] = sides[f]
    rec["QNN data type"] = q.source.get("data_type")
    rec["note"] = p.note
    return rec


def pair_sheet(title: str, pairs: list[PairResult]) -> Sheet:
    records = [_pair_record(p) for p in pairs]
    columns = ["AIMET name", "QNN name", "matched by", "mismatches"]
    for f in FIELDS:
        columns.extend(_cols(f))
    columns += ["QNN data type", "note"]
    red = {(i, c) for i, p in enumerate(pairs) for f in p.diffs for c in _cols(f)}
    return Sheet(title, pd.DataFrame(records, columns=columns), red=red, notes=NOTES, freeze="C2")


def per_channel_sheet(pairs: list[PairResult]) -> Sheet | None:
    rows, red = [], set()
    for p in pairs:
        a, q = p.aimet, p.qnn
        if a.is_float or not q.values_known or a.channels <= 1 or a.channels != q.channels:
            continue
        if not any(f in p.diffs for f in VALUE_FIELDS):
            continue
        for ch in range(a.channels):
            rec = {"kind": p.kind, "AIMET name": a.name, "QNN name": q.name, "channel": ch}
            for f in VALUE_FIELDS:
                ca, cq = _cols(f)
                rec[ca], rec[cq] = getattr(a, f)[ch], getattr(q, f)[ch]
                if ch in p.diffs.get(f, ()):
                    red.update({(len(rows), ca), (len(rows), cq)})
            rows.append(rec)
    if not rows:
        return None
    return Sheet("per_channel", pd.DataFrame(rows), red=red, notes=NOTES, freeze="E2")


def write_encodings_workbook(
    path: Path,
    pairs: list[PairResult],
    only_qnn: pd.DataFrame,
    only_aimet: pd.DataFrame,
    summary: pd.DataFrame,
    info: list[tuple[str, Any]],
    params: bool = True,
    activations: bool = True,
) -> Path:
    sheets = [Sheet("summary", summary, footer=[("", ""), *info])]
    if params:
        sheets.append(pair_sheet("params", [p for p in pairs if p.kind == PARAM]))
    if activations:
        sheets.append(pair_sheet("activations", [p for p in pairs if p.kind == ACTIVATION]))
    pc = per_channel_sheet(pairs)
    if pc is not None:
        sheets.append(pc)
    one_sided = (
        pd.concat([only_qnn, only_aimet], ignore_index=True)
        if len(only_qnn) or len(only_aimet)
        else (
            pd.DataFrame(
                columns=[
                    "side",
                    "kind",
                    "name",
                    "dtype",
                    "bitwidth",
                    "channels",
                    "scale",
                    "offset",
                    "nearest names on the other side",
                ]
            )
        )
    )
    for col in ("scale", "offset"):
        if col in one_sided:
            one_sided[col] = one_sided[col].map(
                lambda v: (
                    _summary_value(tuple(v)) if isinstance(v, list) else ("n/a" if v is None else v)
                )
            )
    sheets.append(Sheet("one_sided", one_sided, freeze="D2"))
    return write_workbook(path, sheets)
