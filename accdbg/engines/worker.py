"""The part of an inference-engine run that touches the backend.

Two jobs, each in its own child process for native backends (see
:mod:`accdbg.core.isolate`), run concurrently because HTP emulation is single-threaded:

* the *plain* job runs the deployable graph: node placement, the QNN graph JSON, final outputs;
* the *debug* job runs a graph exposing every selected activation and writes them as they come.

The parent compares the two jobs' final outputs to catch fusions changed by the exposure.
Only small facts and file paths travel back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from accdbg.core import onnx_model as om
from accdbg.core.batching import plan_batches
from accdbg.core.progress import Progress
from accdbg.core.tensor_store import TensorWriter
from accdbg.engines.base import EngineOptions, get_engine
from accdbg.engines.exposure import Exposed
from accdbg.engines.native_log import capture_fd2, read_log
from accdbg.engines.partitioning import explain_cpu_nodes
from accdbg.engines.source import load_feed
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")

SIMULATION_PLACEMENT = "the simulation engine runs every node on onnxruntime's CPU (not QNN)"


@dataclass
class Job:
    engine: str
    options: EngineOptions
    model_path: str
    exposed: list[Exposed]
    feeds: list[
        dict[str, tuple[str, tuple[int, ...], str]]
    ]  # per inference: name -> (path, dims, dtype, the file's dtype)
    output_root: str
    native_log: str
    output_data_type: str = "float_only"
    memory_budget_bytes: int = 4 * 2**30
    meta: dict = field(default_factory=dict)
    inputs: list[dict] = field(default_factory=list)  # per inference: its input files' record

    def result_meta(self, i: int) -> dict:
        """The manifest meta of ``Result_i``: the job's, its index and the files it was fed."""
        return {**self.meta, "result": i, **({"inputs": self.inputs[i]} if self.inputs else {})}


@dataclass
class JobReport:
    session_seconds: float = 0.0
    run_seconds: float = 0.0
    sessions: int = 0
    placement_counts: dict = field(default_factory=dict)
    cpu_nodes: list = field(default_factory=list)
    cpu_reasons: list = field(default_factory=list)  # per CPU node: type, name, reason, source
    unsupported: list = field(default_factory=list)
    finals: list = field(default_factory=list)  # per inference: .npz with the graph outputs
    results: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)


# the whole model does not compile: which layer does not is what layerwise snooping tells
COMPILES_ALONE = (
    "--debugging_algorithm layerwise runs each layer alone and names those the backend cannot "
    "take; --engine simulation debugs the quantization on onnxruntime's CPU fake-quant (not QNN)"
)


def _explain_failure(exc: Exception, log_path: Path, what: str, hint: str = "") -> AccdbgError:
    native = read_log(log_path)
    detail = native.first_qnn_error()
    refused = list(native.refusals().values())
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "fallback to CPU EP has been explicitly disabled" in msg and refused:
        listed = ", ".join(
            f"{r.name} ({r.type})" + (f": {r.reason}" if r.reasons else "") for r in refused[:10]
        )
        more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
        return AccdbgError(
            f"QNN does not support {len(refused)} node(s): {listed}{more}; CPU fallback is disabled"
        )
    if detail and detail not in msg:
        msg = f"{msg} - QNN: {detail}"
    return AccdbgError(
        f"{what} failed: {msg} (full backend log: {log_path})" + (f"; {hint}" if hint else "")
    )


def checked_session(
    job: Job, model, options: EngineOptions, what: str, report: JobReport, hint: str = ""
):
    """A session whose placement was checked: a native engine must really hold nodes.
    ``hint``: what to try when the backend cannot create it, added to that error."""
    engine = get_engine(job.engine)
    log_path = Path(job.native_log)
    with capture_fd2(log_path):
        t = time.perf_counter()
        try:
            sess = engine.create_session(model, options, verbose_log=True)
        except AccdbgError:
            raise
        except Exception as exc:
            raise _explain_failure(exc, log_path, f"{engine.label} {what}", hint) from None
        report.session_seconds += time.perf_counter() - t
        report.sessions += 1
    native = read_log(log_path)
    placement = native.placement()
    report.placement_counts = placement.counts
    report.cpu_nodes = placement.cpu_nodes
    report.unsupported = native.unsupported()
    report.cpu_reasons = (
        [
            {"type": t, "name": n, "reason": SIMULATION_PLACEMENT, "source": "engine"}
            for t, n in placement.cpu_nodes
        ]
        if engine.simulation
        else explain_cpu_nodes(placement.cpu_nodes, native)
    )
    failed = native.backend_failed()
    if not engine.simulation and (failed or (placement.counts and not placement.qnn_partitions)):
        detail = failed or native.first_qnn_error() or "QNN took no node of the model"
        raise AccdbgError(
            f"-r {job.options.runtime}: the QNN backend did not run here ({detail}); "
            "use -r htp (HTP emulation on x86_64) or --engine simulation"
        )
    return sess


def checked_run(sess, names, feed, job: Job, report: JobReport) -> dict[str, np.ndarray]:
    quiet = ort.RunOptions()
    quiet.log_severity_level = 3
    with capture_fd2(Path(job.native_log)):
        t = time.perf_counter()
        try:
            values = sess.run(names, load_feed(feed), quiet)
        except Exception as exc:
            raise _explain_failure(
                exc, Path(job.native_log), f"{get_engine(job.engine).label} run"
            ) from None
        report.run_seconds += time.perf_counter() - t
    return dict(zip(names, values, strict=True))


def _save_finals(path: Path, values: dict[str, np.ndarray]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{f"o{i}": v for i, v in enumerate(values.values())})
    return str(path)


def load_finals(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"o{i}"] for i in range(len(data.files))]


def plain_job(job: Job, write_outputs: bool) -> JobReport:
    """The deployable graph: placement, QNN JSON, final outputs (written when not debugging)."""
    report = JobReport()
    model = onnx.load(job.model_path, load_external_data=False)
    outputs = [o.name for o in model.graph.output]
    # in a child process the bar is shown by the parent (core/progress.Relay); the engine
    # logs its own line at the end
    with Progress("QNN graph", len(job.feeds), "inputs", line=False) as bar:
        bar.note("session creation")
        sess = checked_session(
            job, job.model_path, job.options, "session creation", report, COMPILES_ALONE
        )
        bar.note("")
        scratch = Path(job.output_root) / ".scratch"
        for i, feed in enumerate(job.feeds):
            values = checked_run(sess, outputs, feed, job, report)
            report.finals.append(_save_finals(scratch / f"plain_{i}.npz", values))
            if write_outputs:
                w = TensorWriter(Path(job.output_root) / f"Result_{i}", meta=job.result_meta(i))
                for j, (name, arr) in enumerate(values.items()):
                    w.write(name, arr, index=j, op_type="output")
                    report.shapes[name] = list(arr.shape)
                w.save_manifest()
                report.results.append(str(w.root))
            bar.update()
    return report


def debug_job(job: Job) -> JobReport:
    """Every selected activation, produced by the engine itself, written as it comes."""
    report = JobReport()
    model = onnx.load(job.model_path)
    outputs = [o.name for o in model.graph.output]
    out_root = Path(job.output_root)
    store = None if job.output_data_type == "native_only" else np.dtype("float32")
    writers = [
        TensorWriter(out_root / f"Result_{i}", store_dtype=store, meta=job.result_meta(i))
        for i in range(len(job.feeds))
    ]
    natives = (
        [
            TensorWriter(
                out_root / f"Result_{i}" / "native", store_dtype=None, meta=job.result_meta(i)
            )
            for i in range(len(job.feeds))
        ]
        if job.output_data_type == "float_and_native"
        else None
    )
    sizes = {
        i.name: i.nbytes for i in om.tensor_infos(om.infer_shapes(model)) if i.nbytes is not None
    }
    batches = plan_batches(
        job.exposed, lambda e: sizes.get(e.graph_tensor), job.memory_budget_bytes
    )
    options = replace(job.options, json_graph_dir=None, profiling_level=None)
    finals: list[dict[str, np.ndarray]] = [{} for _ in job.feeds]
    runs = len(batches) * len(job.feeds)
    with Progress("QNN debug graph", runs, "runs", line=False) as bar:
        for k, batch in enumerate(batches):
            names = list(dict.fromkeys([*outputs, *(e.graph_tensor for e in batch)]))
            exposed_model = om.serialize(om.with_outputs(model, names), out_root / ".scratch")
            bar.note("session creation" + (f" {k + 1}/{len(batches)}" if len(batches) > 1 else ""))
            sess = checked_session(job, exposed_model, options, "debug session creation", report)
            bar.note("")
            for i, feed in enumerate(job.feeds):
                values = checked_run(sess, names, feed, job, report)
                finals[i] = {n: values[n] for n in outputs}
                for e in batch:
                    raw = values[e.graph_tensor]
                    arr = e.dequantize(raw) if store is not None else e.native(raw)
                    writers[i].write(
                        e.name, arr, node=e.node, op_type=e.op_type, index=e.index, **e.encoding()
                    )
                    if natives is not None:
                        natives[i].write(
                            e.name, e.native(raw), node=e.node, op_type=e.op_type, index=e.index
                        )
                    report.shapes[e.name] = list(raw.shape)
                del values
                bar.update()
            del sess
    for w in writers + (natives or []):
        w.save_manifest()
    report.finals = [
        _save_finals(out_root / ".scratch" / f"debug_{i}.npz", f) for i, f in enumerate(finals)
    ]
    report.results = [str(w.root) for w in writers]
    return report
