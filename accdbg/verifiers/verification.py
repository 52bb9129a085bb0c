"""Verification: golden tensors against target tensors, layer by layer, into a summary.

For each input (``Result_N``) the golden and target folders are paired by name (tensor
mapping or exact names), each pair is read from disk memory-mapped, laid out alike
(:mod:`accdbg.mapping.layout`), cast to float64 once, and handed to every verifier before the
next pair is read: memory stays at about one pair whatever the model's size. Rows come out
in execution order (graph structure, else the golden manifest's topological index).

This module is the component: the plan, one input's rows, the detail files, the run. Its
parts live beside it: which folders are compared (:mod:`.pairing`), how a pair is laid out
alike (:mod:`.alignment`), the verifiers of a run (:mod:`.configured`), a row's columns and
scoring step (:mod:`.scoring`), and the table over several inputs (:mod:`.aggregate`).
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.core.progress import progress
from accdbg.core.provenance import recorded_inputs
from accdbg.core.run_dir import RunDir, options_dict
from accdbg.core.tensor_store import TensorFolder, safe_relpath
from accdbg.errors import AccdbgError
from accdbg.mapping.graph_struct import execution_order, load_graph_struct
from accdbg.mapping.layout import reconcile
from accdbg.mapping.qnn_json import QnnGraph
from accdbg.mapping.tensor_mapping import (
    MAPPING_FILE,
    Pairing,
    build_tensor_mapping,
    load_tensor_mapping,
    pair_tensors,
    write_tensor_mapping,
)
from accdbg.reports.summary import (
    inputs_html,
    write_record_csv,
    write_record_html,
    write_summary,
)
from accdbg.verifiers import status as row_status
from accdbg.verifiers.aggregate import aggregate_inputs, final_outputs, inputs_table, worst_input
from accdbg.verifiers.alignment import fmt_shape, golden_view, scale_for, shapeless, target_view
from accdbg.verifiers.base import TensorPair, Verifier, VerifierResult, finite_range
from accdbg.verifiers.configured import ConfiguredVerifier, check_verifiers, configured_verifiers
from accdbg.verifiers.pairing import find_results, match_inputs, pair_inputs, side_file
from accdbg.verifiers.scoring import channel_columns, score_pair, summary_columns

# the component's own names, and those other code imports from here (their homes: above)
__all__ = [
    "Annotator",
    "ConfiguredVerifier",
    "Plan",
    "SummaryAnnotation",
    "SummaryPage",
    "VerificationResult",
    "channel_columns",
    "check_verifiers",
    "configured_verifiers",
    "find_results",
    "plan_pairs",
    "run_verification",
    "score_pair",
    "verify_input",
    "worst_input",
]

log = logging.getLogger("accdbg.verification")

COMPONENT = "verification"
SUMMARY_FORMAT = "accdbg-verification/1"


@dataclass
class VerificationResult:
    """Where the run went, and its summary tables.

    ``summary`` is the top-level ``summary.csv``: the only input's summary, or with several
    inputs the aggregate (each verifier column holds the worst value across inputs, with
    ``<verifier>_median``, ``_mean`` and ``_worst_input`` beside it). ``per_input`` maps
    ``Result_N`` to that input's summary; ``inputs`` is one row per input (its files and its
    final outputs' scores); ``folders`` the (golden, target) folders compared per input.
    """

    run_dir: Path
    summary: pd.DataFrame
    per_input: dict[str, pd.DataFrame]
    aggregate: pd.DataFrame | None
    verifiers: list[dict[str, Any]]
    seconds: float
    inputs: pd.DataFrame | None = None
    folders: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    overlay_seconds: float | None = None  # the Model Explorer overlays' part of ``seconds``


@dataclass
class SummaryAnnotation:
    """What a caller adds to a verification run's top-level summary, applied before the
    summary files are written and the run is renamed finished (oneshot: attribution marks,
    culprit ranking, findings, its own report page).

    ``summary`` replaces the table (same rows, more columns); ``json`` holds more keys for
    ``summary.json``; ``page``, when given, writes ``summary.html`` (its path in, the path
    written out) in place of verification's table page.
    """

    summary: pd.DataFrame
    json: dict[str, Any] = field(default_factory=dict)
    page: Callable[[Path], Path] | None = None


#: Called with the run as verified so far (``run_dir`` is the folder being written, not yet
#: renamed); what it returns goes into the top-level summary files, written once.
Annotator = Callable[[VerificationResult], SummaryAnnotation]


@dataclass
class SummaryPage:
    """One summary table and what is written with it (:func:`write_summary`)."""

    df: pd.DataFrame
    title: str
    meta: dict[str, Any]
    passed: dict[str, list[bool | None]]
    notes: list[str]
    before: str = ""

    def write(self, folder: Path, annotation: SummaryAnnotation | None = None) -> None:
        """``summary.csv/json/html`` in ``folder``, with the annotation's columns and keys."""
        if annotation is None:
            write_summary(
                self.df, folder, self.title, self.meta, self.passed, self.notes, before=self.before
            )
            return
        write_summary(
            annotation.summary,
            folder,
            self.title,
            self.meta,
            self.passed,
            self.notes,
            before=self.before,
            extra=annotation.json,
            page=annotation.page,
        )


@dataclass
class Plan:
    """Everything decided before the first tensor is read."""

    verifiers: list[ConfiguredVerifier]
    mapping: dict[str, str | None] | None
    order: dict[str, tuple[int, str]]
    qnn: QnnGraph | None
    sources: dict[str, str] = field(default_factory=dict)
    # each weighted layer's weight bitwidth (its output's name -> bits), from the engine
    # run's QDQ model; empty when the run has none (a float or compiled run)
    weight_bits: dict[str, int] = field(default_factory=dict)
    # each quantized graph input (its QuantizeLinear, run on the CPU: exactly what QNN is fed)
    # and its dims, from the engine run's QDQ model; a row each against the input file
    fed: dict[str, tuple[Any, tuple[int, ...]]] = field(default_factory=dict)


WEIGHT_BITWIDTH = "weight_bitwidth"


def _engine_qdq(engine_run: Path | None):
    """The engine run's QDQ model (its ``*.qdq.onnx``, else its ``-m`` when that is a QDQ
    model: ``--stage converted``), read once for the weight bitwidths and the graph inputs'
    rows; None when it has none or it cannot be read (said: no such columns, no such rows)."""
    import onnx

    from accdbg.reports.model_explorer.engine import engine_model

    given, qdq = engine_model(engine_run)
    for path in (qdq, given):
        if path is None or path.suffix != ".onnx":
            continue
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # a model the report cannot read
            log.warning("weight bitwidths and graph input rows: %s not read: %s", path.name, exc)
            return None
        if any(n.op_type == "DequantizeLinear" for n in model.graph.node):
            return model
    return None


def _weight_bits(qdq) -> dict[str, int]:
    """Each weighted layer's weight bitwidth in the run's QDQ model."""
    from accdbg.encodings.qdq import weight_bitwidths

    return weight_bitwidths(qdq) if qdq is not None else {}


def _fed_inputs(qdq) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """The run's quantized graph inputs: name -> (its quantizer, its dims)."""
    from accdbg.encodings.qdq import input_quantizers

    if qdq is None:
        return {}
    dims = {
        i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in qdq.graph.input
    }
    found = input_quantizers(qdq)
    return {n: (q, dims[n]) for n, q in found.items() if dims.get(n) and all(dims[n])}


def with_weight_bitwidth(df: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """``df`` with a ``weight_bitwidth`` column (blank for a layer without a quantized
    weight) when the run's model has quantized weights."""
    if not plan.weight_bits or "Name" not in df.columns:
        return df
    values = [plan.weight_bits.get(n) for n in df["Name"]]
    df[WEIGHT_BITWIDTH] = pd.array(values, dtype="Int64")
    return df


# ---------------------------------------------------------------- one tensor pair


class _Writer:
    """Per-verifier folders with one CSV and one HTML file per tensor (names sanitized).

    Files are written by one background thread, so the disk works while numpy computes
    the next pair; :meth:`close` waits for them and re-raises any error.
    """

    def __init__(self, root: Path, labels: list[str]):
        self.root = root
        self.dirs = {label: root / safe_relpath(label) for label in labels}
        self.used: dict[str, set[str]] = {label: set() for label in labels}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accdbg-writer")
        self._pending: list[Future] = []

    def write(self, label: str, name: str, record: dict[str, Any]) -> None:
        base = rel = safe_relpath(name)
        n = 0
        while rel.lower() in self.used[label]:
            n += 1
            rel = f"{base}__{n}"
        self.used[label].add(rel.lower())
        self._pending.append(
            self._pool.submit(self._write, self.dirs[label] / rel, label, name, record)
        )
        if len(self._pending) > 256:  # keep the queue (and its records) short
            self._pending = [f for f in self._pending if not f.done() or f.result()]

    @staticmethod
    def _write(path: Path, label: str, name: str, record: dict[str, Any]) -> None:
        # a / in a tensor name makes sub-folders, as the reference does
        if "/" in name or "\\" in name:
            path.parent.mkdir(parents=True, exist_ok=True)
        write_record_csv(record, path.with_name(path.name + ".csv"))
        write_record_html(record, path.with_name(path.name + ".html"), f"{label}: {name}")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for f in self._pending:
            f.result()


def _verify_pair(
    golden: TensorFolder,
    target: TensorFolder,
    g_name: str | None,
    t_name: str | None,
    verifiers: list[ConfiguredVerifier],
    plan: Plan,
) -> tuple[dict[str, Any], dict[str, VerifierResult]]:
    """One summary row and each verifier's result; reads the pair once, keeps nothing.

    The row's Status holds only its notes here (why a comparison is incomplete or
    abnormal); :func:`_verify_rows` adds the verdict once every verifier has run.
    """
    g_rec = golden.records.get(g_name) if g_name else None
    t_rec = target.records.get(t_name) if t_name else None
    qnn = (
        plan.qnn.find((t_rec.extra or {}).get("qnn_name") if t_rec else None, t_name, g_name)
        if plan.qnn
        else None
    )
    row: dict[str, Any] = {
        "Name": t_name or g_name,
        "LayerType": None,
        "Size": None,
        "Tensor_dims": None,
        "golden_min": math.nan,
        "golden_max": math.nan,
        "target_min": math.nan,
        "target_max": math.nan,
        "Status": "",
        "Golden_name": g_name,
        "Layout": "",
    }
    for key in (t_name, g_name):
        if key in plan.order:
            row["LayerType"] = plan.order[key][1]
            break
    else:
        row["LayerType"] = (g_rec.op_type if g_rec else None) or (t_rec.op_type if t_rec else None)
    if g_rec is None and t_rec is None and t_name in plan.fed:
        return _fed_row(row, target, t_name, plan.fed[t_name], verifiers)
    if g_rec is None or t_rec is None:
        rec = t_rec or g_rec
        row["Size"], row["Tensor_dims"] = rec.size, list(rec.shape)
        row["Status"] = "missing in target" if t_rec is None else "missing in golden"
        return row, {}
    t_shape, t_layout, encoding = target_view(t_rec, qnn)
    g_shape, g_layout = golden_view(g_rec, qnn)
    row["Size"], row["Tensor_dims"] = int(np.prod(t_shape)) if t_shape else 1, fmt_shape(t_shape)
    alignment = shapeless(golden, target, g_shape, t_shape, t_rec.size) or reconcile(
        g_shape, t_shape, g_layout, t_layout
    )
    row["Layout"] = alignment.note if alignment.ok else ""
    try:
        g_arr = np.asarray(golden.load(g_name), dtype=np.float64).reshape(g_shape)
        t_raw = target.load(t_name).reshape(t_shape)
    except AccdbgError as exc:
        row["Status"] = f"unreadable: {exc}"
        return row, {}
    row["golden_min"], row["golden_max"] = finite_range(g_arr)
    if not alignment.ok:
        t_arr = np.asarray(t_raw, dtype=np.float64)
        row["target_min"], row["target_max"] = finite_range(t_arr)
        row["Status"] = alignment.note
        return row, {}
    t_arr = alignment.apply(t_raw).astype(np.float64)  # one copy: transpose and cast together
    results = score_pair(
        row, g_arr, t_arr, scale_for(encoding, t_shape, alignment), g_layout, verifiers
    )
    return row, results


def _input_file(target: TensorFolder, name: str) -> Path | None:
    """The file the target's run fed to graph input ``name`` (its manifest records it)."""
    rec = (recorded_inputs(target.meta) or {}).get(name)
    path = Path(rec["path"]) if rec and rec.get("path") else None
    return path if path is not None and path.is_file() else None


GRAPH_INPUT = "graph input"  # a graph input's row's LayerType


def _fed_row(row, target: TensorFolder, name: str, fed, verifiers):
    """A graph input's row: the input file (the golden) against what the backend is fed (its
    QuantizeLinear's grid, computed exactly); its Status says how much its encoding clips."""
    quantizer, dims = fed
    path = _input_file(target, name)
    n = int(np.prod(dims))
    row["LayerType"], row["Golden_name"] = GRAPH_INPUT, name
    row["Size"], row["Tensor_dims"] = n, fmt_shape(dims)
    dtype = {4 * n: np.float32, 2 * n: np.float16}.get(path.stat().st_size)
    if dtype is None:
        row["Status"] = f"input file {path.name} does not hold {n} float values"
        return row, {}
    g_arr = np.fromfile(path, dtype=dtype).astype(np.float64).reshape(dims)
    t_arr = quantizer.fake_quant(g_arr)
    row["golden_min"], row["golden_max"] = finite_range(g_arr)
    results = score_pair(row, g_arr, t_arr, quantizer.scale, None, verifiers)
    clipped = quantizer.clipped(g_arr)
    if clipped > 0:
        note = f"its encoding clips {clipped:.1%} of the input"
        row["Status"] = f"{row['Status']}; {note}" if row["Status"] else note
    return row, results


def _detail_record(row: dict[str, Any], result: VerifierResult) -> dict[str, Any]:
    return {
        "Name": row["Name"],
        "Golden_name": row["Golden_name"],
        "LayerType": row["LayerType"],
        "Tensor_dims": row["Tensor_dims"],
        "Layout": row["Layout"],
        "status": result.status,
        **({"value": result.value} if not result.details else {}),
        **result.details,
    }


# ---------------------------------------------------------------- one input


def _near(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f"; near matches: {', '.join(near)}" if near else ""


def _order_key(plan: Plan, golden: TensorFolder, target: TensorFolder):
    big = 10**9

    def key(pair: tuple[str | None, str | None]) -> tuple:
        g, t = pair
        if g is None and t in plan.fed and t not in target.records:  # graph inputs first
            return (-1, 0, 0)
        for name in (t, g):
            if name in plan.order:
                return (0, plan.order[name][0], 0)
        g_idx = golden.records[g].index if g in golden.records else None
        t_idx = target.records[t].index if t in target.records else None
        if g_idx is not None:
            return (1, g_idx, 0)
        return (2, t_idx if t_idx is not None else big, 0)

    return key


def plan_pairs(
    golden: TensorFolder, target: TensorFolder, plan: Plan
) -> tuple[Pairing, list[tuple[str | None, str | None]], dict[str, tuple[str | None, str | None]]]:
    """The pairs to compare, in execution order; checked before anything is written."""
    mapping = plan.mapping
    pairing = pair_tensors(golden.names(), target.names(), mapping)
    # each quantized graph input as the backend is fed it: a row against the input file
    paired = {n for pair in pairing.pairs for n in pair if n}
    fed = [n for n in plan.fed if n not in paired and _input_file(target, n) is not None]
    pairs = list(pairing.pairs) + [(None, n) for n in fed]
    # tensors named by the verifier config must be rows even if only one side has them
    by_name: dict[str, tuple[str | None, str | None]] = {}
    for g, t in pairs:
        for n in (g, t):
            if n:
                by_name.setdefault(n, (g, t))
    for cv in plan.verifiers:
        for group in cv.tensors or []:
            for name in group:
                if name in by_name:
                    continue
                if name in golden.records:
                    by_name[name] = (name, None)
                elif name in target.records:
                    by_name[name] = (None, name)
                else:
                    raise AccdbgError(
                        f"--verifier_config: {cv.verifier.name} tensor {name!r} is in neither the golden "
                        f"nor the target tensors{_near(name, golden.names() + target.names())}"
                    )
                pairs.append(by_name[name])
    pairs.sort(key=_order_key(plan, golden, target))
    if not pairs:
        raise AccdbgError(
            f"no tensor of {str(target.root)!r} matches one of {str(golden.root)!r} by name"
            + (
                " or by the tensor mapping"
                if mapping
                else "; pass --tensor_mapping or -m to map names"
            )
        )
    return pairing, pairs, by_name


def verify_input(
    golden: TensorFolder,
    target: TensorFolder,
    plan: Plan,
    out_dir: Path,
    title: str,
) -> tuple[pd.DataFrame, dict[str, list[bool | None]], SummaryPage]:
    """Compare one target folder with its golden folder; write its per-tensor details and
    return its summary page (written by the caller: the top-level one may be annotated)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pairing, pairs, by_name = plan_pairs(golden, target, plan)
    log.info(
        "%s: %d tensor pairs (%d golden-only, %d target-only tensors not compared)",
        title,
        len(pairs),
        len(pairing.golden_only),
        len(pairing.target_only),
    )
    everywhere = [cv for cv in plan.verifiers if cv.tensors is None]
    single = {}  # tensor name -> config verifiers on it
    multi: list[tuple[ConfiguredVerifier, list[str]]] = []
    for cv in plan.verifiers:
        for group in cv.tensors or []:
            if cv.verifier.tensors_per_side == 1:
                single.setdefault(group[0], []).append(cv)
            else:
                multi.append((cv, group))
    writer = _Writer(out_dir, [cv.label for cv in plan.verifiers])
    try:
        rows, passed = _verify_rows(
            golden, target, plan, pairs, by_name, writer, everywhere, single, multi
        )
    finally:
        writer.close()
    df = with_weight_bitwidth(pd.DataFrame(rows, columns=summary_columns(plan.verifiers)), plan)
    meta = {
        "format": SUMMARY_FORMAT,
        "golden": str(golden.root),
        "target": str(target.root),
        "golden_inputs": recorded_inputs(golden.meta),
        "target_inputs": recorded_inputs(target.meta),
        "verifiers": [
            {**cv.verifier.describe(), "label": cv.label, "tensors": cv.tensors}
            for cv in plan.verifiers
        ],
        "sources": plan.sources,
        "not_compared": {"golden_only": pairing.golden_only, "target_only": pairing.target_only},
    }
    notes = _notes(plan, df, passed)
    if pairing.target_only and golden.meta.get("component") == "framework_diagnosis":
        # a full float dump that lacks a tensor the target computes: listed, never dropped
        # silently (the pre-processing or the converter made it; summary.json lists them all)
        shown = ", ".join(pairing.target_only[:10])
        more = f" and {len(pairing.target_only) - 10} more" if len(pairing.target_only) > 10 else ""
        notes.insert(
            0,
            f"{len(pairing.target_only)} target tensor(s) have no framework counterpart and no "
            f"row (made by the pre-processing or the converter): {shown}{more}",
        )
    return df, passed, SummaryPage(df, title, meta, passed, notes)


def _verify_rows(golden, target, plan, pairs, by_name, writer, everywhere, single, multi):
    """Each pair in turn: read, verify, write its details, keep only the row."""
    labels = [cv.label for cv in plan.verifiers]
    rows: list[dict[str, Any]] = []
    passed: dict[str, list[bool | None]] = {label: [] for label in labels}
    row_of: dict[str, int] = {}
    # the run's line ("verification: N rows, M inputs in S s") ends the stage
    for g_name, t_name in progress(pairs, "verification", len(pairs), "tensors", line=False):
        extra = [cv for n in dict.fromkeys((g_name, t_name)) if n for cv in single.get(n, [])]
        row, results = _verify_pair(golden, target, g_name, t_name, everywhere + extra, plan)
        for label in labels:
            res = results.get(label)
            row[label] = res.value if res else math.nan
            passed[label].append(res.passed if res else None)
            if res is not None:
                writer.write(label, row["Name"], _detail_record(row, res))
        failed = [
            label for label in labels if results.get(label) and results[label].passed is False
        ]
        row["Failed"] = ", ".join(failed)
        row["Status"] = row_status.compose(failed, [row["Status"]])
        row["Order"] = len(rows)
        for n in (g_name, t_name):
            if n:
                row_of.setdefault(n, len(rows))
        rows.append(row)
    for cv, group in multi:
        _verify_group(golden, target, cv, group, by_name, rows, row_of, passed, writer)
    return rows, passed


def _verify_group(golden, target, cv, group, by_name, rows, row_of, passed, writer) -> None:
    """A multi-tensor verifier (MeanIOU): its value goes on the row of the group's first tensor."""
    pairs = [by_name[n] for n in group]
    row = rows[row_of[group[0]]]
    missing = [n for n, (g, t) in zip(group, pairs, strict=True) if g is None or t is None]
    if missing:
        res = VerifierResult(math.nan, None, f"{missing[0]!r} is missing on one side")
    else:
        try:
            g_arrays = [np.asarray(golden.load(g), dtype=np.float64) for g, _ in pairs]
            t_arrays = [np.asarray(target.load(t), dtype=np.float64) for _, t in pairs]
            res = cv.verifier.verify(TensorPair(g_arrays, t_arrays))
        except AccdbgError as exc:
            res = VerifierResult(math.nan, None, f"unreadable: {exc}")
    i = row_of[group[0]]
    row[cv.label] = res.value
    passed[cv.label][i] = res.passed
    failed = row_status.split_failed(row["Failed"]) + ([cv.label] if res.passed is False else [])
    notes = [row_status.note(row["Status"])] + (
        [f"{cv.label}: {res.status}"] if res.status != "ok" else []
    )
    row["Failed"] = ", ".join(failed)
    row["Status"] = row_status.compose(failed, notes)
    writer.write(
        cv.label,
        "+".join(group),
        {"tensors": " + ".join(group), "status": res.status, **res.details},
    )


def _notes(plan: Plan, df: pd.DataFrame, passed: dict[str, list[bool | None]]) -> list[str]:
    notes = []
    for cv in plan.verifiers:
        v = cv.verifier
        mark = (
            "no threshold"
            if v.pass_mark is None
            else f"pass if {'>=' if v.higher_is_better else '<='} {v.pass_mark:g}"
        )
        fails = [i for i, p in enumerate(passed[cv.label]) if p is False]
        first = f"; first failing: {df['Name'].iloc[fails[0]]}" if fails else ""
        notes.append(f"{cv.label} ({v.unit}, {mark}): {len(fails)} of {len(df)} rows fail{first}")
    problems = int((df["Status"].map(row_status.note) != "").sum())
    if problems:
        notes.append(
            f"{problems} rows could not be compared fully or hold abnormal values "
            "(see the note in the Status column)"
        )
    notes.append(
        "Rows are in execution order; read top to bottom: the first failing layer is the one to fix."
    )
    return notes


# ---------------------------------------------------------------- the component


def _overlays(
    run: RunDir,
    summary: pd.DataFrame,
    verifiers: Sequence[ConfiguredVerifier],
    model_path: str | os.PathLike | None,
    framework: str | None,
    engine_run: Path | None,
) -> None:
    """Model Explorer overlays of the summary on the ONNX model the engine started from."""
    from accdbg.reports import model_explorer as me

    model, qdq = me.engine_model(engine_run)
    if model_path is not None and str(model_path).endswith(".onnx") and framework in (None, "onnx"):
        model = Path(model_path)
    partitioning = engine_run / "partitioning.json" if engine_run is not None else None
    marks = {}
    if partitioning is not None and partitioning.is_file() and qdq is not None:
        try:
            marks["on CPU"] = me.cpu_marks(partitioning, qdq)
        except AccdbgError as exc:
            log.warning("model explorer: layers on CPU not marked: %s", exc)
    me.overlay_run(
        run.path,
        [run.path / "summary.html"],
        model,
        summary,
        "Name",
        {cv.label: cv.verifier for cv in verifiers},
        marks=marks,
        final_dir=run.final_path,
    )


def _side_files(
    target_run: Path | None,
    discover: bool,
    tensor_mapping,
    graph_struct,
    qnn_model_json_path,
    find_mapping: bool,
) -> tuple[Any, Any, Any, dict[str, str]]:
    """The mapping, graph structure and QNN graph JSON: as given, else (``discover``) the
    files the engine wrote beside its results; with where each came from, for the log."""
    sources: dict[str, str] = {}
    found_words = "(found beside the inference results)"
    if tensor_mapping is None and discover and find_mapping:
        found = side_file(target_run, MAPPING_FILE)
        if found:
            tensor_mapping, sources["tensor_mapping"] = found, f"{found} {found_words}"
    if graph_struct is None and discover:
        found = side_file(target_run, "*graph_struct.json")
        if found:
            graph_struct, sources["graph_struct"] = found, f"{found} {found_words}"
    if qnn_model_json_path is None and discover:
        found = side_file(target_run, "model_net.json") or side_file(target_run, "*_net.json")
        if found:
            qnn_model_json_path, sources["qnn_model_json_path"] = found, f"{found} {found_words}"
    for key, value in (
        ("tensor_mapping", tensor_mapping),
        ("graph_struct", graph_struct),
        ("qnn_model_json_path", qnn_model_json_path),
    ):
        if value is not None and key not in sources:
            sources[key] = str(value) if not isinstance(value, Mapping) else "(given as a dict)"
    return tensor_mapping, graph_struct, qnn_model_json_path, sources


def _mapping(
    tensor_mapping, model_path, framework, folders, sources
) -> dict[str, str | None] | None:
    """Golden name -> target name: given, loaded, or built from the model (said in ``sources``)."""
    if isinstance(tensor_mapping, Mapping):
        return dict(tensor_mapping)
    if tensor_mapping is not None:
        return load_tensor_mapping(tensor_mapping)
    if model_path is None:
        return None
    first_g, first_t = next(iter(folders.values()))
    mapping = build_tensor_mapping(
        model_path, first_g.names(), first_t.names(), framework or "onnx"
    )
    sources["tensor_mapping"] = f"built from {model_path}: {len(mapping)} pairs"
    return mapping


def _aggregate_page(aggregate, passed, per_input, folders, verifiers, plan, table) -> SummaryPage:
    """The top-level page of several inputs: the worst value per verifier over the inputs,
    with the table of inputs above it."""
    meta = {
        "format": SUMMARY_FORMAT,
        "aggregate_of": list(per_input),
        "inputs": {
            k: {"golden": recorded_inputs(g.meta), "target": recorded_inputs(t.meta)}
            for k, (g, t) in folders.items()
        },
        "verifiers": [
            {**cv.verifier.describe(), "label": cv.label, "tensors": cv.tensors} for cv in verifiers
        ],
        "sources": plan.sources,
    }
    notes = [
        f"Aggregate over {len(per_input)} inputs ({', '.join(per_input)}): each verifier "
        "column is the worst value over the inputs, <verifier>_median the median, "
        "<verifier>_worst_input the input it came from; each input's own summary is in "
        "its Result_N folder (linked in the table of inputs)."
    ]
    notes += _notes(plan, aggregate, passed)
    return SummaryPage(
        aggregate,
        "Verification (all inputs)",
        meta,
        passed,
        notes,
        before=inputs_html(table, {k: f"{k}/summary.html" for k in per_input}),
    )


def _verify_each(folders, plan: Plan, root: Path) -> tuple[dict[str, pd.DataFrame], SummaryPage]:
    """Each input's pairs, compared; with several inputs each gets its own folder and page
    (the last page returned is the single input's, written by the caller)."""
    per_input: dict[str, pd.DataFrame] = {}
    several = len(folders) > 1
    each = folders.items()
    if several:  # one bar over the inputs, one over each input's tensors
        each = progress(each, "verification: inputs", len(folders), "inputs", line=False)
    page = None
    for key, (g_folder, t_folder) in each:
        out = root / key if several else root
        title = f"Verification {key}" if several else "Verification"
        df, _, page = verify_input(g_folder, t_folder, plan, out, title)
        per_input[key] = df
        if several:
            page.write(out)
    return per_input, page


def _opened(inputs, first_golden: TensorFolder, one_golden: bool):
    """Each input's folders, opened once (one golden against N results is read once), and
    matched by their recorded input files."""
    opened = {first_golden.root: first_golden}

    def folder(path: Path) -> TensorFolder:
        if path not in opened:
            opened[path] = TensorFolder(path)
        return opened[path]

    return match_inputs({k: (folder(g), folder(t)) for k, (g, t) in inputs.items()}, one_golden)


def run_verification(
    golden_dir: str | os.PathLike,
    inference_results: str | os.PathLike,
    default_verifiers: Sequence[str | Sequence[str] | Verifier] = ("CosineSimilarity",),
    tensor_mapping: str | os.PathLike | Mapping[str, str | None] | None = None,
    graph_struct: str | os.PathLike | None = None,
    verifier_config: str | os.PathLike | None = None,
    qnn_model_json_path: str | os.PathLike | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    model_path: str | os.PathLike | None = None,
    framework: str | None = None,
    discover: bool = True,
    options_record: dict | None = None,
    outputs: Sequence[str] | None = None,
    model_explorer: bool = True,
    annotate: Annotator | None = None,
) -> VerificationResult:
    """Compare golden and inference tensors; write ``<working_dir>/verification/<run>/``.

    ``golden_dir`` is a framework diagnosis run, or an inference engine run / its ``output/``
    (engine against engine, ``Result_N`` against ``Result_N``, exact names).
    ``inference_results`` is one ``Result_N``, an engine ``output/`` or an engine run folder.
    Without ``tensor_mapping``/``graph_struct``/``qnn_model_json_path`` the files the engine
    wrote beside ``output/`` are used when ``discover`` (logged); ``model_path`` builds a
    mapping from an ONNX model instead. ``outputs`` names the model's final outputs for the
    table of inputs (default: the graph structure's last tensors, else the last row).

    Golden and target of each pair must come from the same input files (recorded in their
    manifests); dumps of different inputs are never compared (:func:`match_inputs`).
    With ``model_explorer``, Model Explorer overlays of the scores (and of the layers the
    engine left on the CPU) go to ``model_explorer/`` on the ONNX model (``model_path``, else
    the engine run's own), linked from ``summary.html``.

    ``annotate`` (oneshot) is called once every input is verified, with the run so far; its
    :class:`SummaryAnnotation` goes into the top-level ``summary.csv/json/html`` (and the
    overlays) before they are written: no one rewrites them after the run is finished.
    """
    start = time.perf_counter()
    verifiers = configured_verifiers(default_verifiers, verifier_config)
    golden_inputs, golden_run = find_results(golden_dir, "--golden_output_reference_directory")
    target_inputs, target_run = find_results(inference_results, "--inference_results")
    first_golden = TensorFolder(next(iter(golden_inputs.values())))
    engine_vs_engine = golden_run is not None or (
        len(golden_inputs) > 1 and first_golden.meta.get("component") != "framework_diagnosis"
    )
    inputs = pair_inputs(golden_inputs, target_inputs, golden_dir)
    folders, input_notes = _opened(inputs, first_golden, len(golden_inputs) == 1)
    tensor_mapping, graph_struct, qnn_model_json_path, sources = _side_files(
        target_run,
        discover,
        tensor_mapping,
        graph_struct,
        qnn_model_json_path,
        find_mapping=not engine_vs_engine and model_path is None,
    )
    mapping = _mapping(tensor_mapping, model_path, framework, folders, sources)
    layers = load_graph_struct(graph_struct) if graph_struct is not None else []
    qnn = QnnGraph(qnn_model_json_path) if qnn_model_json_path is not None else None
    qdq = _engine_qdq(target_run)
    plan = Plan(
        verifiers,
        mapping,
        execution_order(layers),
        qnn,
        sources,
        _weight_bits(qdq),
        _fed_inputs(qdq) if not engine_vs_engine else {},
    )
    for g_folder, t_folder in folders.values():
        plan_pairs(g_folder, t_folder, plan)  # bad names fail here, before a run folder exists

    with RunDir(working_dir, COMPONENT, output_dirname) as run:
        for key, value in sources.items():
            log.info("%s: %s", key, value)
        for level, note in input_notes:
            log.log(level, "%s", note)
        run.write_options(
            options_record
            or options_dict(
                golden_output_reference_directory=golden_dir,
                inference_results=inference_results,
                default_verifier=[cv.verifier.label for cv in verifiers if cv.tensors is None],
                verifier_config=verifier_config or None,
                tensor_mapping=sources.get("tensor_mapping"),
                graph_struct=sources.get("graph_struct"),
                qnn_model_json_path=sources.get("qnn_model_json_path"),
                model_path=model_path or None,
                working_dir=working_dir,
                output_dirname=output_dirname,
            )
        )
        if mapping is not None and model_path is not None and tensor_mapping is None:
            write_tensor_mapping(run.path / MAPPING_FILE, mapping)
        several = len(folders) > 1
        per_input, page = _verify_each(folders, plan, run.path)
        table = inputs_table(
            per_input,
            {k: (g.meta, t.meta) for k, (g, t) in folders.items()},
            final_outputs(per_input, outputs, graph_struct),
            verifiers,
        )
        aggregate = None
        if several:
            aggregate, passed = aggregate_inputs(per_input, verifiers)
            aggregate = with_weight_bitwidth(aggregate, plan)
            page = _aggregate_page(aggregate, passed, per_input, folders, verifiers, plan, table)
        summary = page.df
        folder_pairs = {k: (g.root, t.root) for k, (g, t) in folders.items()}
        info = [{**cv.verifier.describe(), "label": cv.label} for cv in verifiers]
        annotation = None
        if annotate is not None:
            draft = VerificationResult(
                run.path,
                summary,
                per_input,
                aggregate,
                info,
                time.perf_counter() - start,
                table,
                folder_pairs,
            )
            annotation = annotate(draft)
            summary = annotation.summary
        page.write(run.path, annotation)
        overlay_seconds = None
        if model_explorer:
            t = time.perf_counter()
            _overlays(run, summary, verifiers, model_path, framework, target_run)
            overlay_seconds = time.perf_counter() - t
        seconds = time.perf_counter() - start
        log.info(
            "verification: %d rows, %d inputs in %.1f s -> %s",
            len(summary),
            len(per_input),
            seconds,
            run.final_path,
        )
    return VerificationResult(
        run.path,
        summary,
        per_input,
        aggregate,
        info,
        seconds,
        table,
        folder_pairs,
        overlay_seconds,
    )
