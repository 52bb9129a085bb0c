"""Framework diagnosis: the float golden reference, every intermediate tensor on disk.

The exposed outputs are split over several runs when their total size exceeds the memory
budget, and each tensor is written as soon as its run returns, so peak memory is about one
batch, not the whole model.

With an input list, every line gets its own golden, ``Result_N/`` like the inference
engine's ``output/Result_N``, so each engine result is compared with the golden of its own
input. Every manifest records the input files it was computed from.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from accdbg.core.batching import plan_batches
from accdbg.core.inputs import InputTensor, inputs_per_line, parse_input_list
from accdbg.core.isolate import run_isolated
from accdbg.core.progress import Progress, stage
from accdbg.core.provenance import inputs_record
from accdbg.core.run_dir import (
    RunDir,
    check_run_folder,
    options_dict,
    replaces_finished,
    taking_over,
)
from accdbg.core.tensor_store import TensorWriter, records_table
from accdbg.errors import AccdbgError
from accdbg.frameworks.base import RunnerOptions, get_runner_class
from accdbg.frameworks.formats import check_model_format
from accdbg.frameworks.versions import check_available

log = logging.getLogger("accdbg.framework_diagnosis")

DEFAULT_MEMORY_BUDGET_MB = 4096


@dataclass
class DiagnosisResult:
    """Where the golden tensors went, and their manifest as a table.

    ``results`` are the tensor folders: ``[run_dir]`` for ``-i`` alone, else one
    ``run_dir/Result_N`` per input-list line. ``tensors`` is the first one's manifest."""

    run_dir: Path
    tensors: pd.DataFrame
    batches: int
    seconds: float
    results: list[Path] = field(default_factory=list)


def check_model_path(model_path: str | Path, framework: str = "onnx") -> None:
    """The model file exists (``file.py:factory`` names a file too)."""
    text = str(model_path)
    path = Path(text).expanduser()
    if path.exists():
        check_model_format(framework, path)
        get_runner_class(framework).check_path(path)
        return
    file, sep, factory = text.rpartition(":")
    if sep and file and factory.isidentifier() and Path(file).expanduser().is_file():
        return
    hint = ""
    if framework.strip().lower() == "pytorch" and not text.endswith(".pt2"):
        hint = " (give model.py:factory or an ExportedProgram .pt2)"
    raise AccdbgError(f"-m/--model_path {text!r} does not exist{hint}")


def check_framework_diagnosis(
    framework: str,
    model_path: str | Path,
    inputs: Sequence[InputTensor],
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
) -> None:
    """What a run needs, checked without writing: framework, model, inputs, run folder."""
    if get_runner_class(framework).isolated(RunnerOptions()):
        check_available(framework)  # here, not only in the child that will import it
    check_model_path(model_path, framework)
    for t in inputs:
        t.check(allow_nonfinite_inputs)
    check_run_folder(working_dir, "framework_diagnosis", output_dirname)


def run_framework_diagnosis(
    framework: str,
    model_path: str | Path,
    inputs: Sequence[InputTensor],
    output_tensors: Sequence[str] = (),
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    disable_graph_optimization: bool = False,
    onnx_custom_op_lib: str | Path | None = None,
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB,
    include_constants: bool = False,
    options_record: dict | None = None,
    input_list: str | Path | None = None,
    allow_nonfinite_inputs: bool = False,
) -> DiagnosisResult:
    """Run the float model and dump every intermediate tensor; returns the manifest table.

    ``inputs`` name the model's inputs (dims, dtype) and feed it; with ``input_list`` every
    line is run instead (its files, the names/dims/dtypes of ``inputs``), each into
    ``Result_N/``."""
    start = time.perf_counter()
    check_framework_diagnosis(
        framework, model_path, inputs, working_dir, output_dirname, allow_nonfinite_inputs
    )
    options = RunnerOptions.from_flags(
        disable_graph_optimization, onnx_custom_op_lib, include_constants
    )
    for t in inputs:
        t.load()  # sizes checked before anything is written
    parsed = parse_input_list(input_list) if input_list is not None else None
    record = options_record or options_dict(
        framework=framework,
        model_path=model_path,
        input_tensor=inputs,
        output_tensor=output_tensors,
        disable_graph_optimization=disable_graph_optimization,
        onnx_custom_op_lib=onnx_custom_op_lib,
        memory_budget_mb=memory_budget_mb,
        input_list=input_list,
    )
    job = _Job(framework, str(model_path), list(inputs), options, list(output_tensors), parsed,
               int(memory_budget_mb * 2**20), Path(working_dir), output_dirname, record,
               replaces_finished(working_dir, output_dirname))  # fmt: skip
    if get_runner_class(framework).isolated(options):
        result = run_isolated(
            _diagnose, job, what=f"running {str(model_path)!r} for its golden tensors",
            who=f"the {framework} runtime", log_hint="the log (-v)",
        )  # fmt: skip
    else:
        result = _diagnose(job)
    result.seconds = time.perf_counter() - start
    return result


@dataclass
class _Job:
    """What :func:`_diagnose` needs, picklable: it may run in a child Python."""

    framework: str
    model_path: str
    inputs: list[InputTensor]
    options: RunnerOptions
    output_tensors: list[str]
    parsed: list | None  # the input list's lines, when there is one
    budget: int  # bytes of tensors per run
    working_dir: Path
    output_dirname: str | None
    record: dict  # the options file's content
    # the run replaces a dead end-to-end run's part of this name (run_dir.taking_over, which
    # does not reach a child process by itself)
    replace: bool = False


def _diagnose(job: _Job) -> DiagnosisResult:
    """Load the model in its framework and dump its tensors into a new run folder. Runs in a
    child Python for frameworks whose native code could crash (``FrameworkRunner.isolated``),
    so a crash there is an error, not the end of the tool."""
    model_path, inputs, options = job.model_path, job.inputs, job.options
    runner = get_runner_class(job.framework)(
        Path(model_path).expanduser().absolute(), inputs, options
    )
    with stage(f"framework diagnosis: loading the model in {job.framework}", line=False):
        runner.activate()  # a big framework's import and model load: many seconds
    try:
        runner.check_outputs(job.output_tensors)
        if job.parsed is not None and job.parsed.output_names:
            runner.check_outputs(job.parsed.output_names, job.parsed.outputs_where)
        lines = (
            inputs_per_line(job.parsed, inputs, runner.model_input_order())
            if job.parsed is not None
            else [list(inputs)]
        )
        infos = runner.tensors()
        batches = plan_batches(infos, lambda i: i.nbytes, job.budget)
        over = taking_over(job.working_dir, job.output_dirname if job.replace else None)
        with over, RunDir(job.working_dir, "framework_diagnosis", job.output_dirname) as run:
            options.scratch_dir = run.path / ".scratch"
            run.write_options(job.record)
            log.info(
                "model %s: %d tensors to dump in %d run(s)%s",
                model_path,
                len(infos),
                len(batches),
                f" for each of {len(lines)} input-list lines" if job.parsed is not None else "",
            )
            meta = {
                "component": "framework_diagnosis",
                "framework": runner.name,
                "model": str(Path(model_path).name),
            }
            writers = [
                TensorWriter(
                    run.path / f"Result_{i}" if job.parsed is not None else run.path,
                    meta={
                        **meta,
                        **({"result": i} if job.parsed is not None else {}),
                        "inputs": inputs_record({t.name: t.path for t in line}),
                    },
                )
                for i, line in enumerate(lines)
            ]
            # one run per batch and input; the stage's line is "wrote N tensors" below
            runs = len(batches) * len(lines)
            with Progress("framework diagnosis", runs, "runs", line=False) as bar:
                for batch in batches:
                    for line, writer in zip(lines, writers, strict=True):
                        values = runner.infer(
                            {t.name: t.load() for t in line}, [i.name for i in batch]
                        )
                        for info in batch:
                            arr = values.pop(info.name)
                            writer.write(
                                info.name,
                                arr,
                                node=info.node,
                                op_type=info.op_type,
                                index=info.index,
                                layout=getattr(info, "layout", runner.layout),
                                **getattr(info, "extra", {}),
                            )
                        del values
                        bar.update()
            for writer in writers:
                writer.save_manifest()
            _cleanup(options.scratch_dir)
            table = records_table(writers[0].records.values())
            log.info(
                "wrote %d tensors (%d bytes)%s to %s",
                len(table),
                int(table["bytes"].sum()),
                f" for each of {len(writers)} inputs" if job.parsed is not None else "",
                run.final_path,
            )
    finally:
        runner.deactivate()
    results = [run.path / f"Result_{i}" for i in range(len(lines))] if job.parsed else [run.path]
    return DiagnosisResult(run.path, table, len(batches), 0.0, results)


def _cleanup(path: Path | None) -> None:
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)
