"""Verification: golden tensors against target tensors, layer by layer, into a summary.

For each input (``Result_N``) the golden and target folders are paired by name (tensor
mapping or exact names), each pair is read from disk memory-mapped, laid out alike
(:mod:`accdbg.mapping.layout`), cast to float64 once, and handed to every verifier before the
next pair is read: memory stays at about one pair whatever the model's size. Rows come out
in execution order (graph structure, else the golden manifest's topological index).
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.core.jsonio import read_json
from accdbg.core.progress import progress
from accdbg.core.provenance import describe_inputs, input_files, recorded_inputs, same_inputs
from accdbg.core.run_dir import RunDir, options_dict
from accdbg.core.tensor_store import MANIFEST_NAME, TensorFolder, TensorRecord, safe_relpath
from accdbg.errors import AccdbgError
from accdbg.mapping.graph_struct import execution_order, load_graph_struct
from accdbg.mapping.layout import Alignment, normalize_layout, reconcile
from accdbg.mapping.qnn_json import QnnGraph, QnnTensor, StepEncoding
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
from accdbg.verifiers import get_verifier, make_verifier
from accdbg.verifiers import status as row_status
from accdbg.verifiers.base import TensorPair, Verifier, VerifierResult, finite_range
from accdbg.verifiers.channels import STATS, ChannelPair, channel_axis, live, summarize

log = logging.getLogger("accdbg.verification")

COMPONENT = "verification"
SUMMARY_FORMAT = "accdbg-verification/1"
LEADING_COLUMNS = ["Name", "LayerType", "Size", "Tensor_dims"]
RANGE_COLUMNS = ["golden_min", "golden_max", "target_min", "target_max"]
EXTRA_COLUMNS = ["Status", "Failed", "Golden_name", "Layout", "Order"]
RESULT_RE = re.compile(r"^Result_(\d+)$")


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
class ConfiguredVerifier:
    """A verifier, its column label, and the tensors it runs on (None: every tensor)."""

    verifier: Verifier
    label: str
    tensors: list[list[str]] | None = None


@dataclass
class Plan:
    """Everything decided before the first tensor is read."""

    verifiers: list[ConfiguredVerifier]
    mapping: dict[str, str | None] | None
    order: dict[str, tuple[int, str]]
    qnn: QnnGraph | None
    sources: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- inputs and side files


def _result_folders(folder: Path) -> list[Path]:
    found = [c for c in folder.iterdir() if c.is_dir() and RESULT_RE.match(c.name)]
    return sorted(found, key=lambda c: int(RESULT_RE.match(c.name).group(1)))


def _has_tensors(folder: Path) -> bool:
    return (folder / MANIFEST_NAME).is_file() or next(folder.rglob("*.raw"), None) is not None


def find_results(path: str | os.PathLike, flag: str) -> tuple[dict[str, Path], Path | None]:
    """``Result_N`` folders under ``path`` (an engine run, its ``output/``, one result or one
    tensor folder), and the engine run folder when there is one (for its side files)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AccdbgError(f"{flag} {str(path)!r} does not exist")
    if not p.is_dir():
        raise AccdbgError(f"{flag} {str(path)!r} is not a folder")
    p = p.absolute()
    if (p / "output").is_dir() and _result_folders(p / "output"):
        return {r.name: r for r in _result_folders(p / "output")}, p
    results = _result_folders(p)
    if results:
        return {r.name: r for r in results}, (p.parent if p.name == "output" else None)
    if not _has_tensors(p):
        raise AccdbgError(
            f"{flag} {str(path)!r} holds no tensors (expected tensors.json or .raw files, "
            f"or output/Result_N folders)"
        )
    in_engine = RESULT_RE.match(p.name) and p.parent.name == "output"
    return {p.name if RESULT_RE.match(p.name) else "Result_0": p}, (
        p.parent.parent if in_engine else None
    )


def pair_inputs(
    golden: dict[str, Path], target: dict[str, Path], golden_dir
) -> dict[str, tuple[Path, Path]]:
    """Which golden folder each target result is compared with: the only one, or the
    ``Result_N`` of the same name (engine against engine)."""
    if len(golden) == 1:
        (g,) = golden.values()
        return {k: (g, t) for k, t in target.items()}
    missing = [k for k in target if k not in golden]
    if missing:
        raise AccdbgError(
            f"--inference_results {missing[0]} has no counterpart in --golden_output_reference_directory "
            f"{str(golden_dir)!r} (it holds {', '.join(golden)})"
        )
    return {k: (golden[k], t) for k, t in target.items()}


def _mismatch(g: TensorFolder, t: TensorFolder, gi: dict, ti: dict) -> str:
    return (
        f"refusing to compare golden {str(g.root)!r} with target {str(t.root)!r}: the golden was "
        f"computed from {describe_inputs(gi, ti)} but the target from {describe_inputs(ti, gi)} "
        "(different inputs); pass the golden and the inference results of the same input"
    )


def match_inputs(
    folders: dict[str, tuple[TensorFolder, TensorFolder]], one_golden: bool
) -> tuple[dict[str, tuple[TensorFolder, TensorFolder]], list[tuple[int, str]]]:
    """Never compare dumps of different inputs: each pair's recorded input files must hold
    the same data. One golden against several results keeps those of its own input (and says
    which it left out); any other mismatch is an error. Returns the pairs and what to log
    (level, line)."""
    kept: dict[str, tuple[TensorFolder, TensorFolder]] = {}
    skipped: list[str] = []
    unrecorded: list[str] = []
    first_mismatch = None
    for key, (g, t) in folders.items():
        gi, ti = recorded_inputs(g.meta), recorded_inputs(t.meta)
        if gi is None or ti is None:
            unrecorded.append(str((g if gi is None else t).root))
            kept[key] = (g, t)
        elif same_inputs(gi, ti):
            kept[key] = (g, t)
        elif one_golden and len(folders) > 1:
            skipped.append(f"{key} ({input_files(ti)})")
            first_mismatch = first_mismatch or _mismatch(g, t, gi, ti)
        else:
            raise AccdbgError(_mismatch(g, t, gi, ti))
    golden_files = input_files(recorded_inputs(next(iter(folders.values()))[0].meta))
    if not kept:
        raise AccdbgError(
            f"no inference result was computed from the golden's input {golden_files}: "
            f"{', '.join(skipped)}; {first_mismatch}"
        )
    notes: list[tuple[int, str]] = []
    if skipped:
        text = (
            f"the golden holds one input ({golden_files}): compared with {', '.join(kept)}; "
            f"not compared (other inputs): {', '.join(skipped)}"
        )
        notes.append((logging.INFO, text))
    if unrecorded:
        more = len(set(unrecorded)) - 1
        text = (
            f"{unrecorded[0]} records no input files{f' (and {more} more)' if more else ''}: "
            "whether golden and target come from the same input cannot be checked"
        )
        notes.append((logging.INFO, text))
        if one_golden and len(kept) > 1:
            text = (
                f"the golden reference holds one input but the inference results hold {len(kept)}; "
                "every Result_N is compared with it (only meaningful if they share that input)"
            )
            notes.append((logging.WARNING, text))
    return kept, notes


def _discover(engine_run: Path | None, pattern: str) -> Path | None:
    if engine_run is None:
        return None
    found = sorted(engine_run.glob(pattern))
    return found[0] if len(found) == 1 else None


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


def load_verifier_config(path: str | os.PathLike) -> list[tuple[Verifier, list[list[str]]]]:
    """``{"TopK": {"parameters": {...}, "tensors": [["a"], ["b"]]}, ...}`` -> verifiers."""
    what = f"--verifier_config {str(path)!r}"
    data = read_json(path, "--verifier_config")
    if not isinstance(data, dict):
        raise AccdbgError(f"{what} must be a JSON object keyed by verifier name")
    out = []
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise AccdbgError(
                f'{what}: {name!r} must map to {{"parameters": {{...}}, "tensors": [[...]]}}'
            )
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise AccdbgError(f"{what}: {name}.parameters must be an object")
        verifier = make_verifier(name, params)
        tensors = entry.get("tensors")
        n = verifier.tensors_per_side
        if (
            not isinstance(tensors, list)
            or not tensors
            or not all(
                isinstance(group, list)
                and len(group) == n
                and all(isinstance(t, str) for t in group)
                for group in tensors
            )
        ):
            example = '[["boxes", "classes"]]' if n == 2 else '[["tensor_a"], ["tensor_b"]]'
            raise AccdbgError(
                f"{what}: {name}.tensors must be a list of lists of {n} tensor name{'s' if n > 1 else ''}, e.g. {example}"
            )
        out.append((verifier, tensors))
    return out


def _label_verifiers(
    items: list[tuple[Verifier, list[list[str]] | None]],
) -> list[ConfiguredVerifier]:
    used: set[str] = set()
    out = []
    for verifier, tensors in items:
        label = verifier.name if verifier.name not in used else verifier.label
        n = 2
        while label in used:
            label, n = f"{verifier.label}#{n}", n + 1
        used.add(label)
        out.append(ConfiguredVerifier(verifier, label, tensors))
    return out


# ---------------------------------------------------------------- one tensor pair


def _fmt_shape(shape) -> list[int]:
    return [int(d) for d in shape]


def _target_view(
    rec: TensorRecord, qnn: QnnTensor | None
) -> tuple[tuple[int, ...], str | None, StepEncoding | None]:
    """The target's shape, layout and encoding, from its record first, then the QNN JSON.

    The QNN JSON describes the QNN tensor: its axis format applies to the dump only when the
    dump kept the QNN dims (an engine that transposed back to the ONNX layout did not).
    """
    shape = tuple(rec.shape)
    layout = normalize_layout(rec.layout, len(shape))
    encoding = None
    extra = rec.extra or {}
    if "scale" in extra and extra["scale"] is not None:
        scale = extra["scale"]
        encoding = StepEncoding(
            np.asarray(scale, dtype=np.float64) if isinstance(scale, list) else float(scale),
            extra.get("offset", 0),
            extra.get("bitwidth"),
            extra.get("axis"),
        )
    if qnn is not None:
        if (
            len(shape) <= 1
            and qnn.dims
            and int(np.prod(qnn.dims)) == rec.size
            and len(qnn.dims) > 1
        ):
            shape = qnn.dims  # bare .raw: the QNN JSON knows the shape
        if layout is None and tuple(qnn.dims) == shape:
            layout = normalize_layout(qnn.axis_format, len(shape))
        if (
            encoding is None
            and qnn.encoding is not None
            and (qnn.encoding.axis is None or tuple(qnn.dims) == shape)
        ):
            encoding = qnn.encoding
    return shape, layout, encoding


def _golden_view(rec: TensorRecord, qnn: QnnTensor | None) -> tuple[tuple[int, ...], str | None]:
    shape = tuple(rec.shape)
    layout = normalize_layout(rec.layout, len(shape))
    if layout is None and qnn is not None:
        layout = normalize_layout(qnn.src_axis_format, len(shape))
    return shape, layout


def _scale_for(encoding: StepEncoding | None, target_shape, alignment: Alignment):
    """The quantization step broadcast to the aligned target (per-axis scales move with it)."""
    if encoding is None:
        return None
    try:
        step = encoding.step_array(target_shape)
    except ValueError as exc:
        log.debug("ignoring encoding: %s", exc)
        return None
    if isinstance(step, float):
        return step
    return alignment.apply(np.broadcast_to(step, target_shape))


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


def _shapeless(golden, target, g_shape, t_shape, size) -> Alignment | None:
    """Bare ``.raw`` folders carry no shape: compare flat only when order cannot differ."""

    def spread(shape) -> int:
        return len([d for d in shape if d != 1])

    if golden.has_manifest and target.has_manifest:
        return None
    if (
        not golden.has_manifest
        and not target.has_manifest
        and len(g_shape) <= 1
        and len(t_shape) <= 1
    ):
        return Alignment("same", g_shape, t_shape, None, "flat (no shapes recorded on either side)")
    if not target.has_manifest and len(t_shape) <= 1 and spread(g_shape) > 1:
        return Alignment(
            "mismatch",
            g_shape,
            t_shape,
            None,
            f"target shape unknown (bare .raw, {size} values) for golden "
            f"{_fmt_shape(g_shape)}: pass --qnn_model_json_path",
        )
    if not golden.has_manifest and len(g_shape) <= 1 and spread(t_shape) > 1:
        return Alignment(
            "mismatch",
            g_shape,
            t_shape,
            None,
            f"golden shape unknown (bare .raw without tensors.json) for target "
            f"{_fmt_shape(t_shape)}: its layout cannot be told",
        )
    return None


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
    if g_rec is None or t_rec is None:
        rec = t_rec or g_rec
        row["Size"], row["Tensor_dims"] = rec.size, list(rec.shape)
        row["Status"] = "missing in target" if t_rec is None else "missing in golden"
        return row, {}
    t_shape, t_layout, encoding = _target_view(t_rec, qnn)
    g_shape, g_layout = _golden_view(g_rec, qnn)
    row["Size"], row["Tensor_dims"] = int(np.prod(t_shape)) if t_shape else 1, _fmt_shape(t_shape)
    alignment = _shapeless(golden, target, g_shape, t_shape, t_rec.size) or reconcile(
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
        row, g_arr, t_arr, _scale_for(encoding, t_shape, alignment), g_layout, verifiers
    )
    return row, results


def score_pair(
    row: dict[str, Any],
    g_arr: np.ndarray,
    t_arr: np.ndarray,
    scale: float | np.ndarray | None,
    g_layout: str | None,
    verifiers: Sequence[ConfiguredVerifier],
) -> dict[str, VerifierResult]:
    """Two aligned float64 arrays through every verifier: fills the row's target range,
    per-channel scores and notes, returns each verifier's result. The one scoring step of a
    pair, whether the arrays were read from dumps or are still in memory (a dataset run)."""
    row["target_min"], row["target_max"] = finite_range(t_arr)
    pair = TensorPair(g_arr, t_arr, scale)
    results = {cv.label: cv.verifier.verify(pair) for cv in verifiers}
    if not pair.notes and not pair.problem:
        row.update(_per_channel(pair, g_arr.shape, g_layout, row["LayerType"], verifiers))
    pair_note = "; ".join(pair.notes)
    notes = list(pair.notes)
    notes += [
        f"{label}: {res.status}"
        for label, res in results.items()
        if res.status not in ("ok", pair_note)
    ]
    if notes:
        row["Status"] = "; ".join(notes)
    return results


def _per_channel(
    pair: TensorPair, shape, layout, op_type, verifiers: list[ConfiguredVerifier]
) -> dict[str, float]:
    """``<label> ch_median`` / ``ch_worst`` of every verifier that has a per-channel form."""
    axis = channel_axis(shape, layout, op_type)
    if axis is None:
        return {}
    g, t = pair.golden.reshape(shape), pair.target.reshape(shape)
    cp = ChannelPair.of(g, t, axis, pair.__dict__.get("diff"))
    alive = live(cp.gg)
    out: dict[str, float] = {}
    for cv in verifiers:
        with np.errstate(all="ignore"):
            values = cv.verifier.per_channel(cp)
        if values is not None:
            stats = summarize(values, alive, cv.verifier.higher_is_better)
            out.update({f"{cv.label} {k}": v for k, v in stats.items()})
    return out


def channel_columns(verifiers: Sequence[ConfiguredVerifier]) -> list[str]:
    """The per-channel columns of the verifiers that have a per-channel form."""
    probe = ChannelPair(np.ones((2, 1)), np.ones((2, 1)))
    return [
        f"{cv.label} {k}"
        for cv in verifiers
        if cv.tensors is None and cv.verifier.per_channel(probe) is not None
        for k in STATS
    ]


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
    pairs = list(pairing.pairs)
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
    labels = [cv.label for cv in plan.verifiers]
    # the reference's columns first; the per-channel scores after them
    columns = (
        LEADING_COLUMNS + labels + RANGE_COLUMNS + EXTRA_COLUMNS + channel_columns(plan.verifiers)
    )
    df = pd.DataFrame(rows, columns=columns)
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
    return df, passed, SummaryPage(df, title, meta, passed, _notes(plan, df, passed))


def _verify_rows(golden, target, plan, pairs, by_name, writer, everywhere, single, multi):
    """Each pair in turn: read, verify, write its details, keep only the row."""
    labels = [cv.label for cv in plan.verifiers]
    rows: list[dict[str, Any]] = []
    passed: dict[str, list[bool | None]] = {label: [] for label in labels}
    row_of: dict[str, int] = {}
    for g_name, t_name in progress(pairs, "verification", total=len(pairs)):
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


# ---------------------------------------------------------------- aggregate over inputs


def aggregate_inputs(
    per_input: dict[str, pd.DataFrame],
    verifiers: list[ConfiguredVerifier],
) -> tuple[pd.DataFrame, dict[str, list[bool | None]]]:
    """One row per layer over all inputs: each verifier's worst value (and which input), its
    median and mean, the value ranges over all inputs, and the first input's note in Status."""
    keys: list[tuple[str, Any]] = []
    stacked = []
    for name, df in per_input.items():
        d = df.assign(_input=name, _key=list(zip(df["Name"], df["Golden_name"], strict=True)))
        stacked.append(d)
        for k in d["_key"]:
            if k not in keys:
                keys.append(k)
    all_rows = pd.concat(stacked, ignore_index=True)
    rows = []
    passed: dict[str, list[bool | None]] = {cv.label: [] for cv in verifiers}
    groups = dict(tuple(all_rows.groupby("_key", sort=False)))
    for key in keys:
        grp = groups[key]
        first = grp.iloc[0]
        row = {c: first[c] for c in LEADING_COLUMNS}
        failed = []
        failed_somewhere = {f for cell in grp["Failed"] for f in row_status.split_failed(cell)}
        for cv in verifiers:
            vals = grp[cv.label].astype(float)
            finite = vals.dropna()
            if finite.empty:
                worst, worst_in, mean, median = math.nan, None, math.nan, math.nan
            else:
                pos = finite.idxmin() if cv.verifier.higher_is_better else finite.idxmax()
                worst, worst_in = float(finite[pos]), grp.loc[pos, "_input"]
                with np.errstate(invalid="ignore"):
                    mean = float(np.mean(finite.to_numpy()))
                    median = float(np.median(finite.to_numpy()))
            row[cv.label] = worst
            for col in [c for c in grp.columns if c.startswith(f"{cv.label} ch_")]:
                vals = grp[col].astype(float).dropna()
                pick = vals.min() if cv.verifier.higher_is_better else vals.max()
                row[col] = float(pick) if not vals.empty else math.nan
            row[f"{cv.label}_median"] = median
            row[f"{cv.label}_mean"] = mean
            row[f"{cv.label}_worst_input"] = worst_in
            verdict = cv.verifier.judge(worst) if not math.isnan(worst) else None
            if cv.label in failed_somewhere:  # e.g. NaN on one input fails it whatever the values
                verdict = False
            passed[cv.label].append(verdict)
            if verdict is False:
                failed.append(cv.label)
        row["golden_min"] = grp["golden_min"].min()
        row["golden_max"] = grp["golden_max"].max()
        row["target_min"] = grp["target_min"].min()
        row["target_max"] = grp["target_max"].max()
        noted = [
            (i, row_status.note(st)) for i, st in zip(grp["_input"], grp["Status"], strict=True)
        ]
        first_note = next((f"{i}: {n}" for i, n in noted if n), "")
        row["Status"] = row_status.compose(failed, [first_note])
        row["Failed"] = ", ".join(failed)
        row["Golden_name"] = first["Golden_name"]
        row["Layout"] = first["Layout"]
        row["Order"] = len(rows)
        row["Inputs"] = int(len(grp))
        rows.append(row)
    labels = [cv.label for cv in verifiers]
    columns = (
        LEADING_COLUMNS
        + labels
        + RANGE_COLUMNS
        + EXTRA_COLUMNS
        + channel_columns(verifiers)
        + ["Inputs"]
        + [f"{label}_{s}" for label in labels for s in ("median", "mean", "worst_input")]
    )
    return pd.DataFrame(rows, columns=columns), passed


def final_outputs(
    per_input: Mapping[str, pd.DataFrame],
    outputs: Sequence[str] | None,
    graph_struct: str | os.PathLike | None,
) -> list[str]:
    """The rows that are the model's final outputs: ``outputs`` when given, else the graph
    structure's tensors no layer consumes, else the last row."""
    names = list(next(iter(per_input.values()))["Name"])
    if outputs:
        found = [n for n in outputs if n in names]
        if found:
            return found
    if graph_struct is not None:
        data = read_json(graph_struct, "--graph_struct")
        layers = data.get("layers", []) if isinstance(data, dict) else data
        consumed = {i for layer in layers for i in layer.get("inputs", []) or []}
        sinks = [o for layer in layers for o in layer.get("outputs", []) or [] if o not in consumed]
        found = [n for n in names if n in set(sinks)]
        if found:
            return found
    return names[-1:]


def inputs_table(
    per_input: Mapping[str, pd.DataFrame],
    metas: Mapping[str, tuple[Mapping, Mapping]],
    outputs: Sequence[str],
    verifiers: Sequence[ConfiguredVerifier],
) -> pd.DataFrame:
    """One row per input: its files and each final output's score per verifier."""
    rows = []
    for key, df in per_input.items():
        g_meta, t_meta = metas[key]
        files = recorded_inputs(t_meta) or recorded_inputs(g_meta)
        row: dict[str, Any] = {"Input": key, "Files": input_files(files) or "(not recorded)"}
        by_name = df.drop_duplicates("Name").set_index("Name")
        for out in outputs:
            for cv in verifiers:
                if cv.label in by_name.columns and out in by_name.index:
                    row[f"{out} {cv.label}"] = by_name.loc[out, cv.label]
        rows.append(row)
    return pd.DataFrame(rows)


def worst_input(table: pd.DataFrame, verifiers: Mapping[str, Verifier]) -> str:
    """The input whose final outputs score worst on the first verifier (label -> verifier)
    that scored them."""
    for label, verifier in verifiers.items():
        cols = [c for c in table.columns if c.endswith(f" {label}")]
        if not cols:
            continue
        scores = table[cols].apply(pd.to_numeric, errors="coerce")
        per_row = scores.min(axis=1) if verifier.higher_is_better else scores.max(axis=1)
        if per_row.isna().all():
            continue
        pos = per_row.idxmin() if verifier.higher_is_better else per_row.idxmax()
        return str(table.loc[pos, "Input"])
    return str(table["Input"].iloc[0])


# ---------------------------------------------------------------- the component


def _resolve_verifiers(
    default_verifiers: Sequence[Any], verifier_config: str | os.PathLike | None
) -> list[ConfiguredVerifier]:
    items: list[tuple[Verifier, list[list[str]] | None]] = []
    for spec in default_verifiers:
        v = get_verifier(spec)
        if v.tensors_per_side != 1:
            raise AccdbgError(
                f"--default_verifier {v.name} compares {v.tensors_per_side} tensors per side "
                f"(boxes, classes): name them in --verifier_config, e.g. "
                f'{{"{v.name}": {{"tensors": [["boxes", "classes"]]}}}}'
            )
        items.append((v, None))
    if verifier_config is not None:
        items.extend(load_verifier_config(verifier_config))
    if not items:
        raise AccdbgError(
            "no verifier: give --default_verifier (e.g. CosineSimilarity) or --verifier_config"
        )
    return _label_verifiers(items)


def configured_verifiers(
    default_verifiers: Sequence[Any], verifier_config: str | os.PathLike | None = None
) -> list[ConfiguredVerifier]:
    """The verifiers of a run with their column labels, as verification resolves them."""
    return _resolve_verifiers(default_verifiers, verifier_config)


def check_verifiers(
    default_verifiers: Sequence[Any], verifier_config: str | os.PathLike | None = None
) -> None:
    """The verifier specs and ``--verifier_config``, checked before any run starts."""
    _resolve_verifiers(default_verifiers, verifier_config)


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
    verifiers = _resolve_verifiers(default_verifiers, verifier_config)
    golden_inputs, golden_run = find_results(golden_dir, "--golden_output_reference_directory")
    target_inputs, target_run = find_results(inference_results, "--inference_results")
    first_golden = TensorFolder(next(iter(golden_inputs.values())))
    engine_vs_engine = golden_run is not None or (
        len(golden_inputs) > 1 and first_golden.meta.get("component") != "framework_diagnosis"
    )
    inputs = pair_inputs(golden_inputs, target_inputs, golden_dir)
    opened = {first_golden.root: first_golden}

    def folder(path: Path) -> TensorFolder:
        if path not in opened:  # one golden against N results is read once
            opened[path] = TensorFolder(path)
        return opened[path]

    folders, input_notes = match_inputs(
        {key: (folder(g), folder(t)) for key, (g, t) in inputs.items()}, len(golden_inputs) == 1
    )
    sources: dict[str, str] = {}

    if tensor_mapping is None and discover and not engine_vs_engine and model_path is None:
        found = _discover(target_run, MAPPING_FILE)
        if found:
            tensor_mapping, sources["tensor_mapping"] = (
                found,
                f"{found} (found beside the inference results)",
            )
    if graph_struct is None and discover:
        found = _discover(target_run, "*graph_struct.json")
        if found:
            graph_struct, sources["graph_struct"] = (
                found,
                f"{found} (found beside the inference results)",
            )
    if qnn_model_json_path is None and discover:
        found = _discover(target_run, "model_net.json") or _discover(target_run, "*_net.json")
        if found:
            qnn_model_json_path, sources["qnn_model_json_path"] = (
                found,
                f"{found} (found beside the inference results)",
            )
    for key, value in (
        ("tensor_mapping", tensor_mapping),
        ("graph_struct", graph_struct),
        ("qnn_model_json_path", qnn_model_json_path),
    ):
        if value is not None and key not in sources:
            sources[key] = str(value) if not isinstance(value, Mapping) else "(given as a dict)"

    mapping: dict[str, str | None] | None
    if isinstance(tensor_mapping, Mapping):
        mapping = dict(tensor_mapping)
    elif tensor_mapping is not None:
        mapping = load_tensor_mapping(tensor_mapping)
    elif model_path is not None:
        first_g, first_t = next(iter(folders.values()))
        mapping = build_tensor_mapping(
            model_path, first_g.names(), first_t.names(), framework or "onnx"
        )
        sources["tensor_mapping"] = f"built from {model_path}: {len(mapping)} pairs"
    else:
        mapping = None
    layers = load_graph_struct(graph_struct) if graph_struct is not None else []
    qnn = QnnGraph(qnn_model_json_path) if qnn_model_json_path is not None else None
    plan = Plan(verifiers, mapping, execution_order(layers), qnn, sources)
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
        per_input: dict[str, pd.DataFrame] = {}
        several = len(folders) > 1
        for key, (g_folder, t_folder) in folders.items():
            out = run.path / key if several else run.path
            title = f"Verification {key}" if several else "Verification"
            df, _, page = verify_input(g_folder, t_folder, plan, out, title)
            per_input[key] = df
            if several:
                page.write(out)
        table = inputs_table(
            per_input,
            {k: (g.meta, t.meta) for k, (g, t) in folders.items()},
            final_outputs(per_input, outputs, graph_struct),
            verifiers,
        )
        aggregate = None
        if several:
            aggregate, passed = aggregate_inputs(per_input, verifiers)
            meta = {
                "format": SUMMARY_FORMAT,
                "aggregate_of": list(per_input),
                "inputs": {
                    k: {"golden": recorded_inputs(g.meta), "target": recorded_inputs(t.meta)}
                    for k, (g, t) in folders.items()
                },
                "verifiers": [
                    {**cv.verifier.describe(), "label": cv.label, "tensors": cv.tensors}
                    for cv in verifiers
                ],
                "sources": sources,
            }
            notes = [
                f"Aggregate over {len(per_input)} inputs ({', '.join(per_input)}): each verifier "
                "column is the worst value over the inputs, <verifier>_median the median, "
                "<verifier>_worst_input the input it came from; each input's own summary is in "
                "its Result_N folder (linked in the table of inputs)."
            ]
            notes += _notes(plan, aggregate, passed)
            page = SummaryPage(
                aggregate,
                "Verification (all inputs)",
                meta,
                passed,
                notes,
                before=inputs_html(table, {k: f"{k}/summary.html" for k in per_input}),
            )
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
