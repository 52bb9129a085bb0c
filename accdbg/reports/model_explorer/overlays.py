"""Model Explorer node-data files of a table, keyed on the source model's graph.

:func:`write_overlays` turns any accdbg table (one row per layer output) into node-data files
built with the package's own ``node_data_builder``: one per score column, one for the culprit
ranking with its cause, one for the run's marks (culprits, layers on the CPU, ...). They are
keyed on the nodes of the *source* model as Model Explorer's ONNX adapter names them: the node
producing a row's tensor, found by running the adapter itself on the model (it names unnamed
nodes through onnx_ir, ``node``, ``node_1``...), so the keys are the nodes the viewer shows.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from accdbg.core.imports import without
from accdbg.core.progress import stage
from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.model_explorer")

DIRNAME = "model_explorer"
MANIFEST = "overlays.json"
ADAPTER = "model_explorer_onnx"  # the extension module Model Explorer loads for .onnx files
ADAPTER_ID = "onnx_adapter"
RANK, CAUSE = "culprit_rank", "cause"
WORST = "#b71c1c"  # the worst score's colour, culprit #1's and the culprit mark's
MID, BEST = "#f9a825", "#2e7d32"
RANK_COLORS = (WORST, "#e53935", "#ef9a9a")  # culprit #1, #2, #3 and beyond
MARK_COLORS = {"culprit": WORST, "on CPU": "#1565c0", "changed by fix": "#6a1b9a"}
OTHER_MARK_COLORS = ("#00838f", "#ef6c00", "#5d4037")
WHITE = "#ffffff"


class Score(Protocol):
    """What an overlay needs of a score column: which way is better (any accdbg
    :class:`~accdbg.verifiers.base.Verifier` is one)."""

    higher_is_better: bool


@dataclass
class Overlays:
    """The node-data files of one run and the model they belong to."""

    folder: Path
    model: Path
    graph: str
    files: list[dict[str, str]] = field(default_factory=list)  # {file, name, kind}
    unmatched: list[str] = field(default_factory=list)  # names no node of the model produces
    final_dir: Path | None = None  # the run folder once finished (for the command)
    notes: list[str] = field(default_factory=list)  # what lands on no node (a global knob)

    @property
    def paths(self) -> list[Path]:
        return [self.folder / f["file"] for f in self.files]


def _builder():
    try:
        with without(("torch", "IPython")):
            from model_explorer import node_data_builder
    except ImportError as exc:
        raise AccdbgError(
            f"Model Explorer is not installed ({exc}); pip install ai-edge-model-explorer "
            "model-explorer-onnx"
        ) from None
    return node_data_builder


class _ToDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log.debug("Model Explorer's ONNX adapter: %s", record.getMessage())


@contextmanager
def _adapter_log_to_debug() -> Iterator[None]:
    """The adapter's log lines (e.g. "graph has no name") go to the run's log, not the
    console, like every native line and warning."""
    adapter_log = logging.getLogger(ADAPTER)
    handler, propagate = _ToDebug(), adapter_log.propagate
    adapter_log.addHandler(handler)
    adapter_log.propagate = False
    try:
        yield
    finally:
        adapter_log.removeHandler(handler)
        adapter_log.propagate = propagate


def source_nodes(model: str | Path) -> tuple[str, dict[str, str]]:
    """The main graph's id and, per tensor, the id of the node producing it - as Model
    Explorer's ONNX adapter builds the graph the viewer shows (graph inputs included; node
    ids map to themselves). A weight or bias (an initializer) maps to the node consuming it."""
    try:
        with without(("torch", "IPython")):
            from model_explorer_onnx.main import ONNXAdapter
    except ImportError as exc:
        raise AccdbgError(
            f"Model Explorer's ONNX adapter is not installed ({exc}); pip install model-explorer-onnx"
        ) from None
    try:
        with _adapter_log_to_debug():
            graphs = ONNXAdapter().convert(str(model), {})["graphs"]
    except Exception as exc:  # the adapter's own error, on a model accdbg already ran
        raise AccdbgError(
            f"Model Explorer's ONNX adapter cannot read {str(model)!r}: {exc}"
        ) from None
    main = graphs[0]
    # an initializer (weight, bias) lands on the first node using it - the Conv or MatMul
    # whose weights they are - not on the initializer's own node, which the viewer folds away
    initializers = {n.id for n in main.nodes if n.label == "Initializer"}
    user: dict[str, str] = {}
    for node in main.nodes:
        if node.label not in ("Initializer", "Output"):
            for edge in node.incomingEdges:
                if edge.sourceNodeId in initializers:
                    user.setdefault(edge.sourceNodeId, node.id)
    producers: dict[str, str] = {}
    for node in main.nodes:
        if node.label == "Output":  # a graph output's own node: its producer comes first
            continue
        for meta in node.outputsMetadata:
            for attr in meta.attrs:
                if attr.key == "__tensor_tag" and attr.value != "None":
                    producers.setdefault(attr.value, user.get(node.id, node.id))
    for node in main.nodes:  # a node may be named too (its id), after every tensor
        producers.setdefault(node.id, node.id)
    return main.id, producers


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _gradient(nb, higher_is_better: bool) -> list:
    """Worst red, middle amber, best green; the worst end is the low end of a
    higher-is-better score (SQNR, cosine) and the high end of an error (MSE)."""
    stops = [(0.0, WORST), (0.5, MID), (1.0, BEST)]
    if not higher_is_better:
        stops = [(0.0, BEST), (0.5, MID), (1.0, WORST)]
    return [nb.GradientItem(stop=s, bgColor=c) for s, c in stops]


def score_results(values: Mapping[str, float], higher_is_better: bool) -> dict[str, float]:
    """One value per node: the worst when several rows land on one node; an infinite score
    (identical tensors: SQNR inf) becomes the column's best finite value, since JSON has no
    infinity and the colour scale runs from the worst to the best value (the largest float
    when no value is finite)."""
    finite = [v for v in values.values() if math.isfinite(v)]
    out: dict[str, float] = {}
    for node, v in values.items():
        if not math.isfinite(v):
            good = (v > 0) == higher_is_better
            if finite:
                low, high = min(finite), max(finite)
                v = (high if good else low) if higher_is_better else (low if good else high)
            else:  # nothing finite to borrow from: the largest float, with its sign
                v = math.copysign(sys.float_info.max, v)
        out[node] = v
    return out


def _safe_file(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("._") or "score"


@stage("model explorer overlays", line=False)  # its line: "model explorer overlays (S s)"
def write_overlays(
    run_dir: str | Path,
    source_model: str | Path,
    table: pd.DataFrame,
    name_col: str,
    scores: Mapping[str, Score],
    rank_col: str = RANK,
    cause_col: str = CAUSE,
    marks: Mapping[str, Mapping[str | tuple[str, ...], str]] | None = None,
    fallback_cols: Sequence[str] = ("Golden_name",),
    final_dir: str | Path | None = None,
    notes: Sequence[str] = (),
) -> Overlays:
    """Write ``<run_dir>/model_explorer/``: one node-data file per score column, one for the
    culprit ranking, one for the marks, and ``overlays.json``.

    ``table`` has one row per layer output; ``name_col`` names the tensor (of
    ``source_model``), else the first of ``fallback_cols`` that does. ``scores`` maps a
    column to its direction (a verifier). ``rank_col``/``cause_col`` are the culprit
    ranking (skipped when absent). ``marks`` maps a mark's label (``"on CPU"``,
    ``"changed by fix"``) to {name: detail}, a name being a row's name, a tensor or node of
    the model, or a tuple of candidates tried in order; culprits are marked from ``rank_col``.
    Names the model has no node for are listed in ``overlays.json`` as ``unmatched``.
    ``final_dir``: where the run folder will be once finished (it is written under a
    temporary name), for the command that opens the overlays. ``notes``: what the run
    changed or found that belongs to no node (a global knob of a fix), kept in
    ``overlays.json``.
    """
    start = time.perf_counter()
    nb = _builder()
    folder = Path(run_dir) / DIRNAME
    folder.mkdir(parents=True, exist_ok=True)
    graph, producers = source_nodes(source_model)
    cols = [name_col, *[c for c in fallback_cols if c in table.columns]]

    def node_of(row: Mapping[str, Any]) -> str | None:
        for c in cols:
            name = row.get(c)
            if isinstance(name, str) and name in producers:
                return producers[name]
        return None

    rows = table.to_dict("records")
    nodes = [node_of(r) for r in rows]
    by_name = {str(r[name_col]): n for r, n in zip(rows, nodes, strict=True) if n is not None}
    unmatched = [str(r[name_col]) for r, n in zip(rows, nodes, strict=True) if n is None]
    model = Path(source_model).absolute()
    if final_dir is not None and model.is_relative_to(Path(run_dir).absolute()):
        # a model inside the run (a conversion it made): where it is once the run is finished
        model = Path(final_dir).absolute() / model.relative_to(Path(run_dir).absolute())
    out = Overlays(folder, model, graph, unmatched=unmatched, notes=list(notes))

    def save(label: str, kind: str, gnd) -> None:
        stem, taken = _safe_file(label), {f["file"] for f in out.files}
        name = next(
            n
            for i in range(1, len(taken) + 2)
            if (n := f"{stem}{f'_{i}' if i > 1 else ''}.json") not in taken
        )
        nb.ModelNodeData(graphsData={graph: gnd}).save_to_file(str(folder / name))
        out.files.append({"file": name, "name": label, "kind": kind})

    for label, score in scores.items():
        if label not in table.columns:
            continue
        values = _worst_per_node(nodes, table[label], score)
        if not values:
            continue
        results = score_results(values, score.higher_is_better)
        save(
            label,
            "score",
            nb.GraphNodeData(
                name=label,
                results={k: nb.NodeDataResult(value=v) for k, v in results.items()},
                gradient=_gradient(nb, score.higher_is_better),
            ),
        )

    culprits: dict[str, str] = {}
    if rank_col in table.columns:
        results, culprits = _ranking(nb, table, rows, nodes, name_col, rank_col, cause_col)
        if results:
            save(
                "culprit ranking",
                "ranking",
                nb.GraphNodeData(
                    name="culprit ranking",
                    results=results,
                    showExpandedSummaryOnGroupNode=True,
                ),
            )

    all_marks = {"culprit": culprits, **(marks or {})}
    marked: dict[str, list[tuple[str, str]]] = {}
    for label, named in all_marks.items():
        for names, detail in named.items():
            candidates = (names,) if isinstance(names, str) else names
            node = next((n for c in candidates if (n := by_name.get(c) or producers.get(c))), None)
            if node is None:
                unmatched.append(" | ".join(candidates))
                continue
            marked.setdefault(node, []).append((label, detail))
    if any(named for named in all_marks.values()):
        others = iter(OTHER_MARK_COLORS * 10)
        colors = {lab: MARK_COLORS.get(lab) or next(others) for lab in all_marks}
        save(
            "marks",
            "marks",
            nb.GraphNodeData(
                name="marks",
                results={
                    node: nb.NodeDataResult(
                        value="; ".join(_mark_text(lab, d) for lab, d in items),
                        bgColor=colors[items[0][0]],
                        textColor=WHITE,
                    )
                    for node, items in marked.items()
                },
                showExpandedSummaryOnGroupNode=True,
            ),
        )
    write_json_atomic(
        folder / MANIFEST,
        {
            "model": str(out.model),
            "graph": graph,
            "adapter": ADAPTER_ID,
            "files": out.files,
            "unmatched": unmatched,
            "notes": list(notes),
            "command": view_command(final_dir or run_dir),
        },
    )
    if unmatched:
        log.debug(
            "model explorer: %d name(s) have no node in %s, e.g. %s",
            len(unmatched),
            out.model.name,
            ", ".join(unmatched[:5]),
        )
    out.final_dir = Path(final_dir or run_dir)
    log.info(
        "model explorer overlays (%.1f s): %s",
        time.perf_counter() - start,
        view_command(out.final_dir),
    )
    return out


def _worst_per_node(nodes: list, values, score: Score) -> dict[str, float]:
    """A score column per graph node: several rows on one node keep the worst value."""
    out: dict[str, float] = {}
    for node, v in zip(nodes, values, strict=True):
        v = _finite(v)
        if node is None or v is None:
            continue
        old = out.get(node)
        worse = old is None or (v < old if score.higher_is_better else v > old)
        out[node] = v if worse else old
    return out


def _ranking(nb, table: pd.DataFrame, rows, nodes, name_col, rank_col, cause_col):
    """The culprit ranking's node results (the best rank per node, coloured) and the
    culprits' marks by row name."""
    results: dict[str, Any] = {}
    culprits: dict[str, str] = {}
    best_rank: dict[str, int] = {}
    ranks = pd.to_numeric(table[rank_col], errors="coerce").astype("float64")
    causes = table[cause_col] if cause_col in table.columns else [""] * len(table)
    for row, node, rank, cause in zip(rows, nodes, ranks, causes, strict=True):
        if node is None:
            continue
        cause = cause if isinstance(cause, str) else ""
        if math.isfinite(rank):
            r = int(rank)
            culprits[str(row[name_col])] = f"#{r}" + (f": {cause}" if cause else "")
            if best_rank.get(node, math.inf) < r:  # several rows on one node: the best
                continue
            best_rank[node] = r
            results[node] = nb.NodeDataResult(
                value=f"#{r}: {cause}" if cause else f"#{r}",
                bgColor=RANK_COLORS[min(r, len(RANK_COLORS)) - 1],
                textColor=WHITE,
            )
        elif node not in results:
            results[node] = nb.NodeDataResult(value=cause or "not a culprit")
    return results, culprits


def _mark_text(label: str, detail: str) -> str:
    """``culprit #1: weight range ...``, ``on CPU: Softmax: QNN's reason``."""
    if not detail:
        return label
    return f"{label} {detail}" if detail.startswith("#") else f"{label}: {detail}"


def view_command(run_dir: str | Path) -> str:
    return f"qnn-accuracy-debugger --model_explorer_view {Path(run_dir).absolute()}"
