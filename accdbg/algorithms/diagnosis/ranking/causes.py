"""What a layer's own encodings lose (weights, a Concat's inputs, its output's range or
clipping), worst first: the words of its ``cause`` and its kind."""

from __future__ import annotations

import math

from accdbg.algorithms.diagnosis.culprit import ACTIVATION, CLIPPING, CONCAT, WEIGHT  # noqa: F401
from accdbg.algorithms.diagnosis.evidence import Evidence, nsr_db
from accdbg.algorithms.diagnosis.policy import POLICY


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
    """The parts of :func:`_parts` within ``POLICY.cause_db`` of the worst: those its cause names (a
    scaled channel blows both its weights' and its output's range)."""
    parts = _parts(ev)
    worst = nsr_db(parts[0][0]) if parts else math.nan
    return [p for p in parts if nsr_db(p[0]) < worst + POLICY.cause_db]


def _named_kinds(ev: Evidence) -> set[str]:
    """The kinds of the parts its cause names (:func:`_named_parts`)."""
    return {kind for _, kind, _ in _named_parts(ev)}


def _cause(ev: Evidence) -> str:
    """What the layer's own encodings do, worst first (:func:`_named_parts`)."""
    return "; ".join(t for _, _, t in _named_parts(ev))


def _rounding_only(ev: Evidence, kinds: set[str]) -> bool:
    """The parts the layer's cause names (:func:`_named_parts`) are all of ``kinds``, it clips
    nothing and its weights multiply no input offset: what it loses is its encodings'
    rounding."""
    named = _named_kinds(ev)
    return bool(named) and named <= kinds and not _clips(ev) and not ev.offset_from


def _own_rounding(ev: Evidence) -> bool:
    """The layer loses only its weights' rounding: its weights' part is the only one its cause
    names (:func:`_named_parts`: its output keeps its range) and it clips nothing,
    and what blows its weights' range is their own wide output channel (or no outlier at all)
    - not an input channel its producer shrank (a pair, measured with it), not an input offset
    they multiply (its maker's), and not a few weights far beyond the rest: such a weight also
    multiplies the error its input channel brings from every encoding upstream, which taking
    its own quantizers out leaves in place (the outlier weights' question asks what the model
    would be without them). Its error then travels through no range of another layer: taken
    out of the whole QDQ model, its quantizers take its fix's part of the error."""
    return _rounding_only(ev, {WEIGHT}) and ev.weight_outlier in ("", "output channel")


def _trained_spread(ev: Evidence) -> bool:
    """What the layer loses is only the rounding of encodings whose range a spread of channels
    sets as trained, none alone beyond the others: its per-tensor weights' (the widest output
    or input channel under ``POLICY.outlier_ratio`` x the next widest on its axis, ``outlier_next``,
    or no channel beyond the median's) and its output's (the loudest channel under
    ``POLICY.outlier_ratio`` x the next loudest, ``loud_next``) - nothing clipped, no input offset
    multiplied, no Concat's inputs. A per-tensor encoding over such a spread crushes the
    narrow channels; per-channel weights, cross-layer equalization or wider activations
    answer it, a change of the model's encodings rather than a fault of this layer: trained
    layers spread their channels widely (PP-OCRv3 det's widest 1x1 channel 54x the median,
    1.4x the next), while a channel or a weight alone far beyond every other - as an outlier
    or a compensated pair makes it - is no trained spread."""
    kinds = _named_kinds(ev)
    return (
        _rounding_only(ev, {WEIGHT, ACTIVATION})
        and (WEIGHT not in kinds or _spread_weights(ev))
        and (ACTIVATION not in kinds or _spread_output(ev))
    )


def _spread_weights(ev: Evidence) -> bool:
    """Per-tensor weights whose range the widest of a trained spread of channels sets."""
    return ev.weight_per_channel is False and (
        not ev.weight_outlier
        or ev.weight_outlier in ("output channel", "input channel")
        and ev.outlier_next < POLICY.outlier_ratio
    )


def _spread_output(ev: Evidence) -> bool:
    """An output whose range the loudest of a trained spread of channels sets: its loudest
    channels reach ``POLICY.outlier_ratio`` x as far as the median channel or more (the spread is
    what crushes the others), the loudest under ``POLICY.outlier_ratio`` x as far as the next. A range
    every channel fills alike (an offset added to all of them) is no spread of channels."""
    return ev.loud_ratio >= POLICY.outlier_ratio and ev.loud_next < POLICY.outlier_ratio


def _spread_words(ev: Evidence) -> str:
    """Why a layer losing only the rounding of encodings over trained spreads is not named,
    and what answers it (:func:`_spread_fix`)."""
    kinds = _named_kinds(ev)
    spreads = []
    if WEIGHT in kinds:
        widest = (
            f" (its widest {ev.weight_outlier} spans {ev.outlier_next:.3g}x the next widest)"
            if ev.weight_outlier
            else ""
        )
        spreads.append(f"its weights' range is the widest of channels spread as trained{widest}")
    if ACTIVATION in kinds:
        spreads.append(
            "its output's range is the loudest of channels spread as trained (channel "
            f"{ev.loud_channel} reaches {ev.loud_next:.3g}x as far as the next loudest)"
        )
    return (
        f"{' and '.join(spreads)}, no channel or weight alone beyond the others: the per-tensor "
        f"encoding crushes the narrow ones, which {_spread_fix(ev)} - a change of the model's "
        "encodings, not a fault of this layer, so it is not named"
    )


# what answers encodings over a trained spread (:func:`_spread_fixes`), in a cause's words
PER_CHANNEL = "per-channel weights"
EQUALIZE = "cross-layer equalization with the layer making that input"
WIDER = "16-bit activations on its output"


def _spread_fixes(ev: Evidence) -> list[str]:
    """What answers a layer's encodings over trained spreads: per-channel weights for a spread
    over output channels; for input channels, whose weights are wide in every output channel
    alike, equalizing them with the layer making them; for an output (no per-channel
    activation encodings on HTP), more bits."""
    kinds = _named_kinds(ev)
    fixes = []
    if WEIGHT in kinds:
        fixes.append(EQUALIZE if ev.weight_outlier == "input channel" else PER_CHANNEL)
    if ACTIVATION in kinds:
        fixes.append(WIDER)
    return fixes


def _spread_fix(ev: Evidence) -> str:
    """The words of :func:`_spread_fixes` for one layer's cause."""
    fixes = _spread_fixes(ev)
    said = " and ".join(fixes) + (" answers" if fixes == [EQUALIZE] else " answer")
    if EQUALIZE in fixes:
        said = (
            "per-channel weights do not narrow (a wide input channel widens every output "
            f"channel) and {said}"
        )
    return said


def _kind(ev: Evidence) -> str:
    parts = _parts(ev)
    return parts[0][1] if parts else ""
