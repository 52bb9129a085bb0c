"""Binary snooping: halve the op list until the quantization error is pinned to a few ops.

The whole quantized model is scored at its outputs against the float golden - an output a
Softmax/Sigmoid makes at its logits, as the culprit ranking judges it (a saturated classifier
turns most of its error into the same probabilities). The op list
(every computing node of the QDQ model in topological order) is split at its midpoint; for
each half a model is built in which only that half is quantized (:mod:`~accdbg.algorithms.mixed`:
the other half gets its float weights back and loses its Q/DQ pairs) and scored the same way,
on QNN HTP - the float half runs there in fp16 (``enable_htp_fp16_precision``), and whatever
QNN leaves to the CPU is counted per model. A half whose score (output error: MSE, or the
noise-to-signal power 10^(-SQNR/10) with ``sqnr``) exceeds ``subgraph_relative_weight`` x the
sum of both halves' is searched further, down to ``min_graph_size`` ops. One QNN session per
model: about 2·log2(N / min_graph_size) + 1 for one culprit instead of N.

Every scored subgraph is journalled (:mod:`~accdbg.algorithms.checkpoint`): a killed run is
taken up again with the same ``--output_dirname`` and only the unscored models run.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.algorithms import checkpoint
from accdbg.algorithms.backend import Backend, PartRun, failure_status
from accdbg.algorithms.checkpoint import Journal
from accdbg.algorithms.diagnosis.evidence import SAME_VALUES
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.sensitivity import exposing, judged_at
from accdbg.algorithms.fragments import QDQ_OPS, Part, QdqModel
from accdbg.algorithms.golden import Golden, GoldenError
from accdbg.algorithms.mixed import FloatModel, op_list, partly_quantized
from accdbg.algorithms.protocol import Algorithm, AlgorithmRequest, AlgorithmResult, register
from accdbg.algorithms.snooping import OPTION_KEYS, SnoopArgs, check_request, set_up
from accdbg.core import onnx_model as om
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.core.progress import progress
from accdbg.core.run_dir import write_json_atomic
from accdbg.core.shares import share_words
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.snooping")

VERIFIERS = {"mse": "MSE", "sqnr": "SQNR"}
DEFAULT_WEIGHT = 0.4
DEFAULT_MIN_SIZE = 16
STEM = "binary_snooping"


@dataclass
class Subgraph:
    """A contiguous range ``[first, last)`` of the op list, quantized alone."""

    id: int
    first: int
    last: int
    parent: int | None
    depth: int
    score: float = math.nan  # output error (MSE, or noise-to-signal power for sqnr)
    sqnr_db: float = math.nan
    mse: float = math.nan
    relative: float = math.nan  # score over the sum of both halves' scores
    decision: str = ""  # whole | recurse | dropped | leaf | split
    status: str = ""  # "" or the err_* status of a model the backend refused
    sessions: int = 0
    cpu_ops: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.last - self.first

    @property
    def key(self) -> str:
        return f"{self.first}:{self.last}"


@dataclass
class BinaryResult:
    """A binary snooping run: per-layer report (``culprit_rank``), subgraphs, iterations."""

    run_dir: Path
    report: pd.DataFrame  # one row per layer output (``O/P Name``)
    subgraphs: pd.DataFrame
    iterations: pd.DataFrame
    sessions: int
    seconds: float = 0.0
    csv: Path | None = None
    html: Path | None = None
    json: Path | None = None
    findings: list[str] = field(default_factory=list)
    new_sessions: int = 0  # created by this call (a resumed run reuses the journalled scores)


def judged_tensors(qdq: QdqModel, golden: set[str]) -> list[str]:
    """The float tensors the search scores, one per model output: the output itself, or the
    logits of a Softmax/Sigmoid (:func:`~accdbg.algorithms.diagnosis.sensitivity.scores`) when the golden
    has them - followed back through reshapes the pre-processing added until it does."""
    out = []
    for output, at in zip(qdq.graph_outputs, judged_at(qdq.model), strict=True):
        t = qdq.float_source(at)
        while t not in golden and not set(qdq.aliases(t)) & golden and t in qdq.producer:
            node = qdq.nodes[qdq.producer[t]]
            if node.op_type not in SAME_VALUES:
                break
            t = qdq.float_source(node.input[0])
        has = t in golden or set(qdq.aliases(t)) & golden
        out.append(t if has and t != qdq.float_source(output) else output)
    return out


def check_binary_options(verifier: str, weight: float, min_size: int) -> str:
    """The verifier's report label; one-line errors for bad values."""
    key = str(verifier).strip().lower()
    if key not in VERIFIERS:
        raise AccdbgError(
            f"--verifier {verifier!r} is not known for binary snooping; expected mse or sqnr"
        )
    if not (isinstance(weight, int | float) and 0.0 < float(weight) < 1.0):
        raise AccdbgError(
            f"--subgraph_relative_weight {weight!r} must be a number between 0 and 1 (default 0.4)"
        )
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise AccdbgError(f"--min_graph_size {min_size!r} must be a whole number >= 1 (default 16)")
    return VERIFIERS[key]


FP16_MAX = 65504.0
FP16_OVERFLOW = (
    "the float part overflowed fp16 (outputs at its limit, 65504, or not finite, where float "
    "stays far under it): this score is fp16's as much as these ops' quantization"
)


def fp16_overflowed(golden: Sequence[np.ndarray], target: Sequence[np.ndarray]) -> bool:
    """Outputs at fp16's limit (or not finite) where the float outputs stay under half of it:
    the fp16 float part overflowed - a quantized variance rounded to 0 makes an Rsqrt's output
    exceed fp16 there while the quantized model's own encoding would clamp it."""
    for g, t in zip(golden, target, strict=True):
        big = np.abs(np.asarray(t, np.float64))
        if np.abs(np.asarray(g, np.float64)).max(initial=0.0) < FP16_MAX / 2 and (
            not np.isfinite(big).all() or big.max(initial=0.0) >= FP16_MAX
        ):
            return True
    return False


def output_error(golden: Sequence[np.ndarray], target: Sequence[np.ndarray]) -> tuple[float, float]:
    """(MSE, noise-to-signal power) over all outputs together."""
    noise = power = 0.0
    count = 0
    for g, t in zip(golden, target, strict=True):
        d = np.asarray(g, np.float64).ravel() - np.asarray(t, np.float64).ravel()
        noise += float(d @ d)
        gg = np.asarray(g, np.float64).ravel()
        power += float(gg @ gg)
        count += d.size
    mse = noise / max(count, 1)
    nsr = noise / power if power > 0 else (0.0 if noise == 0 else math.inf)
    return mse, nsr


class _Search:
    """The models of one run, their scores (journalled) and the halving."""

    def __init__(self, qdq, golden, backend, journal, label, weight, min_size, weights, workers):
        self.qdq, self.golden, self.backend, self.journal = qdq, golden, backend, journal
        self.label, self.weight, self.min_size = label, weight, min_size
        self.weights, self.workers = weights, workers
        self.ops = op_list(qdq)
        self.subgraphs: list[Subgraph] = []
        self.iterations: list[dict[str, Any]] = []
        self.outputs = list(qdq.graph_outputs)
        self.judged = judged_tensors(qdq, set(golden.folder.names()))
        # a record scored at other tensors (a journal an older version wrote) is scored again
        self.done = {
            r["key"]: r
            for r in journal.of_kind("subgraph")
            if r.get("judged", self.outputs) == self.judged
        }
        self.resumed = len(self.done)
        self._golden_out = [
            np.asarray(golden.load(o, qdq.shape(o), *qdq.aliases(o)), np.float64)
            for o in self.judged
        ]

    def new(self, first: int, last: int, parent: Subgraph | None) -> Subgraph:
        sg = Subgraph(
            len(self.subgraphs),
            first,
            last,
            parent.id if parent else None,
            parent.depth + 1 if parent else 0,
        )
        self.subgraphs.append(sg)
        return sg

    def _feeds(self) -> dict:
        return {
            name: self.golden.feed(name, self.qdq.shape(name), self.qdq.dtype(name))
            for name in self.qdq.graph_inputs
        }

    def score(self, subs: list[Subgraph]) -> None:
        """Score the subgraphs not in the journal, ``workers`` sessions at a time."""
        todo = []
        for sg in subs:
            rec = self.done.get(sg.key)
            if rec is not None:
                self._fill(sg, rec)
            else:
                todo.append(sg)

        def runs() -> Iterator[PartRun]:  # built as workers free up, not all at once
            for sg in todo:
                quantized = set(self.ops[sg.first : sg.last])
                model, notes = partly_quantized(self.qdq, quantized, self.weights)
                # a judged tensor is read after its Q/DQ pair where its producer is quantized
                model, names = exposing(model, self.judged)
                part = Part(model, {x: x for x in self.qdq.graph_inputs}, {}, names)
                label = f"subgraph_{sg.first:05d}_{sg.last:05d}"
                yield PartRun((sg, notes, names), part, self._feeds(), names, label)

        if todo:
            # each model logs its line as it is scored
            models = self.backend.run_many(runs())
            scored = progress(models, "binary snooping", len(todo), "models", line=False)
            for (sg, notes, names), report, values in scored:
                rec: dict[str, Any] = {
                    "kind": "subgraph",
                    "key": sg.key,
                    "judged": self.judged,
                    "sessions": report.sessions,
                    "notes": notes,
                    "cpu_ops": sorted({f"{op}:{name}" for op, name in report.cpu_nodes}),
                }
                if report.ok:
                    got = [values[o] for o in names]
                    mse, nsr = output_error(self._golden_out, got)
                    rec.update(mse=mse, nsr=nsr, status="")
                    if fp16_overflowed(self._golden_out, got):
                        rec["notes"] = [*notes, FP16_OVERFLOW]
                else:
                    rec.update(
                        mse="nan",
                        nsr="nan",
                        status=failure_status(report),
                        error=report.error.splitlines()[0] if report.error else "",
                    )
                self.journal.append(rec)
                self.done[sg.key] = rec
                self._fill(sg, rec)
                log.info(
                    "binary: ops %d-%d (%d) quantized alone: %s = %s",
                    sg.first,
                    sg.last - 1,
                    sg.size,
                    self.label,
                    f"{sg.sqnr_db:.2f} dB" if self.label == "SQNR" else f"{sg.mse:.4g}",
                )

    def _fill(self, sg: Subgraph, rec: dict) -> None:
        sg.mse, nsr = float(rec["mse"]), float(rec["nsr"])
        sg.score = nsr if self.label == "SQNR" else sg.mse
        sg.sqnr_db = -10 * math.log10(nsr) if nsr > 0 else math.inf
        sg.status = rec.get("status", "")
        if sg.status:
            sg.notes = [f"{sg.status}: {rec.get('error', '')}"]
        else:
            sg.notes = list(rec.get("notes", []))
        sg.sessions = int(rec.get("sessions", 0))
        # Q/DQ at the graph's edges may stay on the CPU; what matters is where ops compute
        sg.cpu_ops = [op for op in rec.get("cpu_ops", []) if op.split(":", 1)[0] not in QDQ_OPS]

    def run(self) -> None:
        whole = self.new(0, len(self.ops), None)
        whole.decision = "whole"
        self.score([whole])
        if whole.status:
            raise AccdbgError(
                f"the whole quantized model does not run on the backend: {whole.notes[0]}"
            )
        frontier = [whole] if whole.score > 0 else []
        if not frontier:
            whole.decision = "leaf"
        while frontier:
            pairs = []
            for sg in frontier:
                if sg.size <= self.min_size:
                    sg.decision = "leaf"
                    continue
                mid = sg.first + sg.size // 2
                pairs.append((sg, self.new(sg.first, mid, sg), self.new(mid, sg.last, sg)))
            if not pairs:
                break
            self.score([h for _, a, b in pairs for h in (a, b)])
            chosen = []
            for sg, a, b in pairs:
                scores = [h.score if math.isfinite(h.score) else 0.0 for h in (a, b)]
                total = sum(scores)
                picked = []
                for h, s in zip((a, b), scores, strict=True):
                    h.relative = s / total if total > 0 else math.nan
                    if total > 0 and s > self.weight * total and not h.status:
                        h.decision = "recurse"
                        picked.append(h)
                    else:
                        h.decision = "dropped"
                # no half carries the error alone (it comes from their interaction): stop here
                sg.decision = "split" if picked else "leaf"
                chosen += picked
            self.iterations.append(
                {
                    "iteration": len(self.iterations) + 1,
                    "scored": [h.id for _, a, b in pairs for h in (a, b)],
                    "recurse": [h.id for h in chosen],
                    "sessions": sum(h.sessions for _, a, b in pairs for h in (a, b)),
                }
            )
            frontier = chosen

    def leaves(self) -> list[Subgraph]:
        out = [sg for sg in self.subgraphs if sg.decision == "leaf"]
        return sorted(out, key=lambda sg: -(sg.score if math.isfinite(sg.score) else -1))


def _layer_table(
    search: _Search, leaves: list[Subgraph], causes: dict[int, str], nsr: dict[str, float]
) -> pd.DataFrame:
    """One row per layer output: the smallest searched subgraph holding it, and its rank
    (the ranked leaves in order; inside a leaf, worst local evidence first)."""
    from accdbg.algorithms.diagnosis.local import local_text, worst_first

    position = {node: i for i, node in enumerate(search.ops)}
    rank: dict[str, tuple[int, str]] = {}
    for sg in leaves:
        names = [layer.name for layer in _layers(search, sg)]
        for name in worst_first(names, nsr):
            rank[name] = (len(rank) + 1, causes[sg.id] + local_text(name, nsr))
    rows = []
    for layer in search.qdq.layers:
        p = position.get(layer.node_index)
        holding = [sg for sg in search.subgraphs if p is not None and sg.first <= p < sg.last]
        deepest = max(
            (sg for sg in holding if sg.decision != "dropped" or sg.depth == 0),
            key=lambda sg: sg.depth,
            default=None,
        )
        r, cause = rank.get(layer.name, (None, ""))
        rows.append(
            {
                "O/P Name": layer.name,
                "Layer Type": layer.op_type,
                "Op": p,
                "Subgraph": deepest.id if deepest else None,
                "culprit_rank": r,
                "cause": cause,
            }
        )
    df = pd.DataFrame(
        rows, columns=["O/P Name", "Layer Type", "Op", "Subgraph", "culprit_rank", "cause"]
    )
    df["culprit_rank"] = pd.to_numeric(df["culprit_rank"]).astype("Int64")
    return df


def _layers(search: _Search, sg: Subgraph) -> list:
    nodes = set(search.ops[sg.first : sg.last])
    return [layer for layer in search.qdq.layers if layer.node_index in nodes]


def _describe(search: _Search, sg: Subgraph) -> str:
    layers = _layers(search, sg)
    if len(layers) == 1:
        return f"{layers[0].name} ({layers[0].op_type})"
    names = f"{layers[0].name} .. {layers[-1].name}" if layers else "no reported layer"
    return f"ops {sg.first}-{sg.last - 1} ({sg.size} ops; layers {names})"


def _judged_text(search: _Search) -> str:
    """Which outputs are scored at their logits, if any."""
    at = [
        f"{o} at its logits {j}"
        for o, j in zip(search.outputs, search.judged, strict=True)
        if o != j
    ]
    return f", {', '.join(at)}" if at else ""


def _times(share: float) -> str:
    """A share of the whole model's error (:func:`~accdbg.core.shares.share_words`)."""
    return f"{share_words(share)} of"


def _score_text(label: str, sg: Subgraph) -> str:
    return f"SQNR {sg.sqnr_db:.2f} dB" if label == "SQNR" else f"MSE {sg.mse:.4g}"


def run_binary(
    model_path: str | os.PathLike,
    input_tensors: Sequence[InputTensor] = (),
    input_list: str | os.PathLike | None = None,
    golden_dir: str | os.PathLike | None = None,
    qdq_model: str | os.PathLike | None = None,
    verifier: str = "mse",
    subgraph_relative_weight: float = DEFAULT_WEIGHT,
    min_graph_size: int = DEFAULT_MIN_SIZE,
    engine_kwargs: dict | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    workers: int | None = None,
    allow_nonfinite_inputs: bool = False,
    model_explorer: bool = True,
    executor: ExecutorConfig | None = None,
) -> BinaryResult:
    """Binary snooping; writes ``<working_dir>/binary_snooping/<run>/binary_snooping.{csv,json,html}``.

    Arguments as :func:`accdbg.algorithms.layerwise.run_layerwise`, plus ``verifier`` (mse or
    sqnr), ``subgraph_relative_weight`` and ``min_graph_size`` (see the module). With
    ``model_explorer``, Model Explorer overlays of the per-layer ranking, the subgraphs the
    search ended on marked, go to ``model_explorer/`` on ``model_path``'s graph. ``executor``:
    where the models of each step run, as in :func:`~accdbg.algorithms.layerwise.run_layerwise`.
    """
    t0 = time.perf_counter()
    label = check_binary_options(verifier, subgraph_relative_weight, min_graph_size)
    req = check_request(
        "binary",
        SnoopArgs(
            model_path,
            input_tensors,
            input_list,
            golden_dir,
            qdq_model,
            [label],
            None,
            None,
            engine_kwargs,
            working_dir,
            output_dirname,
            1024,
            workers,
            False,
            allow_nonfinite_inputs,
            executor=executor,
        ),
    )
    req.record.update(
        verifier=label.lower(),
        subgraph_relative_weight=float(subgraph_relative_weight),
        min_graph_size=int(min_graph_size),
    )
    keys = [*OPTION_KEYS.split(), "verifier", "subgraph_relative_weight", "min_graph_size"]
    with checkpoint.open_run(working_dir, STEM, output_dirname) as run:
        options = run.path / f"{STEM}_options.json"
        checkpoint.check_options(options, req.record, keys)
        if not options.exists():
            run.write_options(req.record)
        journal = Journal(run.path / checkpoint.JOURNAL)
        golden_root, qdq_path = set_up(req, run.path, journal, working_dir)
        scratch = run.path / ".scratch"
        golden = Golden(golden_root, req.inputs, scratch)
        qdq = QdqModel.load(qdq_path, set(golden.folder.names()))
        from accdbg.algorithms.diagnosis.culprits import prepared_model

        prepared = prepared_model(qdq_path)
        weights = FloatModel(om.load_model(prepared) if prepared.is_file() else None)
        # the float half runs in fp16 on HTP (QNN leaves float ops to the CPU otherwise)
        options_fp16 = replace(req.options, precision="fp16")
        backend = Backend(
            req.engine,
            options_fp16,
            scratch,
            run.path / "backend_logs",
            shown_logs=run.final_path / "backend_logs",
            executor=executor,
            workers=workers,
        )
        try:
            search = _Search(
                qdq,
                golden,
                backend,
                journal,
                label,
                float(subgraph_relative_weight),
                int(min_graph_size),
                weights,
                backend.workers,
            )
        except GoldenError as exc:
            raise AccdbgError(f"binary snooping needs the golden model outputs: {exc}") from None
        if search.resumed:
            log.info("binary: resuming %s: %d model(s) already scored", run.path, search.resumed)
        try:
            search.run()
        finally:  # the worker processes stop with the search, however it ended
            backend.close()
        result = _write(search, run.path, req, label, golden_root, qdq_path, prepared.is_file())
        journal.append({"kind": "done", "sessions": backend.sessions})
        if model_explorer:
            _overlays(search, result, req.model_path, run.path, run.final_path)
        shutil.rmtree(scratch, ignore_errors=True)
    result.run_dir = run.path
    result.csv = run.path / result.csv.name
    result.html = run.path / result.html.name
    result.json = run.path / result.json.name
    result.seconds = time.perf_counter() - t0
    result.new_sessions = backend.sessions
    for line in result.findings:
        log.info("%s", line)
    log.info(
        "binary: %d model(s) scored, %d session(s) this call, in %.1f s -> %s",
        len(search.subgraphs),
        backend.sessions,
        result.seconds,
        run.path,
    )
    return result


def _overlays(
    search: _Search, result: BinaryResult, model: Path, folder: Path, final: Path
) -> None:
    """Model Explorer overlays of the per-layer table on the model given: the culprit
    ranking, and every layer of a subgraph the search ended on (a leaf) marked."""
    from accdbg.reports.model_explorer import overlay_run

    ended: dict[str, str] = {}
    leaves = [sg for sg in search.subgraphs if sg.decision == "leaf" and sg.id != 0]
    for sg in leaves:
        for layer in _layers(search, sg):
            ended[layer.name] = (
                f"subgraph {sg.id}, ops {sg.first}-{sg.last - 1}: {_score_text(search.label, sg)}"
            )
    overlay_run(
        folder,
        [folder / result.html.name],
        model,
        result.report,
        "O/P Name",
        {},
        marks={"search ended here": ended},
        final_dir=final,
    )


def _write(
    search: _Search,
    folder: Path,
    req,
    label: str,
    golden_root: Path,
    qdq_path: Path,
    have_float: bool,
) -> BinaryResult:
    from accdbg.reports.html_report import findings_html
    from accdbg.reports.summary import html_table, write_csv, write_html

    whole = search.subgraphs[0]
    leaves = [sg for sg in search.leaves() if sg.id != 0 or sg.score > 0]
    shares = {sg.id: sg.score / whole.score if whole.score > 0 else math.nan for sg in leaves}
    # a subgraph is a culprit when quantizing it alone costs half the whole model's error, as
    # a layer is in the culprit ranking; the search ends on smaller and smaller parts of a
    # diffuse error too
    culprits = [sg for sg in leaves if sg.id != 0 and shares[sg.id] >= POLICY.share]
    ranks = {sg.id: i + 1 for i, sg in enumerate(culprits)}
    causes = {}
    for sg in leaves:
        share = shares[sg.id]
        causes[sg.id] = (
            f"quantizing only these {sg.size} op(s) gives {_score_text(label, sg)} at the outputs, "
            f"{_times(share)} the whole model's error ({_score_text(label, whole)})"
            + (f"; {FP16_OVERFLOW}" if FP16_OVERFLOW in sg.notes else "")
        )
    from accdbg.algorithms.diagnosis.culprits import prepared_model
    from accdbg.algorithms.diagnosis.local import local_nsr

    ranked = [sg for sg in leaves if sg.id in ranks]
    nsr = local_nsr(
        search.qdq,
        golden_root,
        [layer for sg in ranked for layer in _layers(search, sg)],
        prepared_model(qdq_path),
        {t.name: t.load() for t in req.inputs},
    )
    layers = _layer_table(search, ranked, causes, nsr)
    sessions = sum(sg.sessions for sg in search.subgraphs)
    cpu = sorted({op for sg in search.subgraphs for op in sg.cpu_ops})
    findings = _findings(search, label, leaves, ranks, shares, causes, layers, sessions, cpu)
    sub_rows = []
    for sg in search.subgraphs:
        sub_rows.append(
            {
                "Subgraph": sg.id,
                "Parent": sg.parent,
                "Iteration": sg.depth,
                "First op": sg.first,
                "Last op": sg.last - 1,
                "Ops": sg.size,
                "Layers": _describe(search, sg),
                label: sg.sqnr_db if label == "SQNR" else sg.mse,
                "Score": sg.score,
                "Relative weight": sg.relative,
                "Decision": sg.decision,
                "culprit_rank": ranks.get(sg.id),
                "cause": causes.get(sg.id, ""),
                "Status": sg.status,
                "Sessions": sg.sessions,
                "CPU ops": len(sg.cpu_ops),
                "Info": "; ".join(sg.notes),
            }
        )
    subs = pd.DataFrame(sub_rows)
    subs["culprit_rank"] = pd.to_numeric(subs["culprit_rank"]).astype("Int64")
    iters = pd.DataFrame(search.iterations, columns=["iteration", "scored", "recurse", "sessions"])
    csv = write_csv(subs, folder / f"{STEM}.csv")
    write_csv(layers, folder / f"{STEM}_layers.csv")
    json_path = folder / f"{STEM}.json"
    from accdbg.reports.summary import json_value

    write_json_atomic(
        json_path,
        {
            "verifier": label,
            "score": "MSE" if label == "MSE" else "noise-to-signal power 10^(-SQNR/10)",
            "subgraph_relative_weight": search.weight,
            "min_graph_size": search.min_size,
            "judged": dict(zip(search.outputs, search.judged, strict=True)),
            "ops": len(search.ops),
            "sessions": sessions,
            "float_part": "fp16 on QNN HTP (enable_htp_fp16_precision); ops QNN refuses on the CPU",
            "findings": findings,
            "iterations": search.iterations,
            "subgraphs": [{k: json_value(v) for k, v in r.items()} for r in sub_rows],
        },
    )
    notes = [
        f"QDQ model {qdq_path.name}; golden {golden_root}; {len(search.ops)} ops; verifier {label}; "
        f"subgraph_relative_weight {search.weight:g}; min_graph_size {search.min_size}",
        "Each model keeps the full model's encodings on one subgraph's ops only; the other ops "
        "compute in float (fp16 on QNN HTP)"
        + ("" if have_float else "; float weights were not found: dequantized weights used")
        + ". Score: the output error against the float golden "
        + ("(noise-to-signal power)" if label == "SQNR" else "(MSE)")
        + _judged_text(search)
        + ".",
        f"Cost: {sessions} QNN session(s) for {len(search.subgraphs)} models.",
    ]
    iters_html = "<h2>Iterations</h2>" + html_table(iters.astype(str))
    html = write_html(
        subs,
        folder / f"{STEM}.html",
        f"Binary snooping: {req.model_path.name}",
        notes,
        row_class=lambda i: "culprit" if pd.notna(subs["culprit_rank"].iloc[i]) else None,
        before=findings_html(findings)
        + "<h2>Ranked layers</h2>"
        + html_table(layers[layers["culprit_rank"].notna()].sort_values("culprit_rank"))
        + iters_html
        + "<h2>Subgraphs</h2>",
    )
    return BinaryResult(folder, layers, subs, iters, sessions, 0.0, csv, html, json_path, findings)


def _findings(search, label, leaves, ranks, shares, causes, layers, sessions, cpu) -> list[str]:
    """The culprits (the five first), or why none stands out, and what the search cost."""
    whole = search.subgraphs[0]
    findings = []
    if whole.score == 0:
        findings.append("the quantized model's outputs equal the float ones: nothing to search")
    for sg in leaves:
        if sg.id in ranks and ranks[sg.id] <= 5:
            inside = layers[layers["Subgraph"] == sg.id].sort_values("culprit_rank")
            order = (
                f"; by their own encodings, most likely first: {', '.join(inside['O/P Name'][:3])}"
                if len(inside) > 1
                else ""
            )
            findings.append(
                f"culprit #{ranks[sg.id]}: {_describe(search, sg)} - {causes[sg.id]}{order}"
            )
    if not ranks and whole.score > 0 and whole.size <= search.min_size:
        findings.append(
            f"the model has {whole.size} ops, no more than min_graph_size {search.min_size}: "
            f"nothing to split ({_score_text(label, whole)})"
        )
    elif not ranks and whole.score > 0 and not any(sg.id != 0 for sg in leaves):
        findings.append(
            f"no half carries the error alone: the whole model ({_score_text(label, whole)}) "
            "is not split further"
        )
    elif not ranks and whole.score > 0:
        top = max((sg for sg in leaves if sg.id != 0), key=lambda sg: shares[sg.id])
        findings.append(
            f"no part of the model stands out: quantized alone, no subgraph the search ended on "
            f"costs half of the whole model's error ({_score_text(label, whole)}); the most, "
            f"{_describe(search, top)}, {share_words(shares[top.id])}. The error is spread over the model: "
            "a global change (per-channel weights, 16-bit activations, calibration data) is the "
            "question, not a layer"
        )
    findings.append(
        f"cost: {len(search.subgraphs)} models, {sessions} QNN session(s); the float part ran in "
        f"fp16 on HTP" + (f", {len(cpu)} op(s) on the CPU" if cpu else ", nothing on the CPU")
    )
    return findings


@register("binary")
class Binary(Algorithm):
    """Binary snooping behind the protocol (:func:`run_binary`); its options ``verifier``,
    ``subgraph_relative_weight`` and ``min_graph_size``."""

    def check(self, req: AlgorithmRequest) -> None:
        from accdbg.algorithms.snooping import SnoopArgs, check_request

        o = req.options
        verifier = o.get("verifier", "mse")
        check_binary_options(
            verifier,
            o.get("subgraph_relative_weight", DEFAULT_WEIGHT),
            o.get("min_graph_size", DEFAULT_MIN_SIZE),
        )
        check_request(
            "binary",
            SnoopArgs(
                req.model_path,
                req.input_tensors,
                req.input_list,
                req.golden_dir,
                qdq_model=None,
                verifiers=[verifier.upper()],
                start_layer=None,
                end_layer=None,
                engine_kwargs=req.config,
                working_dir=req.working_dir,
                output_dirname=req.output_dirname,
                memory_budget_mb=0,
                workers=None,
                dump_qnn_json=False,
                allow_nonfinite_inputs=req.allow_nonfinite_inputs,
                model_explorer=req.model_explorer,
            ),
        )

    def run(self, req: AlgorithmRequest) -> AlgorithmResult:
        o = req.options
        res = run_binary(
            req.model_path,
            req.input_tensors,
            input_list=req.input_list,
            golden_dir=req.golden_dir,
            verifier=o.get("verifier", "mse"),
            subgraph_relative_weight=o.get("subgraph_relative_weight", DEFAULT_WEIGHT),
            min_graph_size=o.get("min_graph_size", DEFAULT_MIN_SIZE),
            engine_kwargs=req.config,
            working_dir=req.working_dir,
            output_dirname=req.output_dirname,
            allow_nonfinite_inputs=req.allow_nonfinite_inputs,
            model_explorer=req.model_explorer,
            executor=req.executor,
        )
        log.info("report: %s", res.html)
        return AlgorithmResult(self.name, res.run_dir, res.html, res.report, res.findings, [], res)
