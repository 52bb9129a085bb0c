"""A run's results on the model's graph: Google Model Explorer node-data overlays.

Model Explorer (``ai-edge-model-explorer``, with the ``model-explorer-onnx`` adapter) draws an
ONNX graph and colours its nodes from node-data JSON files. :func:`write_overlays` turns any
accdbg table (one row per layer output) into such files, built with the package's own
``node_data_builder``: one per score column, one for the culprit ranking with its cause, one
for the run's marks (culprits, layers on the CPU, ...). They are keyed on the nodes of the
*source* model - the float ONNX model, or the converted one for other frameworks - as the
ONNX adapter names them: the node that produces a row's tensor (an unnamed node is
``<node_i>``), found by running the adapter itself on the model, so the keys are what the
viewer will show. :func:`serve` opens Model Explorer on a run, offline, on a local port.

Files land in ``<run>/model_explorer/`` with ``overlays.json`` (model, graph, files) that
``qnn-accuracy-debugger --model_explorer_view RUN_DIR`` reads.
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

from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError
from accdbg.reports.cells import escape

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

    @property
    def paths(self) -> list[Path]:
        return [self.folder / f["file"] for f in self.files]


@contextmanager
def _without(modules: Sequence[str]) -> Iterator[None]:
    """Import with ``modules`` made unimportable, when not loaded yet.

    ``model_explorer`` imports torch (for its PyTorch adapter) and IPython (for notebooks)
    if they are installed; accdbg uses neither here, and they cost about 2 s and 150 MB.
    """
    blocked = [m for m in modules if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in blocked:
            if sys.modules.get(m) is None:
                sys.modules.pop(m, None)


def _builder():
    try:
        with _without(("torch", "IPython")):
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
    ids map to themselves)."""
    try:
        with _without(("torch", "IPython")):
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
    producers: dict[str, str] = {}
    for node in main.nodes:
        if node.label == "Output":  # a graph output's own node: its producer comes first
            continue
        for meta in node.outputsMetadata:
            for attr in meta.attrs:
                if attr.key == "__tensor_tag" and attr.value != "None":
                    producers.setdefault(attr.value, node.id)
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
    temporary name), for the command that opens the overlays.
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
    out = Overlays(folder, Path(source_model).absolute(), graph, unmatched=unmatched)

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
        values: dict[str, float] = {}
        for node, v in zip(nodes, table[label], strict=True):
            v = _finite(v)
            if node is None or v is None:
                continue
            old = values.get(node)
            worse = old is None or (v < old if score.higher_is_better else v > old)
            values[node] = v if worse else old
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
        results = {}
        ranks = pd.to_numeric(table[rank_col], errors="coerce").astype("float64")
        causes = table[cause_col] if cause_col in table.columns else [""] * len(table)
        for row, node, rank, cause in zip(rows, nodes, ranks, causes, strict=True):
            if node is None:
                continue
            cause = cause if isinstance(cause, str) else ""
            if math.isfinite(rank):
                r = int(rank)
                culprits[str(row[name_col])] = f"#{r}" + (f": {cause}" if cause else "")
                results[node] = nb.NodeDataResult(
                    value=f"#{r}: {cause}" if cause else f"#{r}",
                    bgColor=RANK_COLORS[min(r, len(RANK_COLORS)) - 1],
                    textColor=WHITE,
                )
            elif node not in results:
                results[node] = nb.NodeDataResult(value=cause or "not a culprit")
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


QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def cpu_marks(partitioning: str | Path, qdq_model: str | Path) -> dict[tuple[str, ...], str]:
    """{candidate names: why the layer ran on the CPU} from an engine run's
    ``partitioning.json``.

    Its node names are the QDQ model's. A Q/DQ node on the CPU belongs to the layer whose
    output it (de)quantizes: the names met walking back to that layer's node (the DQ's
    output, which is the original name of a graph output, the Q's input, the node's own
    output and name) are the candidates, tried in order on the source model.
    """
    import onnx

    from accdbg.core.jsonio import read_json

    info = read_json(partitioning, "partitioning.json")
    try:
        model = onnx.load(str(qdq_model), load_external_data=False)
    except Exception as exc:
        raise AccdbgError(f"cannot read the QDQ model {str(qdq_model)!r}: {exc}") from None
    nodes = {n.name: n for n in model.graph.node if n.name}
    producer = {o: n for n in model.graph.node for o in n.output}
    out: dict[tuple[str, ...], list[str]] = {}
    for rec in info.get("cpu_nodes", []):
        node = nodes.get(rec.get("name", ""))
        if node is None or not node.output:
            continue
        what = rec.get("type") or node.op_type
        names = [node.output[0]]
        for _ in range(4):
            if node is None or node.op_type not in QDQ_OPS or not node.input:
                break
            what = f"its {rec.get('type') or node.op_type}"
            names.append(node.input[0])
            node = producer.get(node.input[0])
        if node is not None:
            names += [*node.output[:1], node.name]
        key = tuple(dict.fromkeys(n for n in names if n))
        out.setdefault(key, []).append(f"{what}: {rec.get('reason', '')}".rstrip(": "))
    return {k: "; ".join(v) for k, v in out.items()}


def engine_model(engine_run: str | Path | None) -> tuple[Path | None, Path | None]:
    """The model an engine run started from (its ``-m``: the float or converted ONNX
    model) and its QDQ model, from the files it wrote; None for what it does not say."""
    if engine_run is None:
        return None, None
    engine_run = Path(engine_run)
    model = None
    options = engine_run / "inference_engine_options.json"
    if options.is_file():
        from accdbg.core.jsonio import read_json

        data = read_json(options, "inference_engine_options.json")
        path = data.get("model_path") if data.get("stage", "source") != "compiled" else None
        model = Path(path) if path and Path(path).is_file() else None
    qdq = sorted(engine_run.glob("*.qdq.onnx"))
    return model, (qdq[0] if len(qdq) == 1 else None)


def _mark_text(label: str, detail: str) -> str:
    """``culprit #1: weight range ...``, ``on CPU: Softmax: QNN's reason``."""
    if not detail:
        return label
    return f"{label} {detail}" if detail.startswith("#") else f"{label}: {detail}"


def overlay_run(
    run_dir: str | Path,
    pages: Sequence[str | Path],
    source_model: str | Path | None,
    table: pd.DataFrame,
    name_col: str,
    scores: Mapping[str, Score],
    **kwargs: Any,
) -> Overlays | None:
    """:func:`write_overlays` for a finished run, linked from its report ``pages``.

    The overlays are a view: a model the adapter cannot read or no source model is a
    warning, never a failed run.
    """
    if source_model is None:
        log.info("model explorer overlays: no source ONNX model known for %s; skipped", run_dir)
        return None
    try:
        overlays = write_overlays(run_dir, source_model, table, name_col, scores, **kwargs)
    except AccdbgError as exc:
        log.warning("model explorer overlays not written: %s", exc)
        return None
    for page in pages:
        if Path(page).is_file():
            add_links(page, overlays)
    return overlays


def view_command(run_dir: str | Path) -> str:
    return f"qnn-accuracy-debugger --model_explorer_view {Path(run_dir).absolute()}"


def read_overlays(run_dir: str | Path) -> Overlays:
    """The overlays of a run folder (or of its ``model_explorer/`` folder)."""
    run_dir = Path(run_dir)
    for folder in (run_dir / DIRNAME, run_dir):
        path = folder / MANIFEST
        if path.is_file():
            break
    else:
        raise AccdbgError(
            f"--model_explorer_view {str(run_dir)!r}: no {DIRNAME}/{MANIFEST} there; expected a "
            "verification, oneshot or snooping run folder written with --model_explorer"
        )
    from accdbg.core.jsonio import read_json

    data = read_json(path, "Model Explorer overlays")
    model = Path(data["model"])
    if not model.is_file():
        raise AccdbgError(f"{path}: its model {str(model)!r} is gone")
    files = [f for f in data["files"] if (folder / f["file"]).is_file()]
    return Overlays(folder, model, data["graph"], files, data.get("unmatched", []))


def links_html(overlays: Overlays, page_dir: str | Path) -> str:
    """The report's section: each file linked (relative to the page) and the one command
    that opens them on the graph."""
    rel = Path(overlays.folder).relative_to(Path(page_dir))
    items = ", ".join(
        f'<a href="{escape((rel / f["file"]).as_posix())}">{escape(f["name"])}</a>'
        for f in overlays.files
    )
    cmd = view_command(overlays.final_dir or overlays.folder.parent)
    return (
        '<section class="model-explorer" id="model-explorer"><h2>On the graph</h2>'
        f"<p>Model Explorer overlays of {escape(overlays.model.name)}: {items}. Open them on "
        f"the model (local server, offline):</p><pre><code>{escape(cmd)}</code></pre></section>"
    )


def add_links(page: str | Path, overlays: Overlays) -> None:
    """Put :func:`links_html` into a written report page: before the chart when there is
    one (after the findings), else after the title."""
    page = Path(page)
    text = page.read_text(encoding="utf-8")
    text = re.sub(r'<section class="model-explorer".*?</section>', "", text, flags=re.S)
    section = links_html(overlays, page.parent)
    for anchor, before in (('<section class="chart">', True), ("</h1>", False)):
        if anchor in text:
            i = text.index(anchor) + (0 if before else len(anchor))
            text = text[:i] + section + text[i:]
            break
    from accdbg.core.run_dir import write_bytes_atomic

    write_bytes_atomic(page, text.encode("utf-8"))


def serve(
    run_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, open_browser: bool = True
) -> None:
    """Model Explorer on the run's source model with its overlays, until Ctrl-C.

    The server serves its own bundled web app (no CDN); its check for a newer release on
    PyPI and GitHub is turned off, so nothing leaves the machine.
    """
    overlays = read_overlays(run_dir)
    if port != 8080 and _in_use(host, port):  # 8080: Model Explorer finds a free port itself
        raise AccdbgError(
            f"--port {port} is already in use on {host}; choose another, or leave the default "
            "(8080 takes the first free port from 8080 to 8099)"
        )
    with _without(("torch", "IPython")):
        import model_explorer
        from model_explorer import server

    server._check_new_version = _offline_version  # type: ignore[attr-defined]
    config = model_explorer.config()
    config.add_model_from_path(str(overlays.model), adapterId=ADAPTER_ID)
    for path in overlays.paths:
        config.add_node_data_from_path(str(path))
    log.info(
        "Model Explorer: %s with %d overlay(s): %s",
        overlays.model,
        len(overlays.files),
        ", ".join(f["name"] for f in overlays.files),
    )
    model_explorer.visualize_from_config(
        config, host=host, port=port, extensions=[ADAPTER], no_open_in_browser=not open_browser
    )


def _in_use(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) == 0


def _offline_version(print_msg: bool = True) -> dict[str, str]:
    return {"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}
