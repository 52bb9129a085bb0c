"""One ranking, one verdict: the layers that stand out from the model's own noise floor, and why.

Every layer of an 8-bit model loses some information; on a real model most layers "fail" an
absolute threshold. A culprit is a layer whose *own* encodings (weights, output, a Concat's
shared range; see :mod:`accdbg.algorithms.evidence`) destroy far more than the model's other
layers do - or whose backend result is far worse than its quantization explains:

* **noise floor** - the local SQNR of every layer with evidence; its median and a robust spread
  (1.4826 x the median absolute deviation, in dB).
* **stands out** - a layer's local SQNR is below ``floor - Z_MIN x spread`` (that gap kept
  between ``GAP_DB`` and ``MAX_GAP_DB``: a few layers make a weak spread estimate) and
  below ``ABS_DB`` (the SQNR pass mark: its own encodings alone fail what the model must keep);
  or its encoding clips at least ``CLIP_MIN`` of its golden values and ``CLIP_RATIO`` times the
  model's median layer. Clipping is not judged by its noise power: it removes the largest
  values, those that carry the most, so a few percent clipped can wreck the outputs at a local
  SQNR that looks healthy (an encoding calibrated by min/max on the debugged inputs clips
  nothing).
* **matters** - quantizing that layer alone, or taking only its quantizers out of the whole
  QDQ model (CPU simulation, :mod:`accdbg.algorithms.sensitivity`), shows it causes at least
  ``SHARE`` of the error of quantizing everything, or the layer destroys its information (local
  SQNR under ``DESTROYED_DB``: its median channel is mostly noise) and still causes
  ``MIN_SHARE``. A layer that is bad locally but drowned by the error around it is reported in
  its ``cause`` and not named; so is one costing much alone whose quantizers, taken out of the
  whole QDQ model, remove under ``MIN_SHARE`` (the other layers' errors mask its own: its fix
  alone would not show - a finding names such layers, measured taken out together), unless it
  destroys its information: that must be fixed whatever masks it (its cause says both). A
  layer that loses only its weights' rounding (its output keeps its range, its weights' own
  channel or outliers blow theirs) needs ``LONE_SHARE`` taken out (``MIN_SHARE`` when its
  weights destroy their information, never less): its error travels through no other layer's
  range, so taken out is exactly what its fix removes. Faults that hurt only together are measured together: a layer
  with the layers whose range the outlier channel it makes blows (measured on the float model:
  :mod:`accdbg.algorithms.reach`) and with the weights that scale that channel back; a
  compensated pair (weights whose range one input channel blows) with the producer that shrank
  that channel; and weights whose rounding multiplies a constant one input channel carries (an
  offset the bias cancels in float) are blamed on that channel's maker, measured with them;
  so is an activation whose range a channel blows that the weights just before it make loud
  (that output channel's weights ``OUTLIER_RATIO`` times the median one's), whether or not the
  weights' own layer stands out on the debugged input.
* **outlier weights** - a layer with a few weights ``BLOWN_RATIO`` times its tensor's 99th
  percentile or more, whether it stands out or not, is asked what the model would be without
  them: those weights brought to the rest's range in the float model and in the QDQ model
  (requantized), each judged against its own float. When the outputs then lose ``SHARE`` of
  their error or more, it is a culprit: such a weight multiplies the error its input channel
  brings from every encoding upstream, which no encoding of its own layer explains (alone and
  taken out it may cost little). So is a layer whose widest output channel of weights spans
  ``OUTLIER_RATIO`` times the next widest or more: that channel brought to the next one's range
  in both models, the QDQ model's activation encodings refitted (noise-to-signal).
* **backend** - the target's error at a layer (per channel) exceeds what the layer's own
  quantization plus the error it inherits explain by ``BACKEND_DB`` or more, standing out the
  same way among the model's layers: the kernel, not the encodings (golden inputs: layerwise).
  Such a layer is run alone in onnxruntime's CPU fake-quant too, fed the same golden inputs: a
  layer can multiply its inputs' rounding beyond their encodings' noise (a loud output channel
  weighing it), and then the CPU loses as much - it is named only when QNN is ``BACKEND_DB``
  worse than the CPU. A layer right alone whose error jumps only run after its producers
  (layerwise's context runs: HTP fuses it with them) is run again there in the CPU fake-quant,
  and from the model's inputs on QNN: the backend's only when the CPU's cut does not jump and
  the whole model does (a cut feeds its producers as graph inputs, which HTP may take
  otherwise), named when their difference costs the outputs ``SHARE`` as above.
  In a full run, each layer's QNN result is compared with onnxruntime's CPU fake-quant of that
  layer fed QNN's own inputs (:func:`~accdbg.algorithms.divergence.local_divergence`); a layer
  where they part far more than at the model's other layers (with fewer than
  ``MIN_DIVERGING`` layers that differ, no spread is known: ``MAX_GAP_DB`` under their median,
  or under ``ABS_DB``) is named when that difference,
  added to the layer in the CPU fake-quant of the whole model, costs the outputs at least
  ``SHARE`` of their error on QNN (:meth:`~accdbg.algorithms.divergence.KernelRuns.each`), and
  noted otherwise. When the kernels carry ``SHARE`` of the outputs' error and no layer is
  named at all, the layers where QNN differs are halved down to one whose difference alone
  costs that much (``kernel_share.search``: a small difference that does not average out).

Culprits are ranked by what they were measured to cost the outputs (the largest of: alone,
taken out, with their partners; for a backend culprit, its kernel difference's share of the
error on QNN): the one whose fix would remove the most comes first - after an upstream culprit
that causes most of the error itself and whose outlier blows its range. Those whose cost could not
be measured follow, then ties, by the information their own encodings destroy (lowest local
SQNR first). Shares of several culprits need not add up (their errors interact), so a share
orders them, it does not split the error between them. When none
stands out, the verdict says the error is diffuse: a global change (per-channel weights,
16-bit activations, calibration; those the model already has left out) is the question, not a
layer. Every other row's ``cause``
says where its error comes from when it is inherited.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from accdbg.algorithms.evidence import BLOWN_RATIO, OUTLIER_RATIO, Evidence, nsr_db
from accdbg.algorithms.fragments import KERNELS, context_walk
from accdbg.algorithms.reach import LOUD, Reach
from accdbg.algorithms.sensitivity import ADDS_UP, Share

Z_MIN = 3.5
GAP_DB = 10.0
# a small model's spread is a weak estimate: 15 dB below the floor (30 times the median layer's
# noise power) always stands out
MAX_GAP_DB = 15.0
ABS_DB = 20.0  # the SQNR verifier's pass mark: the layer's own encodings alone fail it
CLIP_MIN = 0.01  # a layer clipping one value in a hundred goes to the sensitivity step...
CLIP_RATIO = 10.0  # ...when that is ten times what the model's median layer clips
DESTROYED_DB = 6.0  # below this the median channel keeps a quarter of noise: information is gone
SHARE = 0.5  # a culprit alone causes at least this share of the whole model's output error...
MOST = 0.8  # ...and when none was measured to cause this much, the rest is the model's own
# the model's only standout (every other layer at the floor) is a culprit from this share: the
# rest of the error is spread over layers each costing a small part of it
LONE_SHARE = 0.25
MIN_SHARE = 0.05  # ...or destroys its information and still reaches the outputs measurably
# a layer costing much alone whose quantizers, taken out of the whole QDQ model, remove nothing:
# the other layers' error hides its own, so fixing it alone does not show at the outputs - it
# is not named (its fix is not the answer; the findings say what they remove together) unless
# its encoding destroys its information (under DESTROYED_DB), which must go whatever masks it
MASKED = (
    "taken out of the quantized model it removes nothing measurable: the other layers' "
    "errors mask its own, so a fix of this layer alone will not show at the outputs"
)
# a layer that loses only its weights' rounding (its output keeps its range): taking its
# quantizers out of the whole QDQ model is what its fix removes, and under a quarter of the
# error that fix does not carry the model - what it costs alone is the other layers' errors
# interacting with its own (alone it may cost more than all of them together): it is one of
# the layers a model-wide change treats. Weights that destroy their information are named
# from MIN_SHARE taken out (their fix shows), not below it
OWN_MASKED = (
    "taken out of the quantized model it removes too little of the error, and its "
    "weights' rounding is all it loses (its output keeps its range), so that is what its fix "
    "removes: the other layers' errors mask its own, a fix of this layer alone will not carry "
    "the outputs"
)
SHOWN = 5  # layers a finding lists by name (the others: their cause says it)
FEW = "outlier weights"  # a culprit's kind when a few of its weights are the cause
ONE_BY_ONE = 8  # layers with outlier weights asked one by one, at most (the farthest first)
BACKEND_DB = 10.0
# ops whose slope grows without bound near part of their input range: there a rounding step of
# their input becomes many steps of their output (a Log near 0, a reciprocal of a variance)
AMPLIFYING = ("Log", "Reciprocal", "Div", "Sqrt", "Pow", "Exp")
READ_TWICE = ("Div", "Pow")  # ...only when both their inputs are activations
MAX_CULPRITS = 5
AFTER_NAMED = f"after the {MAX_CULPRITS} named: not ranked (fix those first, then debug again)"
CAUSE_DB = 6.0
OUTLIER_HOPS = 3  # how far back an activation outlier is looked for before it counts as new
# layers where QNN and the CPU fake-quant differ at all, needed for their floor (many layers
# of the models measured are bit-exact, and a floor of three rounding steps says nothing)
MIN_DIVERGING = 8
# a layer whose differing integers part from the fake-quant's by this many steps (median) or
# more computes something else; under it, the backend's requantization rounds differently
DIFFERENT_STEPS = 2.0
NOTICED = 0.05  # what the kernels add to the outputs' error below this is not stated as a share

RANK = "culprit_rank"
CAUSE = "cause"
LOCAL = "local SQNR"
SHARE_COL = "output error share"
REMOVED_COL = "output error removed"
COLUMNS = (
    RANK,
    CAUSE,
    LOCAL,
    "weight SQNR",
    "output quant SQNR",
    "clipped %",
    SHARE_COL,
    REMOVED_COL,
)


class Impact(Protocol):
    """This layer's (or this group's) part of the outputs' error: with only its encodings
    applied, and removed when only its quantizers are taken out (NaN when not measured)."""

    def __call__(self, names: str | Sequence[str], enough: float = ...) -> Share:
        """``enough``: a first measure at or above it settles the verdict (the second, which
        costs a run of the QDQ model, may be skipped)."""


def _consider(impact: Impact | None, names: Sequence[str], singles: Sequence[str]) -> None:
    """Tell an impact measure which layers it will be asked about (``singles``: those asked
    alone), when it can use that (the sensitivity builds its models once for all of them)."""
    consider = getattr(impact, "consider", None)
    if consider is not None:
        consider(names, singles)


def cpu_run(quantized: bool, layer: bool = False) -> str:
    """What QNN is compared with: the CPU fake-quant of the model QNN runs, or, for a float
    model QNN runs in fp16, the CPU's float run of it (of one ``layer``, or of the model)."""
    run = "CPU fake-quant" if quantized else "CPU run"
    of = "this layer" if layer else "the same QDQ model" if quantized else "the same float model"
    return f"onnxruntime's {run} of {of}"


@dataclass(frozen=True)
class KernelsAdded:
    """What QNN's kernels add to the outputs' error: at the judged output where they add the
    most, its error on QNN and in onnxruntime's CPU fake-quant of the same QDQ model (each
    noise-to-signal against float). Not the two runs' difference: two runs that round
    differently part by as much as either is from float, with neither worse."""

    output: str
    qnn: float
    cpu: float
    quantized: bool = True  # else an fp16 run on QNN: the CPU ran the float model

    @property
    def share(self) -> float:
        """The part of the output's QNN error the CPU fake-quant does not have (0 when QNN is
        no worse)."""
        return max(0.0, 1.0 - self.cpu / self.qnn) if self.qnn > 0 else 0.0

    def line(self) -> str:
        where = (
            f"{self.output} at {nsr_db(self.qnn):.1f} dB SQNR on QNN, {nsr_db(self.cpu):.1f} dB "
            f"in {cpu_run(self.quantized)}"
        )
        if self.share < NOTICED:
            return f"QNN's kernels add nothing measurable to the outputs' error: {where}"
        return f"QNN's kernels add {_pct(self.share)} to the outputs' error: {where}"

    @classmethod
    def worst(
        cls, errors: Mapping[str, tuple[float, float]], quantized: bool = True
    ) -> KernelsAdded | None:
        """From (QNN's error, the CPU's error) per judged output."""
        found = [
            cls(n, q, c, quantized) for n, (q, c) in errors.items() if q > 0 and math.isfinite(q)
        ]
        return max(found, key=lambda k: (k.share, k.qnn), default=None)


@dataclass
class ContextCheck:
    """A layer whose error jumps in context, run again (layerwise)."""

    cpu: float  # the CPU fake-quant's error in the same cut (noise-to-signal)
    share: float = math.nan  # what the backend's difference there costs the outputs
    # the layer's and its inputs' errors in the whole model on the backend (noise-to-signal)
    whole: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Culprit:
    rank: int
    name: str
    op_type: str
    cause: str
    local_db: float
    kind: str = ""  # what its own encodings lose most (a PATTERN_FIX key), or "backend"
    shows_at: tuple[str, ...] = ()  # where its error appears when not at it (an amplifying op)


@dataclass
class Ranking:
    """The verdict of one run: culprits (maybe none), the noise floor, the lines to print."""

    culprits: list[Culprit]
    floor_db: float
    spread_db: float
    findings: list[str]
    columns: dict[str, dict[str, object]] = field(default_factory=dict)  # name -> column values

    def apply(self, df: pd.DataFrame, name_col: str) -> pd.DataFrame:
        """The table with the ranking columns appended (the reference's columns keep their
        places; the HTML report shows these first)."""
        out = df.drop(columns=[c for c in COLUMNS if c in df.columns])
        names = list(out[name_col])
        for col in COLUMNS:
            vals = [self.columns.get(n, {}).get(col) for n in names]
            if col == RANK:
                out[col] = pd.array([None if v is None else int(v) for v in vals], dtype="Int64")
            elif col == CAUSE:
                out[col] = [v or "" for v in vals]
            else:
                out[col] = [math.nan if v is None else v for v in vals]
        return out


def robust_floor(values_db: Sequence[float]) -> tuple[float, float]:
    """Median and robust spread (1.4826 x MAD) of finite values, in dB."""
    v = np.asarray([x for x in values_db if math.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    med = float(np.median(v))
    return med, float(1.4826 * np.median(np.abs(v - med)))


def _clip_bar(clipped: Sequence[float]) -> float:
    """The share of clipped values at which a layer's clipping stands out: ``CLIP_MIN``, or
    ``CLIP_RATIO`` times the model's median layer when the calibration clips everywhere."""
    v = [x for x in clipped if math.isfinite(x)]
    return max(CLIP_MIN, CLIP_RATIO * float(np.median(v))) if v else math.inf


def standout_gap(spread: float) -> float:
    """How far from the floor a layer must be: 3.5 robust sigmas, at least 10 dB, at most 15."""
    return min(max(Z_MIN * spread, GAP_DB), MAX_GAP_DB)


def compared_inputs(
    inputs_of: Mapping[str, Sequence[str]], compared: set[str]
) -> dict[str, list[str]]:
    """Each layer's nearest compared ancestors: an input that was not compared passes on its own
    inputs, so its error is never taken for the consumer's own."""
    out: dict[str, list[str]] = {}
    for name, inputs in inputs_of.items():
        found: list[str] = []
        seen: set[str] = {name}
        stack = list(inputs)[::-1]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in compared:
                found.append(x)
            else:
                stack.extend(list(inputs_of.get(x, ()))[::-1])
        out[name] = found
    return out


WEIGHT, CONCAT, ACTIVATION, CLIPPING = (
    "weight range",
    "unbalanced concatenation",
    "activation range",
    "clipping",
)


def _parts(ev: Evidence) -> list[tuple[float, str, str]]:
    """(noise-to-signal, kind, text) of each encoding the layer owns, worst first."""
    parts = []
    for nsr, kind in (
        (ev.weight_nsr, WEIGHT),
        (ev.concat_nsr, CONCAT),
        (ev.output_nsr, ACTIVATION),
    ):
        if math.isnan(nsr) or nsr <= 0:
            continue
        db = nsr_db(nsr)
        if kind == WEIGHT:
            what = f"{ev.weight_note} (median channel {db:.1f} dB)"
        elif kind == CONCAT:
            what = f"{ev.concat_note} ({db:.1f} dB)"
        elif _clips(ev):
            kind, what = (
                CLIPPING,
                f"{100 * ev.clipped:.3g}% of values outside the encoding ({db:.1f} dB)",
            )
        else:
            what = f"{ev.output_note} (median channel {db:.1f} dB)"
        parts.append((nsr, kind, f"{kind}: {what}"))
    return sorted(parts, key=lambda p: -p[0])


def _clips(ev: Evidence) -> bool:
    """Clipping makes at least half of the output encoding's error."""
    return not math.isnan(ev.clip_nsr) and ev.clip_nsr >= 0.5 * ev.output_nsr_tensor


def _named_parts(ev: Evidence) -> list[tuple[float, str, str]]:
    """The parts of :func:`_parts` within ``CAUSE_DB`` of the worst: those its cause names (a
    scaled channel blows both its weights' and its output's range)."""
    parts = _parts(ev)
    worst = nsr_db(parts[0][0]) if parts else math.nan
    return [p for p in parts if nsr_db(p[0]) < worst + CAUSE_DB]


def _cause(ev: Evidence) -> str:
    """What the layer's own encodings do, worst first (:func:`_named_parts`)."""
    return "; ".join(t for _, _, t in _named_parts(ev))


def _own_rounding(ev: Evidence) -> bool:
    """The layer loses only its weights' rounding: its weights' part is the only one its cause
    names (:func:`_named_parts`: its output keeps its range) and it clips nothing,
    and what blows its weights' range is their own (a wide output channel, a few outlier
    weights) - not an input channel its producer shrank (a pair, measured with it) nor an
    input offset they multiply (its maker's). Its error then travels through no range of
    another layer: taken out of the whole QDQ model, its quantizers take its fix's part of the
    error. (A few weights far beyond the rest are also asked what the float model would be
    without them, when not named here.)"""
    return (
        [kind for _, kind, _ in _named_parts(ev)] == [WEIGHT]
        and not _clips(ev)
        and ev.weight_outlier in ("", "output channel", "weight")
        and not ev.offset_from
    )


def _kind(ev: Evidence) -> str:
    parts = _parts(ev)
    return parts[0][1] if parts else ""


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
) -> Ranking:
    """Rank the layers named in ``order`` (execution order).

    ``impact(name)`` is the output error with only that layer quantized over the error of the
    whole quantized model (:mod:`accdbg.algorithms.sensitivity`): a standout is a culprit when
    it alone accounts for at least ``SHARE`` of it. When it also has ``clamped(levels)`` (layer
    -> the level its few outlier weights are brought to; the share of the error that goes,
    :meth:`~accdbg.algorithms.sensitivity.Sensitivity.clamped_share`), the layers with such
    weights are asked it (:func:`_outlier_weights`).
    ``observed_nsr`` is the target's error at each compared layer (per channel when known):
    from a full run (oneshot: inputs carry upstream error; used to say what is inherited) or,
    with ``local_observed``, from golden inputs (layerwise: also used to find backend errors).
    ``outputs`` are the model outputs' verdicts ``(name, verifier label, value, passed)``.
    ``divergence`` is, per layer, the QNN result against the CPU fake-quant of that layer fed
    QNN's own inputs (noise-to-signal; :func:`~accdbg.algorithms.divergence.local_divergence`),
    and ``kernels_added`` what QNN's kernels add to the outputs' error (stated in the findings);
    ``quantized`` False for a float model QNN ran in fp16 (the CPU ran it in float).
    ``kernel_share(names)`` is, for layers whose divergence stands out, what that layer's
    kernel difference alone costs the outputs over their error on QNN: at ``SHARE`` or more it
    is a backend culprit of a full run, else a note in its ``cause``. It is asked only when the
    kernels add ``SHARE`` or more: when QNN is less than twice as far from float as the CPU
    fake-quant, no one kernel's rounding is measured (a CPU run each) - but a layer QNN
    computes differently (values ``DIFFERENT_STEPS`` or more apart) is, whatever they add. Its ``search(names, bar)``, when
    it has one, is asked when the kernels add ``SHARE`` and nothing else is named: the layers
    among ``names`` whose difference alone costs ``bar`` of the outputs' error.
    ``reach(names)`` says, of the standouts whose output carries a loud channel, which layers
    that channel blows (:class:`~accdbg.algorithms.reach.OutlierReach`): those layers are its
    carriers, and it is measured with them when alone it does not matter.
    ``run_nsr``: a full run's error per layer over the whole tensor (not per channel: a few
    wrong channels show there). A layer whose error there jumps far beyond what its inputs
    bring and its own encodings explain either amplifies its input's rounding (a Log, a
    reciprocal: its input's encoding, measured, costs the outputs ``SHARE``; that input is
    named, :func:`_amplifying`) or computes something else: with ``backend_jumps`` and no
    ``divergence`` (cumulative-layerwise has no CPU comparison) it is then named as the
    backend's (``RUN_JUMP``) - unless ``run_cpu(names)`` (each layer's whole-tensor error in
    onnxruntime's CPU fake-quant of the whole model) shows the same jump there (``RUN_GAIN``).
    ``alone_cpu(names)`` (layerwise): each layer's error in onnxruntime's CPU fake-quant of it
    alone on the golden inputs the backend was fed, measured as ``observed_nsr``: a layer
    whose error jumps beyond what its encodings and its inputs' explain is the backend's only
    when QNN is ``BACKEND_DB`` worse than that (``ALONE_CPU_JUMP``); when the CPU computes as
    much error, the layer multiplies its inputs' rounding (``CPU_TOO``, in its cause). Its
    ``kernel_share(names)``, when it has one: what each such layer's difference from the CPU
    costs the outputs (added to the CPU fake-quant of the whole model, over the outputs'
    error there); under ``SHARE`` the layer is a note in its cause, not named. Its
    ``in_context(names)``, when it has one, asks the same of a layer whose error jumps only
    run after its producers (``CONTEXT_JUMP``): that cut run again on the backend and in the
    CPU fake-quant, and the model from its inputs on the backend (:class:`ContextCheck`); a
    jump the CPU makes too is the quantization's (``CONTEXT_CPU_TOO``), one the whole model
    does not make is the cut's (``CONTEXT_CUT``).
    """
    observed = dict(observed_nsr or {})
    local = {n: evidence[n].local_nsr for n in order if n in evidence}
    local_db = {n: nsr_db(v) for n, v in local.items() if not math.isnan(v)}
    floor, spread = robust_floor(list(local_db.values()))
    cut = floor - standout_gap(spread) if math.isfinite(floor) else -math.inf
    clip_bar = _clip_bar([evidence[n].clipped for n in order if n in evidence])
    columns: dict[str, dict[str, object]] = {}
    candidates: list[tuple[float, str, str]] = []  # (severity, name, cause)
    costs: dict[str, float] = {}  # a candidate -> the most it was measured to cost the outputs
    standouts: list[str] = []
    carried: dict[str, list[str]] = {}  # a standout -> the later standouts carrying its outlier
    root_of: dict[str, str] = {}
    clipping: set[str] = set()  # standouts whose encoding clips
    severity: dict[str, float] = {}  # an offset's maker -> the NSR its offset causes downstream
    grouped: dict[str, tuple[list[str], Share, float]] = {}  # named only with its partners
    masked: dict[str, Share] = {}  # costing much alone, removing nothing taken out: not named

    def stands(n: str) -> tuple[bool, bool]:
        """(its local SQNR stands out, its encoding clips)"""
        db = local_db.get(n, math.nan)
        weak = math.isfinite(db) and db < cut and db < ABS_DB
        return weak, math.isfinite(db) and evidence[n].clipped >= clip_bar

    # the layers each standout's outlier channel blows (measured once for all of them)
    reaches = reach([n for n in order if n in evidence and any(stands(n))]) if reach else None
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
        if not weak and math.isnan(ev.weight_nsr):
            # a layer without weights (a resize, a pooling) keeps its input's range: its input
            # clipped already
            src = next((x for x in ev.inputs if x in clipping), None)
            if src is not None:
                standouts.append(n)
                columns[n][CAUSE] = f"clipping carried in from {src} (the same range)"
                root_of[n] = root_of.get(src, src)
                continue
        if clips:
            clipping.add(n)
        src = _outlier_source(n, evidence, standouts, reaches)
        if src is not None and src not in standouts:
            if src in local_db:  # an offset's maker, named for what its offset does here
                standouts.append(src)
                severity[src] = local[n]
            else:
                src = None
        standouts.append(n)
        if src is not None:  # the outlier came in with the input: its source is the culprit
            columns[n][CAUSE] = _carried_cause(n, src, ev, reaches, evidence[src])
            root_of[n] = root_of.get(src, src)
            carried.setdefault(root_of[n], []).append(n)
    # the layers a standout is measured with when alone it does not matter: those its outlier
    # blows (measured, else the later standouts carrying it) - but not a standout with a
    # problem of its own, whose cost is its own - or a compensated pair's producer
    roots = [n for n in standouts if n not in root_of]
    partners = {n: _Partners.of(n, evidence, carried, reaches, exclude=set(roots)) for n in roots}
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
            if db >= DESTROYED_DB:
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev)}); its effect on the outputs was not measured"
                )
                continue
            candidates.append((local[n], n, _cause(ev)))
            continue
        share, group_share, matters = verdict
        columns[n][SHARE_COL] = _nan_none(share.alone)
        columns[n][REMOVED_COL] = _nan_none(share.removed)
        if not matters:
            with_them = (
                f" (with {partners[n].short()} {_pct(group_share.best)})" if group_share else ""
            )
            columns[n][CAUSE] = (
                f"stands out locally ({_cause(ev)}) but costs the outputs only "
                f"{_pct(share.best)} of the whole model's error ({_both(share)}){with_them}"
            )
            continue
        cause = _cause(ev)
        if group_share is not None:
            cause += (
                f"; {partners[n].long()}: with them it costs the outputs "
                f"{_pct(group_share.best)} of the whole model's error ({_both(share)})"
            )
        elif share.removed > 2 * share.alone and share.removed >= SHARE:
            cause += (
                f"; with every other encoding applied it causes {_pct(share.removed)} of the "
                f"outputs' error (alone {_pct(share.alone)}): it hurts together with its "
                "neighbours' encodings"
            )
        else:
            if math.isnan(share.removed) and impact is not None:  # named alone: would its fix show?
                share = impact(n)
                columns[n][REMOVED_COL] = _nan_none(share.removed)
            own = _own_rounding(ev)  # destroyed, its fix must still show measurably
            bar = LONE_SHARE if own and db >= DESTROYED_DB else MIN_SHARE
            if share.removed < bar and (own or db >= DESTROYED_DB):
                masked[n] = share
                columns[n][CAUSE] = (
                    f"stands out locally ({_cause(ev)}) and costs the outputs "
                    f"{_pct(share.alone)} of the whole model's error alone, but "
                    f"{OWN_MASKED if own else MASKED} ({_both(share)})"
                )
                continue
            cause += f"; it costs the outputs {_pct(share.best)} of the whole model's error ({_both(share)})"
            if share.removed < MIN_SHARE:  # destroyed: to be fixed whatever masks it
                cause += f"; {MASKED} until theirs are fixed too"
        costs[n] = share.best if group_share is None else max(share.best, group_share.best)
        if group_share is not None and share.best < SHARE:  # it matters only with them
            grouped[n] = (partners[n].names, share, group_share.best)
        if costs[n] < SHARE and db >= DESTROYED_DB:  # named by the lone standout's bar
            cause += "; the model's only standout: every other layer sits at its noise floor"
        candidates.append((max(local[n], severity.get(n, 0.0)), n, cause))
    few, few_together = _outlier_weights(
        evidence, order, impact, {c[1] for c in candidates}, columns
    )
    for n, (share, cause) in few.items():
        costs[n] = share
        candidates.append((local.get(n, 0.0), n, cause))
    backend: list[tuple[float, str, str]] = []
    inherited: Mapping[str, str] = {}
    # a range an upstream outlier blows LOUD times or more: that outlier is its cause
    blown = {x for r in (reaches or {}).values() for x, v in r.layers.items() if v >= LOUD}
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
        composed = {n: j for n, j in jumps.items() if n not in on_cpu}  # not run on the CPU
        backend = _as_backend(composed, taken, ALONE_JUMP)
        # what each measured difference costs the outputs: named from SHARE, as in a full run
        measured = _as_backend(kernel, taken, ALONE_CPU_JUMP)
        ask = getattr(alone_cpu, "kernel_share", None)
        cost = ask([b[1] for b in measured]) if ask is not None and measured else {}
        for nsr, n, cause in measured:
            if n in cost:
                cause += f"; {ALONE_COST.format(share=_pct(cost[n]))}"
            if cost.get(n, SHARE) >= SHARE:
                backend.append((nsr, n, cause))
                if n in cost:
                    costs[n] = cost[n]
            else:
                _add_cause(columns, n, cause)
        for n in jumps.keys() & on_cpu.keys() - taken:
            got, expected, _ = jumps[n]
            cpu = nsr_db(on_cpu[n])
            _add_cause(
                columns, n, CPU_TOO.format(got=nsr_db(got), explained=nsr_db(expected), cpu=cpu)
            )
        # in context a layer reads its producer's error and range as computed: one reading a
        # culprit's output, or a range an outlier blows, jumps by that layer's doing; one
        # reading another standout's stands only when the CPU fake-quant of the same cut,
        # which reads that range alike, was run and does not jump
        ctx_jumps = _in_context(
            evidence, context_nsr or {}, observed, {c[1] for c in candidates} | blown
        )
        ctx_backend = _as_backend(ctx_jumps, taken | set(jumps) | set(kernel), CONTEXT_JUMP)
        ask = getattr(alone_cpu, "in_context", None)
        ran = ask([b[1] for b in ctx_backend]) if ask is not None and ctx_backend else {}
        beside = {n for n in ctx_jumps if _before_in_context(n, evidence) & set(standouts)}
        ctx_backend = [b for b in ctx_backend if b[1] in ran or b[1] not in beside]
        backend += _checked_in_context(ctx_backend, ctx_jumps, ran, evidence, columns, costs)
        candidates += backend
    else:
        inherited = _inherited(order, evidence, observed, local, columns)
        if divergence is None and run_nsr and backend_jumps:
            # a jump the CPU fake-quant of the whole model makes too is the layer's, not a kernel's
            gained = _gained(jumps, evidence, run_cpu)
            backend = _as_backend({n: jumps[n] for n in jumps.keys() - gained}, taken, RUN_JUMP)
            for n in gained.keys() - taken:
                _add_cause(columns, n, gained[n])
            candidates += backend
    named = {c[1] for c in candidates}
    standing = _diverging(divergence or {}, quantized)
    shares: Mapping[str, float] = {}
    added = kernels_added.share if kernels_added is not None else math.nan
    steps: Mapping[str, float] = getattr(divergence, "steps", {})
    if standing and kernel_share is not None and not local_observed:
        # not when the kernels together carry less: a rounding difference then is no one's;
        # a layer computing something else (steps apart) is measured whatever they carry
        asked = [n for n in standing if added >= SHARE or steps.get(n, 1.0) >= DIFFERENT_STEPS]
        shares = kernel_share(asked) if asked else {}

    def name_backend(n: str, cause: str, share: float) -> None:
        # fed QNN's own inputs it parts from the fake-quant: its error is not its inputs'
        col = columns.setdefault(n, {})
        why = f"; {col[CAUSE]}" if col.get(CAUSE) and n not in inherited else ""
        backend.append((divergence[n], n, f"{cause}{why}"))
        candidates.append(backend[-1])
        costs[n] = share

    scattered = _not_adding_up(
        [n for n in standing if shares.get(n, 0.0) >= SHARE and n not in named and n in evidence],
        shares,
        getattr(kernel_share, "together", None),
    )
    interacting: list[str] = []  # backend culprits whose differences do not add up
    for n, cause in standing.items():
        share = shares.get(n, math.nan)
        if not math.isnan(share):
            cause += f"; {_kernel_cost(share, quantized)}"
        # a rounding (one step) that does not add up is no one layer's; a different
        # computation is the kernel's whatever the others do (its cause says they interact)
        rounding = n in scattered and steps.get(n, 1.0) < DIFFERENT_STEPS
        if share >= SHARE and n not in named and n in evidence and not rounding:
            if n in scattered:
                interacting.append(n)
                cause += scattered[n] + INTERACTING
            name_backend(n, cause, share)
        else:
            _add_cause(columns, n, cause + (scattered[n] + NO_ONE_CAUSE if n in scattered else ""))
    search = getattr(kernel_share, "search", None)
    if search is not None and not candidates and not local_observed and added >= SHARE:
        # the kernels carry most of the error and no layer stands out, for its encodings or
        # its difference: a small difference that does not average out (a rounding bias
        # before a pooling) may
        found = search(
            sorted(
                (n for n, d in (divergence or {}).items() if d > 0), key=lambda n: -divergence[n]
            ),
            SHARE,
        )
        how: Mapping[str, str] = getattr(divergence, "how", {})
        for n, share in found.items():
            if n not in named and n in evidence:
                cause = _parted(
                    nsr_db(divergence[n]),
                    how.get(n),
                    quantized,
                    ", no further than at other layers",
                )
                found_by = "(found by halving the layers where QNN differs)"
                name_backend(n, f"{cause}; yet {_kernel_cost(share, quantized)} {found_by}", share)
    candidates.sort(key=lambda c: (-costs.get(c[1], -1.0), -c[0]))
    candidates = _in_order(candidates, interacting, order)
    # an upstream culprit that causes most of the error itself goes before those it blows
    leading = {m: r for m, r in (reaches or {}).items() if costs.get(m, 0.0) >= SHARE}
    candidates = _upstream_first(candidates, leading)
    by_backend = {b[1] for b in backend}
    culprits = []
    for r, (_, n, cause) in enumerate(candidates[:MAX_CULPRITS], start=1):
        columns.setdefault(n, {})[RANK] = r
        columns[n][CAUSE] = cause
        kind = (
            "backend"
            if n in by_backend
            else FEW
            if n in few
            else ACTIVATION
            if n in explained_by
            else _kind(evidence[n])
        )
        shows = tuple(j for j, x in explained.items() if x == n)
        culprits.append(
            Culprit(r, n, evidence[n].op_type, cause, local_db.get(n, math.nan), kind, shows)
        )
    beyond = []  # culprits too, past the named: their cause says so
    for _, n, cause in candidates[MAX_CULPRITS:]:
        columns.setdefault(n, {})[CAUSE] = f"{cause}; {AFTER_NAMED}"
        beyond.append(n)
    # several layers masking each other: what taking them out together removes (one more run)
    together = impact(list(masked)) if len(masked) > 1 and impact is not None else None
    unnamed = [  # standouts measured and not named: what the most of them costs the outputs
        (max(v for v in (c.get(SHARE_COL), c.get(REMOVED_COL)) if v is not None), n)
        for n, c in columns.items()
        if RANK not in c
        and n not in masked
        and (c.get(SHARE_COL) is not None or c.get(REMOVED_COL) is not None)
    ]
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
    )
    if divergence and kernels_added is not None:
        line = kernels_added.line()
        if kernels_added.share < NOTICED and by_backend & {c.name for c in culprits}:
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
    return Ranking(culprits, floor, spread, findings, columns)


def _masked_line(
    masked: Mapping[str, Share], together: Share | None, evidence: Mapping[str, Evidence]
) -> str:
    """What the layers that cost much alone and remove nothing taken out are: one problem of
    the model (their errors mask each other's, or the rest of the model's masks theirs), with
    what taking them out ``together`` removes (measured when several)."""
    if len(masked) == 1:
        ((n, share),) = masked.items()
        return (
            f"{n} costs the outputs {_pct(share.alone)} of their error alone, but taken out of "
            f"the quantized model it removes only {_pct(share.removed)}: the rest of the "
            "model's error masks its own, so it is not named - its fix alone will not show"
        )
    shown = list(masked.items())[:SHOWN]
    each = ", ".join(f"{n} {_pct(s.alone)}" for n, s in shown)
    if len(masked) > SHOWN:
        each += f" and {len(masked) - SHOWN} more: see their cause"
    line = (
        f"{len(masked)} layers each cost the outputs much of their error alone ({each}), but "
        f"taken out one at a time none removes more than "
        f"{_pct(max(s.removed for s in masked.values()))}: their errors mask each other's, so "
        "none is named - a fix of one alone will not show"
    )
    if together is not None and not math.isnan(together.removed):
        line += f"; taken out together they remove {_pct(together.removed)}"
    kinds = {_kind(evidence[n]) for n in masked}
    fix = PATTERN_FIX.get(kinds.pop()) if len(kinds) == 1 else None
    return line + (f" ({fix}, or a global change, is the question)" if fix else "")


def _outlier_weights(
    evidence: Mapping[str, Evidence],
    order: Sequence[str],
    impact: Impact | None,
    named: Collection[str],
    columns: dict[str, dict[str, object]],
) -> tuple[dict[str, tuple[float, str]], str]:
    """Layers whose outlier weights were measured to cost the outputs ``SHARE`` of their error
    or more: name -> (share, cause); and a finding ("" if none). Two questions of the float
    model, each asked of the layers that have such weights whether they stand out or not:

    * a few weights ``BLOWN_RATIO`` times the tensor's 99th percentile or more (4 of the 8
      bits), brought to the rest's range in the float and the QDQ model (error powers);
    * one output channel ``OUTLIER_RATIO`` times every other channel or more, brought to the
      next widest channel's range, the QDQ model's encodings refitted (noise-to-signal).

    Such weights need not stand out locally, nor cost much alone: they multiply the error
    their inputs bring from every encoding upstream. Each question is asked of its layers
    together first (one run of each model), one by one only when together they matter
    (``ONE_BY_ONE`` at most, the farthest outliers first) - and when then none does alone, a
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
        and evidence[n].few_ratio >= BLOWN_RATIO
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
        if together >= SHARE and not shares:
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
        and evidence[n].lone_ratio >= OUTLIER_RATIO
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
                "inputs bring from the encodings upstream louder than any other and blows the "
                "ranges after it, which per-channel weights do not remove: retrain or regularize "
                "that channel, or keep its input path in 16 bits" + _was(columns, n),
            )
        if together >= SHARE and not shares and not finding:
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
    """(layer -> share, for those costing ``SHARE`` alone; their share together) of a
    question asked of ``levels``' layers together, then one by one when together they cost
    ``SHARE`` (``ONE_BY_ONE`` at most, the largest ``ratio`` first): a question is two CPU
    sessions of the model."""
    together = ask(levels)
    if not together >= SHARE:
        return {}, together
    shares = {}
    for n in sorted(levels, key=lambda n: -ratio(n))[:ONE_BY_ONE]:
        share = ask({n: levels[n]})  # the question already asked when it is the only one
        if share >= SHARE:
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


def _pct(x: float) -> str:
    return "?%" if math.isnan(x) else f"{100 * x:.0f}%"


def _both(share: Share) -> str:
    """Both measures, or the one taken (the second is skipped when the first is enough)."""
    parts = [("alone", share.alone), ("taken out of the quantized model", share.removed)]
    return ", ".join(f"{k} {_pct(v)}" for k, v in parts if not math.isnan(v))


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else x


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
    them orders it among the culprits. The model's ``lone`` standout needs ``LONE_SHARE``: the
    rest of the error is spread over layers at the floor, none of which comes near it."""
    bar = MIN_SHARE if db < DESTROYED_DB else LONE_SHARE if lone else SHARE
    share = impact(n, bar) if impact is not None else Share(math.nan)
    if math.isnan(share.best):
        return None
    if not later or share.best >= SHARE:
        return share, None, share.best >= bar
    group = impact([n, *later], bar)
    if math.isnan(group.best):
        return share, None, share.best >= bar
    return share, group, max(share.best, group.best) >= bar


@dataclass
class _Partners:
    """The layers a standout hurts the outputs together with, and why."""

    carriers: list[str]  # its outlier channel blows their range, or they pass it on
    reach: Reach | None  # how far its outlier was measured to reach
    scaling: list[str]  # their weights scale its loud channel back
    pair: list[str]  # producers shrinking the channel its weights amplify
    channel: int = -1

    @classmethod
    def of(
        cls,
        n: str,
        evidence: Mapping[str, Evidence],
        carried: Mapping[str, list[str]],
        reaches: Mapping[str, Reach] | None,
        exclude: set[str],
    ) -> _Partners:
        """``exclude``: standouts with a problem of their own, whose cost is their own."""
        reach = reaches.get(n) if reaches else None
        if reach is None and reaches:  # measured where its outlier first stood out
            reach = next((reaches[x] for x in carried.get(n, []) if x in reaches), None)
        carriers = [*carried.get(n, []), *(reach.layers if reach else ())]
        mine = [x for x in dict.fromkeys(carriers) if x not in exclude]
        scaling = [x for x in _scaling_back(n, evidence) if x not in exclude and x not in mine]
        pair = [] if mine or scaling else _pair_of(evidence[n], evidence)
        return cls(
            mine, reach if reach and reach.layers else None, scaling, pair, evidence[n].loud_channel
        )

    @property
    def names(self) -> list[str]:
        return [*self.carriers, *self.scaling, *self.pair]

    def short(self) -> str:
        parts = []
        if self.carriers:
            parts.append(f"the {len(self.carriers)} layer(s) carrying its outlier")
        if self.scaling:
            parts.append(f"{', '.join(self.scaling)}'s weights scaling it back")
        if self.pair:
            parts.append(f"{', '.join(self.pair)}'s encoding")
        return " and ".join(parts)

    def long(self) -> str:
        parts = []
        if self.carriers:
            later = self.carriers
            shown = ", ".join(later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
            r = self.reach
            parts.append(
                f"the outlier it makes (channel {r.channel}, {r.ratio:.3g}x the median channel) "
                f"blows the ranges of {len(later)} layer(s) after it (up to "
                f"{max(r.layers.values()):.3g}x): {shown}"
                if r
                else f"the outlier it makes reaches {shown}"
            )
        if self.scaling:
            parts.append(
                f"the weights of {', '.join(self.scaling)} scale its channel {self.channel} back "
                f"(they span {LOUD:g}x or more less for it than for their other inputs): their "
                "rounding, coarse for such small weights, multiplies the loud channel"
            )
        if self.pair:
            parts.append(f"{', '.join(self.pair)} shrinks the channel these weights amplify")
        return "; ".join(parts)


def _scaling_back(n: str, evidence: Mapping[str, Evidence]) -> list[str]:
    """The layers reading ``n`` whose weights scale its loud channel back."""
    return [m for m, r in evidence.items() if _scales_back(r, evidence[n])]


def _scales_back(reader: Evidence, maker: Evidence) -> bool:
    """``reader`` reads ``maker`` and its weights for the maker's loud channel span ``LOUD``
    times less than for its other inputs: it scales that channel back (a compensated pair the
    other way round - the producer made the channel loud), and its weights' rounding, coarse
    against such small weights, is multiplied by the loud channel: the two hurt together."""
    return (
        maker.loud_channel >= 0
        and maker.loud_ratio >= LOUD
        and maker.name in reader.inputs
        and reader.quiet_input == maker.loud_channel
        and reader.quiet_ratio >= LOUD
    )


def _pair_of(ev: Evidence, evidence: Mapping[str, Evidence]) -> list[str]:
    """The producers of a layer whose weight range one input channel blows: that channel was
    shrunk upstream and these weights scale it back (a compensated pair), so the producer's
    encoding, which has few levels for it, and these weights hurt together - one quantizer at
    a time neither explains the outputs' loss."""
    if ev.weight_outlier != "input channel":
        return []
    return [x for x in ev.inputs if x in evidence]


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


def _outlier_source(
    n: str,
    evidence: Mapping[str, Evidence],
    standouts: Sequence[str],
    reaches: Mapping[str, Reach] | None = None,
    hops: int = OUTLIER_HOPS,
) -> str | None:
    """The earlier standout an activation-range problem is carried in from, if any.

    A large activation channel travels: every layer after the one that made it (through
    convolutions that mix it, residual adds and activations) sees a blown range too. Only a
    layer whose loss is its output's range (not its weights, not clipping, not a Concat) is
    taken for a carrier - or a layer whose weights' rounding multiplies a large constant its
    input carries (an offset channel the bias cancels in float). With ``reaches`` measured
    (:mod:`accdbg.algorithms.reach`) a carrier's source is the first standout whose outlier
    blows its range; without, the nearest standout within ``hops`` layers it came through. An
    offset's source is the nearest standout it came through, else the input that carries it.
    Weights scaling back a loud channel of a standout they read (:func:`_scaling_back`) come
    from that standout."""
    ev = evidence[n]
    by_weights = ev.owner == "weights" and bool(ev.offset_from)
    if ev.owner == "weights" and not by_weights:
        return next(
            (x for x in ev.inputs if x in standouts and _scales_back(ev, evidence[x])), None
        )
    if not (ev.owner == "output" or by_weights) or _clips(ev):
        return None
    if reaches is not None and not by_weights:
        reached = next((s for s in standouts if s in reaches and n in reaches[s].layers), None)
        return reached or _same_channel(ev, evidence, standouts) or _made_by_weights(ev, evidence)
    frontier, seen = [ev.offset_from] if by_weights else list(ev.inputs), {n}
    for _ in range(hops):
        nxt = []
        for x in frontier:
            if x in seen:
                continue
            seen.add(x)
            if x in standouts:
                return x
            nxt.extend(evidence[x].inputs if x in evidence else ())
        frontier = nxt
    if by_weights:
        return ev.offset_from  # the offset's maker, standing out or not
    return _made_by_weights(ev, evidence)


def _made_by_weights(
    ev: Evidence, evidence: Mapping[str, Evidence], hops: int = OUTLIER_HOPS
) -> str | None:
    """The earlier layer whose own weights make this layer's loud channel, standing out or
    not: its weights for that output channel span ``OUTLIER_RATIO`` times the median output
    channel's or more, and only layers that keep channels in place (an activation, an add, a
    pooling: no weights, as many channels) lie between, at most ``hops``. Where the channel
    first appears its encoding may lose little (on this input the other channels reach as far
    the other way); the layers after it lose their ranges - the weights are the cause."""
    if ev.loud_channel < 0 or not ev.loud_ratio >= LOUD or not math.isnan(ev.weight_nsr):
        return None  # a weighted layer mixes its input channels: its own index means another
    frontier, seen = list(ev.inputs), {ev.name}
    for _ in range(hops):
        nxt = []
        for x in frontier:
            src = evidence.get(x)
            if x in seen or src is None or src.channels not in (0, ev.channels):
                continue
            seen.add(x)
            if not math.isnan(src.weight_nsr):  # a weighted layer: it made the channel or not
                if _makes_loud(src, ev):
                    return x
                continue
            nxt.extend(src.inputs)
        frontier = nxt
    return None


def _makes_loud(weights: Evidence, ev: Evidence) -> bool:
    """``weights``' output channel that spans ``OUTLIER_RATIO`` times the median one's is
    ``ev``'s loud channel (as many channels: the same one, passed on in place)."""
    return (
        weights.channels == ev.channels
        and weights.loud_weights == ev.loud_channel >= 0
        and weights.loud_weights_ratio >= OUTLIER_RATIO
    )


def _upstream_first(
    candidates: list[tuple[float, str, str]], reaches: Mapping[str, Reach]
) -> list[tuple[float, str, str]]:
    """Culprits in their order, but one whose range another culprit's outlier blows after that
    one (``reaches``: of the culprits that cause most of the error): what it costs, it costs
    working on that outlier (its cause says so)."""
    rest, out = list(candidates), []
    everyone = [c[1] for c in candidates]
    while rest:
        named = {c[1] for c in rest}
        free = next(
            (c for c in rest if not any(c[1] in reaches[m].layers for m in named if m in reaches)),
            rest[0],  # a cycle cannot happen (a reach runs downstream); never stuck
        )
        rest.remove(free)
        by = [m for m in everyone if m in reaches and free[1] in reaches[m].layers]
        if by:
            r = reaches[by[0]]
            free = (
                free[0],
                free[1],
                f"{free[2]}; its input carries the outlier channel {r.channel} of {by[0]} "
                f"({r.layers[free[1]]:.3g}x its range without it)",
            )
        out.append(free)
    return out


def _same_channel(
    ev: Evidence, evidence: Mapping[str, Evidence], standouts: Sequence[str]
) -> str | None:
    """The input standout whose loud channel this layer passes on unchanged in place (an add,
    an activation: the same channel index, as loud): a channel the next layers' biases undo
    (an offset) is carried by the residual adds between them, though taking it away at its
    maker does not narrow them - it breaks the biases' compensation."""
    if ev.loud_channel < 0 or not ev.loud_ratio >= LOUD:
        return None
    for x in ev.inputs:
        src = evidence.get(x)
        if (
            x in standouts
            and src is not None
            and src.channels == ev.channels
            and src.loud_channel == ev.loud_channel
            and src.loud_ratio >= LOUD
        ):
            return x
    return None


def _carried_cause(
    n: str, src: str, ev: Evidence, reaches: Mapping[str, Reach] | None, maker: Evidence
) -> str:
    """What a standout whose loss came in with its input says about where from."""
    if ev.owner == "weights" and not ev.offset_from:
        return (
            f"its weights scale back the loud channel {ev.quiet_input} of {src} (they span "
            f"{ev.quiet_ratio:.3g}x less for it than for their median input channel): their "
            f"rounding multiplies it ({_cause(ev)})"
        )
    if ev.owner == "weights":
        return f"its weights' rounding multiplies the offset carried in from {src} ({_cause(ev)})"
    reached = reaches.get(src) if reaches else None
    if reached is not None and n in reached.layers:
        return (
            f"activation range blown by the outlier channel {reached.channel} of {src}: "
            f"{reached.layers[n]:.3g}x what it is without it ({_cause(ev)})"
        )
    if math.isnan(ev.weight_nsr) and _makes_loud(maker, ev):
        return (
            f"activation range blown by channel {ev.loud_channel} ({ev.loud_ratio:.3g}x the median "
            f"channel), which the weights of {src} make loud (their output channel "
            f"{maker.loud_weights} spans {maker.loud_weights_ratio:.3g}x the median one's range; "
            f"{_cause(ev)})"
        )
    return f"activation outlier carried in from {src}"


def _standing_jumps(jumps: Mapping[str, tuple[float, float]]) -> list[str]:
    """Layers whose jump (dB of error beyond what explains it) is at least ``BACKEND_DB`` and
    stands out among the model's jumps, with an error the pass mark would see (``ABS_DB``)."""
    floor, spread = robust_floor([j for j, _ in jumps.values()])
    return [
        n
        for n, (j, nsr) in jumps.items()
        if j >= BACKEND_DB and j >= floor + standout_gap(spread) and nsr_db(nsr) < ABS_DB
    ]


# a layer run alone on the backend (golden inputs) whose error its encodings and its inputs'
# encodings do not explain: the kernel, not the quantization
ALONE_JUMP = (
    "backend: run alone on the backend it keeps {got:.1f} dB where its quantization "
    "explains {explained:.1f} dB ({jump:.1f} dB worse)"
)
# ...and measured: the CPU fake-quant of the same layer alone, fed the same golden inputs
ALONE_CPU_JUMP = (
    "backend: run alone on golden inputs it keeps {got:.1f} dB on the backend where "
    "onnxruntime's CPU fake-quant of the same QDQ layer keeps {explained:.1f} dB ({jump:.1f} "
    "dB worse)"
)
# ...and what that difference costs the outputs (layerwise has no full run on the backend)
ALONE_COST = (
    "that difference alone, added to the CPU fake-quant of the whole model, costs the outputs "
    "{share} of their error there"
)
# a jump the CPU fake-quant reproduces: the layer turns its inputs' rounding into more error
CPU_TOO = (
    "run alone on the backend it keeps {got:.1f} dB where its encodings and its inputs' "
    "explain {explained:.1f} dB, but onnxruntime's CPU fake-quant of the same layer, fed the "
    "same golden inputs, keeps {cpu:.1f} dB: not the kernel - the layer turns its inputs' "
    "rounding into more error than their encodings' own"
)


# a full run's jump that the CPU fake-quant of the whole model makes too
RUN_GAIN = (
    "on the backend its error jumps to {got:.1f} dB where its inputs bring and its encodings "
    "explain {explained:.1f} dB, but in onnxruntime's CPU fake-quant of the whole model it "
    "jumps there too, {gain:.1f} dB beyond what its inputs bring: so far beyond, its inputs' "
    "error here explains {then:.1f} dB - not the kernel"
)


def _gained(
    jumps: Mapping[str, tuple[float, float, list[str]]],
    evidence: Mapping[str, Evidence],
    run_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None,
) -> dict[str, str]:
    """A full run's jumping layers whose jump the CPU fake-quant of the whole model makes too
    (``run_cpu``: whole-tensor errors there): a layer can turn the error brought to it into
    far more - a sigmoid bringing values near 0, a Clip cutting the loud channel that carried
    its input's power - and the factor by which it does so on the CPU, applied to what its
    inputs bring in the run, must still fall ``BACKEND_DB`` short of its error there for the
    kernel to be blamed. Layer -> why it is not."""
    if run_cpu is None or not jumps:
        return {}
    on_cpu = dict(run_cpu(sorted({*jumps, *(x for j in jumps.values() for x in j[2])})))
    brought = _brought(evidence, on_cpu)
    out = {}
    for n, (got, expected, _) in jumps.items():
        if n not in on_cpu or n not in brought or not brought[n][0] > 0:
            continue
        gain = on_cpu[n] / brought[n][0]
        if gain > 1 and not _beyond(got, gain * expected):
            out[n] = RUN_GAIN.format(
                got=nsr_db(got),
                explained=nsr_db(expected),
                gain=10 * math.log10(gain),
                then=nsr_db(gain * expected),
            )
    return out


def _add_cause(columns: dict[str, dict[str, object]], n: str, text: str) -> None:
    """A layer's cause, with ``text`` after what it says already."""
    col = columns.setdefault(n, {})
    col[CAUSE] = f"{col[CAUSE]}; {text}" if col.get(CAUSE) else text


def _beyond(got: float, cpu: float | None) -> bool:
    """The backend's error ``BACKEND_DB`` or more above the CPU fake-quant's (noise-to-signal
    powers; a CPU without error: any backend error is beyond it)."""
    if cpu is None or not math.isfinite(got):
        return False
    return cpu <= 0 < got or (cpu > 0 and 10 * math.log10(got / cpu) >= BACKEND_DB)


# a full run's layer whose error jumps beyond what its nearest compared inputs bring plus its
# own encodings': with no CPU comparison, the nearest sign of a kernel computing something else
RUN_JUMP = (
    "backend: on the backend its error jumps to {got:.1f} dB where its inputs bring and "
    "its encodings explain {explained:.1f} dB ({jump:.1f} dB worse; no CPU comparison in "
    "this run)"
)


# a layer right alone whose error jumps once it runs after its producers: the backend
# computes it differently beside them (a fused or in-place kernel)
CONTEXT_JUMP = (
    "backend: run after its producers as the backend runs them together, it keeps {got:.1f} "
    "dB where its inputs' error there, passed on as it passes it alone, and its quantization "
    "explain {explained:.1f} dB ({jump:.1f} dB worse); run alone it computes what its "
    "encodings explain - a kernel fused with its producer or run in place on its buffer "
    "computes something else"
)


# ...and measured: the CPU fake-quant of the same cut, fed the same golden values
CONTEXT_CPU = (
    "onnxruntime's CPU fake-quant of the same cut, fed the same golden values, keeps {cpu:.1f} "
    "dB there"
)
# ...and the whole model from its inputs on the backend, as deployed
CONTEXT_WHOLE = (
    "in the whole model on the backend it keeps {whole:.1f} dB where its inputs there bring "
    "and its encodings explain {explained:.1f} dB"
)
# a jump in context the whole model on the backend does not make: the cut's
CONTEXT_CUT = (
    "run after its producers it keeps {got:.1f} dB on the backend (onnxruntime's CPU "
    "fake-quant of the same cut {cpu:.1f} dB), but {whole}: the cut's doing - its producers "
    "fed golden values as graph inputs - not the deployed graph's"
)
# a jump in context the CPU fake-quant of the same cut makes too: the quantization's
CONTEXT_CPU_TOO = (
    "run after its producers it keeps {got:.1f} dB on the backend, but onnxruntime's CPU "
    "fake-quant of the same cut, fed the same golden values, keeps {cpu:.1f} dB: not the "
    "kernel - the layer turns its producers' rounding into more error than their encodings' own"
)


def _checked_in_context(
    candidates: Sequence[tuple[float, str, str]],
    jumps: Mapping[str, tuple[float, float, list[str]]],
    ran: Mapping[str, ContextCheck],
    evidence: Mapping[str, Evidence],
    columns: dict[str, dict[str, object]],
    costs: dict[str, float],
) -> list[tuple[float, str, str]]:
    """The backend ``candidates`` whose error jumps in context, as run again (``ran``): one
    the CPU fake-quant of the same cut makes too is the quantization's, one the whole model on
    the backend does not make is the cut's (its producers fed as graph inputs) - each said in
    its cause, not named; one whose difference from the CPU costs the outputs under ``SHARE``
    is a note. The others keep their figures, and their cost orders them (``costs``). A
    candidate not run again stands as measured."""
    out = []
    for nsr, n, cause in candidates:
        check = ran.get(n)
        if check is None:
            out.append((nsr, n, cause))
            continue
        got, cpu = nsr_db(jumps[n][0]), nsr_db(check.cpu)
        if not _beyond(jumps[n][0], check.cpu):
            _add_cause(columns, n, CONTEXT_CPU_TOO.format(got=got, cpu=cpu))
            continue
        deployed = _brought(evidence, check.whole).get(n) if n in check.whole else None
        whole = (
            CONTEXT_WHOLE.format(whole=nsr_db(check.whole[n]), explained=nsr_db(deployed[0]))
            if deployed is not None
            else ""
        )
        if deployed is not None and not _beyond(check.whole[n], deployed[0]):
            _add_cause(columns, n, CONTEXT_CUT.format(got=got, cpu=cpu, whole=whole))
            continue
        cause += f"; {CONTEXT_CPU.format(cpu=cpu)}" + (f"; {whole}" if whole else "")
        if math.isfinite(check.share):
            cause += f"; {ALONE_COST.format(share=_pct(check.share))}"
            if check.share < SHARE:
                _add_cause(columns, n, cause)
                continue
            costs[n] = check.share
        out.append((nsr, n, cause))
    return out


def _in_context(
    evidence: Mapping[str, Evidence],
    context_nsr: Mapping[str, tuple[float, float]],
    observed: Mapping[str, float],
    suspects: Collection[str] = (),
) -> dict[str, tuple[float, float, list[str]]]:
    """Layerwise's layers run in context whose error there stands out (:func:`_jumps`) above
    their own encodings' plus their inputs' error there times the gain measured alone: a
    layer that alone turns its inputs' rounding into more error than it is (an affine map
    bringing values near 0, as a hard sigmoid does) turns their larger error in context into
    as much more. Left out: an ``AMPLIFYING`` op (its gain grows with its input's error) and
    one whose context holds one of the ``suspects`` before it (a standout, a range an outlier
    blows): run there it reads that range as computed, and its jump is that layer's doing. Its
    own encodings, a standout's too, are in what is expected of it."""
    alone = _local_expected(evidence, observed)
    suspects = set(suspects)
    expected = {}
    for n, (_, ins) in context_nsr.items():
        ev = evidence.get(n)
        if ev is None or ev.op_type in AMPLIFYING or _before_in_context(n, evidence) & suspects:
            continue
        gain = 1.0
        if n in alone and alone[n][0] > 0 and math.isfinite(observed.get(n, math.nan)):
            gain = max(1.0, observed[n] / alone[n][0])
        expected[n] = (gain * (_own_nsr(ev) + ins), [])
    return _jumps({n: context_nsr[n][0] for n in expected}, expected)


def _before_in_context(n: str, evidence: Mapping[str, Evidence]) -> set[str]:
    """The layers layerwise runs before a layer in its context (back to the nearest kernels,
    the nearest ``CONTEXT_OPS``) and the tensors golden values enter there through their
    encodings, as rows - not the layer: its own encodings are in what is expected of it."""

    def producers(x: str) -> list[str]:
        return [y for y in evidence[x].inputs if y in evidence]

    inside = context_walk(producers(n), producers, lambda x: evidence[x].op_type in KERNELS)
    return {*evidence[n].inputs, *inside, *(y for x in inside for y in evidence[x].inputs)} - {n}


def _brought(
    evidence: Mapping[str, Evidence], run_nsr: Mapping[str, float]
) -> dict[str, tuple[float, list[str]]]:
    """In a full run, each layer's expected error - what its nearest compared inputs bring (the
    worst) and its own encodings - and those inputs, the worst first."""
    inputs = compared_inputs({n: evidence[n].inputs for n in evidence}, set(run_nsr))
    out: dict[str, tuple[float, list[str]]] = {}
    for n in run_nsr:
        ins = sorted(
            (x for x in inputs.get(n, []) if math.isfinite(run_nsr[x])), key=lambda x: -run_nsr[x]
        )
        if n in evidence and ins:
            out[n] = (_own_nsr(evidence[n]) + run_nsr[ins[0]], ins)
    return out


def _local_expected(
    evidence: Mapping[str, Evidence], observed: Mapping[str, float]
) -> dict[str, tuple[float, list[str]]]:
    """Run alone on golden inputs (layerwise), each layer's expected error - its own encodings
    and its inputs' - and those inputs, the noisiest encoding first."""
    out: dict[str, tuple[float, list[str]]] = {}
    for n in observed:
        ev = evidence.get(n)
        if ev is not None:
            ins = [x for x in ev.inputs if x in evidence]
            parts = [evidence[x].output_nsr for x in ins]
            ranked = sorted(ins, key=lambda x: -np.nan_to_num(evidence[x].output_nsr, nan=-1.0))
            out[n] = (_own_nsr(ev) + sum(v for v in parts if not math.isnan(v)), ranked)
    return out


def _jumps(
    observed: Mapping[str, float], expected: Mapping[str, tuple[float, list[str]]]
) -> dict[str, tuple[float, float, list[str]]]:
    """The layers whose observed error stands out above what is ``expected`` of them
    (:func:`_standing_jumps`): layer -> (its error, the error expected, its inputs)."""
    jumps = {
        n: (10 * math.log10(observed[n] / e), observed[n])
        for n, (e, _) in expected.items()
        if e > 0 and math.isfinite(observed[n]) and observed[n] > 0
    }
    return {n: (observed[n], *expected[n]) for n in _standing_jumps(jumps)}


def _amplifying(
    evidence: Mapping[str, Evidence],
    jumps: Mapping[str, tuple[float, float, list[str]]],
    taken: set[str],
    divergence: Mapping[str, float] | None,
    quantized: bool,
    impact: Impact | None,
) -> tuple[list[tuple[float, str, str]], dict[str, str]]:
    """Inputs whose rounding an ``AMPLIFYING`` op amplifies: a Log of a power spectrum turns
    the few levels an 8-bit encoding leaves its small values into an error of many dB, while the
    input itself (judged by its power) looks fine. A jumping layer QNN computes as the CPU fake-quant does
    (or with no CPU comparison), whose inputs pass the pass mark (``ABS_DB``: an error carried
    in is its maker's), is asked about its inputs' encodings, the worst first: one costing the
    outputs ``SHARE`` of their error alone is the culprit. Returns those
    ``(share, input, cause)`` and, for each jumping layer they explain, its input named."""
    if impact is None:
        return [], {}
    diverging = _diverging(divergence or {}, quantized)
    found: list[tuple[float, str, str]] = []
    explained: dict[str, str] = {}
    for n, (got, expected, ins) in jumps.items():
        ev = evidence[n]
        if ev.op_type not in AMPLIFYING:  # a linear layer's is its weights' doing
            continue
        if ev.op_type in READ_TWICE and len(ev.inputs) < 2:  # a Div by a constant is linear
            continue
        if n in diverging:  # QNN's kernel parts from the fake-quant there: the backend's
            continue
        if nsr_db(expected) < ABS_DB:  # its inputs fail already: an error carried in, not made
            continue
        for x in ins:
            if x in taken or x not in evidence:
                continue
            share = impact(x, SHARE)
            if math.isnan(share.best) or share.best < SHARE:
                continue
            op = ev.op_type
            same = " (computed as onnxruntime's CPU fake-quant does)" if divergence else ""
            cost = (
                f"this encoding alone costs the outputs {_pct(share.best)} of the whole "
                f"model's error ({_both(share)})"
                if math.isfinite(share.best)
                else "this encoding alone (the rest in float) makes the outputs non-finite: "
                "values round to 0"
            )
            found.append(
                (
                    share.best,
                    x,
                    f"{ACTIVATION}: {op} {n} amplifies the rounding of this tensor's encoding - "
                    f"its error jumps there to {nsr_db(got):.1f} dB from {nsr_db(expected):.1f} "
                    f"dB{same}; {cost}: keep this tensor and the {op} in float, or 16-bit if its "
                    "smallest values then get steps of their own",
                )
            )
            taken = taken | {x}
            explained[n] = x
            break
    return found, explained


def _as_backend(
    jumps: Mapping[str, tuple[float, float, list[str]]], taken: set[str], cause: str
) -> list[tuple[float, str, str]]:
    """Backend candidates ``(nsr, name, cause)`` of the standing ``jumps`` not ``taken``;
    ``cause`` is formatted with ``got``, ``explained`` (dB) and ``jump``."""
    return [
        (
            got,
            n,
            cause.format(
                got=nsr_db(got), explained=nsr_db(expected), jump=10 * math.log10(got / expected)
            ),
        )
        for n, (got, expected, _) in jumps.items()
        if n not in taken
    ]


def _own_nsr(ev: Evidence) -> float:
    """What a layer's own encodings (weights, output, a Concat's inputs) cost it."""
    return sum(v for v in (ev.weight_nsr, ev.output_nsr, ev.concat_nsr) if not math.isnan(v))


def _diverging(div: Mapping[str, float], quantized: bool = True) -> dict[str, str]:
    """Layers where QNN parts from the CPU fake-quant fed its own inputs (noise-to-signal
    ``div``) far more than at the model's other layers that differ at all."""
    dbs = {n: nsr_db(d) for n, d in div.items() if d > 0}
    finite = [d for d in dbs.values() if math.isfinite(d)]
    if len(finite) >= MIN_DIVERGING:
        floor, spread = robust_floor(finite)
        cut = floor - standout_gap(spread)
        bar = f"the model's median differing layer: {floor:.1f} dB"
    else:  # too few layers differ for a spread: the widest gap, or the pass mark
        cut = max(ABS_DB, float(np.median(finite)) - MAX_GAP_DB) if finite else ABS_DB
        bar = f"too few layers differ for a floor: under {cut:.1f} dB stands out"
    how: Mapping[str, str] = getattr(div, "how", {})
    return {n: _parted(d, how.get(n), quantized, f" ({bar})") for n, d in dbs.items() if d < cut}


def _not_adding_up(
    over: Sequence[str],
    shares: Mapping[str, float],
    together: Callable[[Sequence[str]], float] | None,
) -> dict[str, str]:
    """Backend standouts whose kernel differences each cost the outputs ``SHARE`` or more
    alone but, added at once, far less than their sum (``ADDS_UP``): outputs this sensitive to
    a small change anywhere make no one layer's difference the cause. Layer -> the figures
    (the caller says what they mean for it: :data:`NO_ONE_CAUSE` or :data:`INTERACTING`);
    empty when they add up (or one layer, or not measured)."""
    if len(over) < 2 or together is None:
        return {}
    whole = together(over)
    parts = sum(shares[n] for n in over)
    if math.isnan(whole) or parts <= ADDS_UP * whole:
        return {}
    why = (
        f", but the differences of the {len(over)} layers that each cost half or more "
        f"({', '.join(over[:4])}{' ...' if len(over) > 4 else ''}), added at once, cost "
        f"{_pct(whole)}"
    )
    return dict.fromkeys(over, why)


NO_ONE_CAUSE = ": one at a time they do not add up, so none of them alone is the cause"
# said of a layer computing differently among them (it is named)
INTERACTING = ": their effects interact (the later ones are fed what the earlier ones made)"


def _in_order(
    candidates: list[tuple[float, str, str]], group: Collection[str], order: Sequence[str]
) -> list[tuple[float, str, str]]:
    """The ``group``'s culprits, in the places they hold, put in execution order: of backend
    differences whose effects interact, the first feeds the others what it made wrong."""
    if len(group) < 2:
        return candidates
    at = {n: i for i, n in enumerate(order)}
    places = [i for i, c in enumerate(candidates) if c[1] in group]
    ordered = sorted((candidates[i] for i in places), key=lambda c: at.get(c[1], len(at)))
    out = list(candidates)
    for i, c in zip(places, ordered, strict=True):
        out[i] = c
    return out


def _parted(db: float, how: str | None, quantized: bool, where: str) -> str:
    """A backend cause's first words: how far QNN parts from the CPU run of the layer fed
    QNN's own inputs (``where``: against what), and how (:func:`~accdbg.algorithms.
    divergence.how_they_part`)."""
    return (
        f"backend: fed the backend's own inputs, {cpu_run(quantized, layer=True)} and QNN part "
        f"at {db:.1f} dB{where}" + (f": {how}" if how else "")
    )


def _kernel_cost(share: float, quantized: bool) -> str:
    """What a layer's kernel difference alone costs the outputs (:class:`~accdbg.algorithms.
    divergence.KernelRuns`)."""
    return (
        f"that difference alone, added to the {'CPU fake-quant' if quantized else 'CPU float run'}"
        f", costs the outputs {_pct(share)} of their error on QNN"
    )


def _findings(
    culprits: Sequence[Culprit],
    floor: float,
    spread: float,
    outputs: Sequence[tuple[str, str, float, bool | None]],
    nearest: tuple[float, str] | None,
    changes: str,
    named_share: float = math.nan,
    bar: str = "half",
    kernels: float = math.nan,
    masked: str = "",
) -> list[str]:
    """``nearest``: the share and name of the standout measured closest to being named;
    ``changes``: the global changes left to try (:func:`_global_changes`); ``named_share``:
    the most a named culprit was measured to cost the outputs (under ``MOST`` the rest of the
    error is the model's own, and the global changes are its question too); ``bar``: the share
    a standout needed; ``kernels``: the part of the outputs' error QNN's kernels add (at
    ``SHARE`` or more, no encoding change is the question); ``masked``: what the layers not
    named because taken out they remove nothing are (:func:`_masked_line`)."""
    lines = []
    verdicts = [o for o in outputs if o[3] is not None]
    if verdicts and all(o[3] for o in verdicts):
        shown = ", ".join(f"{lab} {val:.4g}" for _, lab, val, _ in verdicts[:4])
        lines.append(f"the outputs meet their thresholds ({shown})")
    elif verdicts:
        bad = [o for o in verdicts if not o[3]]
        shown = ", ".join(f"{n} {lab} {val:.4g}" for n, lab, val, _ in bad[:3])
        lines.append(f"outputs failing their threshold: {shown}")
    floor_txt = (
        f"the model's noise floor: median local SQNR {floor:.1f} dB, spread {spread:.1f} dB"
        if math.isfinite(floor)
        else "no quantization evidence (no quantized layer with a golden value)"
    )
    if not culprits and kernels >= SHARE:
        lines.append(
            f"no single layer stands out: QNN's kernels add {_pct(kernels)} of the outputs' error "
            "and no one layer's difference explains it (the layers where QNN parts from its own "
            "inputs say how in their cause) - the backend's computation is the question, not "
            "the encodings"
        )
    elif not culprits:
        near = (
            f" (the {'other ' if masked else ''}layers that stand out locally cost the outputs "
            f"less than {bar} of their "
            f"error - "
            f"the most, {nearest[1]}, {_pct(nearest[0])}: see its cause)"
            if nearest is not None and math.isfinite(nearest[0])
            else ""
        )
        why = (
            "no one layer's fix would show at the outputs"
            if masked
            else "the error is diffuse at the noise floor's level"
        )
        lines.append(
            f"no single layer stands out: {why}{near} - a global change ({changes}) is the "
            "question, not a layer"
        )
    for c in culprits:
        lines.append(f"culprit #{c.rank}: {c.name} ({c.op_type}) - {c.cause}")
    lines += _patterns(culprits)
    if masked:
        lines.append(masked)
    if culprits and named_share < MOST:
        lines.append(
            f"the culprits named cost the outputs at most {_pct(named_share)} of their error; "
            f"the rest is spread over the model: for it a global change ({changes}) is the "
            "question"
        )
    lines.append(floor_txt)
    return lines


def _global_changes(evidence: Mapping[str, Evidence]) -> str:
    """The model-wide changes not already made: per-channel weights unless every quantized
    weight is per-channel, 16-bit activations unless every quantized output is 16-bit or
    more (either listed when the evidence cannot tell), and calibration."""
    weights = [
        ev.weight_per_channel for ev in evidence.values() if ev.weight_per_channel is not None
    ]
    bits = [ev.output_bits for ev in evidence.values() if ev.output_bits]
    changes = [] if weights and all(weights) else ["per-channel weights"]
    if not (bits and min(bits) >= 16):
        changes.append("16-bit activations")
    return ", ".join([*changes, "calibration"])


# what one change across several culprits that lose the same thing would be
PATTERN_FIX = {
    WEIGHT: "per-channel weight encodings for them",
    ACTIVATION: "16-bit activations on their outputs",
    CLIPPING: "a calibration that keeps their whole range",
    CONCAT: "16-bit activations on these concatenations",
}
PATTERN_MIN = 3


def _patterns(culprits: Sequence[Culprit]) -> list[str]:
    """Several culprits losing the same thing (their weight range, their activation range...)
    are one problem of the model as much as several layers: say so, with the change that would
    treat them together."""
    kinds: dict[str, list[str]] = {}
    for c in culprits:
        if c.kind in PATTERN_FIX:
            kinds.setdefault(c.kind, []).append(c.name)
    return [
        f"{len(names)} culprits lose their {kind} alike ({', '.join(names)}): one change across "
        f"them - {PATTERN_FIX[kind]} - may be the fix rather than one layer"
        for kind, names in kinds.items()
        if len(names) >= PATTERN_MIN
    ]
