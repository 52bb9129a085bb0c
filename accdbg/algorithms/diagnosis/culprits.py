"""The culprit ranking of a run: evidence, sensitivity of the standouts, verdict.

Shared by every algorithm: each passes what it measured on the backend (a full run's errors for
oneshot, golden-input errors for the snooping algorithms) and gets back the same
:class:`~accdbg.algorithms.diagnosis.ranking.Ranking` - ``culprit_rank`` and ``cause`` columns and the
finding lines.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import pandas as pd

from accdbg.algorithms.diagnosis.coverage import coverage_culprit
from accdbg.algorithms.diagnosis.divergence import (
    HELD,
    KernelRuns,
    divergence,
    error_against,
    golden_alone,
    held_as_graph,
    held_parts,
    kernel_bisect,
    local_divergence,
)
from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder, float_weights_of
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking import ContextCheck, KernelsAdded, Ranking, rank
from accdbg.algorithms.diagnosis.ranking.defects import as_culprits, defects_beside
from accdbg.algorithms.diagnosis.ranking.measures import CONTEXT, CONTEXT_IN
from accdbg.algorithms.diagnosis.reach import OutlierReach, Reach
from accdbg.algorithms.diagnosis.sensitivity import Sensitivity, Share, judged_outputs
from accdbg.core import onnx_model as om
from accdbg.core.cpu_session import IdleThread, cpu_threads, exact_session, sessions_made
from accdbg.core.progress import stage
from accdbg.core.tensor_store import TensorFolder
from accdbg.verifiers.base import Verifier
from accdbg.verifiers.configured import ConfiguredVerifier
from accdbg.verifiers.scoring import score_pair

log = logging.getLogger("accdbg.culprits")


def prepared_model(qdq_model: Path) -> Path:
    """The pre-processed float model the inference engine keeps beside its QDQ model."""
    return qdq_model.with_name(qdq_model.name.removesuffix(".qdq.onnx") + ".prepared.onnx")


def noise_verifier(verifiers: Mapping[str, Verifier], columns) -> str | None:
    """The label of the verifier that best measures noise-to-signal power (exact first)."""
    usable = [lab for lab, v in verifiers.items() if lab in columns and v.noise_to_signal(0.5)]
    usable.sort(key=lambda lab: not verifiers[lab].nsr_exact)
    return usable[0] if usable else None


def observed_nsr(
    df: pd.DataFrame, name_col: str, verifiers: Mapping[str, Verifier], per_channel: bool = True
) -> dict[str, float]:
    """Each row's error as noise-to-signal power, from the verifier that measures it (SQNR
    exactly, cosine approximately), its median channel when known and ``per_channel``."""
    label = noise_verifier(verifiers, df.columns)
    if label is None:
        return {}
    v = verifiers[label]
    out: dict[str, float] = {}
    columns = (f"{label} ch_median", label) if per_channel else (label,)
    for _, row in df.iterrows():
        for col in columns:
            x = pd.to_numeric(row.get(col), errors="coerce")
            if x is not None and not pd.isna(x):
                out[str(row[name_col])] = v.noise_to_signal(float(x))
                break
    return out


def context_nsr(df: pd.DataFrame, name_col: str) -> dict[str, tuple[float, float]]:
    """Layerwise: each layer run in context (:mod:`accdbg.algorithms.layerwise`) -> its error
    there and its worst input's, as noise-to-signal power."""
    if CONTEXT not in df.columns or CONTEXT_IN not in df.columns:
        return {}
    got = pd.to_numeric(df[CONTEXT], errors="coerce")
    ins = pd.to_numeric(df[CONTEXT_IN], errors="coerce")
    return {
        str(n): (10 ** (-g / 10), 10 ** (-i / 10))
        for n, g, i in zip(df[name_col], got, ins, strict=True)
        if not (pd.isna(g) or pd.isna(i))
    }


def output_verdicts(
    df: pd.DataFrame, name_col: str, verifiers: Mapping[str, Verifier], outputs: Sequence[str]
) -> list[tuple[str, str, float, bool | None]]:
    """(output, verifier label, value, passed) for each model output row."""
    out = []
    rows = df[df[name_col].isin(list(outputs))]
    for _, row in rows.iterrows():
        for label, v in verifiers.items():
            x = pd.to_numeric(row.get(label), errors="coerce")
            if x is None or pd.isna(x):
                continue
            out.append((str(row[name_col]), label, float(x), v.judge(float(x))))
    return out


class _BeforeBackend:
    """What the ranking needs before any backend result, for one input: the models, that
    input's evidence, and the output sensitivity and outlier reach - which remember what they
    were asked, so a ranking run twice measures once."""

    def __init__(
        self,
        qdq_model: Path,
        golden: Path,
        golden_name: Mapping[str, str] | None,
        feeds: Mapping[str, np.ndarray] | None,
        float_model: Path | None,
        more_feeds: Iterable[Mapping[str, np.ndarray]],
        impact: _LazySensitivity | None = None,
    ):
        self.golden, self.feeds = Path(golden).resolve(), dict(feeds or {})
        self.qdq = onnx.load(str(qdq_model))
        names = dict(golden_name or {})
        # read once: its weights, its logits' names and (if a layer stands out) the sensitivity
        self.float_proto = (
            onnx.load(str(float_model)) if float_model and float_model.is_file() else None
        )
        weights = float_weights_of(self.float_proto) if self.float_proto is not None else None
        self.builder = EvidenceBuilder(
            self.qdq,
            TensorFolder(golden),
            lambda n: names.get(n, n),
            weights,
            graph_inputs=feeds,
        )
        self.evidence = self.builder.build()
        self.builder.float_weights.clear()  # read by the build only: a copy of every weight
        self.impact: _LazySensitivity | None = None
        self.reach: _RememberedReach | None = None
        if self.float_proto is not None and feeds:
            by_name = {e.name: e for e in self.builder.layers}
            weights_of = {n: ev.weights_of for n, ev in self.evidence.items() if ev.weights_of}
            self.impact = impact or _LazySensitivity(
                self.float_proto, self.qdq, feeds, more_feeds, by_name, weights_of
            )
            self.reach = _RememberedReach(
                OutlierReach(self.float_proto, self.builder.layers, feeds)
            )

    def serves(self, golden: Path, feeds: Mapping[str, np.ndarray] | None) -> bool:
        """Built for this input (its golden folder and the same input values)."""
        feeds = dict(feeds or {})
        return (
            Path(golden).resolve() == self.golden
            and feeds.keys() == self.feeds.keys()
            and all(np.array_equal(feeds[k], self.feeds[k]) for k in feeds)
        )

    def rank_alone(self) -> None:
        """The ranking with no backend result, in execution order: it asks the sensitivity and
        the reach what the full ranking will ask them (a thread asked to stop stops at its
        next CPU run: :func:`~accdbg.core.cpu_session.stop_if_asked`)."""
        rank(
            self.evidence,
            [e.name for e in self.builder.layers],
            impact=self.impact,
            reach=self.reach,
        )


class Prefetch:
    """The culprit ranking's work that needs no backend result, done in a thread while the
    backend runs (QNN's graph finalize keeps one core busy for seconds; the ranking would
    otherwise wait for it), at the lowest priority (QNN's plain and debug workers take every
    core they get: on PP-OCRv4 det the whole oneshot then takes 0.90-0.93 of its time with
    the thread at the default priority): the evidence of the first input and the output
    sensitivity and outlier reach its standouts ask for. :func:`find_culprits` takes what
    serves its own question and measures the rest. Made for one run: the model the engine
    runs and the inputs it is fed (the sensitivity pools all of them, whichever comes
    first)."""

    def __init__(
        self,
        qdq_model: Path,
        golden: Path,
        golden_name: Mapping[str, str],
        feeds: Mapping[str, np.ndarray],
        more_feeds: Iterable[Mapping[str, np.ndarray]],
        start: bool = True,
    ):
        self._done: _BeforeBackend | None = None
        args = (qdq_model, golden, golden_name, feeds, prepared_model(qdq_model), more_feeds)
        self.seconds = math.nan
        # on the cores QNN leaves idle, never slowing it
        self._thread = IdleThread(lambda: self._run(*args), "accdbg-ranking-prefetch")
        self._start_asked = False
        if start:
            self.start()

    def start(self) -> None:
        """Start the work. A caller that must close it whatever happens (a stop signal can
        land between any two steps) makes it with ``start=False``, arranges :meth:`close`,
        then starts it: a thread left running in onnxruntime while the process ends would
        abort it (``terminate called without an active exception``)."""
        self._start_asked = True
        self._thread.start()

    def _run(self, *args) -> None:
        t = time.perf_counter()
        try:
            with cpu_threads(1):  # the core QNN's graph finalize leaves free, not both
                before = _BeforeBackend(*args)
                before.rank_alone()
            self._done = before
        except Exception as exc:  # the ranking does it all after the run, and says why there
            log.info("culprit ranking not prepared beside the run: %s", str(exc).splitlines()[0])
        self.seconds = time.perf_counter() - t

    def take(self) -> _BeforeBackend | None:
        """What it prepared (waiting for it while it runs), or None; handed over once (not
        held after the ranking: its sessions and evidence go with it). A thread starved by a
        busy machine is stopped, not waited for: the ranking does the work at its own
        priority."""
        if not self._thread.wait():
            self._thread.ask_to_stop()
            log.info("culprit ranking: its work beside the run got no CPU (a busy machine)")
            return None
        done, self._done = self._done, None
        return done

    def close(self) -> None:
        """Stop at the next step and wait (the run is over, stopped or failed: no thread left
        in a CPU run while the process ends - onnxruntime torn down under it would crash a run
        that succeeded; one session or run at most, which a starved thread ends slowly)."""
        self._thread.ask_to_stop()
        if self._start_asked:  # started, or being started when a signal stopped start()
            for _ in range(1000):
                try:
                    self._thread.join()
                    break
                except RuntimeError:  # created, not yet marked started
                    time.sleep(0.001)
        self._done = None


@stage("culprit ranking", line=False, unit="CPU sessions", count=sessions_made)
def find_culprits(
    qdq_model: Path,
    golden: Path,
    table: pd.DataFrame,
    name_col: str,
    verifiers: Mapping[str, Verifier],
    feeds: Mapping[str, np.ndarray] | None,
    float_model: Path | None = None,
    golden_name: Mapping[str, str] | None = None,
    local_observed: bool = False,
    full_run: bool = True,
    target: Path | None = None,
    more_feeds: Iterable[Mapping[str, np.ndarray]] = (),
    prefetch: Prefetch | None = None,
    simulated: bool = False,
    alone: Callable[[str], np.ndarray | None] | None = None,
    in_context: Rerun | None = None,
    verdict_outputs: Sequence[str] = (),
) -> Ranking:
    """Evidence for every layer, output sensitivity for the standouts, one verdict.

    ``verdict_outputs``: the outputs the verdict judges (those a run was asked for: ``-o``,
    an input list's ``#`` line), instead of the graph's.

    ``full_run``: the table's output rows are the model's outputs as deployed (oneshot), so
    their verdict is stated; a snooping table's are not (golden inputs upstream). ``target``:
    the QNN dump of the same input, compared layer by layer with the CPU fake-quant of each
    layer fed QNN's own inputs to find backend culprits. ``more_feeds``: the other inputs debugged with this
    one - the output sensitivity pools its error over all of them (the evidence and the
    backend comparison stay on ``feeds``, whose golden and target are given); read only if
    some layer stands out. ``prefetch``: the same run's work done while the backend ran.
    ``simulated``: the target is onnxruntime's CPU fake-quant itself (``--engine simulation``),
    so there is no backend to find culprits of or to compare with it. ``alone(name)``
    (layerwise): the backend's result of that layer run alone on golden inputs (dequantized;
    None when it has none). ``in_context`` (layerwise): layers whose error jumps in context run
    again (:class:`Rerun`)."""
    t = time.perf_counter()
    before = prefetch.take() if prefetch is not None else None
    beside = "" if before is None else f" ({prefetch.seconds:.1f} s more beside the backend run)"
    if before is None or not before.serves(golden, feeds):  # another input is the worst
        impact = before.impact if before is not None else None  # pooled over the same inputs
        before = _BeforeBackend(
            qdq_model, golden, golden_name, feeds, float_model, more_feeds, impact
        )
    qdq, float_proto, builder = before.qdq, before.float_proto, before.builder
    outputs = [o.name for o in qdq.graph.output]
    quantized = any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)  # else fp16 on QNN
    div = at_outputs = kernels = None
    # the outputs' backend error is judged where their error is: the logits, when compared
    rows = set(table[name_col].astype(str))
    # each judged tensor -> the model output it stands for, as the user knows it
    output_of = judged_outputs(float_proto, rows) if float_proto is not None else {}
    logits = list(output_of)
    judged = [n for n in logits if n in rows] or outputs
    if target is not None and feeds and not simulated:
        folder = TensorFolder(target)
        try:
            div = local_divergence(qdq, builder.layers, feeds, folder)
            ends = [e for e in builder.layers if e.name in judged]
            at_outputs = divergence(qdq, ends, feeds, folder, _golden_of(builder))
            errors = {  # each judged tensor's QNN error, measured just now against float
                n: q for n, (q, _) in at_outputs.errors.items() if math.isfinite(q) and q > 0
            }
            kernels = _KernelShare(qdq, builder.layers, feeds, folder, errors, dict(at_outputs))
        except Exception as exc:  # the CPU cannot run it: no backend verdict, say why
            log.info("no backend comparison (CPU fake-quant failed: %s)", str(exc).splitlines()[0])
    label = noise_verifier(verifiers, table.columns)
    alone_cpu = None
    # a jump on the backend set against the CPU's: layerwise's, and a run's with no comparison
    if label is not None and not simulated and (local_observed or div is None):
        # measured as the jumps are: per channel alone (layerwise), per tensor in a run
        per_channel = local_observed and f"{label} ch_median" in table
        alone_cpu = _CpuReference(
            qdq, builder, feeds or {}, verifiers[label], per_channel, judged, alone, in_context
        )
    ranking = rank(
        before.evidence,
        [str(n) for n in table[name_col]],
        impact=before.impact,
        observed_nsr=observed_nsr(table, name_col, verifiers),
        local_observed=local_observed,
        outputs=(
            output_verdicts(table, name_col, verifiers, list(verdict_outputs) or outputs)
            if full_run
            else ()
        ),
        divergence=div,
        kernel_share=kernels,
        kernels_added=(
            KernelsAdded.worst(at_outputs.errors, quantized, output_of) if at_outputs else None
        ),
        quantized=quantized,
        reach=before.reach,
        # a full run's whole-tensor error: where the error jumps (an amplified rounding; with
        # no CPU comparison, the nearest sign of a backend's layer)
        run_nsr=None if local_observed else observed_nsr(table, name_col, verifiers, False),
        backend_jumps=div is None and not simulated,
        context_nsr=context_nsr(table, name_col) if local_observed else None,
        alone_cpu=alone_cpu if local_observed else None,
        run_cpu=alone_cpu.in_run if alone_cpu is not None and not local_observed else None,
        judged=judged,
        defects=_found_first(qdq_model, qdq, before.evidence, feeds),
    )
    log.info("culprit ranking in %.1f s%s", time.perf_counter() - t, beside)
    return ranking


def _found_first(qdq_model: Path, qdq: onnx.ModelProto, evidence, feeds) -> list:
    """The culprits named before any layer is measured: the quantized model's defects, then a
    calibration that does not cover the debugged input."""
    first = as_culprits(
        defects_beside(qdq_model), {o: n.op_type for n in qdq.graph.node for o in n.output}
    )
    calibration = coverage_culprit(qdq, evidence, feeds, len(first) + 1)
    return first + ([calibration] if calibration is not None else [])


class Rerun(Protocol):
    """Layers run again for the ranking where layerwise saw their error jump in context
    (:class:`~accdbg.algorithms.layerwise.ContextRuns`)."""

    def cut(self, names: Sequence[str]) -> Mapping[str, tuple[np.ndarray, np.ndarray]]:
        """Each layer's context cut on the backend and in the CPU fake-quant: (backend's,
        CPU's) values, dequantized."""
        ...

    def whole(self, names: Sequence[str]) -> Mapping[str, np.ndarray]:
        """The layers' and their inputs' values in the model run from its inputs on the
        backend, dequantized."""
        ...


class _CpuReference:
    """What a backend's jump is set against. Layerwise (called with names): each asked layer's
    error in onnxruntime's CPU fake-quant of it alone, fed the
    golden inputs the backend was fed (:func:`~accdbg.algorithms.diagnosis.divergence.golden_alone`),
    measured as :func:`observed_nsr` measures the backend's row (the verifier ``label``, its
    median channel when ``per_channel``): what the quantization alone makes of the layer, to
    set against the backend's result before blaming its kernel. With the backend's own result
    of the layer alone (``backend(name)``, dequantized), :meth:`kernel_share` says what their
    difference costs the outputs; :meth:`in_run` gives the layers' error in the CPU fake-quant
    of the whole model, for a full run's jumps."""

    def __init__(
        self,
        qdq: onnx.ModelProto,
        builder: EvidenceBuilder,
        feeds: Mapping[str, np.ndarray],
        verifier: Verifier,
        per_channel: bool,
        judged: Sequence[str] = (),
        backend: Callable[[str], np.ndarray | None] | None = None,
        context: Rerun | None = None,
    ):
        self.qdq, self.builder, self.feeds = qdq, builder, feeds
        self.verifier, self.per_channel = verifier, per_channel
        self.judged, self.backend, self.context = list(judged), backend, context
        self.by = {e.name: e for e in builder.layers}
        self.held: dict[str, np.ndarray] = {}  # the CPU's result of each layer asked

    def __call__(self, names: Sequence[str]) -> dict[str, float]:
        b = self.builder
        try:
            self.held = golden_alone(self.qdq, b.layers, names, self.feeds, b.golden, b.golden_name)
        except Exception as exc:  # the CPU cannot cut or run it: the expectation stays composed
            log.info("layers not run alone on the CPU: %s", str(exc).splitlines()[0])
            return {}
        out = {}
        for n, held in self.held.items():
            t = np.asarray(self.by[n].dequantize(held), np.float64)
            gold = b.golden_of(n)
            if gold is not None and gold[0].size == t.size:
                nsr = self._nsr(gold[0].reshape(t.shape), t, gold[1], self.by[n].op_type)
                if nsr is not None and math.isfinite(nsr):
                    out[n] = nsr
        return out

    def in_run(self, names: Sequence[str]) -> dict[str, float]:
        """Each asked layer's whole-tensor error (noise-to-signal against its golden) in
        onnxruntime's CPU fake-quant of the whole model, fed the model's inputs: one run
        exposing only them."""
        asked = [self.by[n] for n in names if n in self.by]
        tensors = list(dict.fromkeys(e.graph_tensor for e in asked))
        try:
            sess = exact_session(om.with_outputs(self.qdq, tensors))
            values = dict(zip(tensors, sess.run(tensors, dict(self.feeds)), strict=True))
        except Exception as exc:  # the CPU cannot run it: the jumps stand as measured
            log.info("no CPU fake-quant run of the model: %s", str(exc).splitlines()[0])
            return {}
        errors = {e.name: self._error(e.name, e.dequantize(values[e.graph_tensor])) for e in asked}
        return {n: v for n, v in errors.items() if not math.isnan(v)}

    def kernel_share(self, names: Sequence[str]) -> dict[str, float]:
        """Per layer (among those asked before), what the difference between the backend's
        result of it alone and the CPU's costs the outputs, added to the CPU fake-quant of the
        whole model, over the outputs' error there (the worst judged output)."""
        pairs = {}
        for n in names:
            got = self.backend(n) if self.backend is not None and n in self.held else None
            if got is not None and got.size == self.held[n].size:
                e = self.by[n]
                pairs[n] = (held_as_graph(e, got.reshape(self.held[n].shape)), self.held[n])
        return self._shares(pairs)

    def in_context(self, names: Sequence[str]) -> dict[str, ContextCheck]:
        """Layers whose error jumps in context, run again (``context``): the CPU fake-quant's
        error in the same cut (whole tensor, as the table's in-context SQNR), what the
        difference between the backend and it there costs the outputs (:meth:`kernel_share`),
        and the layers' and their inputs' errors in the whole model on the backend."""
        if self.context is None or not names:
            return {}
        try:
            ran = self.context.cut(names)
        except Exception as exc:  # the CPU cannot run the cut: the jumps stand as measured
            log.info("layers not run again in context: %s", str(exc).splitlines()[0])
            return {}
        errors, pairs = {}, {}
        for n, (got, cpu) in ran.items():
            error = self._error(n, cpu)
            if n in self.by and math.isfinite(error):
                errors[n] = error
                e = self.by[n]
                pairs[n] = (held_as_graph(e, got), held_as_graph(e, cpu))
        shares = self._shares(pairs)
        try:
            ran_whole = self.context.whole(list(errors))
        except Exception as exc:  # the model cannot be cut there: no deployed figure
            log.info("layers not run again in the whole model: %s", str(exc).splitlines()[0])
            ran_whole = {}
        whole = {n: self._error(n, v) for n, v in ran_whole.items()}
        whole = {n: v for n, v in whole.items() if math.isfinite(v)}
        return {n: ContextCheck(e, shares.get(n, math.nan), whole) for n, e in errors.items()}

    def _shares(self, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        """Per layer, its (backend's, CPU's) values' difference added to the CPU fake-quant of
        the whole model: the outputs' error it adds over their error there."""
        try:
            runs = KernelRuns.of_differences(
                self.qdq, self.builder.layers, self.feeds, pairs, self.judged
            )
            if not runs.names:
                return {}
            ends = zip(runs.ends, runs.base, strict=True)
            errors = {e.name: self._error(e.name, base) for e, base in ends}
            out = {}
            for n, effect in runs.each().items():
                shares = [v / errors[x] for x, v in effect.items() if errors.get(x, 0) > 0]
                if shares:
                    out[n] = max(shares)
            return out
        except Exception as exc:  # the CPU cannot run it: no share, the jump stands alone
            log.info("no kernel effect measured: %s", str(exc).splitlines()[0])
            return {}

    def _error(self, n: str, values: np.ndarray) -> float:
        """``values`` against the layer's golden (NaN when it has none that matches)."""
        gold = self.builder.golden_of(n)
        return error_against(values, gold[0]) if gold is not None else math.nan

    def _nsr(self, g: np.ndarray, t: np.ndarray, layout: str | None, op: str) -> float | None:
        """As the table measures the backend's row (:func:`~accdbg.verifiers.scoring.
        score_pair`): the verifier's value, or its median channel's with ``per_channel``."""
        row: dict[str, object] = {"LayerType": op}
        value = score_pair(row, g, t, None, layout, [ConfiguredVerifier(self.verifier, "v")])
        median = row.get("v ch_median", math.nan)
        return self.verifier.noise_to_signal(
            median if self.per_channel and not math.isnan(median) else value["v"].value
        )


def _golden_of(builder: EvidenceBuilder):
    """A layer's float tensor from the folder and names the evidence reads, None when the
    golden run has none."""

    def read(e) -> np.ndarray | None:
        name = builder.golden_name(e.name)
        return builder.golden.load(name) if name is not None and name in builder.golden else None

    return read


class _KernelShare:
    """What one layer's kernel difference costs the outputs, over their error on QNN (the
    worst judged output); measured only for the layers whose difference stands out."""

    def __init__(
        self,
        qdq,
        layers,
        feeds,
        target: TensorFolder,
        errors: dict[str, float],
        apart: dict[str, float] | None = None,
    ):
        self.args = (qdq, layers, feeds, target)
        self.errors = errors
        self.apart = apart or {}  # judged tensor -> Σ(qnn - cpu)² / Σcpu²
        self._runs: KernelRuns | None = None  # the layers asked last, for :meth:`together`

    def __call__(self, names: Sequence[str]) -> dict[str, float]:
        try:
            self._runs = KernelRuns(*self.args, names, list(self.errors))
            effects = self._runs.each()
        except Exception as exc:  # the CPU cannot run the cut model: a note, not a verdict
            log.info("no kernel effect measured: %s", str(exc).splitlines()[0])
            return {}
        return {n: self._share(per) for n, per in effects.items()}

    def together(self, names: Sequence[str]) -> float:
        """What the kernel differences of these layers (among those asked last) cost the
        outputs added at once, over their error on QNN; NaN when not measured."""
        runs = self._runs
        if runs is None or not set(names) <= set(runs.names):
            return math.nan
        try:
            return self._share(runs.effect(list(names)))
        except Exception as exc:  # as above
            log.info("no kernel effect measured: %s", str(exc).splitlines()[0])
            return math.nan

    def _share(self, effect: dict[str, float]) -> float:
        return max((v / self.errors[end] for end, v in effect.items()), default=math.nan)

    def search(self, names: Sequence[str], bar: float) -> dict[str, float]:
        """The layers among ``names`` (where QNN parts most first) whose kernel difference
        alone costs ``bar`` of the outputs' error or more, found by halving them in graph
        order (:func:`~accdbg.algorithms.diagnosis.divergence.kernel_bisect`); only the first
        ``HELD`` bytes of their dumps are asked about: every one asked is held at once."""
        qdq, layers, feeds, target = self.args
        by = {e.name: e for e in layers}
        asked = held_parts([by[n] for n in names if n in by and n in target], target, HELD)
        chosen = {e.name for e in asked[0]} if asked else set()
        order = [e.name for e in layers if e.name in chosen]
        try:
            runs = KernelRuns(qdq, layers, feeds, target, order, list(self.errors))
            every = runs.effect(runs.names)  # every difference added: QNN's outputs again?
            off = [v / self.apart[n] for n, v in every.items() if self.apart.get(n, 0) > 0]
            if not off or not all(1 / POLICY.reproduced <= r <= POLICY.reproduced for r in off):
                log.info(
                    "kernel search: the CPU run with every kernel difference does not "
                    "reproduce QNN's outputs (%s): no layer searched",
                    off,
                )
                return {}
            return kernel_bisect(runs, self._share, bar)
        except Exception as exc:  # the CPU cannot run the cut model: a note, not a verdict
            log.info("no kernel effect measured: %s", str(exc).splitlines()[0])
            return {}


class _RememberedReach:
    """An outlier reach that measures each question once."""

    def __init__(self, reach: OutlierReach):
        self.reach = reach
        self.answers: dict[tuple[str, ...], dict[str, Reach]] = {}

    def __call__(self, names: Sequence[str]) -> dict[str, Reach]:
        key = tuple(names)
        if key not in self.answers:
            self.answers[key] = self.reach(names)
        return self.answers[key]


class _LazySensitivity:
    """Output sensitivity, set up only when a layer stands out (clean models pay nothing)."""

    def __init__(
        self,
        float_model: onnx.ModelProto,
        qdq: onnx.ModelProto,
        feeds,
        more_feeds,
        layers,
        weights_of: Mapping[str, str] | None = None,
    ) -> None:
        self.args = (float_model, qdq, feeds, more_feeds)
        self.layers = layers
        self.weights_of = dict(weights_of or {})  # a row -> the layer whose weights it stands for
        self._sens: Sensitivity | None = None
        self.failed = False
        self.asked: list[str] = []
        self.singles: list[str] = []
        self.answers: dict[tuple[tuple[str, ...], float], Share] = {}  # each question once
        self.float_answers: dict[tuple, float] = {}  # the float model's questions, each once

    def consider(self, names: Sequence[str], singles: Sequence[str] = ()) -> None:
        """The layers that will be asked about: the models are built once for all of them
        (``singles``: those asked alone, whose shares must add up)."""
        self.asked = [x for n in names if n in self.layers for x in self._with_weights(n)]
        self.singles = [n for n in singles if n in self.layers]

    def _with_weights(self, name: str) -> list[str]:
        """A row and the layer whose weights it stands for, if any."""
        return [name, *([self.weights_of[name]] if name in self.weights_of else [])]

    def _ready(self) -> Sensitivity | None:
        if self._sens is None and not self.failed:
            model, qdq, feeds, more = self.args
            try:
                asked = [self.layers[n] for n in self.asked]
                singles = [[self.layers[x] for x in self._with_weights(n)] for n in self.singles]
                self._sens = Sensitivity(model, qdq, [feeds, *more], asked, singles)
            except Exception as exc:  # onnxruntime refusing the model: rank on evidence alone
                self.failed = True
                self._sens = None
                log.info(
                    "no output sensitivity (CPU simulation failed: %s)", str(exc).splitlines()[0]
                )
        return self._sens

    def __call__(self, names: str | Sequence[str], enough: float = math.inf) -> Share:
        group = [names] if isinstance(names, str) else list(names)
        key = (tuple(group), enough)
        if key not in self.answers:
            self.answers[key] = self._measure(group, enough)
        return self.answers[key]

    def clamped(self, levels: Mapping[str, float]) -> float:
        """What these layers' few outlier weights cost the outputs
        (:meth:`~accdbg.algorithms.diagnosis.sensitivity.Sensitivity.clamped_share`); NaN when the CPU
        cannot tell."""
        return self._edited(
            "clamped_share",
            [(self.layers[self.weights_of.get(n, n)], v) for n, v in levels.items()],
            ("few",) + tuple(sorted(levels.items())),
        )

    def channels(self, levels: Mapping[str, tuple[int, float]]) -> float:
        """What these layers' outlier output channels cost the outputs
        (:meth:`~accdbg.algorithms.diagnosis.sensitivity.Sensitivity.channel_share`; ``levels``: layer ->
        (channel, the level it is brought to)); NaN when the CPU cannot tell."""
        return self._edited(
            "channel_share",
            [(self.layers[self.weights_of.get(n, n)], *v) for n, v in levels.items()],
            ("channel",) + tuple(sorted(levels.items())),
        )

    def _edited(self, question: str, args: list, key: tuple) -> float:
        """A question of the float model edited (each asked once); NaN when the CPU cannot
        tell."""
        if key not in self.float_answers:
            sens = self._ready()
            try:
                self.float_answers[key] = (
                    math.nan if sens is None else getattr(sens, question)(args)
                )
            except Exception as exc:  # onnxruntime refusing the edited model: not measured
                log.info("no %s measure for %s: %s", question, key[1][0], str(exc).splitlines()[0])
                self.float_answers[key] = math.nan
        return self.float_answers[key]

    def _measure(self, group: list[str], enough: float) -> Share:
        sens = self._ready()
        if sens is None:
            return Share(math.nan)
        try:
            return sens.share(
                [self.layers[x] for n in group for x in self._with_weights(n)], enough
            )
        except Exception as exc:  # this layer cannot be isolated on the CPU: evidence alone
            log.info("no output sensitivity for %s: %s", group[0], str(exc).splitlines()[0])
            return Share(math.nan)
