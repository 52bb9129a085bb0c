"""Oneshot over a dataset: every input-list line streamed through golden and QNN, scored, dropped.

What stays is small: a per-input x per-layer score table, per-layer running statistics, the
final outputs' scores per input, and the full tensors of the K worst inputs (by the first
verifier on the final outputs) and of the inputs the user names. Each input is one work item
for an executor (:mod:`accdbg.core.executors`): this process, local worker processes or Ray.

The model QNN runs is made once, here, exactly as the inference engine makes it
(:func:`~accdbg.engines.pipeline.prepare_model`, calibrated on every ``-l`` line), and the
layers are the engine's (:func:`~accdbg.engines.pipeline.select_layers`). Every finished item
appends one line to ``items.jsonl``; rerunning the same command with the same
``--output_dirname`` scores only the items not journalled yet, and the tables are rebuilt
from the journal in input-list order, so they are the same whatever ran them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
import resource
import shutil
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from accdbg.algorithms.checkpoint import Journal, check_options, open_run
from accdbg.algorithms.dataset import tables
from accdbg.algorithms.dataset.keep import KeepSet, remove_unrecorded
from accdbg.algorithms.dataset.stats import RunningStats, encoding_edges
from accdbg.algorithms.dataset.worker import GOLDEN_DIR, TARGET_DIR, score_columns
from accdbg.algorithms.diagnosis import story
from accdbg.algorithms.diagnosis.culprits import find_culprits
from accdbg.algorithms.diagnosis.ranking import Culprit
from accdbg.core import onnx_model as om
from accdbg.core.executors import ExecutorConfig, WorkerSpec, get_executor
from accdbg.core.inputs import InputTensor, parse_input_list
from accdbg.core.progress import progress
from accdbg.core.run_dir import check_run_folder, options_dict, write_json_atomic
from accdbg.engines import artifacts
from accdbg.engines.base import get_engine
from accdbg.engines.options import EngineConfig
from accdbg.engines.pipeline import Calibration, PreparedModel, prepare_model, select_layers
from accdbg.engines.source import build_feeds, load_feed
from accdbg.errors import AccdbgError
from accdbg.frameworks.base import RunnerOptions, get_runner_class
from accdbg.mapping.graph_struct import inputs_of, load_graph_struct, write_graph_struct
from accdbg.reports.dataset_report import write_dataset_report
from accdbg.reports.summary import write_csv
from accdbg.verifiers.configured import check_verifiers, configured_verifiers

log = logging.getLogger("accdbg.dataset")

COMPONENT = "dataset"
JOURNAL = "items.jsonl"
WORKER = "accdbg.algorithms.dataset.worker:DatasetWorker"
# -l with more lines than this runs in dataset mode without --dataset_mode: beyond it a full
# dump per input (170 MB per input on PP-OCRv4 det) costs more than the tables it feeds
AUTO_THRESHOLD = 16
# options that shape the results: a resumed run must have the same
RESULT_KEYS = ["model_path", "input_list", "verifiers", "engine", "keep_worst", "keep_input"]


@dataclass
class DatasetResult:
    """A dataset run's tables (DataFrames) and where its files are."""

    run_dir: Path
    scores: pd.DataFrame  # one row per input and layer, sorted by line then execution order
    layers: pd.DataFrame  # one row per layer: running statistics, median and band, top share
    inputs: pd.DataFrame  # one row per input: files, final-output scores, top-1, kept, error
    findings: list[str]
    culprits: list[Culprit]
    worst_input: str | None
    kept: list[str]
    failed: dict[str, str]
    report: Path
    scored_now: int  # items scored by this call (a resumed run: only the missing ones)
    seconds: dict[str, float] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class _Request:
    """A checked dataset request: everything the run needs, nothing written yet."""

    config: EngineConfig
    model_path: Path
    model: onnx.ModelProto
    calibration: Calibration
    input_tensors: list[InputTensor]
    lines: int
    input_list: str | Path | None = None
    framework: str = "onnx"


def wants_dataset_mode(input_list: str | Path | None, dataset_mode: bool) -> bool:
    """``--dataset_mode``, or an input list longer than :data:`AUTO_THRESHOLD` lines."""
    if dataset_mode:
        return True
    if input_list is None or not Path(input_list).is_file():
        return False
    return len(parse_input_list(input_list).entries) > AUTO_THRESHOLD


def check_dataset(
    framework: str,
    model_path: str | Path,
    input_tensors: Sequence[InputTensor],
    input_list: str | Path | None,
    default_verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    verifier_config: str | Path | None = None,
    engine_kwargs: EngineConfig | dict | None = None,
    executor: ExecutorConfig | None = None,
    keep_worst: int = 1,
    keep_inputs: Sequence[int] = (),
    golden_dir: str | Path | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
) -> _Request:
    """Every input of a dataset run checked, each refusal one line naming the flag or file;
    nothing is written."""
    if framework.strip().lower() != "onnx":
        raise AccdbgError(
            f"--dataset_mode runs ONNX models; -f {framework}: convert the model to ONNX first "
            "(the oneshot's conversion/<run>/ holds it) and run it with -f onnx, or leave out "
            "--dataset_mode"
        )
    if golden_dir is not None:
        raise AccdbgError(
            "--dataset_mode computes each input's golden as it goes; leave out "
            "--golden_output_reference_directory"
        )
    if verifier_config is not None:
        raise AccdbgError(
            "--dataset_mode scores every layer with --default_verifier; --verifier_config is not "
            "supported in dataset mode"
        )
    if input_list is None:
        raise AccdbgError("--dataset_mode needs -l/--input_list (one input per line)")
    if not isinstance(keep_worst, int) or keep_worst < 0:
        raise AccdbgError(f"--keep_worst {keep_worst!r}: expected 0 or a positive integer")
    (executor or ExecutorConfig()).check()
    check_verifiers(default_verifiers, None)
    config = EngineConfig.coerce(engine_kwargs)
    config.check()
    if config.stage == "compiled":
        raise AccdbgError(
            "--dataset_mode scores every layer; a compiled QNN context exposes only its outputs "
            "(use --stage source or converted)"
        )
    check_run_folder(working_dir, COMPONENT, output_dirname, resume=output_dirname is not None)
    path = Path(model_path).expanduser().absolute()
    model = om.load_model(path)
    if config.stage == "source" and config.quant.precision == "int8":
        if any(n.op_type == "QuantizeLinear" for n in model.graph.node):
            raise AccdbgError(f"{str(path)!r} is already quantized (QDQ); use --stage converted")
    parsed = parse_input_list(input_list)
    n = len(parsed.entries)
    if n == 0:
        raise AccdbgError(f"-l/--input_list {str(input_list)!r} has no input line")
    for line in keep_inputs:
        if not isinstance(line, int) or not 1 <= line <= n:
            raise AccdbgError(
                f"--keep_input {line!r}: expected an input-list line number from 1 to {n} "
                f"({str(input_list)!r} has {n} lines)"
            )
    feeds, dims, dtypes = build_feeds(
        model, parsed, input_tensors, allow_nonfinite_inputs, config.inputs.use_native_input_files
    )
    get_runner_class(framework)
    tensors = list(input_tensors) or [
        InputTensor(
            name,
            tuple(dims[name]),
            Path(path),
            np.dtype(dtypes[name]),
            None if stored == dtype else np.dtype(stored),
        )
        for name, (path, _, dtype, stored) in feeds[0].items()
    ]
    return _Request(
        config, path, model, Calibration(feeds, dims, dtypes), tensors, n, input_list, framework
    )


def run_dataset(
    framework: str,
    model_path: str | Path,
    input_tensors: Sequence[InputTensor] = (),
    input_list: str | Path | None = None,
    default_verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    engine_kwargs: EngineConfig | dict | None = None,
    framework_kwargs: dict | None = None,
    executor: ExecutorConfig | None = None,
    keep_worst: int = 1,
    keep_inputs: Sequence[int] = (),
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    verifier_config: str | Path | None = None,
    golden_dir: str | Path | None = None,
) -> DatasetResult:
    """Score every ``-l`` line layer by layer, streaming; returns the tables.

    ``keep_worst``: the K inputs whose final outputs score worst on the first verifier keep
    their tensors (``<run>/golden/Result_N``, ``<run>/target/Result_N``); ``keep_inputs``:
    input-list line numbers (1-based) kept too. ``executor``: where the items run
    (:class:`~accdbg.core.executors.ExecutorConfig`; default local worker processes).
    With ``output_dirname`` a rerun continues the run of that name."""
    start = time.perf_counter()
    executor = executor or ExecutorConfig()
    req = check_dataset(
        framework,
        model_path,
        input_tensors,
        input_list,
        default_verifiers,
        verifier_config,
        engine_kwargs,
        executor,
        keep_worst,
        keep_inputs,
        golden_dir,
        working_dir,
        output_dirname,
        allow_nonfinite_inputs,
    )
    config = req.config
    fw = dict(framework_kwargs or {})
    opts = RunnerOptions.from_flags(
        fw.get("disable_graph_optimization", False),
        fw.get("onnx_custom_op_lib"),
        fw.get("include_constants", False),
    )
    runner_options = {
        k: getattr(opts, k)
        for k in ("disable_graph_optimization", "custom_op_lib", "include_constants")
    }
    memory_budget_mb = float(fw.get("memory_budget_mb", 4096))
    seconds: dict[str, float] = {}
    with open_run(working_dir, COMPONENT, output_dirname) as run:
        options = options_dict(
            framework=framework,
            model_path=req.model_path,
            input_list=str(Path(input_list).expanduser().absolute()),
            verifiers=[list(v) if not isinstance(v, str) else v for v in default_verifiers],
            engine=config.keywords(),
            keep_worst=keep_worst,
            keep_input=sorted(keep_inputs),
            executor=dataclasses.asdict(executor),
            framework_options=runner_options,
            memory_budget_mb=memory_budget_mb,
        )
        options_path = run.path / f"{COMPONENT}_options.json"
        check_options(options_path, options, RESULT_KEYS)
        if not options_path.exists():
            run.write_options(options)
        else:
            log.info("continuing the run in %s (resumed: %s)", run.path, run.resumed)
        t = time.perf_counter()
        prepared = _prepare(req, run.path)
        seconds["model preparation"] = time.perf_counter() - t
        target_model = prepared.load()
        fw_names = set(om.all_tensor_names(req.model))
        selected = select_layers(target_model, config.layers, fw_names)
        if not selected:
            raise AccdbgError("no layer output left to score (check the layer filter flags)")
        mapping = artifacts.tensor_mapping(selected, fw_names)
        write_json_atomic(run.path / "tensor_mapping.json", mapping)
        struct = run.path / f"{prepared.path.name.split('.')[0]}_graph_struct.json"
        write_graph_struct(struct, struct.stem, artifacts.graph_struct_layers(selected, {}))
        outputs = [o.name for o in target_model.graph.output]
        columns = score_columns(list(default_verifiers))
        spec = _spec(
            framework,
            req,
            runner_options,
            memory_budget_mb,
            prepared,
            config,
            exposed=selected,
            golden_name=mapping,
            verifiers=list(default_verifiers),
            outputs=outputs,
            output_root=str(run.path),
        )
        t = time.perf_counter()
        state = _State(run.path, req, keep_worst, keep_inputs, [e.name for e in selected])
        state.replay(Journal(run.path / JOURNAL))
        todo = [i for i in range(req.lines) if i not in state.done]
        log.info(
            "dataset: %d inputs, %d layers each; %d already scored, %d to score on %s x%d",
            req.lines,
            len(selected),
            len(state.done),
            len(todo),
            executor.name,
            executor.workers,
        )
        scored_now = _score(run.path, spec, executor, req, state, todo) if todo else 0
        seconds["scoring"] = time.perf_counter() - t
        state.keep.prune()
        for scratch in (run.path / "logs").glob(".scratch-*"):
            shutil.rmtree(scratch, ignore_errors=True)
        t = time.perf_counter()
        result = _finish(
            run.path,
            req,
            state,
            selected,
            mapping,
            columns,
            default_verifiers,
            outputs,
            prepared,
            struct,
            seconds,
            scored_now,
        )
        seconds["tables and report"] = time.perf_counter() - t
        seconds["total"] = time.perf_counter() - start
    result.run_dir = run.final_path
    result.report = run.final_path / result.report.name
    for line in result.findings:
        log.info("%s", line)
    log.info("report: %s", result.report)
    return result


def _spec(framework, req, runner_options, memory_budget_mb, prepared, config, **rest) -> WorkerSpec:
    """What every worker needs to score one input (the model, the engine, the options)."""
    return WorkerSpec(
        WORKER,
        {
            "framework": framework.strip().lower(),
            "model_path": str(req.model_path),
            "input_tensors": req.input_tensors,
            "runner_options": runner_options,
            "memory_budget_mb": memory_budget_mb,
            "target_model": str(prepared.path),
            "engine": config.backend.engine,
            "engine_options": config.engine_options(),
            **rest,
        },
    )


def _score(run_path: Path, spec: WorkerSpec, executor, req, state, todo: list[int]) -> int:
    """Score the inputs left on the executor, journaling each outcome as it comes (a rerun
    continues from the journal); returns how many scored."""
    journal = _Journal(run_path / JOURNAL)
    scored_now = 0

    def items():
        for i in todo:
            fields = {"index": i, "key": f"Result_{i}", "feed": req.calibration.feeds[i]}
            yield f"Result_{i}", {**fields, **state.keep.item_fields(i)}

    with get_executor(executor) as ex:
        # the first item waits for the worker's start-up and its two sessions; the
        # findings' "N of M inputs scored" is the stage's line
        outcomes = ex.map(spec, items())
        for outcome in progress(outcomes, "dataset", len(todo), "inputs scored", line=False):
            index = int(outcome.key.removeprefix("Result_"))
            if outcome.ok:
                record = _record(outcome.value, outcome.attempts)
            else:
                record = {
                    "index": index,
                    "key": outcome.key,
                    "error": outcome.error,
                    "attempts": outcome.attempts,
                }
                log.warning("%s failed: %s", outcome.key, outcome.error)
            journal.append(record)
            state.absorb(record)
            scored_now += int(outcome.ok)
    return scored_now


def _prepare(req: _Request, out: Path) -> PreparedModel:
    """The engine's model; a resumed run reuses the one it made (same calibration, same file)."""
    stem = req.model_path.name.removesuffix(".onnx")
    steps_path = out / "preprocessing.json"
    suffix = ".qdq.onnx" if req.config.quant.quantizes else ".fp16.onnx"
    existing = out / f"{stem}{suffix}" if req.config.stage == "source" else out / f"{stem}.onnx"
    if steps_path.is_file() and existing.is_file():
        log.info("reusing %s from the earlier run", existing.name)
        steps = json.loads(steps_path.read_text(encoding="utf-8"))
        float_model = out / f"{stem}.prepared.onnx"
        return PreparedModel(
            existing, req.config.stage, steps, float_model if float_model.is_file() else None
        )
    prepared = prepare_model(
        req.model, stem, req.calibration, req.config, out, out / ".work", req.model_path
    )
    for s in prepared.steps:
        log.info("pre-processing: %s", s)
    write_json_atomic(steps_path, prepared.steps)
    return prepared


def _jsonable(value: Any) -> Any:
    """Arrays as their exact bytes, zlib-compressed, base64 (a third of the JSON text of
    their numbers: the journal grows by about the score table's size per input)."""
    if isinstance(value, np.ndarray):
        data = zlib.compress(np.ascontiguousarray(value).tobytes(), 6)
        return {
            "dtype": value.dtype.str,
            "shape": list(value.shape),
            "zlib_b64": base64.b64encode(data).decode("ascii"),
        }
    if isinstance(value, np.generic):
        return value.item()
    return value


def _array(value: Any, dtype) -> np.ndarray:
    """An array journalled by :func:`_jsonable` (or a plain list)."""
    if isinstance(value, dict) and "zlib_b64" in value:
        raw = zlib.decompress(base64.b64decode(value["zlib_b64"]))
        arr = np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        return arr.astype(dtype, copy=True)
    return np.asarray(value, dtype=dtype)


def _record(value: dict[str, Any], attempts: int) -> dict[str, Any]:
    """A worker's result as one journal line (NaN and infinities kept: SQNR of identical
    tensors is inf)."""
    return {**{k: _jsonable(v) for k, v in value.items()}, "attempts": attempts}


class _Journal(Journal):
    """``items.jsonl``: one line per finished item, appended, flushed and fsynced."""

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode("utf-8")
        with open(self.path, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


class _State:
    """What the parent keeps: per input its small score arrays, the running statistics, the
    kept inputs; rebuilt from the journal on resume."""

    def __init__(self, root: Path, req: _Request, keep_worst: int, keep_inputs, names: list[str]):
        self.root = root
        self.done: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, str] = {}
        self.n_layers = len(names)
        self.keep = KeepSet(
            keep_worst,
            [line - 1 for line in keep_inputs],
            lambda i: [root / GOLDEN_DIR / f"Result_{i}", root / TARGET_DIR / f"Result_{i}"],
        )
        # merged as items arrive: exact sums, so the order cannot change a bit, and nothing per
        # input beyond its score row is held
        self.running = RunningStats(names)
        self.seconds: list[float] = []
        self.worker_rss: list[float] = []

    def replay(self, journal: Journal) -> None:
        latest: dict[int, dict[str, Any]] = {}
        for rec in journal.records:
            latest[int(rec["index"])] = rec  # a later line (a failed item rerun) wins
        kept_keys = {f"Result_{i}" for i, r in latest.items() if r.get("kept")}
        gone = remove_unrecorded(self.root, kept_keys, (GOLDEN_DIR, TARGET_DIR))
        if gone:
            log.info("removed tensors of %d unfinished item(s): %s", len(gone), ", ".join(gone))
        for rec in latest.values():
            if rec.get("error") is None:
                self.absorb(rec, replayed=True)

    def absorb(self, rec: dict[str, Any], replayed: bool = False) -> None:
        index = int(rec["index"])
        if rec.get("error") is not None:
            self.failed[index] = str(rec["error"])
            for folder in self.keep.folders_of(index):
                shutil.rmtree(folder, ignore_errors=True)
            return
        self.failed.pop(index, None)
        values = _array(rec["values"], float)
        if values.shape[0] != self.n_layers:
            raise AccdbgError(
                f"{JOURNAL}: {rec['key']} has {values.shape[0]} layers, the model {self.n_layers}; "
                "pick another --output_dirname to start a new run"
            )
        self.done[index] = {
            "values": values,
            "status": rec["status"],
            "failed": rec["failed"],
            "final": rec.get("final") or {},
            "top1": rec.get("top1"),
            "rank_value": rec.get("rank_value"),
            "kept": bool(rec.get("kept")),
            "seconds": rec.get("seconds"),
            "replayed": replayed,
        }
        self.running.add(_array(rec["partials"], float), _array(rec["hists"], np.int64))
        if not replayed:
            self.seconds.append(float(rec.get("seconds") or math.nan))
            self.worker_rss.append(float(rec.get("peak_rss_mb") or math.nan))
        self.keep.add(index, float(rec["badness"]), bool(rec.get("kept")))


def _worst_first(state: _State) -> list[str]:
    """The kept inputs, worst final-output score first (named inputs by their rank too)."""
    order = sorted(state.keep.kept, key=lambda i: state.keep.ranked[i])
    return [f"Result_{i}" for i in order]


def _files(feed: dict) -> str:
    return ", ".join(str(p) for p, *_ in feed.values())


def _fix_last(findings: list[str]) -> list[str]:
    """The measured fix moved to the end (the lines on the inputs come after the ranking's):
    the last finding is what to do."""
    fix = [f for f in findings if f.startswith("fix: ")]
    return [f for f in findings if f not in fix] + fix[:1]


def _finish(
    root: Path,
    req: _Request,
    state: _State,
    selected,
    mapping: dict[str, str],
    columns: list[str],
    default_verifiers,
    outputs: list[str],
    prepared: PreparedModel,
    struct: Path,
    seconds: dict[str, float],
    scored_now: int,
) -> DatasetResult:
    """Tables in input-list order, the culprit ranking on the worst kept input, the report."""
    cvs = configured_verifiers(list(default_verifiers))
    verifiers = {cv.label: cv.verifier for cv in cvs}
    labels = [cv.label for cv in cvs]
    layers = [
        {"Name": e.name, "LayerType": e.op_type, "Golden_name": mapping.get(e.name)}
        for e in selected
    ]
    scores = tables.scores_table(state.done, layers, columns)
    running = state.running
    edges = [encoding_edges(e.scale, e.zero_point, e.native_dtype) for e in selected]
    label, top = tables.top_contributors(scores, verifiers, inputs_of(load_graph_struct(struct)))
    layer_df = tables.layer_table(running.table(edges), scores, labels, top)
    inputs = _inputs_table(req, state, outputs, labels, top)
    kept = [f"Result_{i}" for i in sorted(state.keep.kept)]
    findings: list[str] = []
    ranking_input = None
    culprits: list[Culprit] = []
    worst_kept = [i for i in state.keep.worst() if i in state.keep.kept]
    if worst_kept:
        w = worst_kept[0]
        ranking_input = f"Result_{w}"
        table_w = scores[scores["Input"] == ranking_input].reset_index(drop=True)
        feed = req.calibration.feeds[w]
        ranking = find_culprits(
            prepared.path,
            root / GOLDEN_DIR / ranking_input,
            table_w,
            "Name",
            verifiers,
            feeds=load_feed(feed),
            float_model=prepared.float_model,
            golden_name=mapping,
            target=root / TARGET_DIR / ranking_input,
            simulated=get_engine(req.config.backend.engine).simulation,
        )
        if ranking.culprits or ranking.outputs_pass is False:
            ranking = _verified(ranking, req, prepared, root, [w, *worst_kept[1:]])
        findings.extend(ranking.findings)
        culprits = list(ranking.culprits)
        column = f"final {labels[0]}"
        if column in inputs.columns:
            findings.append(tables.worst_line(inputs, ranking_input, labels[0], column))
    elif state.done:
        findings.append("no culprit ranking: no input's tensors were kept (--keep_worst 0)")
    stable = tables.stability_line(
        culprits[0].name if culprits else None, top, culprits[0].shows_at if culprits else ()
    )
    if stable:
        findings.append(stable)
    n_done = len(state.done)
    findings.append(
        f"{n_done} of {req.lines} inputs scored ({scored_now} in this run, "
        f"{n_done - scored_now} from the journal)"
        + (f"; {len(state.failed)} failed" if state.failed else "")
    )
    failed = {f"Result_{i}": e for i, e in sorted(state.failed.items())}
    for key, error in failed.items():
        findings.append(f"{key} failed, not scored: {error}")
    files = story.feed_files(req.calibration.feeds)
    # the run folder is <working_dir>/dataset/<name>: the other algorithms' runs are beside it
    told = story.tell("dataset", root, root.parent.parent, req.model_path, files, culprits)
    findings = story.before_fix(_fix_last(findings), told)
    layer_df = _with_culprits(layer_df, culprits)
    write_csv(scores, root / "scores.csv")
    write_csv(layer_df, root / "layers.csv")
    write_csv(inputs, root / "inputs.csv")
    figures = _figures(state, root)  # the run folder with its tables (not yet the report)
    write_json_atomic(
        root / "dataset_summary.json",
        {
            "findings": findings,
            "culprit_ranking_input": ranking_input,
            "kept": kept,
            "failed": failed,
            "top_contributor_verifier": label,
            "figures": figures,
            "culprits": [c.as_dict() for c in culprits],
        },
    )
    report = write_dataset_report(
        root / "dataset_report.html",
        title=f"accdbg dataset: {req.model_path.name}",
        findings=findings,
        layers=layer_df,
        inputs=inputs,
        labels=labels,
        units={lab: v.unit for lab, v in verifiers.items()},
        thresholds={lab: v.pass_mark for lab, v in verifiers.items()},
        kept_links={
            k: (f"{GOLDEN_DIR}/{k}/tensors.json", f"{TARGET_DIR}/{k}/tensors.json")
            for k in _worst_first(state)
        },
        notes=[f"{k}: {v:.1f} s" for k, v in seconds.items()]
        + [f"{k}: {v:.4g}" for k, v in figures.items()],
    )
    return DatasetResult(
        run_dir=root,
        scores=scores,
        layers=layer_df,
        inputs=inputs,
        findings=findings,
        culprits=culprits,
        worst_input=ranking_input,
        kept=kept,
        failed=failed,
        report=report,
        scored_now=scored_now,
        seconds=seconds,
        figures=figures,
    )


# inputs the culprits' fixes are measured on at most (the worst kept first, then the first
# lines): a dataset's every line for each candidate would cost its QNN runs many times over
VERIFY_INPUTS = 8


def _verified(ranking, req: _Request, prepared: PreparedModel, root: Path, worst: list[int]):
    """The ranking's culprits confirmed on QNN by their fixes, measured on the worst kept
    inputs and the first lines (:data:`VERIFY_INPUTS` at most)."""
    from accdbg.algorithms.fixes.verify import FixContext, run_command, verify_ranking

    if get_engine(req.config.backend.engine).simulation or prepared.float_model is None:
        return ranking
    order = list(dict.fromkeys([*worst, *range(req.lines)]))[:VERIFY_INPUTS]
    feeds = [req.calibration.feeds[i] for i in order]
    command = run_command(
        req.framework, req.model_path, req.input_tensors, req.input_list, req.config
    )
    return verify_ranking(
        ranking, FixContext.of_run(prepared.path, feeds, req.config, root, command)
    )


def _with_culprits(layers: pd.DataFrame, culprits: Sequence[Culprit]) -> pd.DataFrame:
    """The layer table with each culprit's rank, kind and what QNN verified of its fix."""
    from accdbg.algorithms.diagnosis.ranking.measures import (
        KIND_COL,
        RANK,
        VERIFIED_FIX,
        VERIFIED_GAIN,
    )
    from accdbg.algorithms.fixes.verify import verified_columns

    if "Name" not in layers.columns:
        return layers
    out = layers.copy()
    verified = verified_columns(culprits)
    by = {c.name: c for c in culprits}
    out[RANK] = pd.array([by[n].rank if n in by else None for n in out["Name"]], dtype="Int64")
    out[KIND_COL] = [by[n].kind if n in by else "" for n in out["Name"]]
    out[VERIFIED_FIX] = [verified.get(n, {}).get(VERIFIED_FIX, "") for n in out["Name"]]
    out[VERIFIED_GAIN] = [verified.get(n, {}).get(VERIFIED_GAIN) for n in out["Name"]]
    return out


def _inputs_table(req: _Request, state: _State, outputs, labels, top) -> pd.DataFrame:
    """One row per input-list line: files, final-output scores, top-1 agreement, kept, error."""
    rows = []
    for i in range(req.lines):
        key = f"Result_{i}"
        row: dict[str, Any] = {
            "Input": key,
            "Line": i + 1,
            "Files": _files(req.calibration.feeds[i]),
        }
        rec = state.done.get(i)
        if rec is not None:
            row[f"final {labels[0]}"] = rec["rank_value"]
            for out in outputs:
                for metric, value in (rec["final"].get(out) or {}).items():
                    row[f"{out} {metric}"] = value
            row["top1_agreement"] = rec["top1"]
            row["top_contributor"] = top.get(key)
            row["kept"] = i in state.keep.kept
            row["seconds"] = rec["seconds"]
        row["error"] = state.failed.get(i, "")
        rows.append(row)
    return pd.DataFrame(rows)


def _figures(state: _State, root: Path) -> dict[str, float]:
    """Measured: time per input, peak RSS (this process, the workers), disk of the run."""
    secs = [s for s in state.seconds if math.isfinite(s)]
    rss = [r for r in state.worker_rss if math.isfinite(r)]
    disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    kept_disk = sum(
        p.stat().st_size
        for sub in (GOLDEN_DIR, TARGET_DIR)
        if (root / sub).is_dir()
        for p in (root / sub).rglob("*")
        if p.is_file()
    )
    out = {
        "parent peak RSS MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "run folder MB": disk / 2**20,
        "kept tensors MB": kept_disk / 2**20,
    }
    if secs:
        out["seconds per input (median, in the worker)"] = float(np.median(secs))
    if rss:
        out["worker peak RSS MB"] = float(max(rss))
    return out
