"""Oneshot-layerwise: framework diagnosis, QNN engine and verification in one run.

It shows where the error *appears*. On top of the verification summary it marks where the
error *enters* (see :mod:`accdbg.algorithms.attribution`), rewrites the summary files with
those columns, and writes the HTML report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from accdbg.algorithms.attribution import Attribution, attribute, inputs_from_graph_struct
from accdbg.algorithms.culprits import find_culprits, prepared_model
from accdbg.algorithms.ranking import Culprit
from accdbg.core.inputs import (
    InputTensor,
    check_finite,
    check_raw_size,
    parse_input_list,
)
from accdbg.core.run_dir import (
    check_run_folder,
    check_writable,
    component_root,
    write_json_atomic,
)
from accdbg.core.tensor_store import safe_relpath
from accdbg.engines import run_inference_engine
from accdbg.engines.run import check_engine_options, check_inference_engine
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import (
    check_framework_diagnosis,
    check_model_path,
    run_framework_diagnosis,
)
from accdbg.reports.html_report import write_report
from accdbg.reports.summary import frame_records, json_value, write_csv
from accdbg.verifiers import get_verifier
from accdbg.verifiers.verification import check_verifiers, run_verification

log = logging.getLogger("accdbg.oneshot")


@dataclass
class OneshotResult:
    """Everything a notebook needs after an oneshot run."""

    golden_dir: Path
    engine_run: Path
    verification_run: Path
    summary: pd.DataFrame
    marks: list[Attribution]
    report: Path
    seconds: dict[str, float] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    culprits: list[Culprit] = field(default_factory=list)


def matching_result(
    results: Sequence[Path], input_list: str | Path | None, inputs: Sequence[InputTensor]
) -> Path:
    """The ``Result_N`` computed from the same files as the golden run."""
    if input_list is None or len(results) == 1:
        return results[0]
    wanted = {t.name: t.path.resolve() for t in inputs}
    for entry, result in zip(parse_input_list(input_list).entries, results, strict=False):
        files = [p.resolve() for _, p in entry.items]
        if set(files) == set(wanted.values()):
            return result
    log.warning(
        "no input-list line uses the --input_tensor files; comparing the golden with Result_0"
    )
    return results[0]


def check_oneshot(
    framework: str,
    model_path: str | Path,
    input_tensors: Sequence[InputTensor],
    input_list: str | Path | None = None,
    default_verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    verifier_config: str | Path | None = None,
    golden_dir: str | Path | None = None,
    engine_kwargs: dict | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
) -> None:
    """Everything the three components will need, checked before the first one starts and
    without writing: the model, every ``-i`` and ``-l`` file (size, NaN/Inf), ``-qo``, the
    verifiers, and every folder the run will write."""
    allow = allow_nonfinite_inputs
    if golden_dir is None:
        if not input_tensors:
            raise AccdbgError(
                "framework diagnosis needs -i/--input_tensor (or give --golden_output_reference_directory)"
            )
        check_framework_diagnosis(
            framework, model_path, input_tensors, working_dir, output_dirname, allow
        )
    else:
        if not Path(golden_dir).is_dir():
            raise AccdbgError(
                f"--golden_output_reference_directory {str(golden_dir)!r} does not exist or is not a folder"
            )
        for t in input_tensors:
            t.check(allow)
    kwargs = {k: v for k, v in (engine_kwargs or {}).items() if k != "golden_dir_for_mapping"}
    if framework == "onnx":
        check_inference_engine(
            model_path,
            input_list,
            input_tensors,
            working_dir=working_dir,
            output_dirname=output_dirname,
            allow_nonfinite_inputs=allow,
            **kwargs,
        )
    else:  # the engine's model is converted later: check what can be checked now
        check_model_path(model_path, framework)
        check_engine_options(**kwargs)
        check_writable(component_root(working_dir, "conversion"))
        check_run_folder(working_dir, "inference_engine", output_dirname)
        if input_list:
            _check_list_files(input_list, input_tensors, allow)
    check_verifiers(default_verifiers, verifier_config)
    check_run_folder(working_dir, "verification", output_dirname)


def _check_list_files(
    input_list: str | Path, inputs: Sequence[InputTensor], allow_nonfinite: bool
) -> None:
    """Input-list files of a model converted later: sizes against the matching ``-i``."""
    parsed = parse_input_list(input_list)
    by_name = {t.name: t for t in inputs}
    for entry in parsed.entries:
        for i, (name, path) in enumerate(entry.items):
            t = by_name.get(name) if name else (inputs[i] if i < len(inputs) else None)
            what = f"{parsed.path}:{entry.line_no}: input {name or (t.name if t else i)!r}"
            if t is not None:
                check_raw_size(path, t.dims, t.dtype, what)
            dtype = t.dtype if t is not None else np.dtype("float32")
            check_finite(path, dtype, what, allow_nonfinite, t.dims if t is not None else None)


def run_oneshot(
    framework: str,
    model_path: str | Path,
    input_tensors: Sequence[InputTensor],
    input_list: str | Path | None = None,
    output_tensors: Sequence[str] = (),
    default_verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    verifier_config: str | Path | None = None,
    golden_dir: str | Path | None = None,
    enable_tensor_inspection: bool = False,
    engine_kwargs: dict | None = None,
    framework_kwargs: dict | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
) -> OneshotResult:
    """Run the three components in sequence and write the report; returns its tables.

    Every input is checked first (:func:`check_oneshot`): a bad one is refused before any
    component writes anything.
    """
    check_oneshot(
        framework,
        model_path,
        input_tensors,
        input_list,
        default_verifiers,
        verifier_config,
        golden_dir,
        engine_kwargs,
        working_dir,
        output_dirname,
        allow_nonfinite_inputs,
    )
    with ExitStack() as stack:
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        if golden_dir is None:
            if not input_tensors:
                raise AccdbgError(
                    "framework diagnosis needs -i/--input_tensor (or give --golden_output_reference_directory)"
                )
            gold = run_framework_diagnosis(
                framework,
                model_path,
                input_tensors,
                output_tensors,
                working_dir=working_dir,
                output_dirname=output_dirname,
                allow_nonfinite_inputs=allow_nonfinite_inputs,
                **(framework_kwargs or {}),
            )
            golden_dir = gold.run_dir
            seconds["framework_diagnosis"] = time.perf_counter() - t
        golden_dir = Path(golden_dir)
        conversion = None
        engine_model, engine_inputs = Path(model_path), list(input_tensors)
        if framework != "onnx":
            t = time.perf_counter()
            from accdbg.frameworks.convert import convert_to_onnx

            out = Path(working_dir) / "conversion" / (output_dirname or golden_dir.name)
            conversion = convert_to_onnx(framework, model_path, input_tensors, out, output_tensors)
            engine_model = conversion.onnx_path
            engine_inputs = [
                replace(t, name=conversion.input_names.get(t.name, t.name)) for t in input_tensors
            ]
            seconds["conversion to ONNX"] = time.perf_counter() - t
        pool = None
        if enable_tensor_inspection:
            from accdbg.inspection import Workers

            # Started now: their start-up (imports, plot set-up) overlaps the engine run.
            pool = stack.enter_context(Workers())
        t = time.perf_counter()
        kwargs = {
            **(engine_kwargs or {}),
            "golden_dir_for_mapping": golden_dir if conversion is None else None,
        }
        engine = run_inference_engine(
            engine_model,
            input_list=input_list,
            input_tensors=engine_inputs,
            working_dir=working_dir,
            output_dirname=output_dirname,
            allow_nonfinite_inputs=allow_nonfinite_inputs,
            **kwargs,
        )
        if conversion is not None:
            _carry_conversion(engine, conversion)
        seconds["inference_engine"] = time.perf_counter() - t
        t = time.perf_counter()
        target = matching_result(engine.results, input_list, input_tensors)
        ver = run_verification(
            golden_dir,
            target,
            default_verifiers=default_verifiers,
            tensor_mapping=engine.tensor_mapping,
            graph_struct=engine.graph_struct,
            verifier_config=verifier_config,
            qnn_model_json_path=engine.model_net_json,
            working_dir=working_dir,
            output_dirname=output_dirname,
        )
        seconds["verification"] = time.perf_counter() - t
        verifiers = {
            v["label"]: get_verifier(v["spec"]) for v in ver.verifiers if v.get("spec") is not None
        }
        inputs_of = inputs_from_graph_struct(
            json.loads(engine.graph_struct.read_text(encoding="utf-8"))
        )
        summary, marks = attribute(ver.summary, verifiers, inputs_of)
        t = time.perf_counter()
        ranking = find_culprits(
            engine.qdq_model,
            golden_dir,
            summary,
            "Name",
            verifiers,
            feeds={t_.name: t_.load() for t_ in engine_inputs},
            float_model=prepared_model(engine.qdq_model),
            golden_name=json.loads(engine.tensor_mapping.read_text(encoding="utf-8")),
            target=target,
        )
        summary = ranking.apply(summary, "Name")
        seconds["culprit ranking"] = time.perf_counter() - t
        links = _detail_links(ver.run_dir, summary, [v["label"] for v in ver.verifiers])
        if enable_tensor_inspection:
            t = time.perf_counter()
            from accdbg.inspection import run_tensor_inspection

            insp_dir = ver.run_dir / "tensor_inspection"
            run_tensor_inspection(
                golden_dir,
                target,
                verifiers=[v["spec"] for v in ver.verifiers],
                tensor_mapping=engine.tensor_mapping,
                out_dir=insp_dir,
                workers=pool,
            )
            for name in summary["Name"]:
                folder = insp_dir / safe_relpath(str(name))
                if folder.is_dir():
                    links.setdefault(name, []).append(
                        ("plots", str(folder.relative_to(ver.run_dir)) + "/Histograms.png")
                    )
            seconds["tensor_inspection"] = time.perf_counter() - t
        _rewrite_summary(ver.run_dir, summary, marks, ranking.findings)
        failed = [bool(f) for f in summary.get("Failed", pd.Series([""] * len(summary))).fillna("")]
        meta = (
            f"model {Path(model_path).name} - engine {engine.engine_label} ({engine_kwargs.get('runtime', 'htp') if engine_kwargs else 'htp'})"
            f" - golden {golden_dir} - target {target}"
        )
        report = write_report(
            ver.run_dir / "summary.html",
            summary,
            verifiers,
            marks,
            title=f"accdbg oneshot-layerwise: {Path(model_path).name}",
            meta=meta,
            links=links,
            failed=failed,
            notes=[f"{k}: {v:.1f} s" for k, v in seconds.items()],
            findings=ranking.findings,
        )
        for line in ranking.findings:
            log.info("%s", line)
        log.info("report: %s", report)
        return OneshotResult(
            golden_dir,
            engine.run_dir,
            ver.run_dir,
            summary,
            marks,
            report,
            seconds,
            ranking.findings,
            ranking.culprits,
        )


def _carry_conversion(engine, conversion) -> None:
    """Map engine tensors to framework names and record their layouts, through the conversion.

    The engine names tensors after the converted ONNX model; ``tensor_mapping.json`` becomes
    engine name -> framework name (the ONNX-level file is kept as ``tensor_mapping_onnx.json``),
    and each dumped tensor records its layout so verification transposes instead of guessing.
    """
    onnx_map = json.loads(engine.tensor_mapping.read_text(encoding="utf-8"))
    write_json_atomic(engine.run_dir / "tensor_mapping_onnx.json", onnx_map)
    composed = {
        k: conversion.tensor_mapping[v]
        for k, v in onnx_map.items()
        if v in conversion.tensor_mapping
    }
    write_json_atomic(engine.tensor_mapping, composed)
    onnx_of = {k: v for k, v in onnx_map.items()}
    for result in engine.results:
        path = result / "tensors.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        for rec in data["tensors"]:
            perm = conversion.permutations.get(onnx_of.get(rec["name"], rec["name"]))
            if len(rec["shape"]) == 4 and perm is not None:
                rec["layout"] = (
                    "NCHW"
                    if list(perm) == [0, 2, 3, 1]
                    else ("NHWC" if list(perm) == [0, 1, 2, 3] else None)
                )
        write_json_atomic(path, data)
    missing = [k for k in onnx_map if k not in composed]
    if missing:
        log.info(
            "%d engine tensor(s) have no framework counterpart (fused by the converter), e.g. %s",
            len(missing),
            ", ".join(missing[:5]),
        )


def _rewrite_summary(
    run_dir: Path, summary: pd.DataFrame, marks: Sequence[Attribution], findings: Sequence[str]
) -> None:
    """Add the attribution columns and marks to verification's summary.csv/json, keeping the rest."""
    write_csv(summary, run_dir / "summary.csv")
    path = run_dir / "summary.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data["columns"] = list(map(str, summary.columns))
    data["rows"] = frame_records(summary)
    data["attribution"] = [json_value(m.__dict__) for m in marks]
    data["findings"] = list(findings)
    write_json_atomic(path, data)


def _detail_links(
    run_dir: Path, summary: pd.DataFrame, labels: Sequence[str]
) -> dict[str, list[tuple[str, str]]]:
    """Per-tensor verifier pages written by verification, relative to the summary."""
    links: dict[str, list[tuple[str, str]]] = {}
    for name in summary["Name"]:
        rel = safe_relpath(str(name))
        for label in labels:
            page = run_dir / label / f"{rel}.html"
            if page.is_file():
                links.setdefault(name, []).append((label, f"{label}/{rel}.html"))
    return links
