"""The finding lines: the verdict (culprits, or why none is named), the culprits' patterns,
the layers masked, and the noise floor."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from accdbg.algorithms.diagnosis.culprit import Culprit
from accdbg.algorithms.diagnosis.evidence import Evidence
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking.causes import (
    ACTIVATION,
    CLIPPING,
    CONCAT,
    EQUALIZE,
    PER_CHANNEL,
    WEIGHT,
    WIDER,
    _kind,
    _spread_fixes,
)
from accdbg.algorithms.diagnosis.ranking.measures import _pct
from accdbg.algorithms.diagnosis.sensitivity import Share

SHOWN = 5  # layers a finding lists by name (the others: their cause says it)


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


def _trained_line(
    trained: Mapping[str, tuple[float, str]], evidence: Mapping[str, Evidence]
) -> str:
    """What the layers not named for encodings over a trained spread cost (and with which
    partners), and the changes that answer them (:func:`_spread_fix`)."""
    shown = sorted(trained.items(), key=lambda kv: -kv[1][0])[:SHOWN]
    each = ", ".join(f"{n} {_pct(share)}{partners}" for n, (share, partners) in shown)
    if len(trained) > SHOWN:
        each += f" and {len(trained) - SHOWN} more (their cause says)"
    fixes_of = {n: _spread_fixes(evidence[n]) for n in trained}
    per_channel, inputs, outputs = (
        [n for n in trained if fix in fixes_of[n]] for fix in (PER_CHANNEL, EQUALIZE, WIDER)
    )
    fixes = ["per-channel weights answer it"] if per_channel else []
    if inputs:
        fixes.append(
            f"cross-layer equalization answers {', '.join(inputs[:SHOWN])}, whose spread is "
            "over input channels (per-channel weights do not narrow it)"
        )
    if outputs:
        carried = " (and the layers carrying it)" if any(trained[n][1] for n in outputs) else ""
        fixes.append(
            f"16-bit activations answer {', '.join(outputs[:SHOWN])}, whose output's range is "
            f"such a spread{carried}"
        )
    what = " and ".join(
        w for w, has in (("per-tensor weights", per_channel + inputs), ("outputs", outputs)) if has
    )
    return (
        f"the rounding of {what} over channels spread as trained costs the outputs, layer by "
        f"layer, of their error: {each} - no channel or weight alone beyond the others, so "
        f"none is named; {'; '.join(fixes)} - a change of the model's encodings rather than a "
        "fault of one layer"
    )


NONE_STANDS = "no single layer stands out"  # the verdict's first words when none is named


def _by_output(verdicts: Sequence[tuple[str, str, float, bool | None]]) -> str:
    """'CosineSimilarity 0.9997, SQNR 32.01' for one output; each output's named, its values
    after it, for several (at most four shown)."""
    values: dict[str, list[str]] = {}
    for name, label, value, _ in verdicts:
        values.setdefault(name, []).append(f"{label} {value:.4g}")
    if len(values) == 1:
        return ", ".join(next(iter(values.values())))
    shown = [f"{name}: {', '.join(v)}" for name, v in list(values.items())[:4]]
    more = f"; {len(values) - 4} more" if len(values) > 4 else ""
    return "; ".join(shown) + more


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
    trained: str = "",
) -> list[str]:
    """``nearest``: the share and name of the standout measured closest to being named;
    ``changes``: the global changes left to try (:func:`_global_changes`); ``named_share``:
    the most a named culprit was measured to cost the outputs (under ``POLICY.most`` the rest of the
    error is the model's own, and the global changes are its question too); ``bar``: the share
    a standout needed; ``kernels``: the part of the outputs' error QNN's kernels add (at
    ``POLICY.share`` or more, no encoding change is the question); ``masked``: what the layers not
    named because taken out they remove nothing are (:func:`_masked_line`); ``trained``: what
    the layers not named for their encodings over a trained spread cost
    (:func:`_trained_line`)."""
    lines = []
    verdicts = [o for o in outputs if o[3] is not None]
    if verdicts and all(o[3] for o in verdicts):
        lines.append(f"the outputs meet their thresholds ({_by_output(verdicts)})")
    elif verdicts:
        bad = [o for o in verdicts if not o[3]]
        shown = ", ".join(f"{n} {lab} {val:.4g}" for n, lab, val, _ in bad[:3])
        lines.append(f"outputs failing their threshold: {shown}")
    floor_txt = (
        f"the model's noise floor: median local SQNR {floor:.1f} dB, spread {spread:.1f} dB"
        if math.isfinite(floor)
        else "no quantization evidence (no quantized layer with a golden value)"
    )
    if not culprits and kernels >= POLICY.share:
        most = (
            f"; the most, {nearest[1]}, {_pct(nearest[0])} alone"
            if nearest is not None and math.isfinite(nearest[0])
            else ""
        )
        lines.append(
            f"{NONE_STANDS}: QNN's kernels add {_pct(kernels)} of the outputs' error "
            "and no one layer's difference explains it (the layers where QNN parts from its own "
            f"inputs say how in their cause{most}) - the backend's computation is the question, "
            "not the encodings"
        )
    elif not culprits and trained:
        lines.append(
            f"{NONE_STANDS} as a fault: what costs the outputs most is the rounding of encodings "
            f"over channels spread as trained (below) - a global change ({changes}) is the "
            "question, not a layer"
        )
    elif not culprits:
        measured = nearest is not None and math.isfinite(nearest[0])
        if not masked and measured and POLICY.lone_share <= nearest[0] < POLICY.share:
            # a standout costing a quarter or more is no noise at the floor: it comes nearest
            why = (
                f"the one nearest, {nearest[1]}, costs the outputs {_pct(nearest[0])} of their "
                f"error, under the {bar} a culprit causes (see its cause): its fix alone would "
                "gain under 3 dB"
            )
            near = ""
        else:
            other = "other " if masked else ""
            why = (
                "no one layer's fix would show at the outputs"
                if masked
                else "the error is diffuse at the noise floor's level"
            )
            near = (
                f" (the {other}layers that stand out locally cost the outputs less than {bar} of "
                f"their error - the most, {nearest[1]}, {_pct(nearest[0])}: see its cause)"
                if measured and nearest[0] >= POLICY.min_share
                else f" (the {other}layers that stand out locally each cost the outputs under "
                f"{_pct(POLICY.min_share)} of their error)"
                if measured
                else ""
            )
        lines.append(
            f"{NONE_STANDS}: {why}{near} - a global change ({changes}) is the question, not a layer"
        )
    for c in culprits:
        lines.append(f"culprit #{c.rank}: {c.name} ({c.op_type}) - {c.cause}")
    lines += _patterns(culprits)
    lines += [line for line in (masked, trained) if line]
    if culprits and named_share < POLICY.most and kernels >= POLICY.share:
        lines.append(
            f"the culprits named cost the outputs at most {_pct(named_share)} of their error, "
            f"and QNN's kernels add {_pct(kernels)} of it: for the rest the backend's computation "
            "at the other layers where QNN parts from the CPU fake-quant is the question (their "
            "causes say how), not the encodings"
        )
    elif culprits and named_share < POLICY.most:
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
        if len(names) >= POLICY.pattern_min
    ]
