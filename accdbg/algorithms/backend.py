"""Running parts of the model on the backend, each once, in worker processes.

The QNN backend is native code: each part runs in a worker process of an executor
(:mod:`accdbg.core.executors`; by default local, crash-isolated processes kept for the
whole run), so a crash becomes a status for the layers of that part.
Only paths and small facts travel: golden feeds are raw files the child reads itself, and
the outputs come back as ``.npy`` files. A stage file written by the child tells where a
crash happened (session creation or run), which decides the ``err_*`` status.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accdbg.algorithms.fragments import Part
from accdbg.algorithms.statuses import ERR_CNTX, ERR_CON, ERR_EXEC, ERR_LIB
from accdbg.core import onnx_model as om
from accdbg.core.executors import Executor, ExecutorConfig, get_executor
from accdbg.core.executors.calls import function_spec
from accdbg.core.memory import own_peak_rss_mb
from accdbg.engines.base import EngineOptions, get_engine
from accdbg.errors import AccdbgError


@dataclass
class PartJob:
    """One model to run once in the backend process; only paths and small facts travel."""

    engine: str
    options: EngineOptions
    model_path: str
    feeds: dict[str, tuple[str, tuple[int, ...], str]]
    outputs: list[str]
    out_dir: str
    native_log: str
    stage_file: str


@dataclass
class PartReport:
    ok: bool
    stage: str  # where it stopped: "session", "run" or "done"
    error: str = ""
    outputs: dict[str, str] = field(default_factory=dict)  # output -> .npy file
    cpu_nodes: list = field(default_factory=list)
    session_seconds: float = 0.0
    run_seconds: float = 0.0
    sessions: int = 0
    peak_rss_mb: float | None = None  # the child's own high-water mark


def _mark(path: str, stage: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(stage)


def run_part(job: PartJob) -> PartReport:
    """Create the session, run it once, save every output as ``.npy``. Module-level: it is
    what the backend child process runs."""
    from accdbg.engines import worker

    wjob = worker.Job(
        engine=job.engine,
        options=job.options,
        model_path=job.model_path,
        exposed=[],
        feeds=[job.feeds],
        output_root=job.out_dir,
        native_log=job.native_log,
    )
    wrep = worker.JobReport()
    _mark(job.stage_file, "session")
    try:
        sess = worker.checked_session(wjob, job.model_path, job.options, "session creation", wrep)
    except AccdbgError as exc:
        return PartReport(False, "session", str(exc), sessions=1)
    rep = PartReport(
        True,
        "run",
        cpu_nodes=list(wrep.cpu_nodes),
        session_seconds=wrep.session_seconds,
        sessions=wrep.sessions,
    )
    _mark(job.stage_file, "run")
    try:
        values = worker.checked_run(sess, job.outputs, job.feeds, wjob, wrep)
    except AccdbgError as exc:
        rep.ok, rep.error = False, str(exc)
        return rep
    rep.run_seconds = wrep.run_seconds
    out = Path(job.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(job.outputs):
        path = out / f"{i}.npy"
        np.save(path, values.pop(name))
        rep.outputs[name] = str(path)
    rep.stage = "done"
    rep.peak_rss_mb = own_peak_rss_mb()
    _mark(job.stage_file, "done")
    return rep


_CON = re.compile(
    r"INVALID_GRAPH|Invalid model|Load model|ShapeInferenceError|TypeInferenceError|"
    r"NOT_IMPLEMENTED|No Op registered|Could not find an implementation",
    re.I,
)
_CNTX = re.compile(r"finaliz|context", re.I)


def failure_status(report: PartReport) -> str:
    """The reference status for a failed part (see :mod:`accdbg.algorithms.statuses`)."""
    if report.stage == "run":
        return ERR_EXEC
    if _CON.search(report.error):
        return ERR_CON
    if _CNTX.search(report.error):
        return ERR_CNTX
    return ERR_LIB


@dataclass
class PartRun:
    """One part to run; ``token`` is the caller's, handed back with the part's result."""

    token: Any
    part: Part
    feeds: dict
    outputs: list[str]
    label: str
    json_dir: Path | None = None


class Backend:
    """Runs parts on the chosen engine through an executor - by default persistent local
    worker processes for native backends, so a crash is a status, not our death (the part is
    retried once on a fresh process, then reported failed) - and counts the sessions created."""

    job_fn = staticmethod(run_part)  # module-level, so the worker processes can import it

    def __init__(
        self,
        engine: str,
        options: EngineOptions,
        scratch: Path,
        logs: Path,
        executor: ExecutorConfig | None = None,
        workers: int | None = None,
        shown_logs: Path | None = None,
    ):
        """``shown_logs``: where ``logs`` will be when the run has finished (its run folder
        renamed) - the folder a failed part's error names."""
        self.engine = get_engine(engine)
        self.engine_name = engine
        self.options = options
        self.scratch, self.logs = scratch, logs
        self.shown_logs = shown_logs
        self.sessions = 0
        self.peak_rss_mb: float | None = None  # the largest backend worker's own peak
        self._n = 0
        if executor is None:  # native engines in local worker processes, two at a time
            if workers is None:
                workers = min(2, os.cpu_count() or 1) if self.engine.isolated else 1
            executor = ExecutorConfig(
                "local" if self.engine.isolated else "serial", max(1, workers)
            )
        executor.check()
        self.executor_config = executor
        self._executor: Executor | None = None

    @property
    def concurrent(self) -> bool:
        return self.engine.isolated

    @property
    def workers(self) -> int:
        return self.executor_config.workers

    def _job(self, run: PartRun) -> tuple[PartJob, Path]:
        """The part's model written into its own work folder, and its job."""
        self._n += 1
        work = self.scratch / f"{self._n:04d}-{run.label}"
        work.mkdir(parents=True, exist_ok=True)
        model_path = work / "model.onnx"
        if run.part.model.ByteSize() < om.TWO_GIB:
            onnx.save(run.part.model, str(model_path))
        else:
            onnx.save(
                run.part.model, str(model_path), save_as_external_data=True, location="model.data"
            )
        self.logs.mkdir(parents=True, exist_ok=True)
        options = replace(
            self.options,
            json_graph_dir=str(run.json_dir) if run.json_dir else None,
            profiling_level=None,
        )
        job = PartJob(
            self.engine_name,
            options,
            str(model_path),
            run.feeds,
            run.outputs,
            str(work / "out"),
            str(self.logs / f"{run.label}.txt"),
            str(work / "stage"),
        )
        return job, work

    def run_many(
        self, runs: Iterable[PartRun]
    ) -> Iterator[tuple[Any, PartReport, dict[str, np.ndarray]]]:
        """Each part on the executor's workers: its token, report and outputs, as parts
        complete (not in order). ``runs`` is read lazily, as workers free up: a caller may
        add to what it yields from while results come."""
        jobs: dict[str, tuple[PartRun, PartJob, Path]] = {}

        def items() -> Iterator[tuple[str, PartJob]]:
            for run in runs:
                job, work = self._job(run)
                jobs[work.name] = (run, job, work)
                yield work.name, job

        if self._executor is None:
            self._executor = get_executor(self.executor_config)
        for outcome in self._executor.map(function_spec(self.job_fn), items()):
            run, job, work = jobs.pop(outcome.key)
            report = outcome.value if outcome.ok else self._failed(job, outcome.error or "")
            yield run.token, *self._collect(job, work, report)

    def _failed(self, job: PartJob, error: str) -> PartReport:
        """The part's worker crashed (retries spent) or failed: the stage file says where."""
        stage_file = Path(job.stage_file)
        stage = stage_file.read_text(encoding="utf-8") if stage_file.exists() else "session"
        return PartReport(
            False,
            "run" if stage in ("run", "done") else "session",
            f"{self.engine.label}: {error}"
            + (f" - see {job.native_log}" if Path(job.native_log).is_file() else ""),
            sessions=1,
        )

    def _collect(
        self, job: PartJob, work: Path, report: PartReport
    ) -> tuple[PartReport, dict[str, np.ndarray]]:
        """The part's report and its outputs (loaded, the files removed)."""
        self.sessions += report.sessions
        if report.peak_rss_mb is not None:
            self.peak_rss_mb = max(self.peak_rss_mb or 0.0, report.peak_rss_mb)
        values = {name: np.load(path) for name, path in report.outputs.items()}
        shutil.rmtree(work, ignore_errors=True)
        if report.ok:
            Path(job.native_log).unlink(missing_ok=True)  # kept only to explain failures
        elif self.shown_logs is not None:  # the backend log it names, where the user finds it
            report.error = report.error.replace(str(self.logs), str(self.shown_logs))
        return report, values

    def run(
        self, part: Part, feeds: dict, outputs: list[str], label: str, json_dir: Path | None = None
    ) -> tuple[PartReport, dict[str, np.ndarray]]:
        ((_, report, values),) = self.run_many(
            [PartRun(None, part, feeds, outputs, label, json_dir)]
        )
        return report, values

    def close(self) -> None:
        """Stop the worker processes (the run is over, or interrupted)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None
