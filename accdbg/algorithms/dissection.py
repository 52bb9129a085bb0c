"""Model dissection (the deep analyzer ``modelDissectionAnalyzer``): where the error at one
problem tensor comes from.

Starting from the problem tensor (the first layer output failing a verifier in a verification
run, or one named), a sub-model of the QDQ model is cut that ends at that tensor and starts
from golden tensors: iteration 1 is the problem layer alone (its inputs golden), each next
iteration moves every input one producer back (the producers join the sub-model, their own
inputs become golden), until the model inputs are reached, ``maximum_dissection_iterations``
is done, or (``auto_stop_iterations``) the score has not changed for that many iterations.
``partition_override`` gives the iterations' inputs by hand. Every sub-model runs on the
backend with its golden inputs, through the same Q/DQ as in the full model (cut with
:meth:`~accdbg.algorithms.fragments.QdqModel.between`, like layerwise snooping's fragments),
and all of them share one session (each iteration alone again if that fails).

The error an iteration *adds* (noise-to-signal power for SQNR and cosine) belongs to the nodes
that joined the sub-model in it; the iterations adding most are the "nodes that may be
sources of error", ranked.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.algorithms import checkpoint
from accdbg.algorithms.backend import Backend, failure_status
from accdbg.algorithms.checkpoint import Journal
from accdbg.algorithms.fragments import Layer, Part, QdqModel, SurgeryError, merge
from accdbg.algorithms.golden import Golden, GoldenError
from accdbg.algorithms.judging import Judge, finalize_row, judge_layer, restore_row
from accdbg.algorithms.snooping import find_layer, one_input_golden
from accdbg.algorithms.statuses import ERR_PART
from accdbg.core.inputs import InputTensor, parse_input_tensor
from accdbg.core.progress import Progress
from accdbg.core.shares import share_words
from accdbg.core.tensor_store import TensorWriter
from accdbg.engines.options import EngineConfig
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.dissection")

COMPONENT = "deep_analyzer"
ANALYZERS = ("modelDissectionAnalyzer",)
DEFAULT_ITERATIONS = 7
SHARE = 0.2  # an iteration adding this share of the largest error makes its nodes suspects
STILL = 0.01  # auto-stop: the error changed by less than this share of itself
MAX_SUSPECTS = 10


@dataclass
class Iteration:
    number: int
    inputs: list[str]  # float tensors of the QDQ model fed with golden values
    nodes: list[int]  # node indices (computing ops) of the sub-model
    added: list[int]  # nodes that joined in this iteration
    row: dict[str, Any] = field(default_factory=dict)  # judged like a layerwise row
    error: float = math.nan  # noise-to-signal power (or the verifier's own value)
    added_error: float = math.nan


@dataclass
class DissectionResult:
    run_dir: Path
    summary: pd.DataFrame  # one row per iteration: inputs, outputs, scores
    report: pd.DataFrame  # one row per node of the largest sub-model, with culprit_rank
    problem_tensor: str
    sessions: int
    seconds: float = 0.0
    csv: Path | None = None
    html: Path | None = None
    findings: list[str] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)


def first_failing(verification_dir: str | os.PathLike) -> str | None:
    """The first layer output (execution order) failing a verifier in a verification run."""
    path = Path(verification_dir) / "summary.csv"
    if not path.is_file():
        raise AccdbgError(
            f"--verification_results {str(verification_dir)!r} holds no summary.csv "
            "(a verification run folder was expected)"
        )
    df = pd.read_csv(path, keep_default_na=False)
    if "Name" not in df.columns or "Status" not in df.columns:
        raise AccdbgError(f"{path}: expected the columns Name and Status of a verification summary")
    failing = df[df["Status"].astype(str).str.startswith("fail")]
    return str(failing["Name"].iloc[0]) if len(failing) else None


def load_partitions(value: str | os.PathLike | list | None) -> list[list[str]] | None:
    """``--partition_override``: a JSON file (or text) holding a list of iterations, each the
    list of tensors fed with golden values (``{"partitions": [...]}`` also works)."""
    if value is None or isinstance(value, list):
        data = value
    else:
        text = str(value)
        p = Path(text).expanduser()
        try:
            data = json.loads(p.read_text(encoding="utf-8") if p.is_file() else text)
        except json.JSONDecodeError as exc:
            raise AccdbgError(
                f"--partition_override {text!r}: not a JSON file or JSON text ({exc.msg}, line {exc.lineno})"
            ) from None
    if isinstance(data, dict):
        data = data.get("partitions")
    if data is None:
        return None
    ok = (
        isinstance(data, list)
        and data
        and all(isinstance(p, list) and p and all(isinstance(t, str) for t in p) for p in data)
    )
    if not ok:
        raise AccdbgError(
            "--partition_override: expected a non-empty list of iterations, each a non-empty list of "
            'tensor names fed with golden values, e.g. [["conv3"], ["conv1", "input"]]'
        )
    return data


def check_dissection_options(
    maximum: int, auto_stop: int | None, partition_override
) -> list[list[str]] | None:
    """One-line errors for bad values; the partitions of ``partition_override``."""
    if isinstance(maximum, bool) or not isinstance(maximum, int) or maximum < 1:
        raise AccdbgError(
            f"--maximum_dissection_iterations {maximum!r} must be a whole number >= 1"
        )
    if auto_stop is not None and (
        isinstance(auto_stop, bool) or not isinstance(auto_stop, int) or auto_stop < 1
    ):
        raise AccdbgError(f"--auto_stop_iterations {auto_stop!r} must be a whole number >= 1")
    return load_partitions(partition_override)


class Cuts:
    """The sub-models, one per iteration, going backwards from the problem layer."""

    def __init__(self, qdq: QdqModel, problem: Layer):
        self.qdq, self.problem = qdq, problem

    def cone(self, inputs: Sequence[str]) -> list[int]:
        """The computing nodes between ``inputs`` and the problem layer."""
        stop, seen, todo = set(inputs), set(), [self.problem.node_index]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            for t in self.qdq.activation_inputs(self.qdq.nodes[i]):
                j = self.qdq.producer.get(t)
                if t not in stop and j is not None:
                    todo.append(j)
        return sorted(seen)

    def step(self, inputs: list[str]) -> list[str]:
        """Every input moved one producer back (model inputs stay)."""
        out: list[str] = []
        for t in inputs:
            j = self.qdq.producer.get(t)
            back = [t] if j is None else self.qdq.activation_inputs(self.qdq.nodes[j])
            out += [x for x in back if x not in out]
        return out

    def automatic(self, maximum: int) -> list[list[str]]:
        cuts = [list(self.problem.inputs)]
        while len(cuts) < maximum:
            nxt = self.step(cuts[-1])
            if set(nxt) == set(cuts[-1]):  # the model inputs: the whole cone is in
                break
            cuts.append(nxt)
        return cuts

    def resolve(self, names: Sequence[str], k: int) -> list[str]:
        out = []
        for name in names:
            t = name if name in self.qdq.values else None
            if t is None:
                t = next(
                    (
                        layer.exposed.qdq_tensor
                        for layer in self.qdq.layers
                        if name in (layer.name, layer.exposed.framework_name)
                    ),
                    None,
                )
            if t is None:
                raise AccdbgError(
                    f"--partition_override iteration {k}: {name!r} is not a tensor of the quantized model"
                )
            out.append(self.qdq.float_source(t))
        return out


def run_dissection(
    qdq_model: str | os.PathLike,
    golden_dir: str | os.PathLike,
    input_tensors: Sequence[InputTensor] = (),
    verification_dir: str | os.PathLike | None = None,
    problem_inference_tensor: str | None = None,
    verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    maximum_dissection_iterations: int = DEFAULT_ITERATIONS,
    auto_stop_iterations: int | None = None,
    partition_override: str | os.PathLike | list | None = None,
    engine_kwargs: EngineConfig | dict | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    model_explorer: bool = True,
) -> DissectionResult:
    """Dissect the model backwards from the problem tensor; writes
    ``<working_dir>/deep_analyzer/<run>/dissection_summary.{csv,html}``.

    ``qdq_model``: the QDQ model the inference engine ran (``<model>.qdq.onnx`` of its run);
    ``golden_dir``: a framework diagnosis run; ``verification_dir``: the verification run
    that names the problem tensor (unless ``problem_inference_tensor`` is given). With
    ``model_explorer``, Model Explorer overlays of ``dissection_nodes.csv`` (the error each
    node's iteration added, the suspects ranked, the problem tensor marked) go to
    ``model_explorer/`` on the model the engine run started from (else the QDQ model).
    """
    from accdbg.core.run_dir import RunDir, check_run_folder

    t0 = time.perf_counter()
    judge = Judge.from_specs(verifiers)
    partitions = check_dissection_options(
        maximum_dissection_iterations, auto_stop_iterations, partition_override
    )
    config = EngineConfig.coerce(engine_kwargs)
    config.check()
    engine, options = config.backend.engine, config.engine_options()
    qdq_path = Path(qdq_model).expanduser().absolute()
    if not qdq_path.is_file():
        raise AccdbgError(f"QDQ model {str(qdq_model)!r} does not exist")
    golden_root = Path(golden_dir).expanduser().absolute()
    if not golden_root.is_dir():
        raise AccdbgError(f"golden folder {str(golden_dir)!r} does not exist or is not a folder")
    golden_root = one_input_golden(golden_root, input_tensors)
    inputs = list(input_tensors) or recorded_input_tensors(golden_root, qdq_path)
    problem_name = problem_inference_tensor
    if problem_name is None:
        if verification_dir is None:
            raise AccdbgError(
                "give --problem_inference_tensor, or a verification run (--verification_results) "
                "whose first failing tensor is the problem"
            )
        problem_name = first_failing(verification_dir)
        if problem_name is None:
            raise AccdbgError(
                f"no tensor fails its verifier threshold in {str(verification_dir)!r}: "
                "nothing to dissect; name one with --problem_inference_tensor"
            )
    from accdbg.core.tensor_store import TensorFolder

    qdq = QdqModel.load(qdq_path, set(TensorFolder(golden_root).names()))
    problem = find_layer(qdq, problem_name, "--problem_inference_tensor")
    cuts = Cuts(qdq, problem)
    if partitions is not None:
        plan = [cuts.resolve(p, k + 1) for k, p in enumerate(partitions)]
        plan = plan[:maximum_dissection_iterations]
    else:
        plan = cuts.automatic(maximum_dissection_iterations)
    check_run_folder(working_dir, COMPONENT, output_dirname, resume=True)
    record = {
        "deep_analyzer": "modelDissectionAnalyzer",
        "qdq_model": str(qdq_path),
        "golden_dir": str(golden_root),
        "verification_dir": str(verification_dir) if verification_dir else None,
        "problem_inference_tensor": problem.name,
        "verifiers": [v.label for v in judge.verifiers.values()],
        "maximum_dissection_iterations": maximum_dissection_iterations,
        "auto_stop_iterations": auto_stop_iterations,
        "partitions": plan,
        "engine_kwargs": config.keywords(),
    }
    with RunDir(working_dir, COMPONENT, output_dirname, resume=output_dirname is not None) as run:
        opt_path = run.path / f"{COMPONENT}_options.json"
        checkpoint.check_options(opt_path, record, list(record))
        if not opt_path.exists():
            run.write_options(json.loads(json.dumps(record, default=str)))
        journal = Journal(run.path / checkpoint.JOURNAL)
        scratch = run.path / ".scratch"
        golden = Golden(golden_root, inputs, scratch)
        backend = Backend(engine, options, scratch, run.path / "backend_logs")
        iterations = []
        prev: set[int] = set()
        for k, cut in enumerate(plan, start=1):
            nodes = cuts.cone(cut)
            iterations.append(Iteration(k, cut, nodes, [i for i in nodes if i not in prev]))
            prev = set(nodes)
        done = {r["iteration"]: r for r in journal.of_kind("iteration")}
        for it in iterations:
            if it.number in done:
                it.row = restore_row(done[it.number]["row"], judge.labels)
        todo = [it for it in iterations if not it.row]
        bar = Progress(
            "model dissection",
            len(todo),
            "iterations",
            count=lambda: sum(1 for it in todo if it.row),  # _score judges them all at once
        )
        try:
            with bar:
                _score(todo, qdq, problem, golden, judge, backend, journal, run.path)
        finally:  # its worker process stops with the scoring, however it ended
            backend.close()
        kept = _auto_stop(iterations, judge, auto_stop_iterations)
        from accdbg.algorithms.diagnosis.culprits import prepared_model
        from accdbg.algorithms.diagnosis.local import local_nsr

        by_node = {layer.node_index: layer for layer in qdq.layers}
        joined = [by_node[i] for it in kept for i in it.added if i in by_node]
        nsr = local_nsr(
            qdq, golden_root, joined, prepared_model(qdq_path), {t.name: t.load() for t in inputs}
        )
        result = _report(kept, qdq, problem, judge, run.path, qdq_path, golden_root, backend, nsr)
        if model_explorer:
            _overlays(result, problem, qdq_path, run.path, run.final_path)
        shutil.rmtree(scratch, ignore_errors=True)
    result.run_dir = run.path
    result.csv = run.path / result.csv.name
    result.html = run.path / result.html.name
    result.seconds = time.perf_counter() - t0
    if result.suspects:
        log.info("nodes that may be sources of error: %s", ", ".join(result.suspects))
    for line in result.findings:
        log.info("%s", line)
    return result


class _Error:
    """``Error added`` (noise-to-signal power): lower is better."""

    higher_is_better = False


def _overlays(result: DissectionResult, problem: Layer, qdq_path: Path, folder, final) -> None:
    """Model Explorer overlays of the node table on the source model: the model the
    inference engine run (the QDQ model's folder) started from, else the QDQ model itself."""
    from accdbg.reports.model_explorer import engine_model, overlay_run

    source = engine_model(qdq_path.parent)[0] or qdq_path
    overlay_run(
        folder,
        [folder / result.html.name],
        source,
        result.report,
        "O/P Name",
        {"Error added": _Error()},
        marks={"problem tensor": {problem.name: f"dissected back from {problem.name}"}},
        final_dir=final,
    )


def recorded_input_tensors(golden_root: Path, qdq_path: Path) -> list[InputTensor]:
    """The model inputs a golden run was computed from (its manifest records the files)."""
    from accdbg.core import onnx_model as om
    from accdbg.core.provenance import recorded_inputs
    from accdbg.core.tensor_store import TensorFolder

    rec = recorded_inputs(TensorFolder(golden_root).meta) or {}
    model = om.load_model(qdq_path, "QDQ model")
    out = []
    for vi in om.real_inputs(model):
        if vi.name not in rec or not Path(rec[vi.name]["path"]).is_file():
            raise AccdbgError(
                f"the golden run {str(golden_root)!r} does not record the file of model input "
                f"{vi.name!r} (or it is gone): give it with -i/--input_tensor"
            )
        dims = ",".join(str(d) for d in om.dims_of(vi))
        dtype = np.dtype(om.elem_dtype(vi)).name
        out.append(parse_input_tensor([vi.name, dims, rec[vi.name]["path"], dtype]))
    return out


def _score(todo, qdq, problem, golden, judge, backend, journal, run_path: Path) -> None:
    """All iterations' sub-models in one session; each alone when that fails."""
    if not todo:
        return
    parts: dict[int, tuple[Part, dict]] = {}
    for it in todo:
        try:
            part = qdq.between(it.inputs, [problem], f"i{it.number}/")
            feeds = {
                name: golden.feed(t, qdq.shape(t), qdq.dtype(t), *qdq.aliases(t))
                for name, t in part.inputs.items()
            }
            parts[it.number] = (part, feeds)
        except (SurgeryError, GoldenError) as exc:
            _record(it, {**_error(problem, qdq, ERR_PART, str(exc))}, journal)
    groups = [list(parts)] if len(parts) > 1 else []
    groups += [[k] for k in parts]
    for group in groups:
        group = [k for k in group if not next(i for i in todo if i.number == k).row]
        if not group:
            continue
        merged = merge([parts[k][0] for k in group], qdq.model, "dissection")
        feeds = {n: f for k in group for n, f in parts[k][1].items()}
        report, values = backend.run(
            merged, feeds, list(merged.outputs), f"iterations_{'_'.join(map(str, group))}"
        )
        if not report.ok and len(group) > 1:
            log.info(
                "dissection: the iterations together failed (%s); one at a time",
                failure_status(report),
            )
            continue
        for k in group:
            it = next(i for i in todo if i.number == k)
            if not report.ok:
                _record(it, _error(problem, qdq, failure_status(report), report.error), journal)
                continue
            out = f"i{k}/{problem.output}"
            row = judge_layer(problem, values[out], golden, judge)
            w = TensorWriter(
                run_path / f"iteration_{k:02d}", meta={"component": COMPONENT, "iteration": k}
            )
            w.write(problem.name, problem.dequantize(values[out]), op_type=problem.op_type)
            w.save_manifest()
            _record(it, row, journal)


def _fails(row: dict) -> bool:
    return any(p is False for p in row.get("_passed", {}).values())


def _error(problem: Layer, qdq: QdqModel, status: str, message: str) -> dict:
    from accdbg.algorithms.judging import error_row

    return error_row(problem, status, message, qdq.shape(problem.exposed.qdq_tensor))


def _record(it: Iteration, row: dict, journal: Journal) -> None:
    it.row = row
    journal.append({"kind": "iteration", "iteration": it.number, "row": finalize_row(row)})


def _error_of(row: dict, judge: Judge) -> float:
    """The row's error on a linear scale: noise-to-signal power when a verifier measures it
    (exactly, as SQNR does, first)."""
    exact_first = sorted(judge.verifiers.items(), key=lambda kv: not kv[1].nsr_exact)
    for label, v in exact_first:
        value = row.get("_values", {}).get(label)
        if isinstance(value, int | float) and math.isfinite(value):
            nsr = v.noise_to_signal(float(value))
            if nsr is not None and math.isfinite(nsr):
                return float(nsr)
    for label, v in judge.verifiers.items():  # no noise measure: the distance from the ideal
        value = row.get("_values", {}).get(label)
        if isinstance(value, int | float) and math.isfinite(value) and v.ideal is not None:
            return abs(float(value) - v.ideal)
    return math.nan


def _auto_stop(iterations: list[Iteration], judge: Judge, patience: int | None) -> list[Iteration]:
    prev = 0.0
    still = 0
    for n, it in enumerate(iterations):
        it.error = _error_of(it.row, judge)
        it.added_error = it.error - prev if math.isfinite(it.error) else math.nan
        if patience and n and math.isfinite(it.error):
            still = still + 1 if abs(it.error - prev) <= STILL * max(abs(prev), 1e-12) else 0
            if still >= patience:
                return iterations[: n + 1]
        if math.isfinite(it.error):
            prev = it.error
    return iterations


def _report(iterations, qdq, problem, judge, folder, qdq_path, golden_root, backend, nsr):
    from accdbg.algorithms.diagnosis.local import local_text, worst_first
    from accdbg.reports.html_report import findings_html
    from accdbg.reports.summary import html_table, write_csv, write_html

    layer_of = {layer.node_index: layer for layer in qdq.layers}
    largest = max((it.error for it in iterations if math.isfinite(it.error)), default=math.nan)
    suspect_its = sorted(
        (
            it
            for it in iterations
            if math.isfinite(it.added_error) and largest > 0 and it.added_error >= SHARE * largest
        ),
        key=lambda it: -it.added_error,
    )
    ranked: list[tuple[int, Iteration]] = []
    for it in suspect_its:  # inside an iteration: what their own encodings destroy, worst first
        names = [layer_of[i].name for i in sorted(it.added) if i in layer_of]
        index = {layer_of[i].name: i for i in it.added if i in layer_of}
        ranked += [(index[name], it) for name in worst_first(names, nsr)]
    ranked = ranked[:MAX_SUSPECTS]
    rank_of = {i: r + 1 for r, (i, _) in enumerate(ranked)}

    def cause(it: Iteration) -> str:
        share = it.added_error / largest if largest > 0 else math.nan
        if it.number == 1 and len(it.added) == 1:
            return (
                f"the problem layer itself: fed golden inputs, it makes {share_words(share)} of the largest "
                f"error at {problem.name}"
            )
        return (
            f"joined the sub-model in iteration {it.number} with {len(it.added)} node(s): "
            f"the error at {problem.name} grew by {share_words(share)} of its largest"
        )

    rows = []
    for it in iterations:
        row = it.row
        rows.append(
            {
                "Iteration": it.number,
                "Inputs": json.dumps(it.inputs),
                "Outputs": json.dumps([problem.name]),
                "Nodes": len(it.nodes),
                "Added nodes": json.dumps(
                    [layer_of[i].name if i in layer_of else qdq.nodes[i].name for i in it.added]
                ),
                **{label: row.get(label, math.nan) for label in judge.labels},
                "Error (NSR)": it.error,
                "Error added": it.added_error,
                "culprit_rank": min((rank_of[i] for i in it.added if i in rank_of), default=None),
                "cause": cause(it) if it in suspect_its else "",
                "Status": row.get("Status", ""),
                "Info": row.get("Info", ""),
            }
        )
    summary = pd.DataFrame(rows)
    summary["culprit_rank"] = pd.to_numeric(summary["culprit_rank"]).astype("Int64")
    node_rows = []
    first_it = {}
    for it in iterations:
        for i in it.added:
            first_it.setdefault(i, it)
    for i in sorted(first_it, reverse=True):
        if i not in layer_of:
            continue
        it = first_it[i]
        node_rows.append(
            {
                "O/P Name": layer_of[i].name,
                "Layer Type": layer_of[i].op_type,
                "Iteration": it.number,
                "Error added": it.added_error,
                "culprit_rank": rank_of.get(i),
                "cause": cause(it) + local_text(layer_of[i].name, nsr) if i in rank_of else "",
            }
        )
    nodes = pd.DataFrame(
        node_rows,
        columns=["O/P Name", "Layer Type", "Iteration", "Error added", "culprit_rank", "cause"],
    )
    nodes["culprit_rank"] = pd.to_numeric(nodes["culprit_rank"]).astype("Int64")
    suspects = [layer_of[i].name for i, _ in ranked]
    findings = [
        f"culprit #{rank_of[i]}: {layer_of[i].name} ({layer_of[i].op_type}) - {cause(it)}"
        + local_text(layer_of[i].name, nsr)
        for i, it in ranked[:5]
    ]
    if not ranked:
        findings.append(
            f"no iteration adds error at {problem.name}: it comes from the problem layer's inputs as a whole"
        )
    last = iterations[-1] if iterations else None
    if last is not None and last.row:
        scores = ", ".join(
            f"{lab} {last.row.get(lab):.4g}"
            for lab in judge.labels
            if isinstance(last.row.get(lab), float)
        )
        findings.append(
            f"problem tensor {problem.name}: {len(iterations)} iteration(s), largest sub-model "
            f"{len(last.nodes)} node(s) ({scores}); {backend.sessions} QNN session(s) this run"
        )
    csv = write_csv(summary, folder / "dissection_summary.csv")
    write_csv(nodes, folder / "dissection_nodes.csv")
    for it in iterations:  # each iteration's verification, as a one-row summary
        sub = folder / f"iteration_{it.number:02d}"
        sub.mkdir(exist_ok=True)
        one = {
            "Name": problem.name,
            "LayerType": problem.op_type,
            "Tensor_dims": it.row.get("Shape"),
            **{label: it.row.get(label, math.nan) for label in judge.labels},
            "Status": it.row.get("Status") or ("fail" if _fails(it.row) else "ok"),
            "Info": it.row.get("Info", ""),
            "Golden inputs": json.dumps(it.inputs),
        }
        write_csv(pd.DataFrame([one]), sub / "summary.csv")
    notes = [
        f"QDQ model {qdq_path.name}; golden {golden_root}; problem tensor {problem.name}",
        "Each iteration runs the sub-model from its inputs (golden values, through the full model's "
        "Q/DQ) to the problem tensor on the backend. Error: noise-to-signal power at the problem "
        f"tensor; nodes joining in an iteration that adds >= {SHARE:.0%} of the largest error are suspects.",
    ]
    html = write_html(
        summary,
        folder / "dissection_summary.html",
        f"Model dissection: {problem.name}",
        notes,
        row_class=lambda i: "culprit" if pd.notna(summary["culprit_rank"].iloc[i]) else None,
        before=findings_html(findings)
        + (
            "<h2>Nodes that may be sources of error</h2>"
            + html_table(nodes[nodes["culprit_rank"].notna()])
            if suspects
            else ""
        )
        + "<h2>Iterations</h2>",
    )
    return DissectionResult(
        folder, summary, nodes, problem.name, backend.sessions, 0.0, csv, html, findings, suspects
    )
