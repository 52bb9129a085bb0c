"""Planted faults: one function per kind, each recording the layers a ranking must name.

``plant_<kind>(model, site, strength, rng) -> (model, Fault)`` returns a changed copy of the
model. ``Fault.culprits`` are output tensors (float-model names) of the layer(s) the fault is
in: the planted node's output, the BatchNormalization/bias/affine ops and the sole-consumer
Relu/Clip the quantizer makes into the same layer, and, for a changed activation channel,
every tensor that carries that channel on its way to the layers that undo it. A hit is any
of them ranked.

Compensated kinds (``act_outlier_scale``, ``act_outlier_offset``, ``conv_pair_scaled``,
``concat_unbalanced``) and ``backend_divergence`` must leave the float outputs as they were:
:func:`check_float` runs both models on onnxruntime's CPU provider and a planting that changes
them is excluded, not kept. ``backend_divergence`` inserts an op QNN HTP computes differently
from onnxruntime's CPU fake-quant of the same QDQ model (a channel ``Pad``: HTP fills the new
channels with the integer 0, not the zero point), so only the backend is wrong.
``clipping`` leaves the model alone and narrows one activation's encoding with an AIMET-style
``-qo`` overrides file, as if calibration had missed most of its range.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from accdbg.errors import AccdbgError
from benchmarks.zoo import edits
from benchmarks.zoo.edits import NotEligible, Source
from benchmarks.zoo.graph import Graph, bn_scale, effective_weight, layer_of, layers
from benchmarks.zoo.probe import FloatProbe, channel_axis, output_change, run
from benchmarks.zoo.scoring import HARM_DB

KINDS = (
    "weight_outlier",
    "weight_channel",
    "act_outlier_scale",
    "act_outlier_offset",
    "conv_pair_scaled",
    "concat_unbalanced",
    "clipping",
    "backend_divergence",
    "clean",
)
COMPENSATED = ("act_outlier_scale", "act_outlier_offset", "conv_pair_scaled", "concat_unbalanced")
FLOAT_UNCHANGED = (*COMPENSATED, "backend_divergence")
DEPTHS = {"early": 0.15, "mid": 0.5, "late": 0.85}
FLOAT_RTOL = 1e-3
# clipping: share of the debugged input's values the narrowed encoding clips (tails, not the bulk)
CLIPPED_SHARE = (0.005, 0.25)  # compensated plantings: largest output change / output scale
# backend_divergence: the padded activation's minimum reaches this share of its range below 0
NEGATIVE_SHARE = 0.2

# Strengths, drawn per case from these ranges (seeded): large enough to matter, realistic.
STRENGTH = {
    "weight_outlier": (20.0, 50.0),  # one weight = K x max|W|
    "weight_channel": (10.0, 30.0),  # one output channel's max|w| = K x max|W|
    "act_outlier_scale": (12.0, 40.0),  # channel c's max|x| = K x max|X|
    "act_outlier_offset": (8.0, 20.0),  # channel c + K x max|X|
    "conv_pair_scaled": (20.0, 50.0),  # consumer's input-channel weights reach K x max|W|
    "concat_unbalanced": (12.0, 40.0),  # one branch's range = K x the other branches'
    "clipping": (0.25, 0.25),  # encoding = this fraction of the calibrated range
    "backend_divergence": (0.25, 0.5),  # channels padded = K x the tensor's channels
    "clean": (0.0, 0.0),
}


@dataclass
class Site:
    """Where a fault goes: the node (and the activation) it changes."""

    kind: str
    node: str
    tensor: str | None
    position: int  # index of the node in the model's execution order
    variant: str
    source: Source | None = None
    reach: edits.Reach | None = None
    concat_offset: int = 0
    probe: FloatProbe | None = None  # the float model's activations, to size the fault

    def source_axis(self) -> int:
        return channel_axis(len(self.probe.stats()[self.tensor].shape))


@dataclass
class Fault:
    """A planted fault and the layers that must be named."""

    model: str
    kind: str
    depth: str  # early | mid | late | -
    site: str
    variant: str
    strength: float
    culprits: list[str]
    detail: str
    relative_depth: float = 0.0
    overrides: dict | None = None  # clipping: the AIMET encodings given as -qo
    float_change: float | None = None  # compensated kinds: largest output change / scale
    checked: list[str] = field(default_factory=list)  # tensors compared besides the outputs
    excluded: str = ""  # why the case is not kept
    harm_db: float | None = None  # what it costs the outputs on QNN (benchmarks.zoo.harm)
    backend_gap_db: float | None = None  # clean: QNN's outputs under the CPU fake-quant's
    tries: list[str] = field(default_factory=list)  # the plantings measured before it

    @property
    def case(self) -> str:
        return f"{self.model}/{self.kind}/{self.depth}"


def case_rng(model: str, kind: str, depth: str, seed: int = 0) -> np.random.Generator:
    """One generator per case, independent of the order cases are built in."""
    return np.random.default_rng(zlib.crc32(f"{seed}:{model}:{kind}:{depth}".encode()))


def _copy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Graph]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m, Graph(m)


def _active_channel(absmax: np.ndarray, rng: np.random.Generator) -> int:
    """A channel carrying real signal (at least the median channel's range)."""
    ok = np.flatnonzero(absmax >= np.median(absmax))
    ok = ok[absmax[ok] > 0] if np.any(absmax[ok] > 0) else ok
    return int(rng.choice(ok))


# ---------------------------------------------------------------- eligible sites


def weight_sites(model: onnx.ModelProto, probe: FloatProbe, variant: str) -> list[Site]:
    g = Graph(model)
    out = []
    for layer in layers(g):
        if variant in (layer.kind, "any") and g.const(layer.weight).size > 1:
            out.append(Site("", layer.name, layer.out, g.pos(layer.node), layer.kind))
    return out


def _rank_axis(probe: FloatProbe, tensor: str) -> tuple[int, int, int] | None:
    st = probe.stats().get(tensor)
    if st is None or len(st.shape) < 2:
        return None
    rank = len(st.shape)
    axis = channel_axis(rank)
    return rank, axis, st.shape[axis]


def _consumers_fit(r: edits.Reach, rank: int, axis: int) -> bool:
    for layer in r.consumers:
        if layer.node.op_type == "Conv" and rank != 4:
            return False
        if layer.kind == "dense" and axis != rank - 1:
            return False
    return bool(r.consumers)


def activation_sites(model: onnx.ModelProto, probe: FloatProbe, kind: str) -> list[Site]:
    """Tensors whose channels can be changed exactly and undone by their consumers."""
    g = Graph(model)
    offset = kind == "act_outlier_offset"
    shapes = {k: v.shape for k, v in probe.stats().items()}
    by_source: dict[str, Site] = {}
    for node in g.nodes:
        if node.op_type == "Constant":
            continue
        t = node.output[0]
        ra = _rank_axis(probe, t)
        if ra is None:
            continue
        try:
            r = edits.reach(g, t, offset=offset, shapes=shapes)
            src = edits.find_source(g, t, *ra)
        except NotEligible:
            continue
        if not _consumers_fit(r, ra[0], ra[1]) or (offset and src.relu):
            continue
        if offset and src.elementwise is not None and src.elementwise.op_type not in ("Add", "Sub"):
            continue
        if not offset and src.elementwise is not None and src.elementwise.op_type in ("Add", "Sub"):
            continue
        if kind == "conv_pair_scaled" and len(r.consumers) != 1:
            continue
        if src.layer:
            variant = f"via {src.layer.node.op_type} {src.layer.kind}"
        else:
            variant = f"at {src.elementwise.op_type}"
        # one site per source layer: its last tensor (e.g. after the fused Relu)
        by_source[src.site] = Site(kind, src.site, t, g.pos(node), variant, src, r)
    return sorted(by_source.values(), key=lambda s: s.position)


def _branch_source(g: Graph, probe: FloatProbe, t: str) -> tuple[Source, list[str]] | None:
    """Walk back from a Concat input through scale-preserving ops to a changeable tensor."""
    passed = []
    while True:
        ra = _rank_axis(probe, t)
        if ra is None:
            return None
        try:
            return edits.find_source(g, t, *ra), passed
        except NotEligible:
            pass
        node = g.producer.get(t)
        if node is None or node.op_type not in edits.SCALE_PASS:
            return None
        if g.sole_consumer(node.input[0]) is not node:
            return None
        passed.append(t)
        t = node.input[0]


def concat_sites(model: onnx.ModelProto, probe: FloatProbe) -> list[Site]:
    """Channel Concats read only by layers that can undo a scale of one of its inputs."""
    g = Graph(model)
    out = []
    for node in g.nodes:
        if node.op_type != "Concat":
            continue
        ra = _rank_axis(probe, node.output[0])
        if ra is None or (int(edits.attr(node, "axis", 0)) % ra[0]) != ra[1]:
            continue
        try:
            r = edits.reach(g, node.output[0])
        except NotEligible:
            continue
        if not _consumers_fit(r, ra[0], ra[1]):
            continue
        first = 0
        stats = probe.stats()
        if any(t not in stats for t in node.input):
            continue
        for j, t in enumerate(node.input):
            found = _branch_source(g, probe, t) if g.sole_consumer(t) is node else None
            how = f"via {found[0].site}" if found else "via an inserted Mul"
            out.append(
                Site(
                    "concat_unbalanced",
                    node.name,
                    t,
                    g.pos(node),
                    f"branch {j} of {len(node.input)}, {how}",
                    found[0] if found else None,
                    r,
                    first,
                )
            )
            first += stats[t].shape[ra[1]]
    return out


def clipping_sites(model: onnx.ModelProto, probe: FloatProbe, strength: float) -> list[Site]:
    """Layer outputs where the narrowed encoding clips a visible share of the debugged input."""
    g = Graph(model)
    out = []
    for layer in layers(g):
        st = probe.stats().get(layer.out)
        if st is None or st.hi <= st.lo or layer.out in g.outputs:
            continue
        lo, hi = st.lo * strength if st.lo < 0 else 0.0, st.hi * strength
        v = probe.first(layer.out)
        if CLIPPED_SHARE[0] <= np.mean((v < lo) | (v > hi)) <= CLIPPED_SHARE[1]:
            out.append(Site("clipping", layer.name, layer.out, g.pos(layer.node), layer.kind))
    return out


def backend_sites(model: onnx.ModelProto, probe: FloatProbe) -> list[Site]:
    """Convolutions (group 1) reading a computed 4-D activation whose range reaches well below
    zero: its 8-bit zero point is far from the integer 0 that HTP pads channels with."""
    g = Graph(model)
    out = []
    for layer in layers(g):
        t = layer.node.input[0]
        st = probe.stats().get(t)
        if layer.kind not in ("pointwise", "conv") or t not in g.producer or st is None:
            continue
        if len(st.shape) == 4 and st.lo <= -NEGATIVE_SHARE * st.absmax:
            out.append(Site("backend_divergence", layer.name, t, g.pos(layer.node), layer.kind))
    return out


def by_nearness(sites: Sequence[Site], fraction: float) -> list[Site]:
    """The sites ordered by how near they lie to ``fraction`` of the eligible list (the first
    is the site of that depth; the next ones are where a planting too weak to hurt moves)."""
    if not sites:
        return []
    at = int(round(fraction * (len(sites) - 1)))
    order = sorted(range(len(sites)), key=lambda i: (abs(i - at), i))
    return [sites[i] for i in order]


# weight_outlier covers pointwise, depthwise and dense layers at three depths
WEIGHT_OUTLIER_VARIANTS = {
    "early": ("pointwise",),
    "mid": ("depthwise",),
    "late": ("dense", "pointwise"),
}


def candidate_sites(model: onnx.ModelProto, probe: FloatProbe, kind: str, depth: str) -> list[Site]:
    """The sites of a kind at a depth, nearest first (deterministic)."""
    f = DEPTHS[depth]
    if kind == "weight_outlier":
        for variant in WEIGHT_OUTLIER_VARIANTS[depth]:
            found = by_nearness(weight_sites(model, probe, variant), f)
            if found:
                return found
        return by_nearness(weight_sites(model, probe, "any"), f)
    if kind == "weight_channel":
        return by_nearness(weight_sites(model, probe, "any"), f)
    if kind in ("act_outlier_scale", "act_outlier_offset", "conv_pair_scaled"):
        return by_nearness(activation_sites(model, probe, kind), f)
    if kind == "concat_unbalanced":
        return by_nearness(concat_sites(model, probe), f)
    if kind == "clipping":
        return by_nearness(clipping_sites(model, probe, STRENGTH["clipping"][0]), f)
    if kind == "backend_divergence":
        return by_nearness(backend_sites(model, probe), f)
    raise ValueError(kind)


# ---------------------------------------------------------------- the kinds


def plant_weight_outlier(model, site: Site, strength: float, rng) -> tuple[onnx.ModelProto, Fault]:
    """One weight set to +-K x the tensor's largest |w|: per-tensor 8-bit weights lose the rest.

    Sizes are measured on the weights as quantized (a following BatchNormalization folded in).
    """
    m, g = _copy(model)
    layer = layer_of(g, g.node(site.node))
    w = g.const(layer.weight)
    eff = effective_weight(g, layer)
    peak = float(np.abs(eff).max())
    idx = tuple(int(rng.integers(d)) for d in w.shape)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    fold = bn_scale(g, layer)
    factor = 1.0 if fold is None else float(fold[idx[layer.out_axis]])
    w[idx] = sign * strength * peak / factor
    g.set_const(layer.weight, w)
    detail = f"{layer.weight}{list(idx)} = {w[idx]:+.4g} ({strength:.0f} x max|w| {peak:.4g})"
    return m, _fault(site, "weight_outlier", strength, layer.rows, detail)


def plant_weight_channel(model, site: Site, strength: float, rng) -> tuple[onnx.ModelProto, Fault]:
    """One output channel's weights scaled until its max|w| is K x the tensor's (uncompensated)."""
    m, g = _copy(model)
    layer = layer_of(g, g.node(site.node))
    w = g.const(layer.weight).astype(np.float64)
    eff = np.abs(np.moveaxis(effective_weight(g, layer), layer.out_axis, 0))
    per = eff.reshape(eff.shape[0], -1).max(1)
    c = _active_channel(per, rng)
    factor = strength * per.max() / per[c]
    sl = [slice(None)] * w.ndim
    sl[layer.out_axis] = c
    w[tuple(sl)] *= factor
    g.set_const(layer.weight, w)
    detail = (
        f"output channel {c} of {layer.weight} x{factor:.3g} (max|w| {strength:.0f} x the tensor's)"
    )
    return m, _fault(site, "weight_channel", strength, layer.rows, detail)


def plant_act_outlier_scale(
    model, site: Site, strength: float, rng
) -> tuple[onnx.ModelProto, Fault]:
    """Channel c of an activation K x larger than the tensor's range, undone by its consumers."""
    m, g = _copy(model)
    src, r = _rebind(g, site)
    st = site.probe.stats()[site.tensor]
    c = _active_channel(st.chan_absmax, rng)
    f = np.ones(src.channels)
    f[c] = strength * st.absmax / st.chan_absmax[c]
    edits.scale_channels(g, src, f)
    for layer in r.consumers:
        edits.undo_scale(g, layer, f)
    detail = f"channel {c} of {site.tensor} x{f[c]:.3g} ({site.variant}); undone in " + ", ".join(
        layer.name for layer in r.consumers
    )
    fault = _fault(site, "act_outlier_scale", strength, src.rows + r.through, detail)
    fault.checked = [layer.out for layer in r.consumers]
    return m, fault


def plant_act_outlier_offset(
    model, site: Site, strength: float, rng
) -> tuple[onnx.ModelProto, Fault]:
    """Channel c of an activation shifted by K x the tensor's range, undone in the 1x1 consumers' bias."""
    m, g = _copy(model)
    src, r = _rebind(g, site, offset=True)
    st = site.probe.stats()[site.tensor]
    c = _active_channel(st.chan_absmax, rng)
    delta = np.zeros(src.channels)
    delta[c] = strength * st.absmax
    edits.offset_channels(g, src, delta)
    for layer in r.consumers:
        edits.undo_offset(g, layer, delta)
    detail = (
        f"channel {c} of {site.tensor} {delta[c]:+.4g} ({site.variant}); undone in "
        + ", ".join(layer.name for layer in r.consumers)
    )
    # the tensors after residual Adds carry the same offset channel and its blown range
    fault = _fault(site, "act_outlier_offset", strength, src.rows + r.through, detail)
    fault.checked = [layer.out for layer in r.consumers]
    return m, fault


def plant_conv_pair_scaled(
    model, site: Site, strength: float, rng
) -> tuple[onnx.ModelProto, Fault]:
    """Producer channel c divided by K', its consumer's weights of input channel c times K'.

    The culprit is the *consumer*: its weights of channel c now reach K x its other weights,
    so per-tensor weight quantization loses the rest, and it multiplies the producer's
    quantization noise on that (now small) channel by K'. The producer's own output barely
    changes its error (one channel got smaller), so naming it would be a miss.
    """
    m, g = _copy(model)
    src, r = _rebind(g, site)
    consumer = r.consumers[0]
    st = site.probe.stats()[site.tensor]
    w2 = np.abs(effective_weight(g, consumer))
    axis = consumer.out_axis if consumer.kind == "depthwise" else consumer.in_axis
    per_in = np.moveaxis(w2, axis, 0).reshape(w2.shape[axis], -1).max(1)
    # a channel that carries signal and that the consumer really uses
    used = (per_in >= np.median(per_in)) & (per_in > 0)
    candidates = np.flatnonzero(used & (st.chan_absmax >= np.median(st.chan_absmax)))
    c = int(rng.choice(candidates if candidates.size else np.flatnonzero(used)))
    k = strength * w2.max() / per_in[c]
    f = np.ones(src.channels)
    f[c] = 1.0 / k
    edits.scale_channels(g, src, f)
    edits.undo_scale(g, consumer, f)
    detail = f"channel {c} of {site.tensor} /{k:.3g}; {consumer.weight} input channel {c} x{k:.3g}"
    fault = _fault(site, "conv_pair_scaled", strength, consumer.rows, detail, node=consumer.name)
    fault.checked = [consumer.out]
    return m, fault


def plant_concat_unbalanced(
    model, site: Site, strength: float, rng
) -> tuple[onnx.ModelProto, Fault]:
    """One Concat input K x larger than the others, undone in the Concat's consumers.

    The Concat's single output encoding must cover the big input, so the other inputs lose
    their precision there: the Concat is the culprit. The input is scaled through the layer
    producing it when that is exact (see :mod:`benchmarks.zoo.edits`), else by a Mul by K
    inserted in front of the Concat (a uniform scale costs that Mul no precision).
    """
    m, g = _copy(model)
    concat = g.node(site.node)
    stats = site.probe.stats()
    others = [stats[t].absmax for t in concat.input if t != site.tensor]
    k = strength * max(others) / stats[site.tensor].absmax
    found = _branch_source(g, site.probe, site.tensor) if site.source is not None else None
    if found is not None:
        src = found[0]
        f = np.full(src.channels, k)
        edits.scale_channels(g, src, f)
    else:
        scaled = f"{site.tensor}__zoo_x{k:.3g}"
        const = g.add_init(f"{concat.name}__zoo_scale", np.array(k, np.float32))
        mul = onnx.helper.make_node(
            "Mul", [site.tensor, const], [scaled], name=f"{concat.name}__zoo_branch_scale"
        )
        at = list(m.graph.node).index(concat)
        m.graph.node.insert(at, mul)
        for i, t in enumerate(concat.input):
            if t == site.tensor:
                concat.input[i] = scaled
        g.refresh()
        f = np.full(stats[site.tensor].shape[site.source_axis()], k)
    r = edits.reach(g, concat.output[0])
    for layer in r.consumers:
        edits.undo_scale(g, layer, f, first=site.concat_offset)
    detail = f"{site.variant}: {site.tensor} x{k:.3g}; undone in " + ", ".join(
        layer.name for layer in r.consumers
    )
    fault = _fault(site, "concat_unbalanced", strength, [concat.output[0], *r.through], detail)
    fault.checked = [layer.out for layer in r.consumers]
    return m, fault


def plant_clipping(model, site: Site, strength: float, rng) -> tuple[onnx.ModelProto, Fault]:
    """The encoding of one layer output narrowed to ``strength`` x its calibrated range (-qo)."""
    m, g = _copy(model)
    layer = layer_of(g, g.node(site.node))
    st = site.probe.stats()[layer.out]
    lo = st.lo * strength if st.lo < 0 else 0.0
    hi = st.hi * strength
    v = site.probe.first(layer.out)
    clipped = float(np.mean((v < lo) | (v > hi)))
    overrides = {
        "version": "0.6.1",
        "activation_encodings": {
            layer.out: [
                {"bitwidth": 8, "dtype": "int", "is_symmetric": "False", "min": lo, "max": hi}
            ]
        },
        "param_encodings": {},
    }
    detail = (
        f"{layer.out} encoding [{lo:.4g}, {hi:.4g}] of calibrated [{st.lo:.4g}, {st.hi:.4g}]: "
        f"{100 * clipped:.2f}% of the debugged input's values clipped"
    )
    fault = _fault(site, "clipping", strength, layer.chain, detail)
    fault.overrides = overrides
    return m, fault


def plant_backend_divergence(
    model, site: Site, strength: float, rng
) -> tuple[onnx.ModelProto, Fault]:
    """K x C zero channels padded onto a convolution's input, its weights for them copies of
    channels it uses: in float they add nothing. QNN HTP fills the new channels with the
    integer 0, which is the activation's minimum, not 0, in the 8-bit encoding Pad shares with
    its input (found in MediaPipe's hand re-crop model, where onnxruntime's CPU fake-quant of
    the same QDQ model is right). The Pad is the culprit: fed QNN's own input it computes
    something else; the convolution after it computes right what it is given.

    Measured on small models: after a Conv, HTP is wrong when the new channels fit in the last
    block of 32 channels (8 + 24 channels wrong, 8 + 25 right), and right on a graph input. A
    planting it computes right costs the outputs nothing, and the harm gate leaves it out."""
    m, g = _copy(model)
    node = g.node(site.node)
    layer = layer_of(g, node)
    w = g.const(layer.weight)
    per_in = np.abs(w).max(axis=(0, 2, 3))
    k = max(1, int(round(strength * w.shape[1])))
    copied = rng.choice(np.flatnonzero(per_in >= np.median(per_in)), size=k)
    g.set_const(layer.weight, np.concatenate([w, w[:, copied]], axis=1), reshape=False)
    pads = g.add_init(
        f"{node.name}__zoo_channel_pads", np.array([0, 0, 0, 0, 0, k, 0, 0], np.int64)
    )
    padded = f"{site.tensor}__zoo_padded"
    pad = onnx.helper.make_node(
        "Pad", [site.tensor, pads], [padded], name=f"{node.name}__zoo_channel_pad", mode="constant"
    )
    m.graph.node.insert(list(m.graph.node).index(node), pad)
    node.input[0] = padded
    g.refresh()
    lo = site.probe.stats()[site.tensor].lo
    detail = (
        f"{site.tensor} padded with {k} zero channels before {node.name} (its weights for them "
        f"copy input channels {sorted(set(copied.tolist()))[:6]}); on HTP they read {lo:.4g}, "
        "the encoding's minimum"
    )
    fault = _fault(site, "backend_divergence", strength, [padded], detail, node=pad.name)
    fault.checked = [layer.out]
    return m, fault


def plant_clean(model, site: Site | None, strength: float, rng) -> tuple[onnx.ModelProto, Fault]:
    m, _ = _copy(model)
    return m, Fault("", "clean", "-", "", "", 0.0, [], "the model as shipped")


def _rebind(g: Graph, site: Site, offset: bool = False) -> tuple[Source, edits.Reach]:
    """The site's source and consumers, found again in the copy being changed."""
    ra = (site.source.rank, site.source.axis, site.source.channels)
    shapes = {k: v.shape for k, v in site.probe.stats().items()}
    return (
        edits.find_source(g, site.tensor, *ra),
        edits.reach(g, site.tensor, offset=offset, shapes=shapes),
    )


def _fault(site: Site, kind: str, strength: float, culprits, detail: str, node=None) -> Fault:
    seen: list[str] = []
    for c in culprits:
        if c not in seen:
            seen.append(c)
    return Fault("", kind, "", node or site.node, site.variant, float(strength), seen, detail)


PLANTERS: dict[str, Callable] = {
    "weight_outlier": plant_weight_outlier,
    "weight_channel": plant_weight_channel,
    "act_outlier_scale": plant_act_outlier_scale,
    "act_outlier_offset": plant_act_outlier_offset,
    "conv_pair_scaled": plant_conv_pair_scaled,
    "concat_unbalanced": plant_concat_unbalanced,
    "clipping": plant_clipping,
    "backend_divergence": plant_backend_divergence,
    "clean": plant_clean,
}


def check_float(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: Sequence[dict[str, np.ndarray]],
    extra: Sequence[str] = (),
) -> float:
    """Largest change of the float outputs (and ``extra`` tensors, e.g. the outputs of the
    layers that undo the change: a saturated softmax output alone would hide a wrong
    compensation) relative to their scale, on every input."""
    return output_change(run(before, feeds, extra), run(after, feeds, extra))


@dataclass
class Planted:
    model: onnx.ModelProto
    fault: Fault
    site: Site | None = None
    notes: list[str] = field(default_factory=list)


STRONGER = (1.0, 2.0, 4.0)  # a planting the outputs do not feel is made this much stronger...
SITE_TRIES = 3  # ...at up to this many sites nearest its depth, before the case is left out


def site_key(site: Site) -> str:
    return f"{site.node}:{site.tensor}"


def plant(
    model_name: str,
    model: onnx.ModelProto,
    kind: str,
    depth: str,
    probe: FloatProbe,
    feeds: Sequence[dict[str, np.ndarray]],
    seed: int = 0,
    harm: Callable[[onnx.ModelProto, dict | None], float] | None = None,
    taken: Collection[str] = (),
) -> Planted | None:
    """One case; None when the model has no eligible site for the kind. A compensated planting
    that changes the float outputs comes back with ``fault.excluded`` set.

    ``harm(model, overrides)`` is what a planting costs the quantized outputs, in dB (a
    :class:`benchmarks.zoo.harm.HarmMeter`'s ``loss``). Given it, a planting that costs less
    than :data:`~benchmarks.zoo.harm.HARM_DB` is planted again ``STRONGER`` (the same weight
    or channel; a clipping range narrower), then at the next sites nearest the depth, and is
    left out (``fault.excluded``) when none hurts. ``taken``: :func:`site_key` of the sites
    other depths of the kind hold already."""
    if kind == "clean":
        m, fault = plant_clean(model, None, 0.0, case_rng(model_name, kind, depth, seed))
        fault.model, fault.depth = model_name, "-"
        return Planted(m, fault)
    sites = [s for s in candidate_sites(model, probe, kind, depth) if site_key(s) not in taken]
    if not sites:
        return None
    tried: list[str] = []
    planted = None
    ran = 0  # sites whose planting the pipeline took (one it refuses is not a try)
    for site in sites:
        if ran == (SITE_TRIES if harm else 1):
            break
        ran += 1
        site.probe = probe
        for step in STRONGER if harm else (1.0,):
            planted = _plant_at(model_name, model, kind, depth, site, step, feeds, seed)
            if planted.fault.excluded:
                break  # the float model changed: not this site
            if harm is None:
                return planted
            try:
                loss = harm(planted.model, planted.fault.overrides)
            except AccdbgError as exc:  # e.g. a clipped tensor QNN's pre-processing fuses away
                tried.append(f"{site.node}: {exc}")
                ran -= 1
                break  # not this site
            tried.append(f"{site.node} x{step:g}: {loss:.1f} dB")
            planted.fault.harm_db, planted.fault.tries = loss, list(tried)
            if loss >= HARM_DB:
                return planted
    if tried and planted is not None:
        planted.fault.excluded = (
            f"the outputs do not feel it on QNN (< {HARM_DB:g} dB): {'; '.join(tried)}"
        )
    return planted


def _plant_at(
    model_name: str,
    model: onnx.ModelProto,
    kind: str,
    depth: str,
    site: Site,
    step: float,
    feeds: Sequence[dict[str, np.ndarray]],
    seed: int,
) -> Planted:
    """The case's planting at one site, its drawn strength made ``step`` times stronger."""
    rng = case_rng(model_name, kind, depth, seed)
    lo, hi = STRENGTH[kind]
    strength = float(rng.uniform(lo, hi)) if hi > lo else lo
    strength = strength / step if kind == "clipping" else strength * step
    m, fault = PLANTERS[kind](model, site, strength, rng)
    fault.model, fault.depth = model_name, depth
    computing = [i for i, n in enumerate(model.graph.node) if n.op_type != "Constant"]
    fault.relative_depth = sum(i <= site.position for i in computing) / len(computing)
    if kind in FLOAT_UNCHANGED:
        fault.float_change = check_float(model, m, feeds, fault.checked)
        if not fault.float_change <= FLOAT_RTOL:
            fault.excluded = (
                f"float output changed by {fault.float_change:.3g} of its scale (> {FLOAT_RTOL})"
            )
    onnx.checker.check_model(m)
    return Planted(m, fault, site)
