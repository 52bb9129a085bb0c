"""Oneshot-layerwise: framework diagnosis, QNN engine and verification in one run.

It shows where the error *appears*. On top of the verification summary it marks where the
error *enters* (see :mod:`accdbg.algorithms.diagnosis.attribution`) and ranks the culprits; those
columns and the HTML report go into verification's summary files as verification writes them
(an annotation step, :class:`_Annotator`), never rewritten after that run is finished.

Every input-list line is debugged: framework diagnosis makes one golden per line, each
``Result_N`` is verified against its own golden (verification refuses dumps of different
inputs), and the summary aggregates over the inputs. The culprit ranking and tensor
inspection look at the input whose final outputs score worst.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from accdbg.algorithms.diagnosis import story
from accdbg.algorithms.diagnosis.attribution import Attribution, attribute
from accdbg.algorithms.diagnosis.culprits import Prefetch, find_culprits, prepared_model
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking import Culprit, Ranking
from accdbg.algorithms.protocol import Algorithm, AlgorithmRequest, AlgorithmResult, register
from accdbg.core.inputs import (
    InputTensor,
    check_finite,
    check_raw_size,
    parse_input_list,
    requested_outputs,
)
from accdbg.core.provenance import recorded_inputs
from accdbg.core.run_dir import (
    check_run_folder,
    check_writable,
    component_root,
)
from accdbg.core.tensor_store import TensorFolder, safe_relpath
from accdbg.engines import EngineResult, run_inference_engine
from accdbg.engines.options import EngineConfig
from accdbg.engines.run import ModelReady, check_inference_engine
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import (
    check_framework_diagnosis,
    check_model_path,
    run_framework_diagnosis,
)
from accdbg.mapping.graph_struct import inputs_of, load_graph_struct
from accdbg.reports.html_report import write_report
from accdbg.verifiers import get_verifier
from accdbg.verifiers.aggregate import inputs_worst_first
from accdbg.verifiers.base import Verifier
from accdbg.verifiers.configured import check_verifiers
from accdbg.verifiers.pairing import find_results
from accdbg.verifiers.verification import SummaryAnnotation, VerificationResult, run_verification

log = logging.getLogger("accdbg.oneshot")

# the culprit ranking's evidence and CPU simulation run beside the engine's backend run (off:
# all of it after the run, as the benchmark measures to price the overlap)
PREFETCH = True
# every named culprit's fix measured on QNN (off: the ranking's CPU verdict alone, as the
# benchmark measures to price the verification)
VERIFY = True


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
    inputs: pd.DataFrame | None = None  # one row per input: files, final outputs' scores
    worst_input: str | None = None  # the Result_N the culprit ranking looked at
    # a model of another framework: the ONNX model it was converted to, which QNN ran, and the
    # input tensors under their names there (what the fix search measures)
    converted_model: Path | None = None
    converted_inputs: list[InputTensor] = field(default_factory=list)


def listed_line(input_list: str | Path, inputs: Sequence[InputTensor]) -> int | None:
    """The index of the input-list line that uses exactly the ``--input_tensor`` files."""
    wanted = sorted(str(t.path.resolve()) for t in inputs)
    for i, entry in enumerate(parse_input_list(input_list).entries):
        if sorted(str(p.resolve()) for _, p in entry.items) == wanted:
            return i
    return None


def _note_input_list(input_list: str | Path, inputs: Sequence[InputTensor]) -> None:
    """-i beside -l: the list is what is debugged; say so when -i's files are not in it."""
    n = len(parse_input_list(input_list).entries)
    line = listed_line(input_list, inputs)
    files = ", ".join(str(t.path) for t in inputs)
    if line is None:
        log.info(
            "-i files (%s) are not a line of -l %s: debugging its %d line(s); -i only gives the "
            "input names, dims and types",
            files,
            input_list,
            n,
        )
    else:
        log.debug("-i files are line %d of -l %s", line + 1, input_list)


def _target(
    golden: dict[str, Path],
    engine_results: Sequence[Path],
    input_list: str | Path | None,
    inputs: Sequence[InputTensor],
) -> Path:
    """What verification compares the golden with: every result, except when a golden of one
    input that records no input files meets several results: then the ``-i`` files' line."""
    output = engine_results[0].parent
    if len(golden) > 1 or len(engine_results) == 1:
        return output
    (only,) = golden.values()
    if recorded_inputs(TensorFolder(only).meta) is not None:
        return output  # verification keeps the results of the golden's own input
    line = listed_line(input_list, inputs) if input_list is not None else None
    if line is None:
        raise AccdbgError(
            f"--golden_output_reference_directory {str(only)!r} records no input files and the -i "
            f"files are not a line of -l {str(input_list)!r}: which Result_N it belongs to is unknown"
        )
    log.info(
        "%s records no input files: taken as computed from the -i files (-l line %d, %s)",
        only,
        line + 1,
        engine_results[line].name,
    )
    return engine_results[line]


def check_oneshot(
    framework: str,
    model_path: str | Path,
    input_tensors: Sequence[InputTensor],
    input_list: str | Path | None = None,
    default_verifiers: Sequence = ("CosineSimilarity", "SQNR"),
    verifier_config: str | Path | None = None,
    golden_dir: str | Path | None = None,
    engine_kwargs: EngineConfig | dict | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    output_tensors: Sequence[str] = (),
) -> None:
    """Everything the three components will need, checked before the first one starts and
    without writing: the model, every ``-i`` and ``-l`` file (size, NaN/Inf), ``-qo``, the
    outputs asked for (``-o``, the list's ``#`` line), the verifiers, and every folder the run
    will write."""
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
    config = EngineConfig.coerce(engine_kwargs)
    if framework == "onnx":
        check_inference_engine(
            model_path,
            input_list,
            input_tensors,
            config,
            working_dir=working_dir,
            output_dirname=output_dirname,
            allow_nonfinite_inputs=allow,
            output_tensors=output_tensors,
        )
    else:  # the engine's model is converted later: check what can be checked now
        check_model_path(model_path, framework)
        config.check()
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


def _golden(
    framework,
    model_path,
    input_tensors,
    input_list,
    output_tensors,
    working_dir,
    output_dirname,
    allow_nonfinite_inputs,
    framework_kwargs,
) -> Path:
    """The framework diagnosis run: one float golden per input."""
    if not input_tensors:
        raise AccdbgError(
            "framework diagnosis needs -i/--input_tensor (or give --golden_output_reference_directory)"
        )
    if input_list is not None:
        _note_input_list(input_list, input_tensors)
    gold = run_framework_diagnosis(
        framework,
        model_path,
        input_tensors,
        output_tensors,
        working_dir=working_dir,
        output_dirname=output_dirname,
        input_list=input_list,
        allow_nonfinite_inputs=allow_nonfinite_inputs,
        **(framework_kwargs or {}),
    )
    return gold.run_dir


def _prefetcher(stack: ExitStack, goldens, engine_inputs, prefetch: list):
    """The engine's ``on_ready``: the ranking's work that needs no backend result starts beside
    the run (appended to ``prefetch``; closed with ``stack``)."""

    def ready(m: ModelReady) -> None:
        if not (PREFETCH and "Result_0" in goldens and m.inputs):
            return
        first, *rest = m.inputs
        try:  # never the run's failure: the ranking then does it all after the run
            feeds = _feeds_from(first, engine_inputs)
        except Exception as exc:
            log.info("culprit ranking not prepared beside the run: %s", exc)
            return
        work = Prefetch(
            m.model,
            goldens["Result_0"],
            m.tensor_mapping,
            feeds,
            (_feeds_from(f, engine_inputs) for f in rest),
            start=False,
        )
        stack.callback(work.close)  # done by then, unless the run stopped
        prefetch.append(work)
        work.start()  # once its close is arranged: a signal may come at any step

    return ready


def _converted(framework, model_path, input_tensors, output_tensors, working_dir, name):
    """Another framework's model as ONNX, for the engine: (conversion, model, its inputs)."""
    from accdbg.frameworks.convert import convert_to_onnx

    out = Path(working_dir) / "conversion" / name
    conversion = convert_to_onnx(framework, model_path, input_tensors, out, output_tensors)
    return conversion, conversion.onnx_path, conversion.renamed(input_tensors)


def _judged(output_tensors, input_list, qdq_model: Path) -> tuple[list[str], list[str]]:
    """The outputs judged (the verdict, the table of inputs): those asked for with -o and the
    list's '#' line (else none), and the graph's outputs when none is asked for."""
    listed = parse_input_list(input_list) if input_list else None
    judged = list(requested_outputs(output_tensors, listed))
    graph = onnx.load(str(qdq_model), load_external_data=False).graph
    return judged, judged or [o.name for o in graph.output]


def _result(golden_dir, engine, ver, notes, seconds, conversion, engine_inputs) -> OneshotResult:
    """The verdict printed, the report named, the tables returned."""
    report = ver.run_dir / "summary.html"
    for line in notes.findings:
        log.info("%s", line)
    log.info("report: %s", report)
    return OneshotResult(
        golden_dir,
        engine.run_dir,
        ver.run_dir,
        ver.summary,
        notes.marks,
        report,
        seconds,
        notes.findings,
        notes.culprits,
        ver.inputs,
        notes.worst,
        conversion.onnx_path if conversion is not None else None,
        engine_inputs if conversion is not None else [],
    )


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
    engine_kwargs: EngineConfig | dict | None = None,
    framework_kwargs: dict | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    model_explorer: bool = True,
) -> OneshotResult:
    """Run the three components in sequence and write the report; returns its tables.

    Every input is checked first (:func:`check_oneshot`): a bad one is refused before any
    component writes anything. With ``model_explorer``, the verification run also gets Model
    Explorer overlays (scores, culprit ranking, marks) on the source ONNX model (the
    converted one for other frameworks), linked from the report.
    """
    config = EngineConfig.coerce(engine_kwargs)
    check_oneshot(
        framework,
        model_path,
        input_tensors,
        input_list,
        default_verifiers,
        verifier_config,
        golden_dir,
        config,
        working_dir,
        output_dirname,
        allow_nonfinite_inputs,
        output_tensors,
    )
    with ExitStack() as stack:
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        if golden_dir is None:
            golden_dir = _golden(
                framework,
                model_path,
                input_tensors,
                input_list,
                output_tensors,
                working_dir,
                output_dirname,
                allow_nonfinite_inputs,
                framework_kwargs,
            )
            seconds["framework_diagnosis"] = time.perf_counter() - t
        golden_dir = Path(golden_dir)
        goldens, _ = find_results(golden_dir, "--golden_output_reference_directory")
        conversion, engine_model, engine_inputs = None, Path(model_path), list(input_tensors)
        if framework != "onnx":
            t = time.perf_counter()
            conversion, engine_model, engine_inputs = _converted(
                framework, model_path, input_tensors, output_tensors, working_dir,
                output_dirname or golden_dir.name,
            )  # fmt: skip
            seconds["conversion to ONNX"] = time.perf_counter() - t
        pool = None
        if enable_tensor_inspection:
            from accdbg.inspection import Workers

            # Started now: their start-up (imports, plot set-up) overlaps the engine run.
            pool = stack.enter_context(Workers())
        t = time.perf_counter()
        mapping_dir = next(iter(goldens.values())) if conversion is None else None
        prefetch: list[Prefetch] = []
        ready = _prefetcher(stack, goldens, engine_inputs, prefetch)
        engine = run_inference_engine(
            engine_model,
            input_list=input_list,
            input_tensors=engine_inputs,
            config=replace(
                config,
                dump=replace(
                    config.dump,
                    golden_dir_for_mapping=str(mapping_dir) if mapping_dir else None,
                ),
            ),
            working_dir=working_dir,
            output_dirname=output_dirname,
            allow_nonfinite_inputs=allow_nonfinite_inputs,
            conversion=conversion,
            on_ready=ready,
            output_tensors=output_tensors if conversion is None else (),
        )
        seconds["inference_engine"] = engine.seconds  # as its console line says
        t = time.perf_counter()
        target = _target(goldens, engine.results, input_list, input_tensors)
        judged, graph_outputs = _judged(output_tensors, input_list, engine.qdq_model)
        notes = _Annotator(
            engine=engine,
            engine_inputs=engine_inputs,
            seconds=seconds,
            started=t,
            title=f"accdbg oneshot-layerwise: {Path(model_path).name}",
            meta=(
                f"model {Path(model_path).name} - engine {engine.engine_label} "
                f"({config.backend.runtime}) - golden {golden_dir} - target {target}"
            ),
            inspection=pool,
            prefetch=prefetch[0] if prefetch else None,
            verify=VERIFY
            and _verify_plan(
                engine, engine_model, engine_inputs, input_list, config, framework, model_path
            ),
            judged=judged,
            story=(
                Path(model_path),
                tuple(story.input_files(input_list, input_tensors)),
                Path(working_dir),
            ),
        )
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
            outputs=graph_outputs,
            model_explorer=model_explorer,  # with the ranking and marks: they are in the summary
            annotate=notes,
        )
        if ver.overlay_seconds is not None:
            seconds["model explorer overlays"] = ver.overlay_seconds
        return _result(golden_dir, engine, ver, notes, seconds, conversion, engine_inputs)


@dataclass
class _Annotator:
    """Oneshot's part of the verification summary, computed inside the verification run
    (:class:`~accdbg.verifiers.verification.SummaryAnnotation`): where the error enters
    (marks), the culprit ranking on the worst input, tensor inspection, and the HTML report
    as ``summary.html``. What it found stays on the object for :class:`OneshotResult`."""

    engine: EngineResult
    engine_inputs: Sequence[InputTensor]
    seconds: dict[str, float]
    started: float
    title: str
    meta: str
    inspection: Any = None  # the tensor inspection's worker pool, when it runs
    marks: list[Attribution] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    culprits: list[Culprit] = field(default_factory=list)
    unconfirmed: list[Culprit] = field(default_factory=list)
    worst: str | None = None
    prefetch: Prefetch | None = None  # the ranking's work done beside the engine run
    # what the culprits' fixes are measured with on QNN (None: not verified, e.g. simulation)
    verify: VerifyPlan | None = None
    judged: Sequence[str] = ()  # the outputs asked for (-o, the list's '#' line), if any
    # what the verdict is compared with the other algorithms' on (the model, its input files)
    story: tuple[Path, tuple[Path, ...], Path] | None = None

    def __call__(self, ver: VerificationResult) -> SummaryAnnotation:
        seconds, engine = self.seconds, self.engine
        seconds["verification: tensor pairs compared"] = time.perf_counter() - self.started
        verifiers = {
            v["label"]: get_verifier(v["spec"]) for v in ver.verifiers if v.get("spec") is not None
        }
        layer_inputs = inputs_of(load_graph_struct(engine.graph_struct))
        summary, self.marks = attribute(ver.summary, verifiers, layer_inputs)
        several = len(ver.per_input) > 1
        order = inputs_worst_first(ver.inputs, verifiers) if several else list(ver.per_input)
        worst = order[0]
        mapping = json.loads(engine.tensor_mapping.read_text(encoding="utf-8"))

        def rank_on(key: str, prefetch: Prefetch | None) -> Ranking:
            golden, target = ver.folders[key]
            return find_culprits(
                engine.qdq_model,
                golden,
                ver.per_input[key] if several else summary,
                "Name",
                verifiers,
                feeds=_feeds_of(target, self.engine_inputs),
                float_model=prepared_model(engine.qdq_model),
                golden_name=mapping,
                target=target,
                simulated=engine.simulated,
                more_feeds=(  # loaded only if a layer stands out
                    _feeds_of(t, self.engine_inputs)
                    for k, (_, t) in ver.folders.items()
                    if k != key
                ),
                prefetch=prefetch,
                verdict_outputs=self.judged,
            )

        t = time.perf_counter()
        ranking = rank_on(worst, self.prefetch)
        # the worst input and its noise floor, when that fails the pass mark: every layer
        # loses its information there (its values use a small part of the ranges calibrated
        # on all inputs) and none can stand out, so the ranking is on the worst input where
        # the layers keep theirs
        low = (worst, ranking.floor_db) if ranking.floor_db < POLICY.abs_db else None
        for other in order[1:] if low else ():
            found = rank_on(other, None)
            if found.floor_db >= POLICY.abs_db:
                ranking, worst = found, other
                break
        self.worst = worst
        golden_w, target_w = ver.folders[worst]
        seconds["culprit ranking"] = time.perf_counter() - t
        worst_line = _worst_line(ver.inputs, worst, verifiers, low) if several else ""
        if engine.observer:  # once, after the outputs' verdict: what the debug graph changed
            ranking.findings.insert(
                1,
                f"the debug graph's outputs differ from a plain run of the same model on "
                f"{engine.engine_label}: {'; '.join(e.line() for e in engine.observer)} - "
                "exposing every tensor changed what the backend fuses: the layers' rows are the "
                "debug graph's, the outputs as deployed are the plain run's",
            )
        if self.verify and (ranking.culprits or ranking.outputs_pass is False):
            t = time.perf_counter()
            ranking = self.verify.run(ranking, ver.run_dir, worst_line)
            seconds["verification on QNN"] = time.perf_counter() - t
        elif worst_line:
            ranking.findings.insert(len(ranking.findings), worst_line)
        if self.story is not None:
            model, files, working = self.story
            told = story.tell(
                "oneshot-layerwise", ver.run_dir, working, model, files, ranking.culprits
            )
            ranking.findings[:] = story.before_fix(ranking.findings, told)
        # what the encoding rules flag (Concat inputs on one range, norms at 16 bits, int4
        # where HTP runs it), before what to do
        ranking.findings[:] = story.before_fix(ranking.findings, engine.rules)
        summary = ranking.apply(summary, "Name")
        self.culprits = ranking.culprits
        self.unconfirmed = ranking.unconfirmed
        self.findings = list(ranking.findings)
        labels = [v["label"] for v in ver.verifiers]
        links = _detail_links(ver.run_dir, summary, labels, several)
        if self.inspection is not None:
            t = time.perf_counter()
            from accdbg.inspection import run_tensor_inspection

            insp_dir = ver.run_dir / "tensor_inspection"
            if several:
                log.info("tensor inspection on the worst input, %s", worst)
            run_tensor_inspection(
                golden_w,
                target_w,
                verifiers=[v["spec"] for v in ver.verifiers],
                tensor_mapping=engine.tensor_mapping,
                out_dir=insp_dir,
                workers=self.inspection,
            )
            for name in summary["Name"]:
                folder = insp_dir / safe_relpath(str(name))
                if folder.is_dir():
                    links.setdefault(name, []).append(
                        ("plots", str(folder.relative_to(ver.run_dir)) + "/Histograms.png")
                    )
            seconds["tensor_inspection"] = time.perf_counter() - t
        failed = [bool(f) for f in summary.get("Failed", pd.Series([""] * len(summary))).fillna("")]
        notes = [f"{k}: {v:.1f} s" for k, v in seconds.items()]

        def page(path: Path) -> Path:
            return write_report(
                path,
                summary,
                verifiers,
                self.marks,
                title=self.title,
                meta=self.meta,
                links=links,
                failed=failed,
                notes=notes,
                findings=self.findings,
                inputs=ver.inputs if several else None,
                input_pages={k: f"{k}/summary.html" for k in ver.per_input},
            )

        extra: dict[str, Any] = {
            "attribution": [m.__dict__ for m in self.marks],
            "findings": list(self.findings),
            "culprits": [c.as_dict() for c in self.culprits],
            "unconfirmed": [c.as_dict() for c in self.unconfirmed],
        }
        if several:
            extra["culprit_ranking_input"] = worst
        return SummaryAnnotation(summary, extra, page)


def _verify_plan(
    engine: EngineResult,
    engine_model: Path,
    engine_inputs: Sequence[InputTensor],
    input_list: str | Path | None,
    config: EngineConfig,
    framework: str,
    model_path: str | Path,
) -> VerifyPlan | None:
    """What the culprits' verification needs, when there is a backend to verify on: a model
    quantized here (its float model prepared beside it), run by QNN."""
    if engine.simulated or config.stage != "source" or not config.quant.quantizes:
        return None
    if not prepared_model(engine.qdq_model).is_file():
        return None
    from accdbg.algorithms.fixes.verify import run_command
    from accdbg.engines.pipeline import Calibration

    model = onnx.load(str(engine_model), load_external_data=False)
    feeds = Calibration.from_inputs(model, input_list, engine_inputs).feeds
    return VerifyPlan(
        engine, feeds, config, run_command(framework, model_path, engine_inputs, input_list, config)
    )


@dataclass
class VerifyPlan:
    """How oneshot measures its culprits' fixes on QNN (:mod:`accdbg.algorithms.fixes.verify`)."""

    engine: EngineResult
    feeds: list  # every debugged input: name -> (path, dims, dtype name)
    config: EngineConfig
    command: tuple[str, ...]

    def run(self, ranking: Ranking, run_dir: Path, worst_line: str) -> Ranking:
        """The ranking, its culprits confirmed on QNN (or dropped), the fix line last; the
        worst-input line stays before the verification's lines."""
        from accdbg.algorithms.fixes.verify import FixContext, verify_ranking

        if worst_line:
            ranking.findings.append(worst_line)
        ctx = FixContext.of_run(
            self.engine.qdq_model, self.feeds, self.config, run_dir, self.command
        )
        return verify_ranking(ranking, ctx)


def _feeds_of(target: Path, engine_inputs: Sequence[InputTensor]) -> dict[str, np.ndarray]:
    """The engine's feeds of one result: the files its manifest records, else the -i files."""
    files = recorded_inputs(TensorFolder(target).meta) or {}
    return _feeds_from({n: Path(f["path"]) for n, f in files.items()}, engine_inputs)


def _feeds_from(
    files: dict[str, Path], engine_inputs: Sequence[InputTensor]
) -> dict[str, np.ndarray]:
    """The engine inputs read from these files (by input name), else from their -i files."""
    return {
        t.name: (replace(t, path=files[t.name]) if t.name in files else t).load()
        for t in engine_inputs
    }


def _worst_line(
    table: pd.DataFrame,
    worst: str,
    verifiers: dict[str, Verifier],
    low: tuple[str, float] | None = None,
) -> str:
    """The finding that says which input the culprit ranking looked at, and why."""
    row = table.set_index("Input").loc[worst]
    label = next(
        (lab for lab in verifiers if any(c.endswith(f" {lab}") for c in table.columns)), None
    )
    scores = []
    for col in [c for c in table.columns if label and c.endswith(f" {label}")]:
        values = pd.to_numeric(table[col], errors="coerce").dropna()
        value = pd.to_numeric(pd.Series([row[col]]), errors="coerce").iloc[0]
        if not values.empty and not pd.isna(value):
            scores.append(f"{col} {value:.4g} (median over inputs {np.median(values):.4g})")
    tail = f" - {', '.join(scores)}" if scores else ""
    files = f"{worst} ({row['Files']})"
    why = (
        f"under the {POLICY.abs_db:g} dB pass mark: its values use a small part of the ranges "
        "calibrated for all inputs, which is a calibration question, no one layer's doing"
    )
    if low is None:
        where = f"the worst of {len(table)} inputs: {files}"
    elif worst == low[0]:
        where = (
            f"the worst of {len(table)} inputs: {files}, where the median layer keeps "
            f"{low[1]:.1f} dB - on every input it falls {why}"
        )
    else:
        where = (
            f"{files}, the worst of {len(table)} inputs whose layers keep their information: "
            f"on the worst, {low[0]}, the median layer keeps {low[1]:.1f} dB, {why}"
        )
    return f"the culprit ranking is on {where}{tail}"


def _detail_links(
    run_dir: Path, summary: pd.DataFrame, labels: Sequence[str], several: bool = False
) -> dict[str, list[tuple[str, str]]]:
    """Per-tensor verifier pages written by verification, relative to the summary; over
    several inputs, the page of the input where the verifier scored worst."""
    links: dict[str, list[tuple[str, str]]] = {}
    for _, row in summary.iterrows():
        name = row["Name"]
        rel = safe_relpath(str(name))
        for label in labels:
            where = row.get(f"{label}_worst_input") if several else None
            if several and not isinstance(where, str):
                continue
            sub = f"{safe_relpath(where)}/{label}" if several else label
            if (run_dir / sub / f"{rel}.html").is_file():
                text = f"{label} ({where})" if several else label
                links.setdefault(name, []).append((text, f"{sub}/{rel}.html"))
    return links


@register("oneshot-layerwise")
class Oneshot(Algorithm):
    """Oneshot-layerwise behind the protocol (:func:`run_oneshot`); its options
    ``enable_tensor_inspection`` and ``framework_kwargs``. It runs another framework's model
    in that framework (its golden) and on QNN as converted: not on the ONNX conversion only."""

    on_onnx = False

    def check(self, req: AlgorithmRequest) -> None:
        check_oneshot(
            req.framework,
            req.model_path,
            req.input_tensors,
            req.input_list,
            req.verifiers,
            req.verifier_config,
            req.golden_dir,
            req.config,
            req.working_dir,
            req.output_dirname,
            req.allow_nonfinite_inputs,
            req.output_tensors,
        )

    def run(self, req: AlgorithmRequest) -> AlgorithmResult:
        o = req.options
        res = run_oneshot(
            req.framework,
            req.model_path,
            req.input_tensors,
            input_list=req.input_list,
            output_tensors=req.output_tensors,
            default_verifiers=req.verifiers,
            verifier_config=req.verifier_config,
            golden_dir=req.golden_dir,
            enable_tensor_inspection=o.get("enable_tensor_inspection", False),
            engine_kwargs=req.config,
            framework_kwargs=o.get("framework_kwargs"),
            allow_nonfinite_inputs=req.allow_nonfinite_inputs,
            model_explorer=req.model_explorer,
            working_dir=req.working_dir,
            output_dirname=req.output_dirname,
        )
        return AlgorithmResult(
            self.name,
            res.verification_run,
            res.report,
            res.summary,
            res.findings,
            res.culprits,
            res,
        )
