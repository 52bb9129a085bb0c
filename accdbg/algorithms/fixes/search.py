"""The fix search: from the diagnosis to a change proven on QNN HTP.

Greedy, with re-measurement: every round measures each remaining candidate *on top of the
changes accepted so far* (one QNN session and N plain runs each, in parallel worker
processes), accepts one that raises the output SQNR - the cheapest (16-bit tensors + Convert
ops) among those meeting the target, else the best - and stops when the target is met
(``target_sqnr`` dB, or ``target_gap`` of the baseline's noise power removed) or a budget is
spent (``max_16bit_tensors``, ``time_budget`` seconds). A candidate that did not help in a
round is not tried again (it was measured, that is its result). Each measurement is
journaled: a killed search rerun with the same ``output_dirname`` measures only what it had
not finished.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from accdbg.algorithms import checkpoint
from accdbg.algorithms.checkpoint import Journal
from accdbg.algorithms.diagnosis.sensitivity import scores
from accdbg.algorithms.fixes import candidates as C
from accdbg.algorithms.fixes.equalize import equalize, float_change
from accdbg.algorithms.fixes.measure import (
    Spec,
    activation_changes,
    float_outputs,
    measure_many,
    save_reference,
)
from accdbg.core.executors import Executor, ExecutorConfig, get_executor
from accdbg.core.executors.calls import function_spec
from accdbg.core.inputs import InputTensor
from accdbg.core.progress import progress, stage
from accdbg.core.run_dir import write_json_atomic
from accdbg.encodings.model import zero_point_from_offset
from accdbg.encodings.qdq import qdq_encodings
from accdbg.engines.legalize import clamp_constants
from accdbg.engines.options import EngineConfig, QuantOptions
from accdbg.engines.pipeline import Calibration, prepare_float, quantize_prepared
from accdbg.engines.run import check_engine_options
from accdbg.engines.source import load_feed
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.fix_search")

COMPONENT = "fix_search"
MIN_GAIN_DB = 0.1  # an accepted change must raise the output SQNR by at least this much
FLOAT_RTOL = 1e-4  # equalization must leave every float output within this share of its scale
OPTION_KEYS = (
    "model_path",
    "input_list",
    "per_channel",
    "act_bitwidth",
    "act_quantizer",
    "weights_bitwidth",
    "param_quantizer",
    "runtime",
)


@dataclass
class FixSearchResult:
    """A finished search: every candidate measured, the accepted path, the best fix."""

    run_dir: Path
    candidates: pd.DataFrame  # one row per measurement (see fixes.csv)
    accepted: list[str]  # labels of the accepted changes, in order
    best: dict[str, Any]  # the best measurement's row
    baseline: dict[str, Any]
    findings: list[str]
    reproduce: str  # the command reproducing the best result from best.encodings
    sessions: int
    seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass
class Setup:
    model_path: Path
    prepared: onnx.ModelProto
    prepared_path: Path
    feeds: list
    reference: Path
    options: Any
    quant: QuantOptions  # the baseline: the run's quantizer options
    axes: dict[str, int]
    judged: list[str] = field(default_factory=list)  # what the outputs are judged at (logits)
    # the baseline's (scale, zero point, quant type) of the layers whose encoding a candidate
    # gives others
    encodings: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    # the QDQ model the run under diagnosis ran: the baseline measured as it is, and what a
    # region kept in fp16 is cut from (None: the baseline is quantized here)
    baseline_model: Path | None = None
    clamps: dict[str, float] = field(default_factory=dict)  # a mask constant -> its clamp

    def quant_of(self, settings: Mapping[str, Any]) -> QuantOptions:
        """The quantizer options of a candidate's settings (:func:`C.settings`) over the
        baseline's; its per-tensor overrides go beside them."""
        keys = ("per_channel", "act_bitwidth", "act_quantizer", "keep_activations")
        quant = replace(self.quant, **{k: settings[k] for k in keys if k in settings})
        if settings.get("weights_bitwidth", quant.weights_bitwidth) != quant.weights_bitwidth:
            # 8-bit weights everywhere (w8_all): no int4, so no blocks either
            quant = replace(
                quant, weights_bitwidth=settings["weights_bitwidth"], weight_block_size=None
            )
        if settings.get("recalibrate"):  # the given encodings dropped: calibrated here
            quant = replace(quant, quantization_overrides=None)
        return quant


def run_fix_search(
    model_path: str | Path,
    input_tensors: Sequence[InputTensor] = (),
    input_list: str | Path | None = None,
    diagnosis: pd.DataFrame | str | Path | None = None,
    engine_kwargs: EngineConfig | Mapping[str, Any] | None = None,
    target_sqnr: float | None = None,
    target_gap: float | None = None,
    max_16bit_tensors: int | None = None,
    time_budget: float | None = None,
    workers: int | None = None,
    working_dir: str | Path = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    model_explorer: bool = True,
    executor: ExecutorConfig | None = None,
    **engine_keywords: Any,
) -> FixSearchResult:
    """Search a fix for a float ONNX model's quantization on QNN HTP; returns the candidates
    as a DataFrame (:attr:`FixSearchResult.candidates`) and writes ``fix_search/<run>/``.

    ``engine_kwargs`` is the baseline: the :class:`~accdbg.engines.options.EngineConfig` of
    the run that diagnosed the model (or a dict of its keywords); plain engine keywords
    (``act_bitwidth=16``, ``runtime="htp"``, ``per_channel=True`` ...) override it. Every
    candidate is quantized by the engine's pipeline (:func:`~accdbg.engines.pipeline.
    quantize_prepared`) with that baseline, its own quantizer settings and per-tensor
    overrides. With ``model_explorer``, Model Explorer overlays mark on the model's graph
    what the best fix changed (and show the diagnosis' culprit ranking) in
    ``model_explorer/``. ``executor``: where candidates are measured
    (:class:`~accdbg.core.executors.ExecutorConfig`; default ``workers`` local worker
    processes)."""
    t0 = time.perf_counter()
    check_search_options(target_sqnr, target_gap, max_16bit_tensors, time_budget, workers)
    config = _baseline_config(engine_kwargs, engine_keywords, executor)
    options = config.engine_options()
    quant = config.quant
    model_path = Path(model_path).expanduser().absolute()
    model = _float_model(model_path)
    calibration = Calibration.from_inputs(model, input_list, input_tensors, allow_nonfinite_inputs)
    feeds = calibration.feeds
    culprits = C.read_diagnosis(diagnosis)
    workers = max(1, workers or os.cpu_count() or 1)
    record = {
        "model_path": str(model_path),
        "input_list": str(input_list) if input_list else None,
        "per_channel": quant.per_channel,
        "act_bitwidth": quant.act_bitwidth,
        "act_quantizer": quant.act_quantizer,
        "weights_bitwidth": quant.weights_bitwidth,
        "param_quantizer": quant.param_quantizer,
        "runtime": config.backend.runtime,
        "target_sqnr": target_sqnr,
        "target_gap": target_gap,
        "max_16bit_tensors": max_16bit_tensors,
        "time_budget": time_budget,
        "workers": workers,
        "culprits": [c.as_dict() for c in culprits],
    }
    with checkpoint.open_run(working_dir, COMPONENT, output_dirname) as run:
        opts_path = run.path / f"{COMPONENT}_options.json"
        checkpoint.check_options(opts_path, record, list(OPTION_KEYS))
        run.write_options(record)
        journal = Journal(run.path / checkpoint.JOURNAL)
        work = run.path / ".work"
        work.mkdir(exist_ok=True)
        with stage("fix search: preparation (float model and its outputs)"):
            prepared_path = prepare_float(model, "model", calibration, work, work / ".prepare").path
            prepared = onnx.load(str(prepared_path))
            reference = run.path / "float_outputs.npz"
            # a Softmax/Sigmoid output at its logits, for every candidate
            judged = scores(prepared)
            save_reference(reference, float_outputs(prepared, judged, feeds))
        wtype = weight_type(quant)
        setup = Setup(
            model_path, prepared, prepared_path, feeds, reference, options, quant, axes_of(prepared),
            judged,
        )  # fmt: skip
        cands, notes = C.propose(
            prepared,
            culprits,
            quant.per_channel,
            quant.act_bitwidth,
            quant.act_quantizer,
            C.int4_weights(prepared, quant.weights_bitwidth),
        )
        for n in notes:
            log.info("fix search: %s", n)
        cands = _baseline_state(setup, cands, calibration, prepared_path, quant, work)
        search = Search(setup, run.path, journal, workers, wtype, executor)
        try:
            rows, accepted = search.greedy(
                cands, target_sqnr, target_gap, max_16bit_tensors, time_budget
            )
        finally:  # the measuring workers stop with the search, however it ended
            search.close()
        for r in rows:  # the run folder's final name, not the one it is written under
            if isinstance(r.get("reason"), str):
                r["reason"] = r["reason"].replace(str(run.path), str(run.final_path))
        table = pd.DataFrame(rows)
        base = rows[0]
        best = max(
            (r for r in rows if r["accepted"] or r is base),
            key=lambda r: r.get("SQNR mean", -math.inf),
        )
        from accdbg.algorithms.fixes import outputs

        _ensure_qdq(setup, run.path / "candidates" / best["folder"], best.get("settings") or {})

        files = outputs.write(
            run.path,
            run.final_path,
            setup,
            table,
            best,
            base,
            accepted,
            culprits,
            notes,
            input_tensors,
            input_list,
        )
        for d in (run.path / "candidates").glob("*/candidate.qdq.onnx"):
            if d.parent.name != best["folder"]:
                d.unlink()
        shutil.rmtree(work, ignore_errors=True)
        findings = outputs.findings(culprits, best, base, accepted, notes)
        write_json_atomic(run.path / "findings.json", findings)
        if model_explorer:
            outputs.overlays(run.path, run.final_path, setup, accepted, culprits)
    seconds = time.perf_counter() - t0
    log.info(
        "fix search: %d QNN session(s) in %.1f s -> %s", search.sessions, seconds, run.final_path
    )
    log.info("reproduce: %s", files["reproduce"])
    for line in findings:  # the console ends with the cause, the best fix, before -> after
        log.info("%s", line)
    return FixSearchResult(
        run.final_path,
        table,
        [a.label for a in accepted],
        best,
        base,
        findings,
        files["reproduce"],
        search.sessions,
        seconds,
        notes,
    )


def _baseline_config(engine_kwargs, engine_keywords: Mapping[str, Any], executor) -> EngineConfig:
    """The diagnosed run's engine options with the plain keywords over them, checked."""
    config = EngineConfig.coerce(engine_kwargs)
    if engine_keywords:
        config = EngineConfig.from_keywords(**{**config.keywords(), **engine_keywords})
    check_search_config(config)
    if executor is not None:
        executor.check()
    check_engine_options(config)
    return config


def _float_model(model_path: Path):
    """The user's model, refused when it is already quantized (the search makes the QDQ)."""
    from accdbg.core import onnx_model as om

    model = om.load_model(model_path)
    if any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        raise AccdbgError(
            f"--fix_search: {str(model_path)!r} is already quantized (QDQ); give the float model"
        )
    return model


def _baseline_state(setup: Setup, cands: list, calibration, prepared_path, quant, work: Path):
    """What some candidates need of the baseline's quantization: the shared encodings an
    ``encoding`` candidate edits, and the clamp a mask's defect calls for (a mask candidate
    without one is dropped). Returns the candidates kept."""
    shared = {c.layer for c in cands if c.kind == "encoding"}
    if shared:
        setup.encodings = _baseline_encodings(setup, calibration, shared, work)
    if any(c.kind == "clamp_mask" for c in cands):
        base = quantize_prepared(prepared_path, "baseline", calibration, quant, work)
        setup.clamps = {
            d.constant: float(d.extra["clamp"])
            for d in base.defects
            if d.extra.get("clamp") is not None
        }
        cands = [c for c in cands if c.kind != "clamp_mask" or c.target in setup.clamps]
    return cands


def _baseline_encodings(
    setup: Setup, calibration: Calibration, layers: set[str], work: Path
) -> dict[str, tuple[float, int, str]]:
    """The (scale, zero point, quant type) the baseline quantization gives ``layers``'
    outputs (one quantization of the model, as the engine does it)."""
    qdq = quantize_prepared(setup.prepared_path, "baseline", calibration, setup.quant, work).path
    out = {}
    for name, e in qdq_encodings(qdq).items():
        if name in layers and len(e.scale) == 1:
            signed = e.source.get("onnx_type", "").startswith("INT")
            zero = zero_point_from_offset(e.offset[0], e.bitwidth, signed)
            out[name] = (e.scale[0], zero, f"Q{'Int' if signed else 'UInt'}{e.bitwidth}")
    return out


def _ensure_qdq(setup: Setup, folder: Path, settings: dict) -> None:
    """The best candidate's QDQ model, quantized again when an earlier finish of this run
    pruned it (a resumed search can pick another best); quantization is deterministic."""
    if (folder / "candidate.qdq.onnx").exists():
        return
    float_model = folder / "float.onnx" if (folder / "float.onnx").exists() else setup.prepared_path
    quantize_prepared(
        float_model,
        "candidate",
        Calibration.from_feeds(setup.feeds),
        setup.quant_of(settings),
        folder,
        settings.get("overrides") or {},
    )


def check_search_config(config: EngineConfig) -> None:
    """The search starts from the quantizer options and quantizes: refused before it starts
    when the config says otherwise (``--suggest_fixes`` checks it before oneshot too)."""
    if config.quant.overrides is not None:
        raise AccdbgError(
            "--suggest_fixes starts from the quantizer flags; it does not take -qo overrides as its baseline"
        )
    if config.stage != "source" or not config.quant.quantizes:
        raise AccdbgError(
            "--suggest_fixes needs --stage source and --precision int8 (it quantizes)"
        )


def check_search_options(
    target_sqnr=None, target_gap=None, max_16bit_tensors=None, time_budget=None, workers=None
) -> None:
    max_16bit = max_16bit_tensors
    if target_gap is not None and not 0 < target_gap <= 1:
        raise AccdbgError(f"--target_gap {target_gap}: expected a share in (0, 1], e.g. 0.9")
    if max_16bit is not None and max_16bit < 0:
        raise AccdbgError(f"--max_16bit_tensors {max_16bit}: expected 0 or more")
    if time_budget is not None and time_budget <= 0:
        raise AccdbgError(f"--time_budget {time_budget}: expected seconds > 0")
    if workers is not None and workers < 1:
        raise AccdbgError(f"--workers {workers}: expected 1 or more")
    if target_sqnr is not None and not math.isfinite(target_sqnr):
        raise AccdbgError(f"--target_sqnr {target_sqnr}: expected a finite number of dB")


def weight_type(quant: QuantOptions) -> str:
    """The quant type name a candidate's per-tensor weight override takes."""
    wtype = "QInt8" if quant.param_quantizer == "symmetric" else "QUInt8"
    return wtype.replace("8", "16") if quant.weights_bitwidth == 16 else wtype


def axes_of(model: onnx.ModelProto) -> dict[str, int]:
    out = {}
    inits = {i.name for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type in C.PER_CHANNEL_AXIS and len(n.input) > 1 and n.input[1] in inits:
            out[n.input[1]] = C.PER_CHANNEL_AXIS[n.op_type]
    return out


class Search:
    def __init__(
        self,
        setup: Setup,
        root: Path,
        journal: Journal,
        workers: int,
        wtype: str,
        executor: ExecutorConfig | None = None,
    ):
        self.s, self.root, self.journal, self.workers, self.wtype = (
            setup,
            root,
            journal,
            workers,
            wtype,
        )
        self.done = {r["config"]: r["result"] for r in journal.of_kind("measured")}
        self.label = "fix search"  # what its progress bar and line say it is
        self.sessions = 0
        self.count = len(self.done)
        # candidates are measured by worker processes kept for the whole search
        self.executor_config = executor or ExecutorConfig("local", workers)
        self._executor: Executor | None = None

    # ------------------------------------------------------------------ one measurement
    def _spec(self, changes: list[C.Change], folder: str) -> tuple[Spec | None, dict]:
        s = self.s
        regions = {
            c.target: C.act16_region(s.prepared, c.target) for c in changes if c.kind == "act16"
        }
        st = C.settings(
            changes,
            s.quant.per_channel,
            s.quant.act_bitwidth,
            s.quant.act_quantizer,
            self.wtype,
            s.axes,
            regions,
            s.encodings,
        )
        out_dir = self.root / "candidates" / folder
        out_dir.mkdir(parents=True, exist_ok=True)
        model_path = s.prepared_path
        extra: dict[str, Any] = {}
        made = self._made(changes, out_dir)
        if made is not None:  # measured as made: the run's own model, or a region of it in fp16
            spec = Spec(
                key=C.config_key(changes),
                float_model=str(model_path),
                out_dir=str(out_dir),
                feeds=s.feeds,
                reference=str(s.reference),
                options=s.options,
                quant=s.quant,
                judged=s.judged,
                model=str(made),
            )
            return spec, {"settings": st}
        clamps = {c.target: s.clamps[c.target] for c in changes if c.kind == "clamp_mask"}
        if clamps:  # the mask's sentinel clamped in the float model, quantized again
            clamped = onnx.load(str(model_path))
            clamp_constants(clamped, clamps)
            model_path = out_dir / "float.onnx"
            onnx.save(clamped, str(model_path))
            extra["clamped"] = ", ".join(f"{k} to {v:g}" for k, v in clamps.items())
        pairs = C.pairs_of(s.prepared, changes)
        if pairs:
            eq, notes = equalize(s.prepared, pairs)
            change = float_change(s.prepared, eq, [load_feed(f) for f in s.feeds])
            extra["float change"] = change
            extra["equalization"] = "; ".join(notes)
            if not change <= FLOAT_RTOL:
                return None, {
                    **extra,
                    "status": "float output changed",
                    "reason": f"equalization changed the float outputs by {change:.3g} of their scale",
                }
            model_path = out_dir / "float.onnx"
            onnx.save(eq, str(model_path))
        spec = Spec(
            key=C.config_key(changes),
            float_model=str(model_path),
            out_dir=str(out_dir),
            feeds=s.feeds,
            reference=str(s.reference),
            options=s.options,
            quant=s.quant_of(st),
            overrides=st["overrides"],
            landed=st["landed"],
            judged=s.judged,
        )
        return spec, {**extra, "settings": st}

    def _made(self, changes: list[C.Change], out_dir: Path) -> Path | None:
        """The candidate's QDQ model when it is no quantization of its own: the run's model
        itself (no change), or that model with a culprit's region in float (fp16 on HTP)."""
        base = self.s.baseline_model
        if base is None:
            return None
        if not changes:
            return base
        if len(changes) != 1 or changes[0].kind != "float_region":
            return None
        from accdbg.algorithms.fragments import QdqModel
        from accdbg.algorithms.mixed import FloatModel, op_list, partly_quantized

        qdq = QdqModel.load(base)
        region = {qdq.producer[t] for t in changes[0].target.split(",") if t in qdq.producer}
        quantized = set(op_list(qdq)) - region
        model, _ = partly_quantized(qdq, quantized, FloatModel(self.s.prepared))
        path = out_dir / "candidate.qdq.onnx"
        onnx.save(model, str(path))
        return path

    def _prepare(self, changes: list[C.Change]) -> tuple[str, Spec | None, dict]:
        key = C.config_key(changes)
        self.count += 1
        folder = f"{self.count:03d}"
        spec, extra = self._spec(changes, folder)
        extra["folder"] = folder
        return key, spec, extra

    def _finish(self, key: str, res: dict, extra: dict) -> dict[str, Any]:
        res = {**res, **{k: v for k, v in extra.items() if k != "settings"}}
        res["key"] = key
        res["settings"] = extra.get("settings", {})
        res.pop("trace", None)
        self.sessions += int(res.get("sessions", 0) or 0)
        clean = _json_ready(res)
        self.journal.append({"kind": "measured", "config": key, "result": clean})
        self.done[key] = clean
        return _restore(clean)

    def _many(self, configs: list[list[C.Change]]) -> list[dict[str, Any]]:
        """Measure each config (journaled ones are taken back, not measured again), each on
        a worker of the executor, journaled as each finishes. A worker that crashes on a
        candidate (a native QNN crash) is replaced; the candidate is retried once, then its
        result is the crash, and the search goes on."""
        out: dict[int, dict[str, Any]] = {}
        todo: dict[str, tuple[int, str, Spec, dict]] = {}
        for i, cfg in enumerate(configs):
            key = C.config_key(cfg)
            if key in self.done:
                out[i] = _restore(self.done[key])
                continue
            key, spec, extra = self._prepare(cfg)
            if spec is None:  # refused before any session (e.g. the float output changed)
                out[i] = self._finish(key, {}, extra)
            else:
                todo[extra["folder"]] = (i, key, spec, extra)
        if todo:
            if self._executor is None:
                self._executor = get_executor(self.executor_config)
            # measure_many looked up here, at call time: tests replace it with a crasher
            worker = function_spec(measure_many)
            items = [(folder, [spec]) for folder, (_, _, spec, _) in todo.items()]
            measured = self._executor.map(worker, items)
            for o in progress(measured, self.label, len(items), "candidates measured"):
                i, key, spec, extra = todo[o.key]
                if o.ok:
                    res = o.value[0]
                else:
                    log_file = Path(spec.out_dir) / "backend_log.txt"
                    res = {"status": "crashed", "reason": f"{o.error} - see {log_file}"}
                    res["sessions"] = o.attempts
                out[i] = self._finish(key, res, extra)
        return [out[i] for i in range(len(configs))]

    def close(self) -> None:
        """Stop the measuring worker processes (the search is over, or interrupted)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def _run(self, changes: list[C.Change]) -> dict[str, Any]:
        return self._many([changes])[0]

    def _calibration_landed(self, rr: dict, current: dict, c: C.Change) -> None:
        """A calibration 'landed' when it moved some activation encoding from the state it
        was tried on ("I changed it and nothing changed" is then a fact, not a guess)."""
        root = self.root / "candidates"
        diff = activation_changes(root / str(current.get("folder")), root / rr["folder"])
        if diff is None:
            return
        n, m = diff
        rr["landed"] = f"calibration {c.target}: {n} of {m} activation encodings changed"
        rr["all landed"] = n > 0

    # ------------------------------------------------------------------ the greedy loop
    def greedy(
        self,
        cands: list[C.Change],
        target_sqnr: float | None,
        target_gap: float | None,
        max_16bit: int | None,
        time_budget: float | None,
    ) -> tuple[list[dict[str, Any]], list[C.Change]]:
        t0 = time.perf_counter()
        # the baseline is measured with the first round, in the same workers (one start-up)
        self._many([[]] + [C.with_change([], c) for c in cands if C.compatible([], c)])
        base = self._run([])
        if base.get("status") != "ok":
            raise AccdbgError(
                f"the baseline (the model quantized with the given flags) cannot be measured: "
                f"{base.get('status')}: {base.get('reason')}"
            )
        rows = [_row(base, [], None, 0, "baseline", base)]
        rows[0]["accepted"] = False
        current, state = base, []
        pending = list(cands)
        rnd = 0
        while pending:
            if _met(current, base, target_sqnr, target_gap):
                break
            if time_budget is not None and time.perf_counter() - t0 >= time_budget:
                log.info("fix search: time budget (%.0f s) spent", time_budget)
                break
            rnd += 1
            trial = [c for c in pending if C.compatible(state, c)]
            if not trial:
                break
            configs = [C.with_change(state, c) for c in trial]
            results = self._many(configs)
            round_rows = [
                _row(r, cfg, c, rnd, "measured", base)
                for r, cfg, c in zip(results, configs, trial, strict=True)
            ]
            for rr, c in zip(round_rows, trial, strict=True):
                if c.kind == "calibration" and rr["status"] == "ok":
                    self._calibration_landed(rr, current, c)
            ok = [
                rr
                for rr in round_rows
                if rr["status"] == "ok"
                and rr["SQNR mean"] >= current["SQNR mean"] + MIN_GAIN_DB
                and (max_16bit is None or (rr.get("16-bit tensors") or 0) <= max_16bit)
                and (rr.get("cpu nodes") or 0) <= (base.get("cpu nodes") or 0)
            ]
            for rr in round_rows:
                if (
                    rr["status"] == "ok"
                    and max_16bit is not None
                    and (rr.get("16-bit tensors") or 0) > max_16bit
                ):
                    rr["note"] = f"over --max_16bit_tensors {max_16bit}"
            best = _choose(ok, base, target_sqnr, target_gap)
            improving = {rr["change"] for rr in ok}
            if best is not None:
                best["accepted"] = True
                chosen = next(c for c in trial if c.label == best["change"])
                state = C.with_change(state, chosen)
                current = next(r for r, c in zip(results, trial, strict=True) if c is chosen)
                pending = [c for c in pending if c is not chosen]
                log.info(
                    "fix search round %d: accepted %s -> output SQNR %.2f dB (was %.2f)",
                    rnd,
                    chosen.label,
                    best["SQNR mean"],
                    rows[-1]["SQNR mean"] if rnd == 1 else _last_accepted(rows)["SQNR mean"],
                )
            rows.extend(round_rows)
            if best is None:
                break
            # what did not help now is not tried again (measured: that is its result)
            pending = [c for c in pending if c.label in improving]
        return rows, state


def _choose(ok: list[dict], base: dict, target_sqnr, target_gap) -> dict | None:
    """The change to accept: among those meeting the target, the cheapest (16-bit tensors +
    Convert ops; then the highest SQNR); when none meets it, the highest SQNR."""
    if not ok:
        return None
    meeting = [
        rr
        for rr in ok
        if (target_sqnr is not None and rr["SQNR mean"] >= target_sqnr)
        or (target_gap is not None and rr["gap closed"] >= target_gap)
    ]
    if meeting:
        return min(meeting, key=lambda rr: (_cost(rr), -rr["SQNR mean"]))
    return max(ok, key=lambda rr: rr["SQNR mean"])


def _cost(rr: dict) -> float:
    a, b = _num(rr.get("16-bit tensors")), _num(rr.get("Convert ops"))
    return (0 if math.isnan(a) else a) + (0 if math.isnan(b) else b)


def _last_accepted(rows):
    acc = [r for r in rows if r.get("accepted")]
    return acc[-1] if acc else rows[0]


def _met(current, base, target_sqnr, target_gap) -> bool:
    if target_sqnr is not None and current.get("SQNR mean", -math.inf) >= target_sqnr:
        return True
    if target_gap is not None and _gap(current, base) >= target_gap:
        return True
    return False


def _gap(r: dict, base: dict) -> float:
    """Share of the baseline's output noise power the candidate removed (1 = float)."""
    if r.get("nsr") is None or not base.get("nsr"):
        return math.nan
    return 1.0 - float(r["nsr"]) / float(base["nsr"])


def _row(
    res: dict, cfg: list[C.Change], change: C.Change | None, rnd: int, kind: str, base: dict
) -> dict:
    landed = res.get("landed") or []
    text = "; ".join(
        f"{x['what']} {x['tensor']}: {'yes' if x['ok'] else 'NO'} ({x['qnn']})" for x in landed
    )
    if res.get("equalization"):  # weights changed in the float model: what changed, measured
        text = "; ".join(t for t in (f"equalized {res['equalization']}", text) if t)
    return {
        "round": rnd,
        "change": change.label if change else "baseline",
        "kind": change.kind if change else "baseline",
        "scope": ("global" if change.is_global else "local") if change else "",
        "layer": change.layer if change else "",
        "why": change.why if change else "",
        "config": " + ".join(c.label for c in cfg) or "baseline",
        "status": res.get("status", ""),
        "reason": res.get("reason", ""),
        "SQNR mean": _num(res.get("SQNR mean")),
        "SQNR worst": _num(res.get("SQNR worst")),
        "cosine mean": _num(res.get("cosine mean")),
        "cosine worst": _num(res.get("cosine worst")),
        "top-1 agreement": _num(res.get("top-1 agreement")),
        "gap closed": _gap(res, base),
        "16-bit tensors": _num(res.get("16-bit tensors")),
        "Convert ops": _num(res.get("Convert ops")),
        "landed": text or ("n/a" if res.get("status") == "ok" else ""),
        "all landed": all(x["ok"] for x in landed) if landed else None,
        "float change": _num(res.get("float change")),
        "cpu nodes": _num(res.get("cpu nodes")),
        "seconds": _num(res.get("seconds")),
        "accepted": False,
        "nsr": _num(res.get("nsr")),
        "folder": res.get("folder", ""),
        "settings": res.get("settings", {}),
        "note": res.get("cpu reasons", ""),
    }


def _restore(rec: dict) -> dict:
    """A journaled record with its infinities back (JSON spells them as text) and NaN for
    what was not measured."""
    out = {}
    for k, v in rec.items():
        if v in ("inf", "-inf"):
            v = math.inf if v == "inf" else -math.inf
        out[k] = v
    return out


def _num(v: Any) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def _json_ready(obj: Any) -> Any:
    """Journal records: tuples to lists, non-finite floats to text (JSON has no inf)."""
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "item"):
        return _json_ready(obj.item())
    return obj
