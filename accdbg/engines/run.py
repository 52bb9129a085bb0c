"""Inference engine component: the model on QNN, every intermediate tensor on disk.

Stages (``--stage``), mapped onto ONNX artefacts:

* ``source``    a float ONNX model: pre-processed for QNN, quantized with calibration data from
                the input list (``onnxruntime.quantization`` QNN config), then run.
* ``converted`` the user's own QDQ ONNX model (e.g. exported by AIMET), run as is.
* ``compiled``  a QNN context binary wrapped in an EPContext ONNX model; its graph is sealed,
                so only its outputs can be dumped.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import pandas as pd

from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputTensor, parse_input_list
from accdbg.core.isolate import Isolated
from accdbg.core.provenance import inputs_record
from accdbg.core.run_dir import RunDir, check_run_folder, write_json_atomic
from accdbg.core.tensor_store import MANIFEST_NAME, TensorFolder, records_table
from accdbg.engines import artifacts, exposure, partitioning
from accdbg.engines.base import EngineOptions, get_engine
from accdbg.engines.prepare import fix_shapes
from accdbg.engines.quantize import check_quantizer_options
from accdbg.engines.source import build_feeds, source_model
from accdbg.engines.worker import Job, JobReport, debug_job, load_finals, plain_job
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")

STAGES = ("source", "converted", "compiled")
OUTPUT_DATA_TYPES = ("float_only", "native_only", "float_and_native")
FUSION_TOLERANCE = 1e-6


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


def check_overrides(path: str | Path | None, ignore: bool) -> None:
    """``-qo``: the file exists and is AIMET encodings (checked before any run starts)."""
    if path is None or ignore:
        return
    if not Path(path).is_file():
        raise AccdbgError(f"-qo/--quantization_overrides {str(path)!r} does not exist")
    from accdbg.encodings.aimet import read_aimet

    read_aimet(Path(path))


def check_engine_options(
    stage: str = "source",
    engine: str = "qnn",
    runtime: str = "htp",
    architecture: str = "x86_64-linux-clang",
    precision: str = "int8",
    output_data_type: str = "float_only",
    soc_model: str | None = None,
    profiling_level: str | None = None,
    disable_cpu_fallback: bool = False,
    perf_profile: str | None = None,
    quantization_overrides: str | Path | None = None,
    ignore_encodings: bool = False,
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    act_quantizer: str = "tf",
    param_quantizer: str = "tf",
    **_: object,
) -> tuple:
    """The options that do not depend on the model, checked: ``(engine, EngineOptions)``."""
    if stage not in STAGES:
        raise AccdbgError(f"--stage {stage!r} is not known; expected one of: {', '.join(STAGES)}")
    if output_data_type not in OUTPUT_DATA_TYPES:
        raise AccdbgError(
            f"-odt {output_data_type!r} is not known; expected one of: {', '.join(OUTPUT_DATA_TYPES)}"
        )
    if precision not in ("int8", "fp16"):
        raise AccdbgError(f"--precision {precision!r} is not known; expected int8 or fp16")
    eng = get_engine(engine)
    options = EngineOptions(
        runtime=runtime,
        architecture=architecture,
        precision=precision,
        soc_model=soc_model,
        profiling_level=profiling_level,
        disable_cpu_fallback=disable_cpu_fallback,
        perf_profile=perf_profile,
    )
    eng.check_host(options)
    if stage == "source" and precision == "int8":
        check_quantizer_options(
            act_bitwidth, weights_bitwidth, bias_bitwidth, act_quantizer, param_quantizer
        )
        check_overrides(quantization_overrides, ignore_encodings)
    return eng, options


@dataclass
class EngineRequest:
    """A checked inference-engine request: everything a run needs before it writes."""

    eng: object
    options: EngineOptions
    model_path: Path
    model: onnx.ModelProto
    feeds: list
    dims: dict
    dtypes: dict
    fw_names: set[str] | None


def check_inference_engine(
    model_path: str | Path | None,
    input_list: str | Path | None = None,
    input_tensors: Sequence[InputTensor] = (),
    stage: str = "source",
    precision: str = "int8",
    framework_model_path: str | Path | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    **options: object,
) -> EngineRequest:
    """Every input of an engine run checked - options, run folder, model, each input file's
    size and NaN/Inf, ``-qo`` - without writing anything."""
    eng, engine_options = check_engine_options(stage=stage, precision=precision, **options)
    check_run_folder(working_dir, "inference_engine", output_dirname)
    if model_path is None:
        raise AccdbgError(f"-m/--model_path is required for --stage {stage}")
    model_path = Path(model_path).expanduser().absolute()
    model = om.load_model(model_path)
    if stage == "compiled" and not any(n.op_type == "EPContext" for n in model.graph.node):
        raise AccdbgError(
            f"--stage compiled: {str(model_path)!r} has no EPContext node (not a QNN context model)"
        )
    has_qdq = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    if stage == "source" and has_qdq and precision == "int8":
        raise AccdbgError(
            f"{str(model_path)!r} is already quantized (QDQ); run it with --stage converted"
        )
    parsed_list = parse_input_list(input_list) if input_list else None
    feeds, dims, dtypes = build_feeds(model, parsed_list, input_tensors, allow_nonfinite_inputs)
    fw_path = (
        Path(framework_model_path)
        if framework_model_path
        else (model_path if stage == "source" else None)
    )
    if fw_path is None:
        fw_names = None
    elif fw_path == model_path:  # the source model, already loaded
        fw_names = set(om.all_tensor_names(model))
    else:
        fw_names = set(om.all_tensor_names(om.load_model(fw_path, "--framework_model_path")))
    return EngineRequest(eng, engine_options, model_path, model, feeds, dims, dtypes, fw_names)


def run_inference_engine(
    model_path: str | Path | None = None,
    input_list: str | Path | None = None,
    input_tensors: Sequence[InputTensor] = (),
    runtime: str = "htp",
    architecture: str = "x86_64-linux-clang",
    stage: str = "source",
    engine: str = "qnn",
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    act_quantizer: str = "tf",
    param_quantizer: str = "tf",
    per_channel: bool = False,
    quantization_overrides: str | Path | None = None,
    ignore_encodings: bool = False,
    precision: str = "int8",
    debug: bool = True,
    output_data_type: str = "float_only",
    add_layer_outputs: Sequence[str] = (),
    add_layer_types: Sequence[str] = (),
    skip_layer_types: Sequence[str] = (),
    skip_layer_outputs: Sequence[str] = (),
    profiling_level: str | None = None,
    perf_profile: str | None = None,
    soc_model: str | None = None,
    disable_cpu_fallback: bool = False,
    golden_dir_for_mapping: str | Path | None = None,
    framework_model_path: str | Path | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    memory_budget_mb: float = 4096,
    options_record: dict | None = None,
    allow_nonfinite_inputs: bool = False,
) -> EngineResult:
    """Run the model on the chosen engine and dump its intermediate tensors."""
    start = time.perf_counter()
    req = check_inference_engine(
        model_path,
        input_list,
        input_tensors,
        stage=stage,
        precision=precision,
        framework_model_path=framework_model_path,
        working_dir=working_dir,
        output_dirname=output_dirname,
        allow_nonfinite_inputs=allow_nonfinite_inputs,
        engine=engine,
        runtime=runtime,
        architecture=architecture,
        output_data_type=output_data_type,
        soc_model=soc_model,
        profiling_level=profiling_level,
        disable_cpu_fallback=disable_cpu_fallback,
        perf_profile=perf_profile,
        quantization_overrides=quantization_overrides,
        ignore_encodings=ignore_encodings,
        act_bitwidth=act_bitwidth,
        weights_bitwidth=weights_bitwidth,
        bias_bitwidth=bias_bitwidth,
        act_quantizer=act_quantizer,
        param_quantizer=param_quantizer,
    )
    eng, options, model_path, model = req.eng, req.options, req.model_path, req.model
    feeds, dims, dtypes, fw_names = req.feeds, req.dims, req.dtypes, req.fw_names
    gold = artifacts.golden_names(Path(golden_dir_for_mapping)) if golden_dir_for_mapping else None

    with (
        RunDir(working_dir, "inference_engine", output_dirname) as run,
        _Workers(
            eng, debug and stage != "compiled", run.final_path, model_path.name, runtime
        ) as workers,
    ):
        run.write_options(
            options_record
            or {
                "model_path": str(model_path),
                "stage": stage,
                "engine": engine,
                "runtime": runtime,
                "architecture": architecture,
                "act_bitwidth": act_bitwidth,
                "weights_bitwidth": weights_bitwidth,
                "bias_bitwidth": bias_bitwidth,
                "act_quantizer": act_quantizer,
                "param_quantizer": param_quantizer,
                "per_channel": per_channel,
                "precision": precision,
                "debug": debug,
                "input_list": str(input_list) if input_list else None,
            }
        )
        work = run.path / ".work"
        work.mkdir()
        steps: list[str] = []
        stem = model_path.name.removesuffix(".onnx")
        log.info("engine: %s, runtime %s, stage %s", eng.label, runtime, stage)
        if stage == "source":
            target, steps = source_model(
                model,
                stem,
                feeds,
                dims,
                dtypes,
                run.path,
                work,
                act_bitwidth=act_bitwidth,
                weights_bitwidth=weights_bitwidth,
                bias_bitwidth=bias_bitwidth,
                act_quantizer=act_quantizer,
                param_quantizer=param_quantizer,
                per_channel=per_channel,
                quantization_overrides=quantization_overrides,
                ignore_encodings=ignore_encodings,
                precision=precision,
            )
        elif stage == "converted":
            target = run.path / f"{stem}.onnx"
            onnx.save(fix_shapes(model, dims, steps), str(target))
        else:
            target = model_path
            if debug:
                log.warning(
                    "a compiled QNN context exposes only its graph outputs; run --stage converted to dump intermediates"
                )
        for s in steps:
            log.info("pre-processing: %s", s)
        target_model = onnx.load(str(target), load_external_data=False)
        selected = (
            []
            if stage == "compiled"
            else exposure.select(
                target_model,
                fw_names,
                add_layer_outputs,
                add_layer_types,
                skip_layer_types,
                skip_layer_outputs,
            )
        )
        json_dir = run.path / "qnn_json"
        options.json_graph_dir = None if eng.simulation else str(json_dir)
        if profiling_level:
            options.profiling_path = str(run.path / "qnn_profiling.csv")
        job = Job(
            engine=eng.name,
            options=options,
            model_path=str(target),
            exposed=selected,
            feeds=feeds,
            output_root=str(run.path / "output"),
            native_log=str(run.path / "backend_log.txt"),
            output_data_type=output_data_type,
            memory_budget_bytes=int(memory_budget_mb * 2**20),
            meta={
                "component": "inference_engine",
                "engine": eng.label,
                "runtime": runtime,
                "model": target.name,
            },
            inputs=[inputs_record({n: p for n, (p, _, _) in f.items()}) for f in feeds],
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
        mapping = artifacts.tensor_mapping(selected, fw_names if fw_names is not None else gold)
        mapping_path = run.path / "tensor_mapping.json"
        write_json_atomic(mapping_path, mapping)
        struct_path = run.path / f"{stem}_graph_struct.json"
        write_json_atomic(struct_path, artifacts.graph_struct(stem, selected, report.shapes))
        _report_partitioning(
            run.path, plain, eng.label, target_model, stage == "source" and precision != "fp16"
        )
        _report_fusion(diffs)
        write_json_atomic(run.path / "preprocessing.json", steps)
        shutil.rmtree(work, ignore_errors=True)
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
        tensor_mapping=run.path / "tensor_mapping.json",
        graph_struct=run.path / struct_path.name,
        engine_label=eng.label,
        report=report,
        preprocessing=steps,
        seconds=time.perf_counter() - start,
    )


def _annotate_manifests(
    results: list[Path], selected: list[exposure.Exposed], qnn_tensors: dict
) -> None:
    if not qnn_tensors:
        return
    names = {e.name: artifacts.qnn_name_for(e, qnn_tensors) for e in selected}
    for root in results:
        path = root / MANIFEST_NAME
        data = json.loads(path.read_text(encoding="utf-8"))
        for rec in data["tensors"]:
            qn = names.get(rec["name"])
            if qn:
                rec.setdefault("extra", {})["qnn_name"] = qn
                axis = qnn_tensors[qn].get("axis_format")
                if axis:
                    rec["extra"]["qnn_axis_format"] = axis
        write_json_atomic(path, data)


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
    diffs: list[dict] = []
    if debug:
        for p, d in zip(plain.finals, dbg.finals, strict=True):
            diffs.append(
                {
                    i: float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                    if a.size
                    else 0.0
                    for i, (a, b) in enumerate(zip(load_finals(p), load_finals(d), strict=True))
                }
            )
    dbg.sessions += plain.sessions if debug else 0
    return plain, dbg, diffs


def _report_fusion(fusion_diffs: list[dict]) -> None:
    for i, diffs in enumerate(fusion_diffs):
        for name, d in diffs.items():
            if d > FUSION_TOLERANCE:
                log.warning(
                    "Result_%d: graph output #%s differs by up to %.6g between the debug run and a plain run - exposing "
                    "intermediates changed what QNN fuses; the dumped intermediates are from the debug graph",
                    i,
                    name,
                    d,
                )
