"""The backend's part: where QNN's error jumps beyond what a layer's encodings and inputs
explain (run alone, in context, or in a full run), where it parts from onnxruntime's CPU
fake-quant of the same layer, and what its kernels add to the outputs' error."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from accdbg.algorithms.diagnosis.evidence import Evidence, nsr_db
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking.causes import ACTIVATION
from accdbg.algorithms.diagnosis.ranking.measures import (
    CAUSE,
    Impact,
    _add_cause,
    _both,
    _pct,
    compared_inputs,
    cpu_run,
    robust_floor,
    standout_cut,
    standout_gap,
)
from accdbg.algorithms.fragments import KERNELS, context_walk

# ops whose slope grows without bound near part of their input range: there a rounding step of
# their input becomes many steps of their output (a Log near 0, a reciprocal of a variance)
AMPLIFYING = ("Log", "Reciprocal", "Div", "Sqrt", "Pow", "Exp")
READ_TWICE = ("Div", "Pow")  # ...only when both their inputs are activations


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
    of: str = ""  # the model output it is the logits of, when it is not that output itself

    @property
    def share(self) -> float:
        """The part of the output's QNN error the CPU fake-quant does not have (0 when QNN is
        no worse)."""
        return max(0.0, 1.0 - self.cpu / self.qnn) if self.qnn > 0 else 0.0

    def line(self) -> str:
        logits = f" (the logits of {self.of})" if self.of and self.of != self.output else ""
        where = (
            f"{self.output}{logits} at {nsr_db(self.qnn):.1f} dB SQNR on QNN, "
            f"{nsr_db(self.cpu):.1f} dB in {cpu_run(self.quantized)}"
        )
        if self.share < POLICY.noticed:
            return f"QNN's kernels add nothing measurable to the outputs' error: {where}"
        return f"QNN's kernels add {_pct(self.share)} to the outputs' error: {where}"

    @classmethod
    def worst(
        cls,
        errors: Mapping[str, tuple[float, float]],
        quantized: bool = True,
        output_of: Mapping[str, str] | None = None,
    ) -> KernelsAdded | None:
        """From (QNN's error, the CPU's error) per judged output; ``output_of``: the model
        output each judged tensor stands for (a Softmax/Sigmoid output is judged at its
        logits)."""
        of = output_of or {}
        found = [
            cls(n, q, c, quantized, of.get(n, ""))
            for n, (q, c) in errors.items()
            if q > 0 and math.isfinite(q)
        ]
        return max(found, key=lambda k: (k.share, k.qnn), default=None)


@dataclass
class ContextCheck:
    """A layer whose error jumps in context, run again (layerwise)."""

    cpu: float  # the CPU fake-quant's error in the same cut (noise-to-signal)
    share: float = math.nan  # what the backend's difference there costs the outputs
    # the layer's and its inputs' errors in the whole model on the backend (noise-to-signal)
    whole: Mapping[str, float] = field(default_factory=dict)


def _standing_jumps(jumps: Mapping[str, tuple[float, float]], visible: bool = True) -> list[str]:
    """Layers whose jump (dB of error beyond what explains it) is at least ``POLICY.backend_db`` and
    stands out among the model's jumps, with an error the pass mark would see (``POLICY.abs_db``;
    not ``visible``: any error, for jumps whose cost to the outputs is measured after)."""
    floor, spread = robust_floor([j for j, _ in jumps.values()])
    return [
        n
        for n, (j, nsr) in jumps.items()
        if j >= POLICY.backend_db
        and j >= floor + standout_gap(spread)
        and (not visible or nsr_db(nsr) < POLICY.abs_db)
    ]


# a layer run alone on the backend (golden inputs) whose error its encodings and its inputs'
# encodings do not explain: the kernel, not the quantization
ALONE_JUMP = (
    "backend: run alone on the backend it keeps {got:.1f} dB where its quantization "
    "explains {explained} ({jump})"
)
# ...and measured: the CPU fake-quant of the same layer alone, fed the same golden inputs
ALONE_CPU_JUMP = (
    "backend: run alone on golden inputs it keeps {got:.1f} dB on the backend where "
    "onnxruntime's CPU fake-quant of the same QDQ layer keeps {explained} ({jump})"
)
# ...and what that difference costs the outputs (layerwise has no full run on the backend)
ALONE_COST = "that difference alone, added to the CPU fake-quant of the whole model, {cost}"


def _alone_cost(share: float) -> str:
    """What a layer's difference alone costs the outputs over their error in the CPU
    fake-quant: a share, or - where that error is tiny and the share thousands of percent -
    the dB it takes off their SQNR."""
    if share >= POLICY.times:
        return ALONE_COST.format(
            cost=f"takes {10 * math.log10(1 + share):.1f} dB off the outputs' SQNR there"
        )
    return ALONE_COST.format(cost=f"costs the outputs {_pct(share)} of their error there")


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
    inputs bring in the run, must still fall ``POLICY.backend_db`` short of its error there for the
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


def _beyond(got: float, cpu: float | None) -> bool:
    """The backend's error ``POLICY.backend_db`` or more above the CPU fake-quant's (noise-to-signal
    powers; a CPU without error: any backend error is beyond it)."""
    if cpu is None or not math.isfinite(got):
        return False
    return cpu <= 0 < got or (cpu > 0 and 10 * math.log10(got / cpu) >= POLICY.backend_db)


# a full run's layer whose error jumps beyond what its nearest compared inputs bring plus its
# own encodings': with no CPU comparison, the nearest sign of a kernel computing something else
RUN_JUMP = (
    "backend: on the backend its error jumps to {got:.1f} dB where its inputs bring and "
    "its encodings explain {explained} ({jump}; no CPU comparison in this run)"
)


# a layer right alone whose error jumps once it runs after its producers: the backend
# computes it differently beside them (a fused or in-place kernel)
CONTEXT_JUMP = (
    "backend: run after its producers as the backend runs them together, it keeps {got:.1f} "
    "dB where its inputs' error there, passed on as it passes it alone, and its quantization "
    "explain {explained} ({jump}); run alone it computes what its "
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
# ...when its inputs' error there would hide the jump: the whole model cannot decide
CONTEXT_HIDDEN = (
    "with its inputs' error there its jump would show at most {lift:.1f} dB worse, under the "
    "{gate:.0f} dB that tell the kernel's doing from the cut's"
)
# a jump in context the whole model on the backend does not make, where it would show: the cut's
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
    the backend does not make, where its inputs' error there would not hide it, is the cut's
    (its producers fed as graph inputs) - each said in its cause, not named (inputs that hide
    it leave the whole model unable to decide: the candidate stands as measured); one whose
    difference from the CPU costs the outputs under ``POLICY.share`` is a note. The others keep their
    figures, and their cost orders them (``costs``). A candidate not run again stands as
    measured - unless its error there is one the pass mark (``POLICY.abs_db``) would not see: such a
    jump stands only by the cost it was measured to have."""
    out = []
    for nsr, n, cause in candidates:
        check = ran.get(n)
        if (check is None or not math.isfinite(check.share)) and nsr_db(
            jumps[n][0]
        ) >= POLICY.abs_db:
            continue
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
            # the whole model can only fail to show a jump its inputs' error would not hide
            shown = jumps[n][0] + deployed[0]
            if _beyond(shown, deployed[0]):
                _add_cause(columns, n, CONTEXT_CUT.format(got=got, cpu=cpu, whole=whole))
                continue
            lift = 10 * math.log10(shown / deployed[0])
            whole += f" - {CONTEXT_HIDDEN.format(lift=lift, gate=POLICY.backend_db)}"
        cause += f"; {CONTEXT_CPU.format(cpu=cpu)}" + (f"; {whole}" if whole else "")
        if math.isfinite(check.share):
            cause += f"; {_alone_cost(check.share)}"
            if check.share < POLICY.share:
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
    own encodings, a standout's too, are in what is expected of it. A jump to an error the
    pass mark would not see is kept too: what a kernel's difference there costs the outputs,
    measured once run again, says whether it matters (:func:`_alone_backend`)."""
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
    return _jumps({n: context_nsr[n][0] for n in expected}, expected, visible=False)


def fused_with(n: str, evidence: Mapping[str, Evidence]) -> list[str]:
    """The layers HTP computes with ``n`` as one: its producers back to the nearest kernels
    (included) - what a backend culprit's counterfactual keeps in fp16 with it, since the
    kernel that is wrong may be the fused one, not the layer's own."""

    def producers(x: str) -> list[str]:
        return [y for y in evidence[x].inputs if y in evidence]

    if n not in evidence:
        return []
    return [
        str(x)
        for x in context_walk(producers(n), producers, lambda x: evidence[x].op_type in KERNELS)
    ]


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
    observed: Mapping[str, float],
    expected: Mapping[str, tuple[float, list[str]]],
    visible: bool = True,
) -> dict[str, tuple[float, float, list[str]]]:
    """The layers whose observed error stands out above what is ``expected`` of them
    (:func:`_standing_jumps`): layer -> (its error, the error expected, its inputs)."""
    jumps = {
        n: (10 * math.log10(observed[n] / e), observed[n])
        for n, (e, _) in expected.items()
        if e > 0 and math.isfinite(observed[n]) and observed[n] > 0
    }
    return {n: (observed[n], *expected[n]) for n in _standing_jumps(jumps, visible)}


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
    (or with no CPU comparison), whose inputs pass the pass mark (``POLICY.abs_db``: an error carried
    in is its maker's), is asked about its inputs' encodings, the worst first: one costing the
    outputs ``POLICY.share`` of their error alone is the culprit. Returns those
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
        if (
            nsr_db(expected) < POLICY.abs_db
        ):  # its inputs fail already: an error carried in, not made
            continue
        for x in ins:
            if x in taken or x not in evidence:
                continue
            share = impact(x, POLICY.share)
            if math.isnan(share.best) or share.best < POLICY.share:
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
    ``cause`` is formatted with ``got`` (dB), ``explained`` and ``jump`` (words): a layer
    whose expected error is none (its CPU run exact) has all of its error from the backend."""
    return [
        (got, n, cause.format(got=nsr_db(got), **_explained(got, expected)))
        for n, (got, expected, _) in jumps.items()
        if n not in taken
    ]


def _explained(got: float, expected: float) -> dict[str, str]:
    """What the quantization explains and how much worse the backend is, in words."""
    if expected <= 0:
        return {"explained": "no error at all", "jump": "all of it is the backend's"}
    return {
        "explained": f"{nsr_db(expected):.1f} dB",
        "jump": f"{10 * math.log10(got / expected):.1f} dB worse",
    }


def _own_nsr(ev: Evidence) -> float:
    """What a layer's own encodings (weights, output, a Concat's inputs) cost it."""
    return sum(v for v in (ev.weight_nsr, ev.output_nsr, ev.concat_nsr) if not math.isnan(v))


def _diverging(div: Mapping[str, float], quantized: bool = True) -> dict[str, str]:
    """Layers where QNN parts from the CPU fake-quant fed its own inputs (noise-to-signal
    ``div``) far more than at the model's other layers that differ at all."""
    dbs = {n: nsr_db(d) for n, d in div.items() if d > 0}
    finite = [d for d in dbs.values() if math.isfinite(d)]
    if len(finite) >= POLICY.min_diverging:
        floor, _, cut = standout_cut(finite)
        bar = f"the model's median differing layer: {floor:.1f} dB"
    else:  # too few layers differ for a spread: the widest gap, or the pass mark
        cut = (
            max(POLICY.abs_db, float(np.median(finite)) - POLICY.max_gap_db)
            if finite
            else POLICY.abs_db
        )
        bar = f"too few layers differ for a floor: under {cut:.1f} dB stands out"
    how: Mapping[str, str] = getattr(div, "how", {})
    return {n: _parted(d, how.get(n), quantized, f" ({bar})") for n, d in dbs.items() if d < cut}


def _not_adding_up(
    over: Sequence[str],
    shares: Mapping[str, float],
    together: Callable[[Sequence[str]], float] | None,
) -> dict[str, str]:
    """Backend standouts whose kernel differences each cost the outputs ``POLICY.share`` or more
    alone but, added at once, far less than their sum (``POLICY.adds_up``): outputs this sensitive to
    a small change anywhere make no one layer's difference the cause. Layer -> the figures
    (the caller says what they mean for it: :data:`NO_ONE_CAUSE` or :data:`INTERACTING`);
    empty when they add up (or one layer, or not measured)."""
    if len(over) < 2 or together is None:
        return {}
    whole = together(over)
    parts = sum(shares[n] for n in over)
    if math.isnan(whole) or parts <= POLICY.adds_up * whole:
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


def _alone_backend(
    jumps: Mapping[str, tuple[float, float, list[str]]],
    on_cpu: Mapping[str, float],
    kernel: Mapping[str, tuple[float, float, list[str]]],
    taken: set[str],
    alone_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None,
    evidence: Mapping[str, Evidence],
    context_nsr: Mapping[str, tuple[float, float]],
    observed: Mapping[str, float],
    suspects: set[str],
    standouts: Sequence[str],
    columns: dict[str, dict[str, object]],
    costs: dict[str, float],
) -> list[tuple[float, str, str]]:
    """Layerwise's backend candidates ``(nsr, name, cause)``: the layers whose error run alone
    jumps (``jumps``) - those not run in the CPU fake-quant as they stand, those run there
    (``kernel``: the CPU does not jump) when their difference costs the outputs ``POLICY.share`` -
    and those whose error jumps only in context, checked again there (:func:`_in_context`,
    :func:`_checked_in_context`; ``suspects``: the culprits and the ranges an outlier blows).
    A jump the CPU makes too (``on_cpu``) is said in that layer's cause; so is a difference
    costing less. ``costs`` gets what each named one was measured to cost."""
    composed = {n: j for n, j in jumps.items() if n not in on_cpu}  # not run on the CPU
    backend = _as_backend(composed, taken, ALONE_JUMP)
    # what each measured difference costs the outputs: named from POLICY.share, as in a full run
    measured = _as_backend(kernel, taken, ALONE_CPU_JUMP)
    ask = getattr(alone_cpu, "kernel_share", None)
    cost = ask([b[1] for b in measured]) if ask is not None and measured else {}
    for nsr, n, cause in measured:
        if n in cost:
            cause += f"; {_alone_cost(cost[n])}"
        if cost.get(n, POLICY.share) >= POLICY.share:
            backend.append((nsr, n, cause))
            if n in cost:
                costs[n] = cost[n]
        else:
            _add_cause(columns, n, cause)
    for n in jumps.keys() & on_cpu.keys() - taken:
        got, expected, _ = jumps[n]
        cpu = nsr_db(on_cpu[n])
        _add_cause(columns, n, CPU_TOO.format(got=nsr_db(got), explained=nsr_db(expected), cpu=cpu))
    # in context a layer reads its producer's error and range as computed: one reading a
    # culprit's output, or a range an outlier blows, jumps by that layer's doing; one
    # reading another standout's stands only when the CPU fake-quant of the same cut,
    # which reads that range alike, was run and does not jump
    ctx_jumps = _in_context(evidence, context_nsr, observed, suspects)
    ctx_backend = _as_backend(ctx_jumps, taken | set(jumps) | set(kernel), CONTEXT_JUMP)
    ask = getattr(alone_cpu, "in_context", None)
    ran = ask([b[1] for b in ctx_backend]) if ask is not None and ctx_backend else {}
    beside = {n for n in ctx_jumps if _before_in_context(n, evidence) & set(standouts)}
    ctx_backend = [b for b in ctx_backend if b[1] in ran or b[1] not in beside]
    backend += _checked_in_context(ctx_backend, ctx_jumps, ran, evidence, columns, costs)
    return backend


def _run_backend(
    jumps: Mapping[str, tuple[float, float, list[str]]],
    evidence: Mapping[str, Evidence],
    run_cpu: Callable[[Sequence[str]], Mapping[str, float]] | None,
    taken: set[str],
    columns: dict[str, dict[str, object]],
) -> list[tuple[float, str, str]]:
    """A full run's backend candidates with no CPU comparison of each layer (cumulative): the
    layers whose error jumps (``RUN_JUMP``), unless the CPU fake-quant of the whole model
    (``run_cpu``) jumps there too (:func:`_gained`: said in their cause)."""
    gained = _gained(jumps, evidence, run_cpu)
    backend = _as_backend({n: jumps[n] for n in jumps.keys() - gained}, taken, RUN_JUMP)
    for n in gained.keys() - taken:
        _add_cause(columns, n, gained[n])
    return backend


# a lone backend standout named under half: why
LONE_BACKEND = (
    " - QNN parts here {where}, and its kernels add {added} of the outputs' error: this "
    "layer's difference is the largest part of it"
)


def _lone(standing: Collection[str], divergence: Mapping[str, float]) -> tuple[str, float] | None:
    """The standing layer QNN parts at ``POLICY.backend_db`` further than at any other layer that
    differs at all, and by how much (dB; +inf when no other differs), if there is one."""
    dbs = sorted((nsr_db(d), n) for n, d in divergence.items() if d > 0)
    if not dbs or dbs[0][1] not in standing:
        return None
    gap = dbs[1][0] - dbs[0][0] if len(dbs) > 1 else math.inf
    return (dbs[0][1], gap) if gap >= POLICY.backend_db else None


def _diverging_backend(
    divergence: Mapping[str, float] | None,
    kernel_share: Callable[[Sequence[str]], Mapping[str, float]] | None,
    added: float,
    quantized: bool,
    local_observed: bool,
    named: set[str],
    evidence: Mapping[str, Evidence],
    inherited: Mapping[str, str],
    columns: dict[str, dict[str, object]],
    costs: dict[str, float],
    noted: dict[str, float] | None = None,
) -> tuple[list[tuple[float, str, str]], list[str]]:
    """A full run's backend candidates ``(nsr, name, cause)`` where QNN parts from the CPU
    fake-quant fed its own inputs (``divergence``, :func:`_diverging`): named when that
    difference alone costs the outputs ``POLICY.share`` (``kernel_share``; asked when the kernels
    add that much - ``added``, their part of the outputs' error - or of a layer computing
    something else), unless those differences do not add up (a rounding that is no one's);
    the others are a note in their cause. With nothing
    ``named`` at all and the kernels carrying ``POLICY.share``, the layers where QNN differs are halved
    down to one whose difference alone costs that much (``kernel_share.search``). Returns the
    candidates and those among them whose effects interact (put in execution order);
    ``costs`` gets what each was measured to cost, ``noted`` what each one left a note cost."""
    standing = _diverging(divergence or {}, quantized)
    shares: Mapping[str, float] = {}
    steps: Mapping[str, float] = getattr(divergence, "steps", {})
    if standing and kernel_share is not None and not local_observed:
        # not when the kernels together carry less: a rounding difference then is no one's;
        # a layer computing something else (steps apart) is measured whatever they carry
        asked = [
            n
            for n in standing
            if added >= POLICY.share or steps.get(n, 1.0) >= POLICY.different_steps
        ]
        shares = kernel_share(asked) if asked else {}

    found: list[tuple[float, str, str]] = []

    def name_backend(n: str, cause: str, share: float) -> None:
        # fed QNN's own inputs it parts from the fake-quant: its error is not its inputs'
        col = columns.setdefault(n, {})
        why = f"; {col[CAUSE]}" if col.get(CAUSE) and n not in inherited else ""
        found.append((divergence[n], n, f"{cause}{why}"))
        costs[n] = share

    # the kernels carrying most of the error and QNN parting at one layer far more than at
    # any other: that layer is named from POLICY.lone_share, as the model's lone standout is
    lone, gap = (_lone(standing, divergence or {}) if added >= POLICY.share else None) or ("", 0.0)

    def bar(n: str) -> float:
        return POLICY.lone_share if n == lone else POLICY.share

    scattered = _not_adding_up(
        [n for n in standing if shares.get(n, 0.0) >= bar(n) and n not in named and n in evidence],
        shares,
        getattr(kernel_share, "together", None),
    )
    interacting: list[str] = []  # backend culprits whose differences do not add up
    for n, cause in standing.items():
        share = shares.get(n, math.nan)
        if not math.isnan(share):
            cause += f"; {_kernel_cost(share, quantized)}"
            if n == lone and POLICY.lone_share <= share < POLICY.share:
                where = (
                    f"{gap:.1f} dB further than at any other layer"
                    if math.isfinite(gap)
                    else "and at no other layer"
                )
                cause += LONE_BACKEND.format(where=where, added=_pct(added))
        # a rounding (one step) that does not add up is no one layer's; a different
        # computation is the kernel's whatever the others do (its cause says they interact)
        rounding = n in scattered and steps.get(n, 1.0) < POLICY.different_steps
        if share >= bar(n) and n not in named and n in evidence and not rounding:
            if n in scattered:
                interacting.append(n)
                cause += scattered[n] + INTERACTING
            name_backend(n, cause, share)
        else:
            _add_cause(columns, n, cause + (scattered[n] + NO_ONE_CAUSE if n in scattered else ""))
            if noted is not None and not math.isnan(share):
                noted[n] = share
    search = getattr(kernel_share, "search", None)
    if (
        search is not None
        and not named
        and not found
        and not local_observed
        and added >= POLICY.share
    ):
        # the kernels carry most of the error and no layer stands out, for its encodings or
        # its difference: a small difference that does not average out (a rounding bias
        # before a pooling) may
        halved = search(
            sorted(
                (n for n, d in (divergence or {}).items() if d > 0), key=lambda n: -divergence[n]
            ),
            POLICY.share,
        )
        how: Mapping[str, str] = getattr(divergence, "how", {})
        for n, share in halved.items():
            if n not in named and n in evidence:
                cause = _parted(
                    nsr_db(divergence[n]),
                    how.get(n),
                    quantized,
                    ", no further than at other layers",
                )
                found_by = "(found by halving the layers where QNN differs)"
                name_backend(n, f"{cause}; yet {_kernel_cost(share, quantized)} {found_by}", share)
    return found, interacting
