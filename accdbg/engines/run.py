"""Inference engine component: the model on QNN, every intermediate tensor on disk.

Stages (``--stage``), mapped onto ONNX artefacts:

* ``source``    a float ONNX model: pre-processed for QNN, quantized with calibration data from
                the input list (``onnxruntime.quantization`` QNN config), then run.
* ``converted`` the user's own QDQ ONNX model (e.g. exported by AIMET), run as is.
* ``compiled``  a QNN context binary wrapped in an EPContext ONNX model; its graph is sealed,
                so only its outputs can be dumped.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import pandas as pd

from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputTensor, parse_input_list, requested_outputs
from accdbg.core.isolate import Isolated
from accdbg.core.provenance import inputs_record
from accdbg.core.run_dir import RunDir, check_run_folder, options_dict, write_json_atomic
from accdbg.core.tensor_store import TensorFolder, TensorRecord, records_table, update_manifest
from accdbg.encodings.rules import check_rules, summary_lines
from accdbg.engines import artifacts, exposure, partitioning
from accdbg.engines.base import Engine
from accdbg.engines.options import OUTPUT_DATA_TYPES, STAGES, EngineConfig, LayerFilter
from accdbg.engines.pipeline import Calibration, prepare_model, select_layers
from accdbg.engines.source import build_feeds
from accdbg.engines.worker import Job, JobReport, debug_job, load_finals, plain_job
from accdbg.errors import AccdbgError
from accdbg.mapping.graph_struct import write_graph_struct
from accdbg.mapping.tensor_mapping import (
    MAPPING_FILE,
    ONNX_MAPPING_FILE,
    through_conversion,
    write_tensor_mapping,
)

if TYPE_CHECKING:
    from accdbg.frameworks.convert import Conversion

log = logging.getLogger("accdbg.inference_engine")

# operators of a model quantized for onnxruntime's integer kernels (dynamic or QOperator
# quantization): neither float nor QDQ, QNN's pre-processing cannot take them
INTEGER_OPS = {
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeLSTM",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QLinearConv",
    "QLinearMatMul",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
}

__all__ = ["OUTPUT_DATA_TYPES", "STAGES", "EngineResult", "run_inference_engine"]
FUSION_TOLERANCE = 1e-6
# the debug graph's output this many dB or more above its difference from a plain run is the
# same output rounded otherwise (an 8-bit step is ~48 dB under a full-range signal); under it
# exposing intermediates changed what QNN computes
OBSERVER_DB = 40.0


@dataclass
class EngineResult:
    """An inference-engine run: where things are, and the dumped tensors as a table."""

    run_dir: Path
    results: list[Path]
    tensors: pd.DataFrame
    qdq_model: Path
    model_net_json: Path | None
    tensor_mapping: Path
    graph_struct: Path
    engine_label: str
    report: JobReport
    preprocessing: list[str]
    seconds: float
    simulated: bool = False  # a CPU simulation ran it, not a backend
    # graph outputs the debug graph computes otherwise than the deployable one
    observer: list[ObserverEffect] = field(default_factory=list)
    # what the encoding rules flag in the QDQ model run (accdbg.encodings.rules)
    rules: list[str] = field(default_factory=list)


def check_engine_options(config: EngineConfig | None = None, **keywords: object) -> Engine:
    """The options that do not depend on the model, checked; returns the engine."""
    return (config or EngineConfig.from_keywords(**keywords)).check()


@dataclass
class EngineRequest:
    """A checked inference-engine request: everything a run needs before it writes."""

    eng: Engine
    config: EngineConfig
    model_path: Path
    model: onnx.ModelProto
    feeds: list
    dims: dict
    dtypes: dict
    fw_names: set[str] | None
    # outputs asked for that --debug_mode_off dumps instead of the graph outputs
    dumped_instead: tuple[str, ...] = ()

    @property
    def calibration(self) -> Calibration:
        return Calibration(self.feeds, self.dims, self.dtypes)


def check_inference_engine(
    model_path: str | Path | None,
    input_list: str | Path | None = None,
    input_tensors: Sequence[InputTensor] = (),
    config: EngineConfig | None = None,
    framework_model_path: str | Path | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    output_tensors: Sequence[str] = (),
    **keywords: object,
) -> EngineRequest:
    """Every input of an engine run checked - options, run folder, model, each input file's
    size and NaN/Inf, ``-qo``, the outputs asked for (``-o`` and the list's ``#`` line) -
    without writing anything. Options: ``config``, or the API's flat keywords
    (``runtime='htp', act_bitwidth=16``), or both (keywords win).

    Outputs asked for with ``--debug_mode_off`` are what the run dumps, as qnn-net-run writes
    the outputs an input list's ``#`` line names: the request's config dumps those layer
    outputs (as QNN produced them) instead of the graph outputs."""
    config = _config(config, keywords)
    stage, precision = config.stage, config.quant.precision
    eng = config.check()
    check_run_folder(working_dir, "inference_engine", output_dirname)
    if model_path is None:
        raise AccdbgError(f"-m/--model_path is required for --stage {stage}")
    model_path = Path(model_path).expanduser().absolute()
    model = om.load_model(model_path)
    if stage == "compiled" and not any(n.op_type == "EPContext" for n in model.graph.node):
        raise AccdbgError(
            f"--stage compiled: {str(model_path)!r} has no EPContext node (not a QNN context model)"
        )
    integer = Counter(n.op_type for n in model.graph.node if n.op_type in INTEGER_OPS)
    if stage != "compiled" and integer:
        ops = ", ".join(f"{op} x{k}" for op, k in integer.most_common())
        raise AccdbgError(
            f"{str(model_path)!r} is already quantized with integer operators ({ops}); QNN "
            "takes a float model (quantized here) or a QDQ one - give the float model"
        )
    has_qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    if stage == "source" and has_qdq and precision == "int8":
        raise AccdbgError(
            f"{str(model_path)!r} is already quantized (QDQ); run it with --stage converted"
        )
    parsed_list = parse_input_list(input_list) if input_list else None
    feeds, dims, dtypes = build_feeds(
        model,
        parsed_list,
        input_tensors,
        allow_nonfinite_inputs,
        config.inputs.use_native_input_files,
    )
    om.check_tensor_names(model, output_tensors, "-o/--output_tensor")
    requested = requested_outputs(output_tensors, parsed_list)
    instead = requested if requested and not config.dump.debug and stage != "compiled" else ()
    if instead:
        log.info(
            "--debug_mode_off with outputs named (-o, the input list's '#' line): %s are "
            "dumped, as QNN produces them, instead of the graph outputs",
            ", ".join(requested),
        )
        config = replace(
            config,
            dump=replace(config.dump, debug=True),
            layers=LayerFilter(add_layer_outputs=requested),
        )
    fw_path = (
        Path(framework_model_path)
        if framework_model_path
        else (model_path if stage == "source" else None)
    )
    if fw_path is None:
        fw_names = None
    elif fw_path == model_path:  # the source model, already loaded
        fw_names = set(om.all_tensor_names(model))
        om.check_tensor_names(model, config.layers.add_layer_outputs, "--add_layer_outputs")
        om.check_tensor_names(model, config.layers.skip_layer_outputs, "--skip_layer_outputs")
    else:
        fw_names = set(om.all_tensor_names(om.load_model(fw_path, "--framework_model_path")))
    return EngineRequest(eng, config, model_path, model, feeds, dims, dtypes, fw_names, instead)


def _config(config: EngineConfig | dict | None, keywords: dict) -> EngineConfig:
    if config is None or isinstance(config, dict):
        return EngineConfig.from_keywords(**{**(config or {}), **keywords})
    if keywords:
        return EngineConfig.from_keywords(**{**config.keywords(), **keywords})
    return config


@dataclass(frozen=True)
class ModelReady:
    """What the engine will run, known before it runs: work that needs only the models (the
    culprit ranking's evidence and CPU simulation) can go on beside the backend's run, whose
    graph finalize keeps one core busy for seconds."""

    model: Path  # the model the backend runs (QDQ), in the run's staging folder until it ends
    tensor_mapping: dict[str, str]  # as tensor_mapping.json will have it
    inputs: list[dict[str, Path]]  # per input line: graph input -> file


def run_inference_engine(
    model_path: str | Path | None = None,
    input_list: str | Path | None = None,
    input_tensors: Sequence[InputTensor] = (),
    config: EngineConfig | None = None,
    framework_model_path: str | Path | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    memory_budget_mb: float = 4096,
    options_record: dict | None = None,
    allow_nonfinite_inputs: bool = False,
    conversion: Conversion | None = None,
    on_ready: Callable[[ModelReady], None] | None = None,
    output_tensors: Sequence[str] = (),
    **keywords: object,
) -> EngineResult:
    """Run the model on the chosen engine and dump its intermediate tensors.

    Options: an :class:`~accdbg.engines.options.EngineConfig` (what the CLI parses), or the
    flat keywords of its fields, e.g. ``runtime="htp", act_bitwidth=16, per_channel=True``.
    ``conversion``: the model is another framework's, converted to ONNX; the tensor mapping then
    goes to the framework's names and each dumped tensor records its layout. ``on_ready`` is
    called once the quantized model is written, before the backend runs it (not for a converted
    model, whose mapping is known only after the run)."""
    start = time.perf_counter()
    req = check_inference_engine(
        model_path,
        input_list,
        input_tensors,
        config,
        framework_model_path=framework_model_path,
        working_dir=working_dir,
        output_dirname=output_dirname,
        allow_nonfinite_inputs=allow_nonfinite_inputs,
        output_tensors=output_tensors,
        **keywords,
    )
    config = req.config
    stage, runtime, debug = config.stage, config.backend.runtime, config.dump.debug
    eng, options, model_path, model = (
        req.eng,
        req.config.engine_options(),
        req.model_path,
        req.model,
    )
    feeds, fw_names = req.feeds, req.fw_names
    mapping_dir = config.dump.golden_dir_for_mapping
    gold = artifacts.golden_names(Path(mapping_dir)) if mapping_dir else None

    with (
        RunDir(working_dir, "inference_engine", output_dirname) as run,
        _Workers(
            eng, debug and stage != "compiled", run.final_path, model_path.name, runtime
        ) as workers,
    ):
        run.write_options(
            options_record
            or options_dict(
                model_path=model_path,
                input_list=input_list,
                memory_budget_mb=memory_budget_mb,
                **config.keywords(),
            )
        )
        stem = model_path.name.removesuffix(".onnx")
        log.info("engine: %s, runtime %s, stage %s", eng.label, runtime, stage)
        prepared = prepare_model(
            model, stem, req.calibration, config, run.path, run.path / ".work", model_path
        )
        target, steps = prepared.path, prepared.steps
        if stage == "compiled" and debug:
            log.warning(
                "a compiled QNN context exposes only its graph outputs; run --stage converted to dump intermediates"
            )
        for s in steps:
            log.info("pre-processing: %s", s)
        for d in prepared.defects:  # before the backend is asked: what no encoding can hold
            log.warning("encodings: %s", d.line())
        target_model = onnx.load(str(target), load_external_data=False)
        rules = summary_lines(check_rules(target_model))  # before the backend is asked
        for line in rules:
            log.info("%s", line)
        selected = _selected(target_model, config, fw_names, req.dumped_instead)
        json_dir = run.path / "qnn_json"
        options.json_graph_dir = None if eng.simulation else str(json_dir)
        if options.profiling_level:  # --profiling_level, or --extra_contextbin_args
            options.profiling_path = str(run.path / "qnn_profiling.csv")
        job = _job(eng, options, target, selected, feeds, run.path, config, memory_budget_mb)
        mapping = artifacts.tensor_mapping(selected, fw_names if fw_names is not None else gold)
        if prepared.float_model is not None and fw_names is not None:
            mapping.update(_renamed(prepared.float_model, model, selected, mapping, feeds))
        if on_ready is not None and conversion is None and prepared.stage == "source":
            on_ready(
                ModelReady(
                    target,
                    dict(mapping),
                    [{n: Path(p) for n, (p, *_) in f.items()} for f in feeds],
                )
            )
        plain, report, diffs = _execute(eng, job, workers)
        model_net = (
            artifacts.merge_qnn_json(
                json_dir, run.path / "model_net.json", None if stage == "compiled" else target
            )
            if json_dir.exists()
            else None
        )
        qnn_tensors = artifacts.qnn_tensor_names(model_net)
        _annotate_manifests([Path(r) for r in report.results], selected, qnn_tensors)
        if conversion is not None:
            mapping = _through_conversion(run.path, report.results, mapping, conversion)
        write_tensor_mapping(run.path / MAPPING_FILE, mapping)
        struct_path = run.path / f"{stem}_graph_struct.json"
        write_graph_struct(
            struct_path, stem, artifacts.graph_struct_layers(selected, report.shapes)
        )
        _report_partitioning(run.path, plain, eng.label, target_model, prepared.quantized_here)
        effects = observer_effects(diffs, [o.name for o in target_model.graph.output])
        _report_fusion(effects, eng.label)
        write_json_atomic(run.path / "preprocessing.json", steps)
        shutil.rmtree(run.path / "output" / ".scratch", ignore_errors=True)
    results = [run.path / "output" / Path(r).name for r in report.results]
    table = records_table(TensorFolder(results[0])) if results else pd.DataFrame()
    log.info(
        "inference engine: %d tensors per input, %d input(s), %.1f s -> %s",
        len(table),
        len(results),
        time.perf_counter() - start,
        run.path,
    )
    return EngineResult(
        run_dir=run.path,
        results=results,
        tensors=table,
        qdq_model=run.path / Path(target).name if stage != "compiled" else Path(target),
        model_net_json=(run.path / "model_net.json") if model_net else None,
        tensor_mapping=run.path / MAPPING_FILE,
        graph_struct=run.path / struct_path.name,
        engine_label=eng.label,
        report=report,
        preprocessing=steps,
        seconds=time.perf_counter() - start,
        simulated=eng.simulation,
        observer=effects,
        rules=rules,
    )


def _selected(target_model: onnx.ModelProto, config: EngineConfig, fw_names, dumped_instead):
    """The layer outputs to dump; none left while debugging is refused (the filters ate them)."""
    stage, debug = config.stage, config.dump.debug
    selected = [] if stage == "compiled" else select_layers(target_model, config.layers, fw_names)
    _check_dumped_instead(
        dumped_instead,
        selected,
        lambda: select_layers(target_model, LayerFilter(), fw_names),
    )
    if debug and stage != "compiled" and not selected:
        raise AccdbgError(
            "no layer output left to dump: --add_layer_outputs/--add_layer_types and "
            "--skip_layer_outputs/--skip_layer_types leave none (--debug_mode_off dumps "
            "the model outputs only)"
        )
    return selected


def _job(eng, options, target: Path, selected, feeds, run_path: Path, config, budget_mb) -> Job:
    """The backend's job: the model, what to expose, every input, where to write."""
    return Job(
        engine=eng.name,
        options=options,
        model_path=str(target),
        exposed=selected,
        feeds=feeds,
        output_root=str(run_path / "output"),
        native_log=str(run_path / "backend_log.txt"),
        output_data_type=config.dump.data_type,
        memory_budget_bytes=int(budget_mb * 2**20),
        meta={
            "component": "inference_engine",
            "engine": eng.label,
            "runtime": config.backend.runtime,
            "model": target.name,
        },
        inputs=[inputs_record({n: p for n, (p, *_) in f.items()}) for f in feeds],
    )


def _renamed(
    prepared: Path, source: onnx.ModelProto, selected: list[exposure.Exposed], mapping: dict, feeds
) -> dict[str, str]:
    """Dumped tensors the pre-processing renamed, mapped to the source model's by value
    (:mod:`accdbg.engines.renamed`); the ones still unmapped are said once."""
    from accdbg.engines.renamed import match_by_value
    from accdbg.engines.source import load_feed

    lost = {e.qdq_tensor: e.name for e in selected if e.name not in mapping}
    if not lost or not feeds:
        return {}
    found = match_by_value(
        onnx.load(str(prepared), load_external_data=False),
        source,
        list(lost),
        set(mapping.values()),
        load_feed(feeds[0]),
    )
    out = {lost[k]: v for k, v in found.items()}
    still = [n for k, n in lost.items() if k not in found]
    if out or still:
        log.info(
            "%d tensor(s) renamed by the pre-processing mapped to the model's by value%s",
            len(out),
            f"; {len(still)} have no counterpart in the model (rows of their own): "
            + ", ".join(still[:5])
            if still
            else "",
        )
    return out


def _check_dumped_instead(
    asked: Sequence[str],
    selected: list[exposure.Exposed],
    every_layer: Callable[[], list[exposure.Exposed]],
) -> None:
    """Outputs asked for with --debug_mode_off that the quantized model does not produce as
    a layer output of its own: named, with the reason, rather than dumped silently short."""
    found = {e.name for e in selected}
    missing = [n for n in asked if n not in found]
    if missing:
        layers = [e.name for e in every_layer()]
        shown = ", ".join(layers[:8]) + (" ..." if len(layers) > 8 else "")
        raise AccdbgError(
            f"{', '.join(missing)}: asked for as output(s) (-o, the input list's '#' line) but "
            "no layer of the quantized model outputs it as QNN runs it (an op quantized with "
            "the next, e.g. a Conv with its Relu, or folded by the pre-processing); name a "
            f"layer output instead: {shown or 'none'}"
        )


def _annotate_manifests(
    results: list[Path], selected: list[exposure.Exposed], qnn_tensors: dict
) -> None:
    """Each dumped tensor's QNN name and axis format, from the QNN graph JSON."""
    if not qnn_tensors:
        return
    names = {e.name: artifacts.qnn_name_for(e, qnn_tensors) for e in selected}

    def annotate(rec: TensorRecord) -> None:
        qn = names.get(rec.name)
        if qn:
            rec.extra["qnn_name"] = qn
            axis = qnn_tensors[qn].get("axis_format")
            if axis:
                rec.extra["qnn_axis_format"] = axis

    for root in results:
        update_manifest(root, annotate)


def _through_conversion(
    run_path: Path, results: list, onnx_map: dict[str, str], conversion: Conversion
) -> dict[str, str]:
    """Engine tensors mapped to framework names, and their layouts recorded, through the
    conversion to ONNX: returns engine name -> framework name (the ONNX-level mapping is kept
    as ``tensor_mapping_onnx.json``); each dumped tensor records its layout so verification
    transposes instead of guessing."""
    write_tensor_mapping(run_path / ONNX_MAPPING_FILE, onnx_map)
    composed = through_conversion(onnx_map, conversion.tensor_mapping)

    def layout(rec: TensorRecord) -> None:
        perm = conversion.permutations.get(onnx_map.get(rec.name, rec.name))
        if len(rec.shape) == 4 and perm is not None:
            rec.layout = (
                "NCHW"
                if list(perm) == [0, 2, 3, 1]
                else ("NHWC" if list(perm) == [0, 1, 2, 3] else None)
            )

    for result in results:
        update_manifest(Path(result), layout)
    missing = [k for k in onnx_map if k not in composed]
    if missing:
        log.info(
            "%d engine tensor(s) have no framework counterpart (fused by the converter), e.g. %s",
            len(missing),
            ", ".join(missing[:5]),
        )
    return composed


def _report_partitioning(
    run_path: Path, report: JobReport, label: str, model: onnx.ModelProto, ours: bool
) -> None:
    info = partitioning.partitioning_info(
        label, report.placement_counts, report.cpu_reasons, report.unsupported, model, ours
    )
    write_json_atomic(run_path / "partitioning.json", info)
    if "QNNExecutionProvider" in report.placement_counts:
        partitioning.report(info)


class _Workers:
    """The plain and debug processes of a native engine, started before pre-processing so
    that their start-up (a second of imports) overlaps quantization in this process."""

    def __init__(self, eng, debug: bool, final_path: Path, model_name: str, runtime: str):
        what = f"running {model_name} on {eng.label} -r {runtime}"
        self.debug = debug
        self.plain = self.debug_graph = None
        if eng.isolated:
            warm = "accdbg.engines.worker"
            self.plain = Isolated.prestart(
                warm, what=what, log_hint=str(final_path / "backend_log.txt")
            )
            if debug:
                self.debug_graph = Isolated.prestart(
                    warm,
                    what=what + " (debug graph)",
                    log_hint=str(final_path / "backend_log_debug.txt"),
                )

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in (self.plain, self.debug_graph):
            if child is not None:
                child.kill()


def _execute(eng, job: Job, workers: _Workers) -> tuple[JobReport, JobReport, list[dict]]:
    """Plain and debug jobs: concurrently in two children for native engines, else in turn."""
    debug = workers.debug
    if workers.plain is not None:
        logs = Path(job.native_log)
        workers.plain.submit(
            plain_job, replace(job, native_log=str(logs.with_name("backend_log.txt"))), not debug
        )
        if workers.debug_graph is not None:
            workers.debug_graph.submit(
                debug_job, replace(job, native_log=str(logs.with_name("backend_log_debug.txt")))
            )
        plain = workers.plain.result()
        dbg = workers.debug_graph.result() if workers.debug_graph is not None else plain
    else:
        plain = plain_job(job, not debug)
        dbg = debug_job(job) if debug else plain
    diffs: list[list[tuple[float, float]]] = []  # per input, per output: (max |diff|, SQNR)
    if debug:
        for p, d in zip(plain.finals, dbg.finals, strict=True):
            diffs.append(
                [_apart(a, b) for a, b in zip(load_finals(p), load_finals(d), strict=True)]
            )
    dbg.sessions += plain.sessions if debug else 0
    return plain, dbg, diffs


def _apart(plain: np.ndarray, debug: np.ndarray) -> tuple[float, float]:
    """How far the debug graph's output is from the plain run's: its largest difference and
    the SQNR of the plain output over it (inf: the same)."""
    a, b = plain.astype(np.float64).ravel(), debug.astype(np.float64).ravel()
    if not a.size:
        return 0.0, math.inf
    err = float(np.dot(a - b, a - b))
    sig = float(np.dot(a, a))
    return float(np.max(np.abs(a - b))), math.inf if err == 0 else 10 * math.log10(
        sig / err
    ) if sig else -math.inf


@dataclass(frozen=True)
class ObserverEffect:
    """A graph output the debug graph (every tensor exposed) computes otherwise than the
    deployable graph: exposing intermediates changed what QNN fuses. Worst over the inputs."""

    output: str
    max_diff: float
    sqnr_db: float  # the plain run's output over the difference
    inputs: int  # how many inputs show it

    def line(self) -> str:
        return (
            f"{self.output} by up to {self.max_diff:.4g} ({self.sqnr_db:.1f} dB SQNR between "
            f"them, on {self.inputs} input(s))"
        )


def observer_effects(
    diffs: list[list[tuple[float, float]]], outputs: list[str]
) -> list[ObserverEffect]:
    """The outputs whose debug-graph values part from a plain run beyond rounding noise
    (under :data:`OBSERVER_DB` SQNR between the two), worst input first."""
    out = []
    for j, name in enumerate(outputs):
        seen = [d[j] for d in diffs if j < len(d)]
        far = [x for x in seen if x[1] < OBSERVER_DB and x[0] > FUSION_TOLERANCE]
        if far:
            worst = min(far, key=lambda x: x[1])
            out.append(ObserverEffect(name, worst[0], worst[1], len(far)))
    return out


def _report_fusion(effects: list[ObserverEffect], label: str) -> None:
    """One line for every output the debug graph computes otherwise than the plain run."""
    if effects:
        log.warning(
            "the debug graph's outputs differ from a plain run of the same quantized model on "
            "%s: %s - exposing intermediates changed what it fuses; the dumped intermediates are "
            "the debug graph's, the outputs as deployed the plain run's",
            label,
            "; ".join(e.line() for e in effects),
        )
