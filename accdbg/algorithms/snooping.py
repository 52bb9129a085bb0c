"""What layerwise and cumulative-layerwise snooping share.

Both start from the QDQ model the full run uses (quantized here from the float model with the
engine's own quantizer, or given) and from golden tensors (a framework diagnosis run, or any
folder of ``.raw`` files such as an AIMET layer-output dump). Parts of the QDQ model
(:mod:`accdbg.algorithms.fragments`) run on the backend in a child process
(:mod:`accdbg.engines.isolate`), fed with golden values; each layer output is then judged
with the verifiers against its golden value.

Statuses, as the reference names them, mapped onto this implementation's stages:

=============  ==============================================================================
(empty)        judged normally
``skip``       not debugged as asked: outside ``--start_layer``/``--end_layer``, or removed by
               ``skip_layer_types``/``skip_layer_outputs`` (or not in ``add_layer_*``)
``part``       (cumulative) the first layer failing a verifier since the last partition point;
               the next run starts after it, fed with golden values
``err_part``   cutting the model failed: onnx extraction, or no usable golden value for a
               tensor entering the part (the reference's partitioning step)
``err_con``    onnxruntime refused the part as a model (invalid graph, type or shape
               inference) - the stage the reference's converter fills
``err_lib``    QNN refused the graph while composing it at session creation (op validation,
               adding nodes) - the reference's model-library step
``err_cntx``   QNN failed to finalize the graph or create its context at session creation
               - the reference's context-binary step
``err_exec``   the session was created but running it failed (or the backend crashed then)
``err_COMPARE`` the output could not be compared: no golden value, sizes differ, or no
               verifier could produce a value
=============  ==============================================================================

A failing batch or step is bisected until the failing layer is alone, so one failing layer
never stops the run and never takes other layers' results with it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from accdbg.algorithms.fragments import Layer, Part, QdqModel
from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputTensor
from accdbg.core.tensor_store import TensorFolder, safe_relpath
from accdbg.engines.base import EngineOptions, get_engine
from accdbg.engines.isolate import Isolated
from accdbg.errors import AccdbgError
from accdbg.mapping.qnn_json import qnn_sanitize
from accdbg.verifiers import get_verifier
from accdbg.verifiers.base import TensorPair, Verifier

log = logging.getLogger("accdbg.snooping")

OK, SKIP, PART = "", "skip", "part"
ERR_PART, ERR_CON, ERR_LIB, ERR_CNTX, ERR_EXEC, ERR_COMPARE = (
    "err_part",
    "err_con",
    "err_lib",
    "err_cntx",
    "err_exec",
    "err_COMPARE",
)
ERRORS = (ERR_PART, ERR_CON, ERR_LIB, ERR_CNTX, ERR_EXEC, ERR_COMPARE)

# engine_kwargs this module uses; the others the inference engine knows have no effect here
QUANT_KEYS = (
    "act_bitwidth",
    "weights_bitwidth",
    "bias_bitwidth",
    "act_quantizer",
    "param_quantizer",
    "per_channel",
    "quantization_overrides",
    "ignore_encodings",
)
BACKEND_KEYS = (
    "engine",
    "runtime",
    "architecture",
    "precision",
    "soc_model",
    "perf_profile",
    "disable_cpu_fallback",
)
FILTER_KEYS = ("add_layer_outputs", "add_layer_types", "skip_layer_types", "skip_layer_outputs")
IGNORED_KEYS = (
    "debug",
    "output_data_type",
    "profiling_level",
    "golden_dir_for_mapping",
    "stage",
    "framework_model_path",
    "input_list",
    "memory_budget_mb",
    "options_record",
)


@dataclass
class SnoopingResult:
    """Where the run went, its report, and how many backend sessions this call created."""

    run_dir: Path
    report: pd.DataFrame
    sessions: int
    seconds: float = 0.0
    csv: Path | None = None
    html: Path | None = None


# ---------------------------------------------------------------- golden tensors


class GoldenError(Exception):
    """No usable golden value for a tensor."""


class Golden:
    """Golden values by QDQ-model tensor name: a tensor folder plus the model inputs.

    Names are matched exactly, then as the tensor store writes them (``safe_relpath``) and as
    QNN-style tools sanitize them, so a bare folder of ``<tensor>.raw`` (an AIMET layer-output
    dump, no manifest) works too; its flat tensors take their shape from the model.
    """

    def __init__(self, folder: str | os.PathLike, inputs: Sequence[InputTensor], scratch: Path):
        self.root = Path(folder)
        self.folder = TensorFolder(self.root)
        self.inputs = {t.name: t for t in inputs}
        self.scratch = scratch
        self._aliases: dict[str, str] = {}
        for name in self.folder.names():
            for alias in (safe_relpath(name), qnn_sanitize(name), re.sub(r"\W", "_", name)):
                self._aliases.setdefault(alias, name)

    def name_for(self, *candidates: str | None) -> str | None:
        for c in candidates:
            if c and c in self.folder:
                return c
        for c in candidates:
            if not c:
                continue
            for alias in (safe_relpath(c), qnn_sanitize(c), re.sub(r"\W", "_", c)):
                if alias in self._aliases:
                    return self._aliases[alias]
        return None

    def _record(self, tensor: str, shape: tuple[int, ...] | None, *aliases: str | None):
        name = self.name_for(tensor, *aliases)
        if name is None:
            raise GoldenError(f"no golden value for {tensor!r} in {str(self.root)!r}")
        rec = self.folder.records[name]
        if shape is not None and rec.size != int(np.prod(shape)):
            raise GoldenError(
                f"golden {name!r} holds {rec.size} values, the model's {tensor!r} has shape {list(shape)}"
            )
        return name, rec

    def feed(
        self, tensor: str, shape: tuple[int, ...] | None, dtype: np.dtype | None
    ) -> tuple[str, tuple, str]:
        """``(raw file, dims, dtype)`` feeding ``tensor`` (a model input or an activation)."""
        if tensor in self.inputs:
            t = self.inputs[tensor]
            return str(t.path), tuple(t.dims), t.dtype.name
        name, rec = self._record(tensor, shape)
        dims = tuple(shape) if shape is not None else tuple(rec.shape)
        want = np.dtype(dtype or np.float32)
        if np.dtype(rec.dtype) == want:
            return str(self.folder.path(name)), dims, want.name
        # a file of another dtype is converted once into the scratch folder
        path = self.scratch / "golden" / (safe_relpath(name) + ".raw")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            np.asarray(self.folder.load(name), dtype=want).tofile(path)
        return str(path), dims, want.name

    def load(self, tensor: str, shape: tuple[int, ...] | None, *aliases: str | None) -> np.ndarray:
        if tensor in self.inputs:
            return self.inputs[tensor].load()
        name, rec = self._record(tensor, shape, *aliases)
        arr = np.asarray(self.folder.load(name))
        return arr.reshape(shape) if shape is not None else arr


# ---------------------------------------------------------------- running a part


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
        sess = worker._session(wjob, job.model_path, job.options, "session creation", wrep)
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
        values = worker._run(sess, job.outputs, job.feeds, wjob, wrep)
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
    _mark(job.stage_file, "done")
    return rep


_CON = re.compile(
    r"INVALID_GRAPH|Invalid model|Load model|ShapeInferenceError|TypeInferenceError|"
    r"NOT_IMPLEMENTED|No Op registered|Could not find an implementation",
    re.I,
)
_CNTX = re.compile(r"finaliz|context", re.I)


def failure_status(report: PartReport) -> str:
    """The reference status for a failed part (see the module docstring)."""
    if report.stage == "run":
        return ERR_EXEC
    if _CON.search(report.error):
        return ERR_CON
    if _CNTX.search(report.error):
        return ERR_CNTX
    return ERR_LIB


@dataclass
class Handle:
    job: PartJob
    child: Isolated | None
    work: Path


class Backend:
    """Runs parts on the chosen engine - in a fresh child process per part for native
    backends, so a crash is a status, not our death - and counts the sessions created."""

    job_fn = staticmethod(run_part)  # module-level, so the child process can import it

    def __init__(self, engine: str, options: EngineOptions, scratch: Path, logs: Path):
        self.engine = get_engine(engine)
        self.engine_name = engine
        self.options = options
        self.scratch, self.logs = scratch, logs
        self.sessions = 0
        self._n = 0

    @property
    def concurrent(self) -> bool:
        return self.engine.isolated

    def start(
        self, part: Part, feeds: dict, outputs: list[str], label: str, json_dir: Path | None = None
    ) -> Handle:
        """Start running ``part`` (in the background for native engines)."""
        self._n += 1
        work = self.scratch / f"{self._n:04d}-{label}"
        work.mkdir(parents=True, exist_ok=True)
        model_path = work / "model.onnx"
        om_bytes = part.model.ByteSize()
        if om_bytes < om.TWO_GIB:
            onnx.save(part.model, str(model_path))
        else:
            onnx.save(
                part.model, str(model_path), save_as_external_data=True, location="model.data"
            )
        self.logs.mkdir(parents=True, exist_ok=True)
        options = replace(
            self.options, json_graph_dir=str(json_dir) if json_dir else None, profiling_level=None
        )
        job = PartJob(
            self.engine_name,
            options,
            str(model_path),
            feeds,
            outputs,
            str(work / "out"),
            str(self.logs / f"{label}.txt"),
            str(work / "stage"),
        )
        if not self.engine.isolated:
            return Handle(job, None, work)
        child = Isolated(
            self.job_fn,
            job,
            what=f"running {label} on {self.engine.label}",
            log_hint=job.native_log,
        )
        return Handle(job, child, work)

    def finish(self, handle: Handle) -> tuple[PartReport, dict[str, np.ndarray]]:
        """Wait for a part; its report and its outputs (loaded, the files removed)."""
        job = handle.job
        if handle.child is None:
            report = self.job_fn(job)
        else:
            try:
                report = handle.child.result()
            except KeyboardInterrupt:
                handle.child.kill()
                raise
            except AccdbgError as exc:  # the backend crashed: the stage file says where
                stage_file = Path(job.stage_file)
                stage = stage_file.read_text(encoding="utf-8") if stage_file.exists() else "session"
                report = PartReport(
                    False, "run" if stage in ("run", "done") else "session", str(exc), sessions=1
                )
        self.sessions += report.sessions
        values = {name: np.load(path) for name, path in report.outputs.items()}
        shutil.rmtree(handle.work, ignore_errors=True)
        if report.ok:
            Path(job.native_log).unlink(missing_ok=True)  # kept only to explain failures
        return report, values

    def run(
        self, part: Part, feeds: dict, outputs: list[str], label: str, json_dir: Path | None = None
    ) -> tuple[PartReport, dict[str, np.ndarray]]:
        return self.finish(self.start(part, feeds, outputs, label, json_dir))


# ---------------------------------------------------------------- judging a layer


@dataclass
class Judge:
    """The verifiers, labelled as report columns."""

    verifiers: dict[str, Verifier]

    @classmethod
    def from_specs(cls, specs: Sequence[Any]) -> Judge:
        out: dict[str, Verifier] = {}
        for spec in specs:
            v = get_verifier(spec)
            if v.tensors_per_side != 1:
                raise AccdbgError(
                    f"verifier {v.name} compares several tensors per side; layerwise snooping "
                    "compares one layer output at a time: choose e.g. CosineSimilarity"
                )
            label = v.name if v.name not in out else v.label
            out[label] = v
        if not out:
            raise AccdbgError("no verifier: give at least one, e.g. CosineSimilarity")
        return cls(out)

    @property
    def labels(self) -> list[str]:
        return list(self.verifiers)

    def mark(self, label: str) -> str:
        v = self.verifiers[label]
        if v.pass_mark is None:
            return "no threshold"
        return f"pass {'>=' if v.higher_is_better else '<='} {v.pass_mark:g}"

    def scores(
        self, golden: np.ndarray, target: np.ndarray, scale: float | None
    ) -> tuple[dict, dict, list[str]]:
        """Values, verdicts and notes of every verifier on one pair."""
        pair = TensorPair(golden, target, scale)
        values, passed, notes = {}, {}, list(pair.notes)
        for label, v in self.verifiers.items():
            res = v.verify(pair)
            values[label] = res.value
            passed[label] = res.passed
            if res.status not in ("ok", "; ".join(pair.notes)):
                notes.append(f"{label}: {res.status}")
        return values, passed, notes


def describe(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {_num(v)}" for k, v in values.items())


def _num(v: float) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"


def base_row(layer: Layer, shape: Sequence[int] | None, status: str = OK) -> dict[str, Any]:
    return {
        "O/P Name": layer.name,
        "Status": status,
        "Layer Type": layer.op_type,
        "Shape": list(shape) if shape is not None else None,
        "Activations": "",
        "Info": "",
        "_position": layer.position,
        "_passed": {},
        "_values": {},
    }


def judge_layer(
    layer: Layer, values: np.ndarray, golden: Golden, judge: Judge, qdq: QdqModel, cpu: bool = False
) -> dict[str, Any]:
    """One report row: the layer's output from a part against its golden value."""
    target = layer.dequantize(values)
    row = base_row(layer, target.shape)
    info: list[str] = ["ran on the CPU: QNN did not take this node"] if cpu else []
    try:
        g = golden.load(layer.exposed.qdq_tensor, None, layer.name)
    except GoldenError as exc:
        row["Status"], row["Info"] = ERR_COMPARE, "; ".join([*info, str(exc)])
        return row
    if g.size != target.size:
        row["Status"] = ERR_COMPARE
        row["Info"] = "; ".join(
            [*info, f"golden has {g.size} values, the backend output {list(target.shape)}"]
        )
        return row
    g = np.asarray(g, dtype=np.float64).reshape(target.shape)
    finite = g[np.isfinite(g)]
    if finite.size:
        row["Activations"] = f"[{finite.min():.4g}, {finite.max():.4g}, {np.median(finite):.4g}]"
    vals, passed, notes = judge.scores(g, target, layer.exposed.scale)
    row["_values"], row["_passed"] = vals, passed
    for label in judge.labels:
        row[label] = vals[label]
        if passed[label] is False:
            info.append(f"{label} {_num(vals[label])} fails ({judge.mark(label)})")
    info += notes
    if all(isinstance(v, float) and math.isnan(v) for v in vals.values()):
        row["Status"] = ERR_COMPARE
    row["Info"] = "; ".join(info)
    return row


def failing(row: dict[str, Any]) -> bool:
    return any(p is False for p in row.get("_passed", {}).values())


def error_row(layer: Layer, status: str, message: str, shape=None) -> dict[str, Any]:
    row = base_row(layer, shape, status)
    row["Info"] = message.splitlines()[0] if message else ""
    return row


# ---------------------------------------------------------------- set-up


def check_engine_kwargs(kwargs: dict | None) -> dict:
    kwargs = dict(kwargs or {})
    known = set(QUANT_KEYS) | set(BACKEND_KEYS) | set(FILTER_KEYS) | set(IGNORED_KEYS)
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise AccdbgError(
            f"engine option {unknown[0]!r} is not known; expected some of: {', '.join(sorted(known))}"
        )
    if kwargs.get("stage") == "compiled":
        raise AccdbgError(
            "--stage compiled: a QNN context binary is sealed and cannot be cut into layers; "
            "give the QDQ model (--stage converted) or the float model"
        )
    return kwargs


def engine_options(kwargs: dict) -> tuple[str, EngineOptions]:
    engine = kwargs.get("engine") or "qnn"
    options = EngineOptions(
        runtime=kwargs.get("runtime") or "htp",
        architecture=kwargs.get("architecture") or "x86_64-linux-clang",
        precision=kwargs.get("precision") or "int8",
        soc_model=kwargs.get("soc_model"),
        perf_profile=kwargs.get("perf_profile"),
        disable_cpu_fallback=bool(kwargs.get("disable_cpu_fallback")),
    )
    get_engine(engine).check_host(options)
    return engine, options


def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def quantize(
    model_path: Path,
    model: onnx.ModelProto,
    inputs: Sequence[InputTensor],
    kwargs: dict,
    out_dir: Path,
) -> Path:
    """The QDQ model exactly as the inference engine's source stage makes it (same
    pre-processing, same quantizer and options), without running it."""
    from accdbg.engines.prepare import prepare_float_model
    from accdbg.engines.quantize import FeedsReader, quantize_for_qnn

    dims = {t.name: tuple(t.dims) for t in inputs}
    dtypes = {t.name: t.dtype for t in inputs}
    missing = [vi.name for vi in om.real_inputs(model) if vi.name not in dims]
    if missing:
        raise AccdbgError(f"model input {missing[0]!r} has no -i/--input_tensor")
    work = out_dir / ".quantize"
    work.mkdir(parents=True, exist_ok=True)
    prepared, steps = prepare_float_model(model, dims, work)
    for s in steps:
        log.info("pre-processing: %s", s)
    stem = model_path.name.removesuffix(".onnx")
    if kwargs.get("precision") == "fp16":
        target = out_dir / f"{stem}.fp16.onnx"
        shutil.copyfile(prepared, target)
        shutil.rmtree(work, ignore_errors=True)
        return target
    overrides = None
    qo = kwargs.get("quantization_overrides")
    if qo and not kwargs.get("ignore_encodings"):
        from accdbg.encodings.aimet import read_aimet
        from accdbg.encodings.overrides import aimet_to_tensor_quant_overrides

        if not Path(qo).is_file():
            raise AccdbgError(f"-qo/--quantization_overrides {str(qo)!r} does not exist")
        overrides = aimet_to_tensor_quant_overrides(
            read_aimet(Path(qo)), onnx.load(str(prepared), load_external_data=False)
        )
    target = out_dir / f"{stem}.qdq.onnx"
    t = time.perf_counter()
    quantize_for_qnn(
        prepared,
        target,
        FeedsReader([{t_.name: t_.path for t_ in inputs}], dims, dtypes),
        int(kwargs.get("act_bitwidth") or 8),
        int(kwargs.get("weights_bitwidth") or 8),
        int(kwargs.get("bias_bitwidth") or 32),
        kwargs.get("act_quantizer") or "tf",
        kwargs.get("param_quantizer") or "tf",
        bool(kwargs.get("per_channel")),
        overrides,
    )
    log.info(
        "quantized %s for QNN in %.1f s -> %s",
        model_path.name,
        time.perf_counter() - t,
        target.name,
    )
    shutil.rmtree(work, ignore_errors=True)
    return target


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
    qdq: QdqModel, start: str | None, end: str | None, kwargs: dict
) -> tuple[list[Layer], dict[int, str]]:
    """The layers to debug, and why each other layer is skipped."""
    first = find_layer(qdq, start, "--start_layer").position if start else 0
    last = find_layer(qdq, end, "--end_layer").position if end else len(qdq.layers) - 1
    if first > last:
        raise AccdbgError(
            f"--start_layer {start!r} comes after --end_layer {end!r} in execution order"
        )

    def split(v) -> set[str]:
        if not v:
            return set()
        items = v.split(",") if isinstance(v, str) else v
        return {str(i).strip() for i in items if str(i).strip()}

    add_o, add_t = (
        split(kwargs.get("add_layer_outputs")),
        {t.lower() for t in split(kwargs.get("add_layer_types"))},
    )
    skip_o, skip_t = (
        split(kwargs.get("skip_layer_outputs")),
        {t.lower() for t in split(kwargs.get("skip_layer_types"))},
    )
    span, skipped = [], {}
    for layer in qdq.layers:
        names = {layer.name, layer.exposed.qdq_tensor}
        if not first <= layer.position <= last:
            skipped[layer.position] = "outside --start_layer/--end_layer"
        elif (add_o or add_t) and not (names & add_o or layer.op_type.lower() in add_t):
            skipped[layer.position] = "not in --add_layer_outputs/--add_layer_types"
        elif names & skip_o or layer.op_type.lower() in skip_t:
            skipped[layer.position] = "in --skip_layer_outputs/--skip_layer_types"
        else:
            span.append(layer)
    return span, skipped


def finalize_row(row: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint/JSON-safe copy (NaN and infinities as strings)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float | np.floating) and not math.isfinite(float(v)):
            out[k] = str(float(v))
        elif isinstance(v, dict):
            out[k] = {
                kk: (
                    str(float(vv))
                    if isinstance(vv, float | np.floating) and not math.isfinite(float(vv))
                    else vv
                )
                for kk, vv in v.items()
            }
        elif isinstance(v, np.generic):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def restore_row(row: dict[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    out = dict(row)
    for label in labels:
        v = out.get(label)
        out[label] = float(v) if isinstance(v, str) else (math.nan if v is None else v)
    out["_values"] = {
        k: float(v) if isinstance(v, str) else v for k, v in out.get("_values", {}).items()
    }
    return out


def orig_outputs_text(scores: dict[str, dict[str, float]]) -> str:
    """``{"output": {"CosineSimilarity": 0.99}}`` as the reference prints the column."""
    return json.dumps(
        {
            k: {
                kk: (round(vv, 6) if isinstance(vv, float) and math.isfinite(vv) else str(vv))
                for kk, vv in v.items()
            }
            if isinstance(v, dict)
            else v
            for k, v in scores.items()
        }
    )


# ---------------------------------------------------------------- the shared driver


@dataclass
class Context:
    """Everything an algorithm's loop needs; ``rows`` holds finished rows by position."""

    run_path: Path
    journal: Any
    qdq: QdqModel
    golden: Golden
    judge: Judge
    span: list[Layer]
    skipped: dict[int, str]
    backend: Backend
    rows: dict[int, dict[str, Any]]
    start_layer: Layer | None
    end_layer: Layer | None
    memory_budget_bytes: int
    workers: int
    dump_qnn_json: bool
    write: Any = None  # callable: rewrite the reports from ``rows``

    def record(self, kind: str, rows: list[dict[str, Any]], sessions: int, **extra: Any) -> None:
        """Journal finished rows (fsynced), then rewrite the reports atomically."""
        for r in rows:
            self.rows[r["_position"]] = r
        self.journal.append(
            {"kind": kind, "rows": [finalize_row(r) for r in rows], "sessions": sessions, **extra}
        )
        self.write()

    def write_outputs(self, folder: str, layers_values: list[tuple[Layer, np.ndarray]]) -> None:
        """The backend's outputs of the judged layers, dequantized, as a tensor folder."""
        from accdbg.core.tensor_store import TensorWriter

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


HTML_EVERY = 30.0  # seconds between HTML rewrites while running
OPTION_KEYS = [
    "algorithm",
    "model_path",
    "qdq_model",
    "golden_dir",
    "input_tensor",
    "verifiers",
    "start_layer",
    "end_layer",
    "engine_kwargs",
]


def snoop(
    algorithm: str,
    loop,
    model_path: str | os.PathLike,
    input_tensors: Sequence[InputTensor],
    golden_dir: str | os.PathLike | None,
    qdq_model: str | os.PathLike | None,
    verifiers: Sequence[Any],
    start_layer: str | None,
    end_layer: str | None,
    engine_kwargs: dict | None,
    working_dir: str | os.PathLike,
    output_dirname: str | None,
    memory_budget_mb: float,
    workers: int | None,
    dump_qnn_json: bool,
) -> SnoopingResult:
    """Set up (golden, QDQ model, span), resume what a killed run left, run ``loop(ctx)``,
    write the final reports. ``algorithm`` is ``layerwise`` or ``cumulative_layerwise``."""
    from accdbg.algorithms import checkpoint, report
    from accdbg.frameworks.diagnosis import run_framework_diagnosis

    t0 = time.perf_counter()
    component, stem = f"{algorithm}_snooping", algorithm
    cumulative = algorithm == "cumulative_layerwise"
    kwargs = check_engine_kwargs(engine_kwargs)
    judge = Judge.from_specs(verifiers)
    engine, options = engine_options(kwargs)
    model_path = Path(model_path).expanduser().absolute()
    model = om.load_model(model_path)
    names = [vi.name for vi in om.real_inputs(model)]
    for t in input_tensors:
        if t.name not in names:
            raise AccdbgError(
                f"--input_tensor {t.name!r} is not an input of the model; its inputs are: "
                f"{om.describe_inputs(model)}"
            )
        t.load()  # size checked now, not in the middle of the run
    if not input_tensors and golden_dir is None:
        raise AccdbgError(
            "give -i/--input_tensor (framework diagnosis needs them) or --golden_output_reference_directory"
        )
    if golden_dir is not None and not Path(golden_dir).expanduser().is_dir():
        raise AccdbgError(
            f"--golden_output_reference_directory {str(golden_dir)!r} does not exist or is not a folder"
        )
    given_qdq = Path(qdq_model).expanduser().absolute() if qdq_model else None
    if given_qdq is None and (is_qdq(model) or kwargs.get("stage") == "converted"):
        given_qdq = model_path
    if given_qdq is not None and not given_qdq.is_file():
        raise AccdbgError(f"QDQ model {str(qdq_model)!r} does not exist")
    if given_qdq is not None:  # layer names are checked before anything is written
        early = QdqModel.load(given_qdq)
        select_span(early, start_layer, end_layer, kwargs)
    else:
        names_here = [n for n in (start_layer, end_layer) if n]
        if names_here:
            om.check_tensor_names(model, names_here, "--start_layer/--end_layer")
    record = {
        "algorithm": algorithm.replace("_", "-"),
        "model_path": str(model_path),
        "qdq_model": str(given_qdq) if given_qdq else None,
        "golden_dir": str(Path(golden_dir).expanduser().absolute()) if golden_dir else None,
        "input_tensor": [
            [t.name, ",".join(map(str, t.dims)), str(t.path), t.dtype.name] for t in input_tensors
        ],
        "verifiers": [v.label for v in judge.verifiers.values()],
        "start_layer": start_layer,
        "end_layer": end_layer,
        "engine_kwargs": {
            k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in sorted(kwargs.items())
        },
        "working_dir": str(working_dir),
        "output_dirname": output_dirname,
        "memory_budget_mb": memory_budget_mb,
    }
    run = checkpoint.open_run(working_dir, component, output_dirname)
    with run:
        lock = checkpoint.RunLock(run.path)
        lock.acquire()
        backend = None
        try:
            opts = run.path / f"{component}_options.json"
            checkpoint.check_options(opts, json.loads(json.dumps(record, default=str)), OPTION_KEYS)
            if not opts.exists():
                run.write_options(record)
            journal = checkpoint.Journal(run.path / checkpoint.JOURNAL)
            setup = journal.of_kind("setup")
            if setup:
                golden_root = Path(setup[0]["golden_dir"])
                qdq_path = (
                    run.path / setup[0]["qdq_model"]
                    if setup[0]["qdq_inside"]
                    else Path(setup[0]["qdq_model"])
                )
                for what, p in (("golden folder", golden_root), ("QDQ model", qdq_path)):
                    if not p.exists():
                        raise AccdbgError(
                            f"cannot resume {str(run.path)!r}: its {what} {str(p)!r} is gone"
                        )
                log.info("resuming: %d finished unit(s) in %s", len(journal.records) - 1, run.path)
            else:
                if golden_dir is not None:
                    golden_root = Path(golden_dir).expanduser().absolute()
                else:
                    if given_qdq == model_path:
                        log.warning(
                            "no golden reference: framework diagnosis runs the QDQ model on the CPU, so the "
                            "golden values are a CPU simulation of the same quantization"
                        )
                    golden_root = run_framework_diagnosis(
                        "onnx", model_path, input_tensors, working_dir=working_dir
                    ).run_dir
                qdq_path = given_qdq or quantize(model_path, model, input_tensors, kwargs, run.path)
                inside = qdq_path.parent == run.path
                journal.append(
                    {
                        "kind": "setup",
                        "golden_dir": str(golden_root),
                        "qdq_model": qdq_path.name if inside else str(qdq_path),
                        "qdq_inside": inside,
                    }
                )
            scratch = run.path / ".scratch"
            golden = Golden(golden_root, input_tensors, scratch)
            qdq = QdqModel.load(qdq_path, set(golden.folder.names()))
            if not qdq.layers:
                raise AccdbgError(f"{qdq_path.name} has no layer to debug")
            span, skipped = select_span(qdq, start_layer, end_layer, kwargs)
            backend = Backend(engine, options, scratch, run.path / "backend_logs")
            n_workers = (
                workers
                if workers is not None
                else (min(2, os.cpu_count() or 1) if backend.concurrent else 1)
            )
            ctx = Context(
                run.path,
                journal,
                qdq,
                golden,
                judge,
                span,
                skipped,
                backend,
                {},
                find_layer(qdq, start_layer, "--start_layer") if start_layer else None,
                find_layer(qdq, end_layer, "--end_layer") if end_layer else None,
                int(memory_budget_mb * 2**20),
                max(1, n_workers),
                dump_qnn_json,
            )
            for rec in journal.records:
                for r in rec.get("rows", []):
                    ctx.rows[r["_position"]] = restore_row(r, judge.labels)
            skip_rows = {}
            for layer in qdq.layers:
                if layer.position in skipped:
                    row = base_row(layer, qdq.shape(layer.exposed.qdq_tensor), SKIP)
                    row["Info"] = skipped[layer.position]
                    skip_rows[layer.position] = row
            title = f"{'Cumulative-layerwise' if cumulative else 'Layerwise'} snooping: {model_path.name}"
            meta = f"{backend.engine.label} -r {options.runtime}; QDQ model {qdq_path.name}; golden {golden_root}"

            last_html = [time.perf_counter()]

            def write(final: bool = False) -> tuple:
                """The CSV after every unit; the HTML (heavier) at most every HTML_EVERY s and at the end."""
                rows = list({**skip_rows, **ctx.rows}.values())
                html = final or time.perf_counter() - last_html[0] >= HTML_EVERY
                if html:
                    last_html[0] = time.perf_counter()
                return report.write_reports(
                    run.path,
                    stem,
                    rows,
                    judge,
                    cumulative,
                    title,
                    meta,
                    _notes(judge, cumulative),
                    html=html,
                )

            ctx.write = write
            todo = [layer for layer in span if layer.position not in ctx.rows]
            log.info(
                "%s: %d layers, %d to debug, %d already done, %d skipped",
                algorithm,
                len(qdq.layers),
                len(todo),
                len(span) - len(todo),
                len(skipped),
            )
            if todo and not journal.of_kind("done"):
                loop(ctx)
            if not journal.of_kind("done"):
                journal.append({"kind": "done", "sessions": backend.sessions})
            df, csv_path, html_path = write(final=True)
            shutil.rmtree(scratch, ignore_errors=True)
        finally:
            lock.release()
    seconds = time.perf_counter() - t0
    log.info(
        "%s: %d rows, %d session(s) in %.1f s -> %s",
        algorithm,
        len(df),
        backend.sessions if backend else 0,
        seconds,
        run.path,
    )
    return SnoopingResult(
        run.path,
        df,
        backend.sessions if backend else 0,
        seconds,
        run.path / csv_path.name,
        run.path / html_path.name,
    )


def _notes(judge: Judge, cumulative: bool) -> list[str]:
    marks = "; ".join(f"{label}: {judge.mark(label)}" for label in judge.labels)
    common = (
        "Statuses: empty = judged; skip = not debugged as asked; err_part = the model could not be cut "
        "there; err_con = onnxruntime refused the part; err_lib = QNN refused the graph; err_cntx = QNN "
        "could not finalize it; err_exec = running it failed; err_COMPARE = no comparison possible."
    )
    if cumulative:
        return [
            f"Each layer runs on the backend from the last partition point, fed with golden values there; "
            f"the first layer failing a verifier ({marks}) becomes a partition point (part). Orig Outputs: "
            f"the model outputs' scores in the run that judged the layer.",
            common,
        ]
    return [
        f"Each layer runs alone on the backend, fed with golden inputs quantized with the full model's "
        f"encodings ({marks}).",
        common,
    ]
