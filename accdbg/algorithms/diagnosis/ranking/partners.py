"""Layers that hurt the outputs together: an outlier channel and the layers whose range it
blows or whose weights scale it back, a compensated pair, an offset and the weights it
meets - who is the source, and what its cause says."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from accdbg.algorithms.diagnosis.evidence import Evidence
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking.causes import _cause, _clips
from accdbg.algorithms.diagnosis.reach import Reach


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
                f"(they span {POLICY.loud:g}x or more less for it than for their other inputs): their "
                "rounding, coarse for such small weights, multiplies the loud channel"
            )
        if self.pair:
            parts.append(f"{', '.join(self.pair)} shrinks the channel these weights amplify")
        return "; ".join(parts)


def _scaling_back(n: str, evidence: Mapping[str, Evidence]) -> list[str]:
    """The layers reading ``n`` whose weights scale its loud channel back."""
    return [m for m, r in evidence.items() if _scales_back(r, evidence[n])]


def _scales_back(reader: Evidence, maker: Evidence) -> bool:
    """``reader`` reads ``maker`` and its weights for the maker's loud channel span ``POLICY.loud``
    times less than for its other inputs: it scales that channel back (a compensated pair the
    other way round - the producer made the channel loud), and its weights' rounding, coarse
    against such small weights, is multiplied by the loud channel: the two hurt together."""
    return (
        maker.loud_channel >= 0
        and maker.loud_ratio >= POLICY.loud
        and maker.name in reader.inputs
        and reader.quiet_input == maker.loud_channel
        and reader.quiet_ratio >= POLICY.loud
    )


def _pair_of(ev: Evidence, evidence: Mapping[str, Evidence]) -> list[str]:
    """The producers of a layer whose weight range one input channel blows: that channel was
    shrunk upstream and these weights scale it back (a compensated pair), so the producer's
    encoding, which has few levels for it, and these weights hurt together - one quantizer at
    a time neither explains the outputs' loss."""
    if ev.weight_outlier != "input channel":
        return []
    return [x for x in ev.inputs if x in evidence]


def _outlier_source(
    n: str,
    evidence: Mapping[str, Evidence],
    standouts: Sequence[str],
    reaches: Mapping[str, Reach] | None = None,
    hops: int = POLICY.outlier_hops,
) -> str | None:
    """The earlier standout an activation-range problem is carried in from, if any.

    A large activation channel travels: every layer after the one that made it (through
    convolutions that mix it, residual adds and activations) sees a blown range too. Only a
    layer whose loss is its output's range (not its weights, not clipping, not a Concat) is
    taken for a carrier - or a layer whose weights' rounding multiplies a large constant its
    input carries (an offset channel the bias cancels in float). With ``reaches`` measured
    (:mod:`accdbg.algorithms.diagnosis.reach`) a carrier's source is the first standout whose outlier
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
    ev: Evidence, evidence: Mapping[str, Evidence], hops: int = POLICY.outlier_hops
) -> str | None:
    """The earlier layer whose own weights make this layer's loud channel, standing out or
    not: its weights for that output channel span ``POLICY.outlier_ratio`` times the median output
    channel's or more, and only layers that keep channels in place (an activation, an add, a
    pooling: no weights, as many channels) lie between, at most ``hops``. Where the channel
    first appears its encoding may lose little (on this input the other channels reach as far
    the other way); the layers after it lose their ranges - the weights are the cause."""
    if ev.loud_channel < 0 or not ev.loud_ratio >= POLICY.loud or not math.isnan(ev.weight_nsr):
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
    """``weights``' output channel that spans ``POLICY.outlier_ratio`` times the median one's is
    ``ev``'s loud channel (as many channels: the same one, passed on in place)."""
    return (
        weights.channels == ev.channels
        and weights.loud_weights == ev.loud_channel >= 0
        and weights.loud_weights_ratio >= POLICY.outlier_ratio
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
    if ev.loud_channel < 0 or not ev.loud_ratio >= POLICY.loud:
        return None
    for x in ev.inputs:
        src = evidence.get(x)
        if (
            x in standouts
            and src is not None
            and src.channels == ev.channels
            and src.loud_channel == ev.loud_channel
            and src.loud_ratio >= POLICY.loud
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
