"""What layerwise and cumulative-layerwise snooping share: set-up and the driver.

Both start from the QDQ model the full run uses (quantized here from the float model with the
inference engine's own pre-processing and quantizer, or given) and from golden tensors (a
framework diagnosis run, or any folder of ``.raw`` files such as an AIMET layer-output dump).
Parts of the QDQ model (:mod:`~accdbg.algorithms.fragments`) run on the backend
(:mod:`~accdbg.algorithms.backend`) fed with golden values, and each layer output is judged
with the verifiers (:mod:`~accdbg.algorithms.judging`); statuses are in
:mod:`~accdbg.algorithms.statuses`. :func:`snoop` sets up, resumes what a killed run left
(:mod:`~accdbg.algorithms.checkpoint`), runs an algorithm's loop and writes the reports.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import onnx
import pandas as pd

from accdbg.algorithms import checkpoint
from accdbg.algorithms.backend import Backend
from accdbg.algorithms.checkpoint import Journal
from accdbg.algorithms.diagnosis import story
from accdbg.algorithms.diagnosis.culprit import Culprit
from accdbg.algorithms.diagnosis.ranking import NONE_STANDS, Ranking
from accdbg.algorithms.fragments import Layer, QdqModel
from accdbg.algorithms.golden import Golden
from accdbg.algorithms.judging import CPU_INFO, Judge, base_row, finalize_row, restore_row
from accdbg.algorithms.protocol import Algorithm, AlgorithmRequest, AlgorithmResult
from accdbg.algorithms.statuses import ERRORS, MEANING, SKIP
from accdbg.core import onnx_model as om
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor, parse_input_list
from accdbg.core.progress import Progress
from accdbg.core.run_dir import (
    FINISHED,
    check_run_folder,
    check_writable,
    component_root,
    options_dict,
)
from accdbg.core.tensor_store import TensorFolder, TensorWriter
from accdbg.engines.base import EngineOptions, get_engine
from accdbg.engines.options import EngineConfig, LayerFilter
from accdbg.engines.pipeline import Calibration, prepare_model
from accdbg.engines.source import Feeds, build_feeds, load_feed
from accdbg.errors import AccdbgError

if TYPE_CHECKING:
    from accdbg.algorithms.diagnosis.culprits import Rerun

log = logging.getLogger("accdbg.snooping")


@dataclass
class SnoopingResult:
    """Where the run went, its report, and how many backend sessions this call created."""

    run_dir: Path
    report: pd.DataFrame
    sessions: int
    seconds: float = 0.0
    csv: Path | None = None
    html: Path | None = None
    backend_peak_rss_mb: float | None = None  # the largest backend child process's own peak
    findings: list[str] = field(default_factory=list)
    culprits: list[Culprit] = field(default_factory=list)


# ---------------------------------------------------------------- set-up


# engine options of a full engine run that mean nothing to snooping, accepted without effect
NOT_SNOOPING = ("framework_model_path", "memory_budget_mb", "options_record")


def check_engine_config(value: EngineConfig | dict | None) -> EngineConfig:
    """The engine options as the inference engine takes them (an :class:`EngineConfig` or its
    flat keywords), checked for what snooping can do."""
    if isinstance(value, dict) and "input_list" in value:
        raise AccdbgError(
            "engine option 'input_list' is an argument of its own: pass input_list=... "
            "(the calibration data), not in engine_kwargs"
        )
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in NOT_SNOOPING}
    config = EngineConfig.coerce(value)
    if config.stage == "compiled":
        raise AccdbgError(
            "--stage compiled: a QNN context binary is sealed and cannot be cut into layers; "
            "give the QDQ model (--stage converted) or the float model"
        )
    return config


def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def quantize(req: Request, out_dir: Path) -> Path:
    """The QDQ model exactly as the inference engine's source stage makes it: the engine's own
    pipeline (:func:`~accdbg.engines.pipeline.prepare_model`), with the same feeds (every
    ``-l`` line, else the ``-i`` files); written into ``out_dir``, not run."""
    assert req.feeds is not None
    t = time.perf_counter()
    prepared = prepare_model(
        req.model,
        req.model_path.name.removesuffix(".onnx"),
        Calibration(req.feeds, req.dims, req.dtypes),
        replace(req.config, stage="source"),
        out_dir,
        out_dir / ".quantize",
    )
    for step in prepared.steps:
        log.info("pre-processing: %s", step)
    for d in prepared.defects:  # before the backend is asked: what no encoding can hold
        log.warning("encodings: %s", d.line())
    log.info(
        "%s %s for QNN in %.1f s, pre-processing included -> %s",
        "quantized" if req.config.quant.quantizes else "prepared",
        req.model_path.name,
        time.perf_counter() - t,
        prepared.path.name,
    )
    return prepared.path


def find_layer(qdq: QdqModel, name: str, flag: str) -> Layer:
    for layer in qdq.layers:
        if name in (layer.name, layer.exposed.qdq_tensor, layer.exposed.framework_name):
            return layer
    import difflib

    names = [layer.name for layer in qdq.layers]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"; near matches: {', '.join(near)}" if near else ""
    raise AccdbgError(f"{flag} {name!r} is not the output of a layer of the quantized model{hint}")


def select_span(
    qdq: QdqModel, start: str | None, end: str | None, layers: LayerFilter
) -> tuple[list[Layer], dict[int, str]]:
    """The layers to debug, and why each other layer is skipped."""
    first = find_layer(qdq, start, "--start_layer").position if start else 0
    last = find_layer(qdq, end, "--end_layer").position if end else len(qdq.layers) - 1
    if first > last:
        raise AccdbgError(
            f"--start_layer {start!r} comes after --end_layer {end!r} in execution order"
        )

    span, skipped = [], {}
    for layer in qdq.layers:
        reason = layers.skip_reason((layer.name, layer.exposed.qdq_tensor), layer.op_type)
        if not first <= layer.position <= last:
            skipped[layer.position] = "outside --start_layer/--end_layer"
        elif reason:
            skipped[layer.position] = reason
        else:
            span.append(layer)
    return span, skipped


PREPROCESSED = (
    "made by QNN's pre-processing: the model given has no such tensor, so no golden value "
    "(measured within the layer of the model that reads it)"
)


def has_golden(tensor: str, source: set[str], golden: Golden, qdq: QdqModel) -> bool:
    """A golden value can exist: the model given (``source``: its tensors) has the tensor
    under one of its names, or the golden holds it; else QNN's pre-processing made it."""
    names = (tensor, *qdq.aliases(tensor))
    return any(n in source for n in names) or golden.has(*names)


# ---------------------------------------------------------------- the shared driver

POOLED_LINES = 2  # -l lines besides the -i files that a culprit must matter on
HTML_EVERY = 30.0  # seconds between HTML rewrites while running (the CSV follows every unit)
# options that shape the results: a resumed run must have the same
OPTION_KEYS = (
    "algorithm model_path qdq_model golden_dir input_tensor input_list verifiers start_layer "
    "end_layer engine_kwargs"
)


@dataclass
class SnoopArgs:
    """The arguments of :func:`~accdbg.algorithms.layerwise.run_layerwise` and
    :func:`~accdbg.algorithms.cumulative.run_cumulative_layerwise`, as the caller gave them."""

    model_path: str | os.PathLike
    input_tensors: Sequence[InputTensor]
    input_list: str | os.PathLike | None
    golden_dir: str | os.PathLike | None
    qdq_model: str | os.PathLike | None
    verifiers: Sequence[Any]
    start_layer: str | None
    end_layer: str | None
    engine_kwargs: EngineConfig | dict | None
    working_dir: str | os.PathLike
    output_dirname: str | None
    memory_budget_mb: float
    workers: int | None
    dump_qnn_json: bool
    allow_nonfinite_inputs: bool = False
    model_explorer: bool = True
    executor: ExecutorConfig | None = None  # where the parts run (default: local workers)


@dataclass
class Request:
    """The checked arguments of a run; nothing is written before they are all valid."""

    algorithm: str  # layerwise | cumulative_layerwise
    model_path: Path
    model: onnx.ModelProto
    inputs: Sequence[InputTensor]
    golden_dir: Path | None
    qdq_model: Path | None  # given (or the model itself when it is a QDQ model)
    judge: Judge
    config: EngineConfig
    start_layer: str | None
    end_layer: str | None
    record: dict  # the options JSON
    # every -l line (else the -i files), as the inference engine builds them: the calibration
    # when quantized here, and the inputs the output sensitivity pools over; None when a QDQ
    # model is given without -l
    feeds: Feeds | None = None
    dims: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    allow_nonfinite_inputs: bool = False

    @property
    def engine(self) -> str:
        return self.config.backend.engine

    @property
    def options(self) -> EngineOptions:
        return self.config.engine_options()

    @property
    def cumulative(self) -> bool:
        return self.algorithm == "cumulative_layerwise"


def check_request(algorithm: str, args: SnoopArgs) -> Request:
    """Every argument checked (one-line errors), before any folder is created."""
    if args.executor is not None:
        args.executor.check()
    config = check_engine_config(args.engine_kwargs)
    judge = Judge.from_specs(args.verifiers)
    get_engine(config.backend.engine).check_host(config.engine_options())
    model_path = Path(args.model_path).expanduser().absolute()
    model = om.load_model(model_path)
    om.check_given_inputs(model, args.input_tensors)
    for t in args.input_tensors:
        t.check(args.allow_nonfinite_inputs)  # size, NaN/Inf: now, not in the middle of the run
    if not args.input_tensors and args.golden_dir is None:
        raise AccdbgError(
            "give -i/--input_tensor (framework diagnosis needs them) or "
            "--golden_output_reference_directory"
        )
    golden = Path(args.golden_dir).expanduser().absolute() if args.golden_dir is not None else None
    if golden is not None and not golden.is_dir():
        raise AccdbgError(
            f"--golden_output_reference_directory {str(args.golden_dir)!r} does not exist or is not a folder"
        )
    qdq = Path(args.qdq_model).expanduser().absolute() if args.qdq_model else None
    if qdq is None and (is_qdq(model) or config.stage == "converted"):
        qdq = model_path
    if qdq is not None and not qdq.is_file():
        raise AccdbgError(f"QDQ model {str(args.qdq_model)!r} does not exist")
    if qdq is None:
        config.quant.check()
    check_run_folder(args.working_dir, f"{algorithm}_snooping", args.output_dirname, resume=True)
    if golden is None:
        check_writable(component_root(args.working_dir, "framework_diagnosis"))
    if qdq is not None:  # layer names are checked before anything is written
        select_span(QdqModel.load(qdq), args.start_layer, args.end_layer, config.layers)
    elif args.start_layer or args.end_layer:
        om.check_tensor_names(
            model,
            [n for n in (args.start_layer, args.end_layer) if n],
            "--start_layer/--end_layer",
        )
    input_list = Path(args.input_list).expanduser().absolute() if args.input_list else None
    feeds, dims, dtypes = None, {}, {}
    if qdq is None or input_list is not None:
        # quantized here: calibrated on the same feeds as the engine's; the -l lines are also
        # the inputs a culprit must matter on (the output sensitivity pools over a few of them)
        listed = parse_input_list(input_list) if input_list else None
        if qdq is not None and listed is not None:  # nothing to calibrate: the pooled lines only
            listed = replace(listed, entries=listed.entries[: POOLED_LINES + 1])
        feeds, dims, dtypes = build_feeds(
            model, listed, args.input_tensors, native=config.inputs.use_native_input_files
        )
    record = {
        "algorithm": algorithm.replace("_", "-"),
        "model_path": str(model_path),
        "qdq_model": str(qdq) if qdq else None,
        "golden_dir": str(golden) if golden else None,
        "input_tensor": [t.record() for t in args.input_tensors],
        "input_list": str(input_list) if input_list else None,
        "verifiers": [v.label for v in judge.verifiers.values()],
        "start_layer": args.start_layer,
        "end_layer": args.end_layer,
        "engine_kwargs": options_dict(config),
        "working_dir": str(args.working_dir),
        "output_dirname": args.output_dirname,
        "memory_budget_mb": args.memory_budget_mb,
    }
    return Request(
        algorithm,
        model_path,
        model,
        args.input_tensors,
        golden,
        qdq,
        judge,
        config,
        args.start_layer,
        args.end_layer,
        json.loads(json.dumps(record, default=str)),
        feeds,
        dims,
        dtypes,
        args.allow_nonfinite_inputs,
    )


def pooled_feeds(
    feeds: Feeds | None, inputs: Sequence[InputTensor], most: int = POOLED_LINES
) -> Iterator[dict[str, np.ndarray]]:
    """The first ``most`` ``-l`` lines other than the ``-i`` files, loaded one by one (only if
    a layer stands out): a culprit must matter on the user's data, not on the one input
    debugged. A few lines, not the whole calibration list: each costs every sensitivity run
    one more inference on the CPU."""
    debugged = {t.name: Path(t.path).resolve() for t in inputs}
    taken = 0
    for line in feeds or ():
        if taken >= most:
            return
        if {n: Path(f[0]).resolve() for n, f in line.items()} == debugged:
            continue
        taken += 1
        yield load_feed(line)


def one_input_golden(folder: Path, inputs: Sequence[InputTensor]) -> Path:
    """The golden tensors of one input: a framework-diagnosis run over an input list holds one
    ``Result_N`` per line; the one computed from the ``-i`` files' data is taken, else the first."""
    from accdbg.core.provenance import inputs_record, recorded_inputs, same_inputs
    from accdbg.core.tensor_store import TensorFolder
    from accdbg.verifiers.pairing import find_results

    lines, _ = find_results(folder, "--golden_output_reference_directory")
    if list(lines.values()) == [folder.absolute()]:  # one tensor folder
        return folder
    wanted = inputs_record({t.name: t.path for t in inputs}) if inputs else None
    for line in lines.values():
        rec = recorded_inputs(TensorFolder(line).meta)
        if wanted and rec and same_inputs(rec, wanted):
            return line
    first = next(iter(lines.values()))
    log.info("golden %s: using %s (no line was computed from the -i files)", folder, first.name)
    return first


def set_up(req: Request, run_path: Path, journal: Journal, working_dir) -> tuple[Path, Path]:
    """The golden folder and the QDQ model: from the journal when resuming, else made now."""
    from accdbg.frameworks.diagnosis import run_framework_diagnosis

    setup = journal.of_kind("setup")
    if setup:
        rec = setup[0]
        golden = Path(rec["golden_dir"])
        qdq = run_path / rec["qdq_model"] if rec["qdq_inside"] else Path(rec["qdq_model"])
        for what, p in (("golden folder", golden), ("QDQ model", qdq)):
            if not p.exists():
                raise AccdbgError(f"cannot resume {str(run_path)!r}: its {what} {str(p)!r} is gone")
        return golden, qdq
    golden = one_input_golden(req.golden_dir, req.inputs) if req.golden_dir else None
    if golden is None:
        if req.qdq_model == req.model_path:
            log.warning(
                "no golden reference: framework diagnosis runs the QDQ model on the CPU, so the golden "
                "values are a CPU simulation of the same quantization"
            )
        golden = run_framework_diagnosis(
            "onnx",
            req.model_path,
            req.inputs,
            working_dir=working_dir,
            allow_nonfinite_inputs=req.allow_nonfinite_inputs,
        ).run_dir
    qdq = req.qdq_model or quantize(req, run_path)
    inside = (
        qdq.parent == run_path
    )  # paths inside the run folder are kept relative: it is renamed at the end
    journal.append(
        {
            "kind": "setup",
            "golden_dir": str(golden),
            "qdq_model": qdq.name if inside else str(qdq),
            "qdq_inside": inside,
        }
    )
    return golden, qdq


def _layers_bar(algorithm: str, todo: list[Layer], ctx: Context) -> Progress:
    """The loop's bar, counted as it journals rows (read by the ticker thread: a walk of the
    list, not of the dict the loop fills); its own lines, per batch or step, say the rest."""
    wanted = [layer.position for layer in todo]

    def count() -> int:
        return sum(1 for p in wanted if p in ctx.rows)

    return Progress(algorithm, len(todo), "layers", line=False, count=count)


@dataclass
class Context:
    """Everything an algorithm's loop needs; ``rows`` holds finished rows by position."""

    req: Request
    run_path: Path
    journal: Journal
    qdq: QdqModel
    golden: Golden
    span: list[Layer]
    skipped: dict[int, str]
    backend: Backend
    memory_budget_bytes: int
    workers: int
    dump_qnn_json: bool
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    start_layer: Layer | None = None
    end_layer: Layer | None = None
    meta: str = ""
    qdq_path: Path | None = None
    source: set[str] = field(default_factory=set)  # the tensors of the model as given
    _html_at: float = field(default_factory=time.perf_counter)
    ranking: Ranking | None = None
    in_context: Rerun | None = None  # layers run again for the ranking (layerwise)

    @property
    def judge(self) -> Judge:
        return self.req.judge

    def skip_rows(self) -> dict[int, dict[str, Any]]:
        out = {}
        for position, why in self.skipped.items():
            layer = self.qdq.layers[position]
            out[position] = base_row(layer, self.qdq.shape(layer.exposed.qdq_tensor), SKIP)
            out[position]["Info"] = why
        return out

    def write(self, final: bool = False) -> tuple[pd.DataFrame, Path, Path]:
        """The CSV (atomically, after every unit); the HTML at most every HTML_EVERY s and at the end."""
        from accdbg.algorithms import report

        html = final or time.perf_counter() - self._html_at >= HTML_EVERY
        if html:
            self._html_at = time.perf_counter()
        rows = list({**self.skip_rows(), **self.rows}.values())
        title = f"{'Cumulative-layerwise' if self.req.cumulative else 'Layerwise'} snooping: {self.req.model_path.name}"
        if final:
            self.ranking = self.rank(report.frame(rows, self.judge.labels, self.req.cumulative))
            if self.ranking is not None:
                with_unmeasured(self.ranking, rows, self.backend.engine.label)
            if self.ranking is not None and self.ranking.culprits:
                self.ranking = self.verified(self.ranking)
            if self.ranking is not None:
                self._tell(self.ranking)
        return report.write_reports(
            self.run_path,
            self.req.algorithm,
            rows,
            self.judge,
            self.req.cumulative,
            title,
            self.meta,
            _notes(self.judge, self.req.cumulative),
            html=html,
            ranking=self.ranking if final else None,
        )

    def _tell(self, ranking: Ranking) -> None:
        """This verdict beside the other algorithms' on the same model and inputs."""
        req = self.req
        files = story.feed_files(req.feeds) if req.feeds else [t.path for t in req.inputs]
        name = "cumulative-layerwise" if req.cumulative else "layerwise"
        working = req.record.get("working_dir", ".")
        told = story.tell(name, self.run_path, working, req.model_path, files, ranking.culprits)
        ranking.findings[:] = story.before_fix(ranking.findings, told)

    def rank(self, df: pd.DataFrame) -> Ranking | None:
        """The culprit ranking over the finished table (layerwise scores are local: golden
        inputs; cumulative ones carry the error since the last partition point)."""
        if self.qdq_path is None:
            return None
        from accdbg.algorithms.diagnosis.culprits import find_culprits, prepared_model

        feeds = {t.name: t.load() for t in self.req.inputs} or None
        # a tensor QNN's pre-processing made is judged in the model's layer that reads it (a
        # Gemm's weights on the Reshape after it), as oneshot judges it
        made = {self.qdq.layers[p].name for p, why in self.skipped.items() if why == PREPROCESSED}
        judged = df[~df["O/P Name"].isin(made)]
        return find_culprits(
            self.qdq_path,
            self.golden.folder.root,
            judged,
            "O/P Name",
            self.judge.verifiers,
            feeds,
            float_model=prepared_model(self.qdq_path),
            local_observed=not self.req.cumulative,
            full_run=False,
            more_feeds=pooled_feeds(self.req.feeds, self.req.inputs),
            alone=None if self.req.cumulative else _written(self.run_path / "output"),
            in_context=self.in_context,
        )

    def verified(self, ranking: Ranking) -> Ranking:
        """The ranking's culprits confirmed on QNN by their fixes (the model quantized here
        only: a given QDQ model has no float model to quantize a change from)."""
        from accdbg.algorithms.diagnosis.culprits import prepared_model
        from accdbg.algorithms.fixes.verify import FixContext, run_command, verify_ranking

        req = self.req
        quantized_here = self.qdq_path is not None and prepared_model(self.qdq_path).is_file()
        if self.backend.engine.simulation or not quantized_here or not req.feeds:
            return ranking
        command = run_command(
            "onnx", req.model_path, req.inputs, req.record.get("input_list"), req.config
        )
        ctx = FixContext.of_run(self.qdq_path, list(req.feeds), req.config, self.run_path, command)
        return verify_ranking(ranking, ctx)

    def record(self, kind: str, rows: list[dict[str, Any]], sessions: int, **extra: Any) -> None:
        """Journal finished rows (fsynced), then rewrite the reports."""
        for r in rows:
            self.rows[r["_position"]] = r
        self.journal.append(
            {"kind": kind, "rows": [finalize_row(r) for r in rows], "sessions": sessions, **extra}
        )
        self.write()

    def write_outputs(self, folder: str, layers_values: list[tuple[Layer, np.ndarray]]) -> None:
        """The backend's outputs of the judged layers, dequantized, as a tensor folder."""
        if not layers_values:
            return
        w = TensorWriter(
            self.run_path / "output" / folder, meta={"component": "snooping", "unit": folder}
        )
        for layer, values in layers_values:
            w.write(
                layer.name,
                layer.dequantize(values),
                node=layer.exposed.node,
                op_type=layer.op_type,
                index=layer.position,
                **layer.exposed.encoding(),
            )
        w.save_manifest()


def _written(root: Path) -> Callable[[str], np.ndarray | None]:
    """A judged layer's backend output as :meth:`Context.write_outputs` wrote it under
    ``root`` (dequantized; None when none was). The folders' manifests are read once, at the
    first question: most rankings ask none."""
    where: dict[str, TensorFolder] | None = None

    def read(name: str) -> np.ndarray | None:
        nonlocal where
        if where is None:  # the first folder holding a name answers for it
            where = {}
            for folder in map(TensorFolder, sorted(root.glob("*"))):
                for n in folder.names():
                    where.setdefault(n, folder)
        return where[name].load(name) if name in where else None

    return read


def snoop(
    algorithm: str,
    loop: Callable[[Context], None],
    args: SnoopArgs,
    in_context: Callable[[Context], Rerun] | None = None,
) -> SnoopingResult:
    """Check the arguments, set up (golden, QDQ model, span), take back what a killed run of
    the same name finished, run ``loop(ctx)`` on the rest and write the final reports.
    ``in_context(ctx)``: what the ranking asks to run layers again in their context with."""
    t0 = time.perf_counter()
    req = check_request(algorithm, args)
    start_layer, end_layer = args.start_layer, args.end_layer
    component = f"{algorithm}_snooping"
    with checkpoint.open_run(args.working_dir, component, args.output_dirname) as run:
        options = run.path / f"{component}_options.json"
        checkpoint.check_options(options, req.record, OPTION_KEYS.split())
        if not options.exists():
            run.write_options(req.record)
        journal = Journal(run.path / checkpoint.JOURNAL)
        resuming = bool(journal.of_kind("setup"))
        golden_root, qdq_path = set_up(req, run.path, journal, args.working_dir)
        scratch = run.path / ".scratch"
        golden = Golden(golden_root, req.inputs, scratch)
        qdq = QdqModel.load(qdq_path, set(golden.folder.names()))
        if not qdq.layers:
            raise AccdbgError(f"{qdq_path.name} has no layer to debug")
        span, skipped = select_span(qdq, start_layer, end_layer, req.config.layers)
        source = set(om.all_tensor_names(req.model))
        for layer in span:
            if not has_golden(layer.exposed.qdq_tensor, source, golden, qdq):
                skipped[layer.position] = PREPROCESSED
        span = [x for x in span if x.position not in skipped]
        backend = Backend(
            req.engine,
            req.options,
            scratch,
            run.path / "backend_logs",
            shown_logs=run.final_path / "backend_logs",
            executor=args.executor,
            workers=args.workers,
        )
        workers = backend.workers
        ctx = Context(
            req,
            run.path,
            journal,
            qdq,
            golden,
            span,
            skipped,
            backend,
            int(args.memory_budget_mb * 2**20),
            max(1, workers),
            args.dump_qnn_json,
            start_layer=find_layer(qdq, start_layer, "--start_layer") if start_layer else None,
            end_layer=find_layer(qdq, end_layer, "--end_layer") if end_layer else None,
            source=source,
            meta=f"{backend.engine.label} -r {req.options.runtime}; QDQ model {qdq_path.name}; "
            f"golden {golden_root}",
            qdq_path=qdq_path,
        )
        for rec in journal.records:  # what a killed run finished
            for r in rec.get("rows", []):
                ctx.rows[r["_position"]] = restore_row(r, req.judge.labels)
        todo = [layer for layer in span if layer.position not in ctx.rows]
        log.info(
            "%s%s: %d layers, %d to debug, %d already done, %d skipped",
            f"resuming the {'finished' if run.resumed == FINISHED else 'interrupted'} run "
            f"{run.final_path}: "
            if resuming
            else "",
            algorithm,
            len(qdq.layers),
            len(todo),
            len(span) - len(todo),
            len(skipped),
        )
        if todo and not journal.of_kind("done"):
            try:
                with _layers_bar(algorithm, todo, ctx):
                    loop(ctx)
            finally:  # the worker processes stop with the loop, however it ended
                backend.close()
        if not journal.of_kind("done"):
            journal.append({"kind": "done", "sessions": backend.sessions})
        if in_context is not None:
            ctx.in_context = in_context(ctx)
        try:
            df, csv_path, html_path = ctx.write(final=True)
        finally:  # the ranking may have run parts again
            backend.close()
        if args.model_explorer:
            from accdbg.reports.model_explorer import overlay_run

            # on the model given: the float model (or the QDQ model when that is what was given);
            # layers QNN did not take (their Info says so) marked as on the CPU
            on_cpu = {
                str(name): "QNN did not take this node"
                for name, info in zip(df["O/P Name"], df["Info"], strict=True)
                if CPU_INFO in str(info)
            }
            overlay_run(
                run.path,
                [html_path],
                req.model_path,
                df,
                "O/P Name",
                req.judge.verifiers,
                marks={"on CPU": on_cpu},
                final_dir=run.final_path,
            )
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.perf_counter() - t0
    findings = ctx.ranking.findings if ctx.ranking is not None else []
    for line in findings:
        log.info("%s", line)
    log.info(
        "%s: %d rows, %d session(s) in %.1f s -> %s",
        algorithm,
        len(df),
        backend.sessions,
        seconds,
        run.path,
    )
    return SnoopingResult(
        run.path,
        df,
        backend.sessions,
        seconds,
        run.path / csv_path.name,
        run.path / html_path.name,
        backend.peak_rss_mb,
        findings,
        list(ctx.ranking.culprits) if ctx.ranking is not None else [],
    )


NOTHING_MEASURED = (
    "no layer was measured: the culprit ranking has nothing to rank, and names no layer - "
    "run oneshot-layerwise (the whole model on the backend), or --engine simulation for the "
    "quantization's own findings"
)


def with_unmeasured(ranking: Ranking, rows: Sequence[dict[str, Any]], engine: str) -> None:
    """The layers the backend could not measure, said first; the verdict then holds for the
    layers measured only, and with none measured it names none (nothing was compared)."""
    unmeasured = not_measured(rows, engine)
    if not unmeasured:
        return
    measured = sum(1 for r in rows if r.get("Status") not in ERRORS)
    if measured == 0:
        ranking.culprits, ranking.columns = [], {}
        ranking.findings[:] = [unmeasured, NOTHING_MEASURED]
        return
    ranking.findings[:] = [unmeasured, *among_measured(ranking.findings, measured)]


def among_measured(findings: Sequence[str], measured: int) -> list[str]:
    """A verdict that no layer stands out holds for the layers measured only: said so, after
    the line naming those that were not (a model QNN cannot compile is not "diffuse")."""
    return [
        f"{NONE_STANDS} among the {measured} layer(s) measured{f[len(NONE_STANDS) :]}"
        if f.startswith(NONE_STANDS)
        else f
        for f in findings
    ]


def not_measured(rows: Sequence[dict[str, Any]], engine: str, most: int = 5) -> str | None:
    """The finding naming the layers whose error could not be measured, by status (a layer
    QNN cannot compile alone is news of its own: the deployed graph may not compile either)."""
    by_status: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["_position"]):
        if r.get("Status") in ERRORS:
            by_status.setdefault(r["Status"], []).append(r)
    if not by_status:
        return None
    parts = []
    for status, failed in by_status.items():
        names = ", ".join(str(r["O/P Name"]) for r in failed[:most])
        more = f" and {len(failed) - most} more" if len(failed) > most else ""
        own = {str(r.get("Layer Type", "")) for r in failed} - {""}
        types = "/".join(sorted(own))
        # the ops the failing fragments ran besides the layers' own: one may be the op refused
        inside = [o for r in failed for o in r.get("_ops", ()) if o not in own]
        types += f"; their fragments run {', '.join(dict.fromkeys(inside))}" if inside else ""
        parts.append(
            f"{status}, {MEANING[status]}: {names}{more}" + (f" ({types})" if types else "")
        )
    count = sum(map(len, by_status.values()))
    return (
        f"{count} layer(s) not measured on {engine}: " + "; ".join(parts) + " - their error is "
        "unknown; each row's Info says why and where the backend log is"
    )


def _notes(judge: Judge, cumulative: bool) -> list[str]:
    marks = "; ".join(f"{label}: {judge.mark(label)}" for label in judge.labels)
    statuses = (
        "Statuses: empty = judged; skip = not debugged as asked; "
        + "; ".join(f"{status} = {MEANING[status]}" for status in ERRORS)
        + "."
    )
    if cumulative:
        return [
            f"Each layer runs on the backend from the last partition point, fed with golden values there; the "
            f"first layer failing a verifier ({marks}) becomes a partition point (part). Orig Outputs: the "
            f"model outputs' scores in the run that judged the layer.",
            statuses,
        ]
    return [
        f"Each layer runs alone on the backend, fed with golden inputs quantized with the full model's "
        f"encodings ({marks}).",
        statuses,
    ]


class Snooping(Algorithm):
    """Layerwise and cumulative-layerwise behind the protocol: one request, their run."""

    snoop_name: ClassVar[str]
    default_memory_budget_mb: ClassVar[float]

    def _args(self, req: AlgorithmRequest) -> SnoopArgs:
        o = req.options
        return SnoopArgs(
            req.model_path,
            req.input_tensors,
            req.input_list,
            req.golden_dir,
            qdq_model=None,
            verifiers=req.verifiers,
            start_layer=o.get("start_layer"),
            end_layer=o.get("end_layer"),
            engine_kwargs=req.config,
            working_dir=req.working_dir,
            output_dirname=req.output_dirname,
            memory_budget_mb=o.get("memory_budget_mb") or self.default_memory_budget_mb,
            workers=None,
            dump_qnn_json=False,
            allow_nonfinite_inputs=req.allow_nonfinite_inputs,
            model_explorer=req.model_explorer,
            executor=req.executor,
        )

    def check(self, req: AlgorithmRequest) -> None:
        check_request(self.snoop_name, replace(self._args(req), executor=None))

    def _call(self, fn: Callable[..., SnoopingResult], req: AlgorithmRequest) -> AlgorithmResult:
        a = self._args(req)
        res = fn(a.model_path, a.input_tensors, **{k: getattr(a, k) for k in RUN_KEYWORDS})
        return self._result(res)

    def _result(self, res: SnoopingResult) -> AlgorithmResult:
        log.info("report: %s", res.html)
        return AlgorithmResult(
            self.name, res.run_dir, res.html, res.report, res.findings, res.culprits, res
        )


# the keywords a request's SnoopArgs gives run_layerwise / run_cumulative_layerwise
RUN_KEYWORDS = (
    "input_list",
    "golden_dir",
    "verifiers",
    "start_layer",
    "end_layer",
    "engine_kwargs",
    "working_dir",
    "output_dirname",
    "memory_budget_mb",
    "allow_nonfinite_inputs",
    "model_explorer",
    "executor",
)
