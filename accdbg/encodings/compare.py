"""``--compare_encodings``: every disagreement between QNN's encodings and AIMET's.

1. extract the encodings of a QNN graph JSON (:mod:`accdbg.encodings.qnn_json`) into
   ``extracted_encodings.json`` (AIMET legacy form, QNN names);
2. read the AIMET file (:mod:`accdbg.encodings.aimet`);
3. pair the names (:mod:`accdbg.encodings.matching`) and compare each pair;
4. write ``encodings_diff.xlsx`` and warn about entries found on one side only.

How values are compared: integers (bitwidth, offset) as numbers, scale/min/max as float32 -
the precision QNN stores scales in, so a double-precision AIMET value is compared with what
QNN could hold - then all rounded to ``precision`` decimal places. QNN stores no symmetry
flag: its tensor counts as symmetric when ``offset == -2**(bw-1)``, and only an AIMET
symmetric encoding that QNN does not hold symmetric is a mismatch.
"""

from __future__ import annotations

import difflib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from accdbg.core.run_dir import RunDir, options_dict, write_json_atomic
from accdbg.encodings.aimet import AimetEncodings, aimet_dict, load_aimet
from accdbg.encodings.matching import RULES, loose, match_names
from accdbg.encodings.model import ACTIVATION, PARAM, Encoding
from accdbg.encodings.pairs import FIELDS, VALUE_FIELDS, PairResult, compare_pair, symmetric_offset
from accdbg.encodings.qnn_json import QnnGraph, load_qnn_graph, qnn_encodings
from accdbg.encodings.report import write_encodings_workbook
from accdbg.errors import AccdbgError
from accdbg.mapping.tensor_mapping import MAPPING_FILE, load_tensor_mapping

log = logging.getLogger("accdbg.compare_encodings")

COMPONENT = "compare_encodings"
DEFAULT_PRECISION = 17
WORKBOOK = "encodings_diff.xlsx"
EXTRACTED = "extracted_encodings.json"


@dataclass
class CompareResult:
    run_dir: Path
    table: pd.DataFrame
    only_qnn: pd.DataFrame
    only_aimet: pd.DataFrame
    summary: pd.DataFrame
    pairs: list[PairResult]
    node_report: str | None
    seconds: float


def _value(values: tuple, known: bool = True) -> Any:
    if not known:
        return None
    if len(values) == 1:
        return values[0]
    return list(values)


def pair_row(p: PairResult) -> dict[str, Any]:
    a, q = p.aimet, p.qnn
    row: dict[str, Any] = {
        "kind": p.kind,
        "aimet_name": a.name,
        "qnn_name": q.name,
        "matched_by": p.matched_by,
        "mismatches": ", ".join(f for f in FIELDS if f in p.diffs),
        "channels_aimet": a.channels,
        "channels_qnn": q.channels if q.values_known or "channels" in q.source else None,
        "dtype_aimet": a.dtype,
        "dtype_qnn": q.dtype,
        "bitwidth_aimet": a.bitwidth,
        "bitwidth_qnn": q.bitwidth,
        "is_symmetric_aimet": a.is_symmetric,
        "is_symmetric_qnn": symmetric_offset(q) if q.values_known and not q.is_float else None,
    }
    for name in VALUE_FIELDS:
        row[f"{name}_aimet"] = None if a.is_float else _value(getattr(a, name))
        row[f"{name}_qnn"] = None if q.is_float else _value(getattr(q, name), q.values_known)
    row["qnn_data_type"] = q.source.get("data_type")
    row["note"] = p.note
    return row


def one_sided_row(e: Encoding, side: str, near: list[str]) -> dict[str, Any]:
    return {
        "side": side,
        "kind": e.kind,
        "name": e.name,
        "dtype": e.dtype,
        "bitwidth": e.bitwidth,
        "channels": e.channels,
        "scale": None if e.is_float else _value(e.scale, e.values_known),
        "offset": None if e.is_float else _value(e.offset, e.values_known),
        "nearest names on the other side": ", ".join(near),
    }


def _near(name: str, others: list[str], index: dict[str, list[str]]) -> list[str]:
    hits = index.get(loose(name), [])
    return hits[:3] or difflib.get_close_matches(name, others, n=3, cutoff=0.6)


def summary_frame(
    pairs: list[PairResult], only_q: list[Encoding], only_a: list[Encoding]
) -> pd.DataFrame:
    rows = []

    def count(label: str, pred_pair=None, pred_enc=None, encs=()) -> None:
        c = Counter()
        if pred_pair is not None:
            c.update(p.kind for p in pairs if pred_pair(p))
        if pred_enc is not None:
            c.update(e.kind for e in encs if pred_enc(e))
        rows.append(
            {
                "check": label,
                "params": c[PARAM],
                "activations": c[ACTIVATION],
                "total": c[PARAM] + c[ACTIVATION],
            }
        )

    count("tensors compared", lambda p: True)
    count("tensors with a mismatch", lambda p: bool(p.diffs))
    for f in FIELDS:
        count(f"{f} mismatch", lambda p, f=f: f in p.diffs)
    count("QNN values not in the JSON (not compared)", lambda p: not p.qnn.values_known)
    count("only in QNN", pred_enc=lambda e: True, encs=only_q)
    count("only in AIMET", pred_enc=lambda e: True, encs=only_a)
    for rule in RULES:
        count(f"matched by {rule}", lambda p, rule=rule: p.matched_by == rule)
    return pd.DataFrame(rows)


def _load_mapping(qnn_path: Path) -> dict[str, str] | None:
    folder = qnn_path if qnn_path.is_dir() else qnn_path.parent
    path = folder / MAPPING_FILE
    if not path.is_file():
        return None
    try:
        data = load_tensor_mapping(path, "tensor_mapping.json")
    except AccdbgError as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    log.info("using tensor name mapping %s (%d names)", path, len(data))
    return {str(k): str(v) for k, v in data.items() if isinstance(v, str)}


def describe_node(
    pairs: list[PairResult], only_q: list[Encoding], only_a: list[Encoding], name: str
) -> str:
    """A console report of one tensor's encodings on both sides and their differences."""
    keys = {name, loose(name)}
    hits = [p for p in pairs if p.aimet.name == name or p.qnn.name == name]
    if not hits:
        hits = [p for p in pairs if loose(p.aimet.name) in keys or loose(p.qnn.name) in keys]
    lines: list[str] = []
    for p in hits:
        lines.append(
            f"Encodings of {name!r}: {p.kind}, AIMET {p.aimet.name!r} <-> QNN {p.qnn.name!r} "
            f"(matched by {p.matched_by})"
        )
        lines.extend(_side_by_side(p))
        lines.append(
            "  differences: "
            + (
                ", ".join(
                    f
                    + (
                        f" (channels {_channels(p.diffs[f])})"
                        if p.diffs[f] and p.aimet.channels > 1
                        else ""
                    )
                    for f in FIELDS
                    if f in p.diffs
                )
                or "none"
            )
        )
        if p.note:
            lines.append(f"  note: {p.note}")
    for e, side, other in [(e, "QNN", "AIMET") for e in only_q] + [
        (e, "AIMET", "QNN") for e in only_a
    ]:
        if e.name == name or loose(e.name) in keys:
            lines.append(
                f"Encodings of {name!r}: {e.kind}, only in {side} ({e.name!r}); {other} has no entry"
            )
            lines.extend(f"  {k:<10} {v}" for k, v in _fields(e).items())
    return "\n".join(lines)


def _channels(idx: tuple[int, ...]) -> str:
    return ", ".join(map(str, idx[:12])) + (f" ... ({len(idx)} in all)" if len(idx) > 12 else "")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _fields(e: Encoding) -> dict[str, str]:
    out = {
        "dtype": e.dtype,
        "bitwidth": str(e.bitwidth),
        "symmetry": str(e.is_symmetric),
        "channels": str(e.channels),
    }
    if not e.is_float:
        for f in VALUE_FIELDS:
            vals = getattr(e, f)
            if not e.values_known:
                out[f] = "(not in the QNN JSON)"
            elif len(vals) == 1:
                out[f] = _fmt(vals[0])
            else:
                out[f] = (
                    "["
                    + ", ".join(_fmt(v) for v in vals[:6])
                    + (", ...]" if len(vals) > 6 else "]")
                )
    return out


def _side_by_side(p: PairResult) -> list[str]:
    a, q = _fields(p.aimet), _fields(p.qnn)
    q["symmetry"] = (
        (str(symmetric_offset(p.qnn)) + " (from offset)")
        if p.qnn.values_known and not p.qnn.is_float
        else "n/a"
    )
    width = max(24, *(len(v) for v in a.values()))
    out = [f"  {'field':<10} {'AIMET':<{width}} QNN"]
    for f in a:
        mark = "   <-- differs" if f in p.diffs else ""
        out.append(f"  {f:<10} {a[f]:<{width}} {q.get(f, '')}{mark}")
    return out


def pair_up(
    graph: QnnGraph,
    qnn_all: dict[str, Encoding],
    a_all: dict[str, Encoding],
    mapping: dict[str, str] | None,
    precision: int,
) -> tuple[list[PairResult], list[Encoding], list[Encoding]]:
    """Pair and compare; returns ``(pairs, only in QNN, only in AIMET)``.

    Quantized QNN tensors are paired first; float ones only meet the AIMET names left over
    (where they show a dtype disagreement), and are never listed as one-sided.
    """
    quant = {n: e for n, e in qnn_all.items() if not e.is_float}
    found, only_a, only_q = match_names(a_all, quant, graph, mapping)
    floats = [n for n, e in qnn_all.items() if e.is_float]
    if only_a and floats:
        more, only_a, _ = match_names(only_a, floats, graph, mapping)
        found += more
    pairs = [
        compare_pair(a_all[p.aimet_name], qnn_all[p.qnn_name], p.matched_by, precision)
        for p in found
    ]
    return pairs, [qnn_all[n] for n in only_q], [a_all[n] for n in only_a]


def one_sided_frames(
    only_q: list[Encoding], only_a: list[Encoding]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The one-sided entries, each with the nearest one-sided names of the other side."""
    q_names, a_names = [e.name for e in only_q], [e.name for e in only_a]
    q_idx: dict[str, list[str]] = {}
    a_idx: dict[str, list[str]] = {}
    for n in q_names:
        q_idx.setdefault(loose(n), []).append(n)
    for n in a_names:
        a_idx.setdefault(loose(n), []).append(n)
    only_qnn = pd.DataFrame(
        [one_sided_row(e, "only in QNN", _near(e.name, a_names, a_idx)) for e in only_q]
    )
    only_aimet = pd.DataFrame(
        [one_sided_row(e, "only in AIMET", _near(e.name, q_names, q_idx)) for e in only_a]
    )
    return only_qnn, only_aimet


def compare_encodings(
    qnn_json: str | os.PathLike,
    aimet_json: str | os.PathLike,
    precision: int = DEFAULT_PRECISION,
    params_only: bool = False,
    activations_only: bool = False,
    specific_node: str | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    options_record: dict | None = None,
) -> CompareResult:
    """Compare QNN's encodings with AIMET's; writes the run folder and returns the tables."""
    start = time.perf_counter()
    if params_only and activations_only:
        raise AccdbgError(
            "--params_only and --activations_only exclude each other; give at most one"
        )
    if not isinstance(precision, int) or isinstance(precision, bool) or not 0 <= precision <= 30:
        raise AccdbgError(
            f"--precision {precision!r} must be an integer number of decimal places, 0..30"
        )
    graph = load_qnn_graph(qnn_json)
    qnn_all = qnn_encodings(graph, include_float=True)
    qnn_quant = {n: e for n, e in qnn_all.items() if not e.is_float}
    if not qnn_quant:
        raise AccdbgError(
            f"--input {str(qnn_json)!r} has no quantized tensors (every tensor is float or has no encoding); "
            "is it the graph of a quantized model?"
        )
    aimet: AimetEncodings = load_aimet(aimet_json)
    pairs, only_q, only_a = pair_up(
        graph, qnn_all, aimet.all(), _load_mapping(Path(qnn_json)), precision
    )
    if params_only or activations_only:
        keep = PARAM if params_only else ACTIVATION
        pairs = [p for p in pairs if p.kind == keep]
        only_q = [e for e in only_q if e.kind == keep]
        only_a = [e for e in only_a if e.kind == keep]
    node_report = None
    if specific_node is not None:
        node_report = describe_node(pairs, only_q, only_a, specific_node)
        if not node_report:
            names = (
                [p.aimet.name for p in pairs]
                + [p.qnn.name for p in pairs]
                + [e.name for e in only_q + only_a]
            )
            near = difflib.get_close_matches(specific_node, names, n=5, cutoff=0.5)
            raise AccdbgError(
                f"--specific_node {specific_node!r} is neither an AIMET nor a QNN tensor with an encoding"
                + (f"; near matches: {', '.join(near)}" if near else "")
            )

    table = pd.DataFrame([pair_row(p) for p in pairs])
    only_qnn, only_aimet = one_sided_frames(only_q, only_a)
    summary = summary_frame(pairs, only_q, only_a)

    with RunDir(working_dir, COMPONENT, output_dirname) as run:
        run.write_options(
            options_record
            or options_dict(
                input=qnn_json,
                aimet_encodings_json=aimet_json,
                precision=precision,
                params_only=params_only,
                activations_only=activations_only,
                specific_node=specific_node,
                working_dir=working_dir,
                output_dirname=output_dirname,
            )
        )
        log.info(
            "QNN graph %s: %d quantized tensors; AIMET %s (%s form): %d params, %d activations",
            graph.path,
            len(qnn_quant),
            aimet.path,
            aimet.form,
            len(aimet.params),
            len(aimet.activations),
        )
        _write_extracted(run.path / EXTRACTED, qnn_quant)
        by_rule = Counter(p.matched_by for p in pairs)
        log.info(
            "paired %d tensors (%s)",
            len(pairs),
            ", ".join(f"{k}: {v}" for k, v in by_rule.most_common()),
        )
        _warn_one_sided(only_q, "in QNN but not in AIMET")
        _warn_one_sided(only_a, "in AIMET but not in QNN")
        unknown = [p for p in pairs if not p.qnn.values_known]
        if unknown:
            log.warning(
                "%d QNN tensors hold encodings whose values the JSON does not contain (%s); only their "
                "bitwidth and channel count are compared",
                len(unknown),
                unknown[0].note,
            )
        bad = [p for p in pairs if p.diffs]
        for p in bad:
            log.debug("mismatch %s <-> %s: %s", p.aimet.name, p.qnn.name, ", ".join(p.diffs))
        counts = Counter(f for p in bad for f in p.diffs)
        log.info(
            "%d of %d paired tensors disagree%s (precision %d decimal places)",
            len(bad),
            len(pairs),
            (": " + ", ".join(f"{f} {counts[f]}" for f in FIELDS if counts[f])) if counts else "",
            precision,
        )
        if node_report:
            log.debug("--specific_node report:\n%s", node_report)
        write_encodings_workbook(
            run.path / WORKBOOK,
            pairs,
            only_qnn,
            only_aimet,
            summary,
            info=[
                ("QNN graph JSON", str(graph.path)),
                ("AIMET encodings", f"{aimet.path} ({aimet.form})"),
                ("precision (decimal places)", precision),
                (
                    "compared",
                    "params only"
                    if params_only
                    else "activations only"
                    if activations_only
                    else "params and activations",
                ),
            ],
            params=not activations_only,
            activations=not params_only,
        )
        log.info("wrote %s", run.final_path / WORKBOOK)
    return CompareResult(
        run.path,
        table,
        only_qnn,
        only_aimet,
        summary,
        pairs,
        node_report,
        time.perf_counter() - start,
    )


def _warn_one_sided(encs: list[Encoding], where: str) -> None:
    if not encs:
        return
    names = [e.name for e in encs]
    log.warning(
        "%d encodings are %s: %s%s (all in the 'one_sided' sheet)",
        len(encs),
        where,
        ", ".join(names[:8]),
        " ..." if len(names) > 8 else "",
    )
    log.debug("all encodings %s: %s", where, ", ".join(names))


def _write_extracted(path: Path, encs: dict[str, Encoding]) -> None:
    known = [e for e in encs.values() if e.values_known]
    missing = [e.name for e in encs.values() if not e.values_known]
    doc = aimet_dict(known, "0.6.1")
    write_json_atomic(path, doc)
    log.info("extracted %d QNN encodings to %s", len(known), path.name)
    if missing:
        log.warning(
            "%d quantized QNN tensors left out of %s, their values are not in the JSON: %s%s",
            len(missing),
            path.name,
            ", ".join(missing[:5]),
            " ..." if len(missing) > 5 else "",
        )


__all__ = ["CompareResult", "PairResult", "compare_encodings", "compare_pair", "describe_node"]
