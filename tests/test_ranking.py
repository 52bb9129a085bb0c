"""The culprit ranking: per-channel scores, quantization evidence, noise floor, verdict.

Unit tests check the numbers against numpy formulas written here; the end-to-end tests run
the real QNN backend on synthetic models whose culprit is known by construction.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest

from accdbg.algorithms.diagnosis import ranking as ranking_mod
from accdbg.algorithms.diagnosis.evidence import Evidence, qdq
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranking import ContextCheck, KernelsAdded, rank
from accdbg.algorithms.diagnosis.reach import Reach
from accdbg.algorithms.diagnosis.sensitivity import Share
from accdbg.algorithms.oneshot import run_oneshot
from accdbg.core.imports import qnn_quantization
from accdbg.core.inputs import parse_input_tensor
from accdbg.verifiers import get_verifier
from accdbg.verifiers.channels import ChannelPair, channel_axis, live, summarize
from tests import models
from tests.ranking_stubs import Impact as _Impact
from tests.ranking_stubs import chain as _chain
from tests.ranking_stubs import evidence as _ev

ADDS_90 = KernelsAdded("out", 0.1, 0.01)  # QNN ten times as far from float as the CPU


def _db(nsr: float) -> float:
    return -10 * math.log10(nsr)


def test_one_loud_channel_hides_in_the_tensor_score_not_in_the_channel_median():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((1, 8, 6, 6))
    g[0, 0] *= 100.0  # one channel carries almost all the power
    t = g + rng.standard_normal(g.shape) * 0.3  # the same absolute noise everywhere
    sqnr = get_verifier("SQNR")
    per_tensor = sqnr(g, t).value
    pair = ChannelPair.of(g, t, channel_axis(g.shape, "NCHW"))
    per_ch = sqnr.per_channel(pair)
    stats = summarize(per_ch, live(pair.gg), True)
    expected = [
        10 * np.log10((g[0, c] ** 2).sum() / ((g[0, c] - t[0, c]) ** 2).sum()) for c in range(8)
    ]
    assert per_ch == pytest.approx(expected)
    assert stats["ch_median"] == pytest.approx(np.median(expected))
    assert stats["ch_worst"] == pytest.approx(min(expected))
    assert per_tensor > stats["ch_median"] + 25  # the tensor score hides the crushed channels


def test_channel_axis_from_layout_and_rank():
    assert channel_axis((1, 16, 8, 8), "NCHW") == 1
    assert channel_axis((1, 8, 8, 16), "NHWC") == 3
    assert channel_axis((1, 16, 8, 8)) == 1
    assert channel_axis((1, 40, 120), None, "MatMul") == 2  # [batch, sequence, features]
    assert channel_axis((1, 40, 120), None, "Conv") == 1
    assert channel_axis((1, 16, 1, 1)) is None  # one value per channel: nothing to score
    assert channel_axis((1, 10)) is None


def test_qdq_matches_onnx_quantize_dequantize():
    from onnx import TensorProto, helper

    x = np.linspace(-3, 9, 101, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [101])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [101])],
        [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.03]),
            helper.make_tensor("z", TensorProto.UINT8, [], [17]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x})
    ours = qdq(x.astype(np.float64), np.float32(0.03), 17, np.dtype(np.uint8))
    assert ours == pytest.approx(y.astype(np.float64), abs=1e-6)


def test_clean_model_names_no_layer():
    rng = np.random.default_rng(1)
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 35 + rng.normal(0, 3)) for n in names}
    r = rank(ev, names, impact=_Impact({}))
    assert r.culprits == []
    assert r.findings[0].startswith("no single layer stands out")
    assert all(r.columns[n].get("culprit_rank") is None for n in names)


@pytest.mark.parametrize(
    "per_channel, bits, advice",
    [
        ((False, True), (8, 8), "per-channel weights, 16-bit activations, calibration"),
        ((True, True), (8, 16), "16-bit activations, calibration"),
        ((False, True), (16, 16), "per-channel weights, calibration"),
        ((True, True), (16, 16), "calibration"),
        ((None, None), (0, 0), "per-channel weights, 16-bit activations, calibration"),
    ],
)
def test_the_diffuse_verdict_leaves_out_the_changes_the_model_already_has(
    per_channel, bits, advice
):
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 35 + (i % 5)) for i, n in enumerate(names)}
    for i, n in enumerate(names):  # the first layer as given, the others as the second
        ev[n].weight_per_channel = per_channel[i > 0]
        ev[n].output_bits = bits[i > 0]
    (line,) = [f for f in rank(ev, names).findings if f.startswith("no single layer")]
    assert line.endswith(f"a global change ({advice}) is the question, not a layer")


def test_a_standout_is_named_only_when_it_reaches_the_outputs():
    rng = np.random.default_rng(2)
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 36 + rng.normal(0, 2)) for n in names}
    ev["l10"] = _ev("l10", 1.0)  # destroyed, reaches the outputs a little
    ev["l20"] = _ev("l20", 14.0)  # bad locally, drowned by the rest
    ev["l30"] = _ev("l30", 15.0)  # bad locally, most of the output error
    r = rank(ev, names, impact=_Impact({"l10": 0.08, "l20": 0.1, "l30": 0.7}))
    # ordered by what they cost the outputs (70 % against 8 %), not by their local SQNR
    assert [c.name for c in r.culprits] == ["l30", "l10"]
    assert r.columns["l20"].get("culprit_rank") is None
    assert (
        "costs the outputs only 10% of the whole model's error (alone 10%"
        in (r.columns["l20"]["cause"])
    )
    assert r.findings[0].startswith("culprit #1: l30 (Conv) - weight range")
    assert r.findings[1].startswith("culprit #2: l10 (Conv) - weight range")
    # the most either costs is 70 %: the rest of the error is the model's own
    assert r.findings[2] == (
        "the culprits named cost the outputs at most 70% of their error; the rest is spread "
        "over the model: for it a global change (per-channel weights, 16-bit activations, "
        "calibration) is the question"
    )
    # the same cost: the one whose encodings destroy more comes first
    r = rank(ev, names, impact=_Impact({"l10": 0.7, "l20": 0.1, "l30": 0.7}))
    assert [c.name for c in r.culprits] == ["l10", "l30"]
    # one that costs 90 %: its fix is the question, nothing more is said
    r = rank(ev, names, impact=_Impact({"l10": 0.08, "l20": 0.1, "l30": 0.9}))
    assert not any("spread over the model" in f for f in r.findings)
    # without l30, none is named: the verdict says which standout came closest, and how close;
    # at a quarter of the error or more that is no noise at the floor, and it is not called so
    for l30, verdict in (
        (
            0.3,
            "the one nearest, l30, costs the outputs 30% of their error, under the half a culprit "
            "causes (see its cause): its fix alone would gain under 3 dB - a global change",
        ),
        (
            0.2,
            "the error is diffuse at the noise floor's level (the layers that stand out locally "
            "cost the outputs less than half of their error - the most, l30, 20%: see its cause)",
        ),
    ):
        r = rank(ev, names, impact=_Impact({"l10": 0.01, "l20": 0.1, "l30": l30}))
        assert r.culprits == []
        assert r.findings[0].startswith(f"no single layer stands out: {verdict}"), r.findings[0]
    # standouts that cost the outputs next to nothing: no "most" named at 0% (captcha's CRNN)
    r = rank(ev, names, impact=_Impact({"l10": 0.01, "l20": 0.004, "l30": 0.02}))
    assert r.culprits == []
    assert (
        "layers that stand out locally each cost the outputs under 5% of their error)"
        in (r.findings[0])
    ), r.findings[0]


def test_the_models_only_standout_is_named_from_a_quarter_of_the_error():
    """Every other layer at the floor: the rest of the error is spread thin, so the one layer
    standing out is named from a quarter of it (and the verdict says the rest is the model's
    own); beside another standout it needs half."""
    rng = np.random.default_rng(6)
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 36 + rng.normal(0, 2)) for n in names}
    ev["l20"] = _ev("l20", 12.0)
    r = rank(ev, names, impact=_Impact({"l20": 0.3}))
    assert [c.name for c in r.culprits] == ["l20"]
    assert r.culprits[0].cause.endswith(
        "; the model's only standout: every other layer sits at its noise floor"
    )
    assert any(f.startswith("the culprits named cost the outputs at most 30%") for f in r.findings)
    r = rank(ev, names, impact=_Impact({"l20": 0.2}))
    assert (
        r.culprits == []
        and "cost the outputs less than a quarter of their error" in (r.findings[0])
    )
    ev["l30"] = _ev("l30", 13.0)  # a second standout of its own
    r = rank(ev, names, impact=_Impact({"l20": 0.3, "l30": 0.1}))
    assert r.culprits == [] and "the one nearest, l20, costs the outputs 30%" in r.findings[0]


def test_a_standout_that_hurts_only_with_the_other_encodings_is_named():
    """Quantized alone on the float model a layer may cost the outputs nothing, yet taking its
    quantizers out of the whole QDQ model removes most of the error (a channel it crushes
    that the next layer's weights amplify): that second measure names it too, and is asked
    only when the first does not settle it."""
    rng = np.random.default_rng(5)
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 36 + rng.normal(0, 2)) for n in names}
    ev["l10"] = _ev("l10", 12.0)
    ev["l20"] = _ev("l20", 12.5)
    asked = []

    def impact(n, enough=math.inf):
        asked.append((n, enough))
        alone = {"l10": 0.02, "l20": 0.03}[n]
        return Share(alone, {"l10": 0.8, "l20": 0.1}[n])

    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert "causes 80% of the outputs' error (alone 2%)" in r.culprits[0].cause
    assert r.columns["l10"]["output error removed"] == pytest.approx(0.8)
    assert "(alone 3%, taken out of the quantized model 10%)" in r.columns["l20"]["cause"]
    assert asked == [("l10", 0.5), ("l20", 0.5)]  # the bar each measure is held to


def test_a_layer_whose_fix_would_not_show_is_not_named_and_the_verdict_says_why():
    """Quantized alone a layer costs 90 % of the outputs' error, yet taking its quantizers out
    of the whole QDQ model removes nothing (the rest of the model destroys the same
    information - seen on PP-OCRv3 rec as shipped, where per-channel weights for that layer
    alone gain nothing on QNN): fixing it would not show, so it is not named; its cause and
    the findings say what it costs each way. The second measure, skipped when the first
    settled the verdict, is asked for that; a layer whose removal shows stays named."""
    names, ev = _chain(7)
    ev["l10"] = _ev("l10", 12.0, inputs=["l9"])
    ev["l20"] = _ev("l20", 12.5, inputs=["l19"])
    measured = {"l10": Share(0.9, -0.08), "l20": Share(0.8, 0.6)}

    def impact(n, enough=math.inf):
        # the first measure settles the verdict: the second comes only when asked for it
        return measured[n] if math.isinf(enough) else Share(measured[n].alone)

    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l20"]
    assert "mask" not in r.culprits[0].cause
    cause = r.columns["l10"]["cause"]
    assert "costs the outputs 90% of the whole model's error alone" in cause
    assert "the other layers' errors mask its own" in cause
    assert "(alone 90%, taken out of the quantized model -8%)" in cause
    assert r.columns["l10"]["output error removed"] == pytest.approx(-0.08)
    assert "culprit_rank" not in r.columns["l10"]
    assert any(f.startswith("l10 costs the outputs 90% of their error alone") for f in r.findings)
    # alone it is masked: no culprit, and the verdict does not call the error diffuse
    measured.pop("l20")
    ev.pop("l20")
    r = rank(ev, [n for n in names if n != "l20"], impact=impact)
    assert r.culprits == []
    assert r.findings[0].startswith("no single layer stands out: no one layer's fix would show")
    # a layer whose encoding destroys its information (4 dB: its median channel mostly noise)
    # is named whatever masks it - PP-OCRv3 rec with an output clipped to a quarter of its range
    ev["l10"] = _ev("l10", 4.0, inputs=["l9"], owner="output")
    r = rank(ev, [n for n in names if n != "l20"], impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert (
        "mask its own" in r.culprits[0].cause
        and "until theirs are fixed too" in r.culprits[0].cause
    )


def test_a_layer_losing_only_its_weights_rounding_is_named_by_what_its_fix_removes():
    """A layer whose only loss is its weights' rounding (a wide output channel of its own
    weights, per-tensor; its output keeps its range) costs 131 % of the outputs' error alone
    and removes 20 % taken out of the whole QDQ model - MediaPipe's pose detector as shipped:
    its error travels through no other layer's range, so taken out is what its fix removes,
    and under a quarter that fix does not carry the outputs: not named; weights destroying
    their median channel (4 dB) are named once their fix shows at all. The same figures on a layer whose output range is its
    loss keep it named (an outlier it makes blows the ranges after it, which taking out its
    own quantizers leaves in place), and so does the weights-only layer removing 30 % - or one whose range a few outlier weights
    blow (they also multiply the error their input channel brings)."""
    names, ev = _chain(7)

    def impact(n, enough=math.inf):
        return Share(1.31, 0.20)

    ev["l10"] = _ev("l10", 12.0, inputs=["l9"])
    ev["l10"].weight_outlier = "output channel"
    r = rank(ev, names, impact=impact)
    assert r.culprits == []
    cause = r.columns["l10"]["cause"]
    assert "its weights' rounding is all it loses" in cause
    assert "(alone all (+1.2 dB), taken out of the quantized model 20%)" in cause
    assert any(
        f.startswith("l10 costs the outputs all (+1.2 dB) of their error alone") for f in r.findings
    )
    # a few weights far beyond the rest blow it instead (MediaPipe's hand_landmark_full with a
    # planted weight 48x its tensor's largest in the last dense layer: 52 % alone, 24 % taken
    # out): such a weight multiplies the error its input channel brings from upstream, which
    # taking its quantizers out leaves in place - held to the usual bars, it is named
    hand = lambda n, enough=math.inf: Share(0.52, 0.24)  # noqa: E731
    assert rank(ev, names, impact=hand).culprits == []  # its own channel: under a quarter
    ev["l10"].weight_outlier, ev["l10"].few_outliers = "weight", 3
    assert [c.name for c in rank(ev, names, impact=hand).culprits] == ["l10"]
    assert [c.name for c in rank(ev, names, impact=impact).culprits] == ["l10"]
    # weights that destroy their information (4 dB) are named once their fix shows at all
    # (a dead channel 1000x the rest in PP-OCRv4 det: 13 % taken out), not when it removes
    # nothing (2 %)
    ev["l10"] = _ev("l10", 4.0, inputs=["l9"])
    assert [c.name for c in rank(ev, names, impact=impact).culprits] == ["l10"]
    assert rank(ev, names, impact=lambda n, enough=math.inf: Share(1.31, 0.02)).culprits == []
    # its output's range is what it loses: taken out leaves the ranges its outlier blew
    ev["l10"] = _ev("l10", 12.0, inputs=["l9"], owner="output")
    assert [c.name for c in rank(ev, names, impact=impact).culprits] == ["l10"]
    # a pair's reader (an input channel its producer shrank) is measured with that producer
    ev["l10"] = _ev("l10", 12.0, inputs=["l9"])
    ev["l10"].weight_outlier = "input channel"
    assert "l10" in [c.name for c in rank(ev, names, impact=impact).culprits]
    ev["l10"].weight_outlier = "output channel"
    r = rank(ev, names, impact=lambda n, enough=math.inf: Share(1.31, 0.30))
    assert [c.name for c in r.culprits] == ["l10"]


def test_layers_that_mask_each_other_are_one_problem_measured_together():
    """Three layers each cost the whole model's error alone and none removes anything taken
    out (each one's error masks the others' - PP-OCRv3-like per-tensor weight channels in
    several layers): none is named; the findings name the three, what taking them out
    together removes (one more measure), and the one change that treats their common loss."""
    names, ev = _chain(7)
    for n in ("l10", "l20", "l30"):
        ev[n] = _ev(n, 12.0, inputs=[f"l{int(n[1:]) - 1}"])
    asked = []

    def impact(n, enough=math.inf):
        asked.append(tuple(n) if isinstance(n, list) else n)
        return Share(0.7, 0.85) if isinstance(n, list) else Share(1.1, 0.01)

    r = rank(ev, names, impact=impact)
    assert r.culprits == []
    assert ("l10", "l20", "l30") in asked
    line = next(f for f in r.findings if f.startswith("3 layers each cost"))
    assert "(l10 all (+0.4 dB), l20 all (+0.4 dB), l30 all (+0.4 dB))" in line
    assert "taken out together they remove 85%" in line
    # the stubs lose their weights' range: per-channel weights is the change for all three
    assert "(per-channel weight encodings for them, or a global change, is the question)" in line


def test_a_layer_whose_outlier_wrecks_its_carriers_is_named_with_them():
    """One quantizer at a time, neither the layer that makes an outlier channel nor the layers
    carrying it explain the outputs' loss; quantized together they do: the maker is named, the
    carriers are not, and the cause says both shares."""
    names, ev = _chain(3)
    ev["l10"] = _ev("l10", 12.0, inputs=["l9"])  # the maker: a weight outlier
    for n, prev in (("l11", "l10"), ("l12", "l11")):  # carriers: their output range is blown
        ev[n] = Evidence(n, "Conv", [prev], output_nsr=10 ** (-11 / 10), output_note="range")
    impact = _Impact({"l10": 0.05, ("l10", "l11", "l12"): 0.9})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert ("l10", "l11", "l12") in impact.asked  # measured as a group only after alone failed
    assert "reaches l11, l12" in r.culprits[0].cause
    assert "costs the outputs 90%" in r.culprits[0].cause and "(alone 5%)" in r.culprits[0].cause
    assert r.columns["l11"]["cause"] == "activation outlier carried in from l10"
    assert r.columns["l12"]["cause"] == "activation outlier carried in from l11"
    # the same layers, with a group that does not matter either: nothing is named
    r = rank(ev, names, impact=_Impact({"l10": 0.05, ("l10", "l11", "l12"): 0.1}))
    assert r.culprits == []
    assert (
        "only 5% of the whole model's error (alone 5%) "
        "(with the 2 layer(s) carrying its outlier 10%)" in (r.columns["l10"]["cause"])
    )
    # the verdict gives the most a standout was measured to cost: here with its carriers
    assert (
        "the most, l10 with the 2 layer(s) carrying its outlier, 10%: see its cause"
        in (r.findings[0])
    )
    # the group's share has a column of its own; the layers measured with it have none
    assert r.columns["l10"]["output error with partners"] == pytest.approx(0.1)
    assert all("output error with partners" not in r.columns.get(n, {}) for n in ("l11", "l12"))
    r = rank(ev, names, impact=_Impact({"l10": 0.2, ("l10", "l11", "l12"): 0.1}))
    assert "the most, l10, 20%: see its cause" in r.findings[0]  # alone it costs more
    # a model of several outputs: the group's share says its output when the layer's is another
    shares = {
        "l10": Share(0.05, 0.02, "boxes", "boxes"),
        ("l10", "l11", "l12"): Share(0.9, 0.4, "scores", "boxes"),
    }
    cause = rank(ev, names, impact=_Impact(shares)).culprits[0].cause
    group = "with them it costs the outputs 90% of the whole model's error at the output scores ("
    assert group in cause
    assert "(alone 5%, taken out of the quantized model 2%; of the output boxes's error)" in cause
    shares[("l10", "l11", "l12")] = Share(0.9, 0.4, "boxes", "boxes")
    cause = rank(ev, names, impact=_Impact(shares)).culprits[0].cause
    assert "90% of the whole model's error (alone 5%" in cause  # said once, at the end


def test_a_compensated_pair_is_measured_with_the_producer_whose_channel_it_amplifies():
    """A layer whose weight range one input channel blows (the producer shrank that channel,
    the weights scale it back) hurts only with the producer's encoding, which has few levels for
    the shrunk channel: measured alone neither matters, together they are named (the weights'
    side, whose loss is local)."""
    names, ev = _chain(4)
    ev["l10"] = _ev("l10", 9.0, inputs=["l9"])
    ev["l10"].weight_outlier = "input channel"
    impact = _Impact({"l10": Share(0.2, -0.3), ("l10", "l9"): 0.8})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert impact.asked == ["l10", ("l10", "l9")]
    assert "l9 shrinks the channel these weights amplify" in r.culprits[0].cause
    assert "costs the outputs 80%" in r.culprits[0].cause
    # an output-channel outlier is the weights' own: no partner is asked
    ev["l10"].weight_outlier = "output channel"
    impact = _Impact({"l10": Share(0.2, -0.3), ("l10", "l9"): 0.8})
    assert rank(ev, names, impact=impact).culprits == []
    assert impact.asked == ["l10"]


def test_weights_multiplying_an_offset_name_the_layer_that_makes_the_offset():
    """A channel carrying a large constant (an offset the next bias cancels in float) blows its
    maker's range only mildly, but the consumer's weights multiply their rounding by it: the
    consumer stands out, the maker is named for it - as severe as the consumer - and the
    consumer's cause says where the offset comes from."""
    names, ev = _chain(6)
    ev["l10"] = _ev("l10", 30.0, inputs=["l9"])  # the maker: within the floor's reach
    ev["l11"] = _ev("l11", 8.0, inputs=["l10"])
    ev["l11"].offset_from = "l10"
    ev["l30"] = _ev("l30", 9.0, inputs=["l29"])  # another culprit, costing the outputs less
    impact = _Impact({"l10": 0.1, ("l10", "l11"): 0.7, "l30": 0.6})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10", "l30"]  # l10 with l11: 70 %, l30: 60 %
    assert r.columns["l11"]["cause"].startswith(
        "its weights' rounding multiplies the offset carried in from l10"
    )
    assert "reaches l11: with them it costs the outputs 70%" in r.culprits[0].cause
    assert r.columns["l11"].get("culprit_rank") is None


def test_an_activation_range_blown_by_a_channel_the_weights_before_it_make_names_those_weights():
    """A conv whose weights for one output channel span 50x the others makes that channel
    loud; on this input its own range loses little (30 dB, within the floor), the activation
    after it (same channels) loses its range to that channel (11 dB). The weights are the
    cause: they are named, measured with the activation, and the activation's cause says so.
    Weights whose widest channel is another one, or not an outlier, are not blamed."""
    names, ev = _chain(8)
    ev["l10"] = _ev("l10", 30.0, inputs=["l9"])
    ev["l10"].channels, ev["l10"].loud_weights, ev["l10"].loud_weights_ratio = 16, 5, 50.0
    act = Evidence("l11", "PRelu", ["l10"], output_nsr=10 ** (-11 / 10), output_note="range")
    act.channels, act.loud_channel, act.loud_ratio = 16, 5, 40.0
    ev["l11"] = act
    shares = {"l10": 0.1, ("l10", "l11"): 0.8, "l11": 0.3}
    impact = _Impact(shares)
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert ("l10", "l11") in impact.asked
    assert (
        "which the weights of l10 make loud (their output channel 5 spans 50x"
        in (r.columns["l11"]["cause"])
    )
    assert r.columns["l11"].get("culprit_rank") is None
    # another channel is the weights' widest, or their widest is no outlier: the activation's own
    for channel, ratio in ((6, 50.0), (5, 3.0)):
        ev["l10"].loud_weights, ev["l10"].loud_weights_ratio = channel, ratio
        r = rank(ev, names, impact=_Impact({**shares, "l11": 0.8}))
        assert [c.name for c in r.culprits] == ["l11"]


def test_weights_far_under_the_other_weights_stand_out_where_an_outlier_drags_the_floor_down():
    """An outlier channel travelling through the model blows the range of most layers after its
    maker: their outputs keep 12 dB give or take 1, so the median local SQNR falls to about
    12 dB and the maker (output 11 dB, weights 19 dB: one output channel far wider than the
    rest) sits within the floor's 10 dB gap. Its weights stand out from every other layer's
    (36 dB give or take 2, which no outlier upstream touches): it is measured and named. A
    layer whose weights stand out as far but whose own encodings pass (22 dB) is not."""
    names, ev = _chain(seed=3, n=40)
    rng = np.random.default_rng(4)
    for x in names[11:]:  # the carriers: their output ranges blown
        ev[x].output_nsr, ev[x].output_note = 10 ** (-(12 + rng.normal(0, 1)) / 10), "range"
    maker, passing = names[10], names[5]
    ev[maker].weight_nsr, ev[maker].output_nsr, ev[maker].output_note = 10**-1.9, 10**-1.1, "r"
    ev[passing].weight_nsr = 10**-2.2
    local = [-10 * math.log10(ev[x].local_nsr) for x in names]
    med = float(np.median(local))
    assert 11 < med < 13 and 11.0 > med - 10  # by the median alone the maker would not stand out
    weights = [-10 * math.log10(ev[x].weight_nsr) for x in names]
    w_med = float(np.median(weights))
    w_spread = 1.4826 * float(np.median(np.abs(np.array(weights) - w_med)))
    assert 19.0 < 22.0 < w_med - min(max(3.5 * w_spread, 10), 15)  # both under the weights' cut
    impact = _Impact({maker: 0.9, passing: 0.9})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == [maker]
    assert passing not in impact.asked
    assert r.floor_db == pytest.approx(med)  # the floor reported is the local SQNR's, as before
    assert f"(19.0 dB against their median {w_med:.1f} dB)" in r.culprits[0].cause


def test_per_tensor_weights_over_a_trained_spread_are_the_models_question_not_a_culprit():
    """Two standouts whose only loss is their per-tensor weights' rounding (8 dB), each costing
    the outputs 70 % of their error. l25's widest output channel spans 30x the next widest -
    one channel alone beyond the others, as an outlier makes it: named. l10's spans 1.4x the
    next - the widest of a spread its channels have as trained, which per-channel weights
    answer: not named, its cause and a finding say why and what it costs. Alone, l10 leaves the
    verdict "no single layer stands out as a fault" with the global change - for a spread over
    input channels, cross-layer equalization; with per-channel weights already (their rounding
    then not the spread's) both are named."""
    names, ev = _chain(seed=7, n=40)
    for x, ratio in (("l10", 1.4), ("l25", 30.0)):
        ev[x].weight_nsr, ev[x].weight_per_channel = 10**-0.8, False
        ev[x].weight_outlier, ev[x].outlier_next = "output channel", ratio
    shares = {"l10": 0.7, "l25": 0.7}
    r = rank(ev, names, impact=_Impact(shares))
    assert [c.name for c in r.culprits] == ["l25"]
    cause = r.columns["l10"]["cause"]
    assert "spans 1.4x the next widest" in cause and "spread as trained" in cause, cause
    assert "costs the outputs 70%" in cause and "not named" in cause
    line = next(f for f in r.findings if "spread as trained" in f)
    assert "layer by layer, of their error: l10 70% -" in line and "per-channel weights" in line
    ev["l25"].outlier_next = 1.2  # now both are trained spreads
    r = rank(ev, names, impact=_Impact(shares))
    assert r.culprits == []
    assert r.findings[0].startswith("no single layer stands out as a fault"), r.findings
    assert "per-channel weights" in r.findings[0]
    assert "layer by layer, of their error: l10 70%, l25 70% -" in r.findings[1]
    # a spread over input channels: wide in every output channel alike, which per-channel
    # weights do not narrow - equalizing them with their producer does
    ev["l25"].weight_outlier = "input channel"
    r = rank(ev, names, impact=_Impact(shares))
    assert r.culprits == []
    assert "cross-layer equalization" in r.columns["l25"]["cause"]
    assert "cross-layer equalization" not in r.columns["l10"]["cause"]
    assert "per-channel weights answer it; cross-layer equalization answers l25" in r.findings[1]
    for x in ("l10", "l25"):
        ev[x].weight_per_channel = True
    assert [c.name for c in rank(ev, names, impact=_Impact(shares)).culprits] == ["l10", "l25"]


def test_an_output_whose_range_the_loudest_of_a_trained_spread_sets_is_not_a_culprit():
    """Two standouts whose only loss is their 8-bit output's range (9 dB), each costing the
    outputs 70 % of their error. l25's loudest channel reaches 30x as far as the next loudest
    - one channel alone, as an activation outlier makes it: named. l10's reaches 1.1x as far
    as the next - the loudest of a spread the channels have as trained (iris's
    depthwise_conv2d_2: 109 and 100 against a median channel's 5.6): not named, its cause and
    a finding say what it costs and that 16-bit activations answer it. A range every channel
    fills alike (the loudest 2x the median) is no spread of channels: named. The loudest
    channel blowing the ranges of the layers after it changes nothing (the spread travels as
    trained); a lone channel doing so is named with them, and so is a spread whose reader's
    weights scale that channel back (a compensated pair)."""
    names, ev = _chain(seed=11, n=40)
    for x, ratio in (("l10", 1.1), ("l25", 30.0)):
        ev[x] = _ev(x, 9.0, ev[x].inputs, owner="output")
        ev[x].channels, ev[x].loud_channel, ev[x].loud_ratio = 32, 3, 20.0
        ev[x].loud_next = ratio
    shares0 = {"l10": 0.7, "l25": 0.7}
    r = rank(ev, names, impact=_Impact(shares0))
    assert [c.name for c in r.culprits] == ["l25"]
    cause = r.columns["l10"]["cause"]
    assert "costs the outputs 70% of the whole model's error" in cause, cause
    assert "channel 3 reaches 1.1x as far as the next loudest" in cause
    assert "16-bit activations on its output answer" in cause and "not named" in cause
    line = next(f for f in r.findings if "spread as trained" in f)
    assert line.startswith("the rounding of outputs over channels spread as trained"), line
    assert "of their error: l10 70% -" in line and "16-bit activations answer l10" in line
    # a range every channel fills alike (the loudest 2x the median): no spread of channels
    ev["l10"].loud_ratio = 2.0
    assert [c.name for c in rank(ev, names, impact=_Impact(shares0)).culprits] == ["l10", "l25"]
    ev["l10"].loud_ratio = 20.0
    # its loudest channel blows the ranges of l11..l20: measured with them, still a spread
    blown = {f"l{i}": 3.0 for i in range(11, 21)}
    group = ("l10", *blown)
    shares = {"l10": 0.05, group: 0.9, "l25": 0.7}
    impact = _Impact(shares)
    r = rank(ev, names, impact=impact, reach=lambda s: {"l10": Reach(3, 20.0, blown)})
    assert [c.name for c in r.culprits] == ["l25"] and group in impact.asked
    line = next(f for f in r.findings if "spread as trained" in f)
    assert "l10 90% with the 10 layer(s) carrying its outlier" in line
    assert "16-bit activations answer l10, whose output's range is such a spread (and the" in line
    # one channel alone travelling: named, with the layers it blows
    ev["l10"].loud_next = 30.0
    r = rank(ev, names, impact=_Impact(shares), reach=lambda s: {"l10": Reach(3, 20.0, blown)})
    assert [c.name for c in r.culprits] == ["l10", "l25"]
    # a spread whose reader scales its loudest channel back: a compensated pair, named
    ev["l10"].loud_next = 1.1
    ev["l11"].quiet_input, ev["l11"].quiet_ratio = 3, 20.0
    r = rank(ev, names, impact=_Impact(shares0))
    assert [c.name for c in r.culprits] == ["l10", "l25"]


def test_the_loudest_output_channel_is_measured_against_the_next_loudest():
    """``loud_next``: the loudest output channel's reach from zero over the next loudest's, as
    numpy finds it on a hand-built tensor - an offset channel (narrow, far from zero) counts by
    its magnitude, a silent channel not at all."""
    from accdbg.algorithms.diagnosis.evidence import output_evidence
    from accdbg.engines.exposure import Exposed

    rng = np.random.default_rng(5)
    g = rng.uniform(-1.0, 1.0, (1, 6, 4, 4)) * np.arange(1, 7).reshape(1, 6, 1, 1)
    g[0, 2] = -40.0 + rng.uniform(-1.0, 1.0, (4, 4))  # an offset channel
    g[0, 4] = 0.0  # silent
    e = Exposed("t", "t", "n", "Conv", 0, "t", scale=0.5, zero_point=128, native_dtype="uint8")
    ev = Evidence("t", "Conv", [])
    output_evidence(e, (g, "NCHW"), ev)
    reach = np.abs(g[0]).reshape(6, -1).max(axis=1)
    loudest, second = np.sort(reach[reach > 0])[::-1][:2]
    assert ev.loud_channel == 2 and second == reach[5]
    assert ev.loud_next == pytest.approx(loudest / second, rel=1e-12)
    g[0, 2] *= 0.1  # now a spread: 4.0 against channel 5's 6 or less
    output_evidence(e, (g, "NCHW"), ev)
    reach = np.abs(g[0]).reshape(6, -1).max(axis=1)
    loudest, second = np.sort(reach)[::-1][:2]
    assert ev.loud_next == pytest.approx(loudest / second, rel=1e-12) and ev.loud_next < 4


def test_a_wide_spread_still_lets_a_layer_16_db_under_the_floor_stand_out():
    """On a model whose layers spread widely (3.5 sigmas > 20 dB), a layer 16 dB under the
    median (40 times its noise power) still reaches the sensitivity step; 13.5 dB does not."""
    dbs = [23.0, 28.0, 33.0, 38.0, 43.0] * 6 + [17.0, 19.5]
    names = [f"l{i}" for i in range(30)] + ["deep", "near"]
    ev = {n: _ev(n, d) for n, d in zip(names, dbs, strict=True)}
    med = float(np.median(dbs))
    spread = 1.4826 * float(np.median(np.abs(np.array(dbs) - med)))
    assert med == 33.0 and 3.5 * spread > 20  # the spread alone would ask for more than 20 dB
    impact = _Impact({"deep": 0.9, "near": 0.9})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["deep"]
    assert set(impact.asked) == {"deep"}  # near (13.5 dB under) is not measured


def test_a_full_run_names_where_qnn_parts_from_its_own_inputs_only_when_that_costs_the_outputs():
    """Hand-built local divergences (dB): twenty layers a rounding step from the CPU fake-quant,
    ten bit-exact, one 20 dB apart. Only that one is measured for what its difference costs the
    outputs (when QNN's kernels together carry half their error or more, or QNN computes it
    differently: its values steps apart); it is a backend
    culprit at half their error or more (a quarter when QNN parts there 10 dB further than at
    any other layer), a note below that. With fewer than eight layers that
    differ at all there is no spread: a layer is measured when it parts 15 dB under their median
    (or under the pass mark)."""
    rng = np.random.default_rng(5)
    names = [f"l{i}" for i in range(31)]
    ev = {n: _ev(n, 36 + rng.normal(0, 1)) for n in names}  # no quantization standout
    dbs = [44 + rng.normal(0, 2) for _ in range(20)] + [math.inf] * 10 + [23.0]
    div = {n: 10 ** (-d / 10) for n, d in zip(names, dbs, strict=True)}
    asked: list[list[str]] = []

    def kernel(share):
        def measure(ns):
            asked.append(list(ns))
            return {n: share for n in ns}

        return measure

    r = rank(ev, names, divergence=div, kernel_share=kernel(0.8), kernels_added=ADDS_90)
    assert asked == [["l30"]]
    assert [(c.name, c.kind) for c in r.culprits] == [("l30", "backend")]
    assert "23.0 dB" in r.culprits[0].cause and "costs the outputs 80% of their error on QNN" in (
        r.culprits[0].cause
    )
    for share in (0.2, math.nan):
        r = rank(ev, names, divergence=div, kernel_share=kernel(share), kernels_added=ADDS_90)
        assert r.culprits == [] and r.columns["l30"]["cause"].startswith("backend: fed")
    # the kernels carry 90% and QNN parts at l30 21 dB further than anywhere else: the lone
    # backend standout is named from a quarter (mediapipe's hand_recrop: its channel Pad, 18 dB
    # beyond the next, costs 45% alone) ...
    gap = min(dbs[:20]) - 23.0
    r = rank(ev, names, divergence=div, kernel_share=kernel(0.3), kernels_added=ADDS_90)
    assert [(c.name, c.kind) for c in r.culprits] == [("l30", "backend")]
    assert r.culprits[0].cause.endswith(
        f"costs the outputs 30% of their error on QNN - QNN parts here {gap:.1f} dB further than "
        "at any other layer, and its kernels add 90% of the outputs' error: this layer's "
        "difference is the largest part of it"
    )
    assert (
        "the culprits named cost the outputs at most 30% of their error, and QNN's kernels add "
        "90% of it: for the rest the backend's computation at the other layers"
    ) in " ".join(r.findings)
    # ... not with a second layer parting within 10 dB of it
    second = dict(div, l29=10 ** (-30.0 / 10))
    shares = {"l29": 0.2, "l30": 0.3}
    r = rank(ev, names, divergence=second, kernel_share=lambda ns: shares, kernels_added=ADDS_90)
    assert r.culprits == [], [(c.name, c.cause) for c in r.culprits]
    # the verdict says which difference came nearest
    assert r.findings[0].startswith(
        "no single layer stands out: QNN's kernels add 90% of the outputs' error and no one "
        "layer's difference explains it (the layers where QNN parts from its own inputs say "
        "how in their cause; the most, l30, 30% alone)"
    )
    under_half = KernelsAdded("out", 1.0, 0.6)  # the kernels carry 40% of the outputs' error

    def ranked_under_half(divergence):
        asked.clear()
        return rank(
            ev, names, divergence=divergence, kernel_share=kernel(0.8), kernels_added=under_half
        )

    r = ranked_under_half(div)  # none is measured
    assert r.culprits == [] and asked == []
    # ... unless QNN computes something else there (101 steps apart, a Pad reading the integer
    # 0): that layer is the kernel's whatever the others carry, and is measured and named
    apart = type("Div", (dict,), {})(div)
    apart.steps = {"l30": 101.0}
    r = ranked_under_half(apart)
    assert asked == [["l30"]] and [(c.name, c.kind) for c in r.culprits] == [("l30", "backend")]
    # QNN no worse than the CPU overall (magika): the kernels line says the culprit's difference
    # was measured alone
    r = rank(
        ev,
        names,
        divergence=apart,
        kernel_share=kernel(0.8),
        kernels_added=KernelsAdded("out", 0.5, 1.0),
    )
    assert [c.name for c in r.culprits] == ["l30"]
    line = next(f for f in r.findings if f.startswith("QNN's kernels add nothing measurable"))
    assert line.endswith(
        "(each backend culprit's difference is measured alone; with every layer's, QNN ends no "
        "worse than the CPU fake-quant)"
    )
    apart.steps = {"l30": 1.0}  # a rounding step: not measured, as above
    r = ranked_under_half(apart)
    assert r.culprits == [] and asked == []
    asked.clear()
    # seven layers differ: no spread; 15 dB under their median (or the pass mark) stands out
    few = {n: (div[n] if n in ("l30", *names[:6]) else 0.0) for n in names}
    median = float(np.median([_db(few[n]) for n in ("l30", *names[:6])]))
    assert median - 15 > 23.0  # l30 is under that bar, the six others far above it
    asked.clear()
    r = rank(ev, names, divergence=few, kernel_share=kernel(0.8), kernels_added=ADDS_90)
    assert asked == [["l30"]] and [(c.name, c.kind) for c in r.culprits] == [("l30", "backend")]
    assert f"(too few layers differ for a floor: under {median - 15:.1f} dB stands out)" in (
        r.culprits[0].cause
    )
    few["l30"] = few[names[0]]  # all seven a rounding step apart: nothing is measured
    asked.clear()
    r = rank(ev, names, divergence=few, kernel_share=kernel(0.8), kernels_added=ADDS_90)
    assert r.culprits == [] and "cause" not in r.columns["l30"] and asked == []


def test_backend_standouts_whose_differences_do_not_add_up_are_not_named():
    """Three layers 20 dB apart from the CPU fake-quant, each of whose kernel differences alone
    costs the outputs 80-120% of their error on QNN (hand-set). Added at once they cost 90%:
    the parts sum to 300%, over twice the whole, so none of them is named (outputs this
    sensitive make any one layer's difference look decisive); each cause says so. When the
    three together cost 200% (the parts within twice the whole), all three are named."""
    rng = np.random.default_rng(5)
    names = [f"l{i}" for i in range(33)]
    ev = {n: _ev(n, 36 + rng.normal(0, 1)) for n in names}
    dbs = [44 + rng.normal(0, 2) for _ in range(20)] + [math.inf] * 10 + [23.0, 22.0, 24.0]
    div = {n: 10 ** (-d / 10) for n, d in zip(names, dbs, strict=True)}
    alone = {"l30": 0.8, "l31": 1.2, "l32": 1.0}

    class Kernels:
        def __init__(self, whole):
            self.whole, self.asked = whole, []

        def __call__(self, ns):
            return {n: alone[n] for n in ns}

        def together(self, ns):
            self.asked.append(sorted(ns))
            return self.whole

    k = Kernels(0.9)
    r = rank(ev, names, divergence=div, kernel_share=k, kernels_added=ADDS_90)
    assert r.culprits == [] and k.asked == [["l30", "l31", "l32"]]
    # the verdict is the backend's, not a global encoding change
    assert r.findings[0].startswith(
        "no single layer stands out: QNN's kernels add 90% of the outputs' error"
    ) and not any("per-channel weights" in f for f in r.findings)
    for n in alone:
        assert "added at once, cost 90%: one at a time they do not add up" in r.columns[n]["cause"]
    r = rank(ev, names, divergence=div, kernel_share=Kernels(2.0), kernels_added=ADDS_90)
    assert sorted(c.name for c in r.culprits) == ["l30", "l31", "l32"]
    assert {c.kind for c in r.culprits} == {"backend"}
    # QNN computing l30 and l32 differently (the values that part, 106 and 75 steps apart at
    # the median), l31 rounding a step: the first two are the kernels', whatever the others'
    # differences do - named in execution order (l30 feeds l32 what it made wrong), though l32
    # costs more alone
    steps = type("Div", (dict,), {})(div)
    steps.steps = {"l30": 106.0, "l31": 1.0, "l32": 75.0}
    r = rank(ev, names, divergence=steps, kernel_share=Kernels(0.9), kernels_added=ADDS_90)
    assert [c.name for c in r.culprits] == ["l30", "l32"]
    assert "added at once, cost 90%: their effects interact" in r.culprits[0].cause
    assert "one at a time they do not add up" in r.columns["l31"]["cause"]
    # in a full run every layer's error here is its input's (the observed figures), yet a
    # backend culprit, fed QNN's own inputs, parts from the fake-quant itself: its cause does
    # not say "inherited"
    linked = {
        n: _ev(n, -10 * math.log10(e.weight_nsr), inputs=names[i - 1 : i])
        for i, (n, e) in enumerate(ev.items())
    }
    observed = {n: 1e-3 for n in names}
    r = rank(
        linked,
        names,
        observed_nsr=observed,
        divergence=div,
        kernel_share=Kernels(2.0),
        kernels_added=ADDS_90,
    )
    assert sorted(c.name for c in r.culprits) == ["l30", "l31", "l32"]
    assert not any("inherited" in c.cause for c in r.culprits), [c.cause for c in r.culprits]


def _on_qnn_and_cpu(built, tmp_path, tensors: list[str]):
    """Oneshot on the real backend, QNN's dumps, the engine's QDQ model and onnxruntime's CPU
    fake-quant of it (every Q/DQ as written) at ``tensors``, by name."""
    import onnx

    from accdbg.core.onnx_model import with_outputs
    from accdbg.core.tensor_store import TensorFolder

    inp = [parse_input_tensor(["x", ",".join(map(str, built.dims)), str(built.input_path)])]
    res = run_oneshot("onnx", built.path, inp, working_dir=tmp_path / "w")
    qdq_path = next(res.engine_run.glob("*.qdq.onnx"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = with_outputs(onnx.load(str(qdq_path)), tensors).SerializeToString()
    x = np.fromfile(built.input_path, np.float32).reshape(built.dims)
    cpu = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(tensors, {"x": x})
    qnn = TensorFolder(res.engine_run / "output" / "Result_0")
    return res, inp, qnn, qdq_path, dict(zip(tensors, cpu, strict=True))


def _sqnr(gold: np.ndarray, got: np.ndarray) -> float:
    g, d = gold.astype(np.float64).ravel(), (got - gold).astype(np.float64).ravel()
    return 10 * math.log10(g @ g / (d @ d))


def encoding_of(qdq_path, tensor: str) -> tuple[float, int]:
    """(scale, zero point) of a tensor's QuantizeLinear in a QDQ model (a graph output's
    producer is renamed ``<name>_QuantizeLinear_Input``)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(qdq_path))
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    q = next(
        n
        for n in m.graph.node
        if n.op_type == "QuantizeLinear"
        and n.input[0] in (tensor, f"{tensor}_QuantizeLinear_Input")
    )
    return float(consts[q.input[1]]), int(consts[q.input[2]])


@pytest.mark.slow
def test_htp_part_of_a_nested_concat_in_the_wrong_encoding_is_a_backend_culprit(tmp_path):
    """HTP's outer Concat of a YOLOX-style head: ten layers, too few that differ from the CPU
    fake-quant for a floor. Independently of the ranking: QNN's ``out`` is far from float while
    its own inputs on QNN and onnxruntime's CPU fake-quant of the same QDQ model are close, so
    the error enters at ``out``, on the backend. The tool names it first, as the backend, says
    why (the inner Concat's integers kept in their encoding) and the fix search proves the fix
    it names."""
    built = models.nested_concat(tmp_path)
    res, inp, qnn, qdq_path, cpu = _on_qnn_and_cpu(built, tmp_path, ["out"])
    cpu = cpu["out"]
    flat = {
        "other_flat": built.expected["other_scale"].reshape(1, 6, -1),
        "head_flat": np.concatenate(
            [built.expected[n] for n in ("boxes", "obj", "cls")], 1
        ).reshape(1, 6, -1),
    }

    assert _sqnr(built.expected["out"], cpu) > 30
    assert _sqnr(built.expected["out"], qnn.load("out")) < 15
    assert min(_sqnr(v, qnn.load(n)) for n, v in flat.items()) > 30
    first = res.culprits[0]
    assert (first.rank, first.name, first.kind) == (1, "out", "backend"), res.findings
    assert "too few layers differ for a floor" in first.cause
    # numpy, on QNN's dumps: the sigmoids' rows of head_flat come out as head_flat's own
    # integers read in out's encoding
    e_out, e_head = (encoding_of(qdq_path, n) for n in ("out", "head_flat"))
    q_out = np.rint(qnn.load("out")[0, 4:, 256:] / e_out[0]) + e_out[1]
    q_head = np.rint(qnn.load("head_flat")[0, 4:] / e_head[0]) + e_head[1]
    assert np.array_equal(q_out, q_head) and e_out != e_head
    assert "512 of its values are head_flat's own integers" in first.cause
    assert "giving head and head_flat this Concat's encoding avoids it" in first.cause
    # that fix, measured on QNN by the fix search: 8-bit still, the outputs as the CPU's
    from accdbg.algorithms.fixes import run_fix_search

    fixed = run_fix_search(
        built.path, inp, diagnosis=res.summary, target_sqnr=30, working_dir=tmp_path / "w"
    )
    best = fixed.best
    assert fixed.accepted == ["head, head_flat: the encoding of out"], fixed.candidates
    assert best["16-bit tensors"] == 0 and best["all landed"]
    assert best["SQNR mean"] > _sqnr(built.expected["out"], cpu) - 1


def test_a_concat_whose_backend_kept_an_inputs_own_integers_says_so_and_names_the_fix():
    """Hand-built integers: a Concat of two inputs along axis 2; the backend copied the second
    input's integers (its own encoding, zero point 41) where the fake-quant requantized them
    (zero point 71), and differs by a rounding step elsewhere. The note names that input,
    counts the copied values and says whose encoding to change - through the Reshape that
    keeps its input's encoding - and the fix search reads those tensors back."""
    from accdbg.algorithms.diagnosis.divergence import _copied_note, encoding_fix, kept_integers
    from accdbg.engines.exposure import Exposed

    a = np.full((1, 2, 3), 100, np.uint8)
    b = np.full((1, 2, 4), 41, np.uint8)  # b's integers in b's encoding
    cpu = np.concatenate([a, np.full((1, 2, 4), 71, np.uint8)], 2)
    backend = np.concatenate([a, b], 2)
    backend[0, 0, 0] += 1  # one rounding step: not a copy, not counted
    assert kept_integers(backend, cpu, [("a", a), ("b", b)]) == ("b", 8)
    assert kept_integers(cpu, cpu, [("a", a), ("b", b)]) is None  # nothing far off
    assert kept_integers(backend, cpu, [("a", a)]) is None  # the shapes make no concatenation
    moved = backend.copy()
    moved[0, :, 3:] = 90  # far off, and not the input's integers: not a copy
    assert kept_integers(moved, cpu, [("a", a), ("b", b)]) is None

    def exposed(name: str, op: str, scale: float, zero: int, inputs: list[str]) -> Exposed:
        return Exposed(name, name, name, op, 0, name, scale, zero, "uint8", inputs=inputs)

    layers = {
        "a": exposed("a", "Conv", 0.02, 100, ["x"]),
        "head": exposed("head", "Concat", 0.008, 41, ["p", "q"]),
        "b": exposed("b", "Reshape", 0.008, 41, ["head"]),
        "out": exposed("out", "Concat", 0.0129, 71, ["a", "b"]),
    }
    cuts = {f"{n}::backend": e for n, e in layers.items() if n != "out"}
    loaded = {"a::backend": a, "b::backend": b}
    note = _copied_note(layers["out"], backend, cpu, loaded, cuts, lambda e: None)
    assert note == (
        "; 8 of its values are b's own integers (scale 0.008, offset -41) kept in this "
        "Concat's encoding (scale 0.0129, offset -71), not requantized: giving head and b "
        "this Concat's encoding avoids it"
    )
    assert encoding_fix(f"backend: fed the backend's own inputs{note}; that costs") == [
        "head",
        "b",
    ]
    assert encoding_fix("backend: run alone on the backend it keeps 3 dB") == []


def test_kernel_differences_are_halved_down_to_the_one_that_costs_the_outputs():
    """A stub of the CPU runs: each layer's kernel difference adds a hand-set error power at
    the output, and a group adds the sum. Halving finds the one layer at half of QNN's error
    or more, in at most two runs per halving; spread evenly, none is named."""
    from accdbg.algorithms.diagnosis.divergence import kernel_bisect

    class Runs:
        def __init__(self, power: dict[str, float]):
            self.names, self.power, self.asked = list(power), power, []

        def effect(self, group):
            self.asked.append(list(group))
            return {"out": sum(self.power[n] for n in group)}

    names = [f"l{i}" for i in range(16)]
    runs = Runs({n: (0.6 if n == "l11" else 0.02) for n in names})
    found = kernel_bisect(runs, lambda e: e["out"] / 1.0, 0.5)
    assert found == pytest.approx({"l11": 0.6})
    assert len(runs.asked) <= 1 + 2 * 4  # the whole, then two halves per level
    spread = Runs({n: 0.06 for n in names})  # together 0.96, any half 0.48
    assert kernel_bisect(spread, lambda e: e["out"], 0.5) == {}
    assert len(spread.asked) == 3


def test_with_no_culprit_the_kernels_carrying_most_of_the_error_are_searched_layer_by_layer():
    """No layer stands out (encodings or QNN's difference) while QNN's kernels carry most of
    the outputs' error: the kernel search is asked, and a layer it finds is a backend culprit.
    With a quantization culprit named, or the kernels under half, it is not asked."""
    rng = np.random.default_rng(2)
    names = [f"l{i}" for i in range(20)]
    ev = {n: _ev(n, 36 + rng.normal(0, 1)) for n in names}
    div = {n: 10 ** (-(44 + rng.normal(0, 2)) / 10) for n in names}  # all a step apart
    asked: list[list[str]] = []

    class Kernels:
        def __call__(self, ns):
            return {}

        def search(self, ns, bar):
            asked.append(list(ns))
            return {"l7": 0.7}

    r = rank(ev, names, divergence=div, kernel_share=Kernels(), kernels_added=ADDS_90)
    assert [(c.name, c.kind) for c in r.culprits] == [("l7", "backend")]
    assert "costs the outputs 70% of their error on QNN (found by halving" in r.culprits[0].cause
    assert sorted(asked[0]) == sorted(names)  # every layer that differs, largest first
    assert asked[0][0] == max(names, key=lambda n: div[n])
    asked.clear()
    rank(
        ev,
        names,
        divergence=div,
        kernel_share=Kernels(),
        kernels_added=KernelsAdded("out", 1.0, 0.6),
    )
    assert asked == []  # the kernels carry under half
    ev["l3"] = _ev("l3", 5.0)  # a layer whose encodings destroy it
    impact = _Impact({"l3": 0.8})
    r = rank(
        ev, names, impact=impact, divergence=div, kernel_share=Kernels(), kernels_added=ADDS_90
    )
    assert [c.name for c in r.culprits] == ["l3"] and asked == []


@pytest.mark.slow
def test_a_rounding_bias_before_a_pooling_is_named_on_the_backend(tmp_path):
    """Conv -> GlobalAveragePool -> Conv on QNN: the first Conv's integers sit one step off the
    CPU fake-quant's on a few percent of values, nearly all one way, so no layer's difference
    stands out; averaging keeps the bias. Independently of the ranking: QNN's pooling is its
    input's mean (within a step), the CPU fake-quant's outputs are far better than QNN's, and
    the bias is there in QNN's features. The tool names the Conv, as the backend."""
    built = models.pooled_conv(tmp_path, seed=1)
    res, _, qnn, qdq_path, cpu = _on_qnn_and_cpu(built, tmp_path, ["features", "scores"])
    cpu_features, cpu_scores = cpu["features"], cpu["scores"]

    assert (
        _sqnr(built.expected["scores"], cpu_scores)
        > _sqnr(built.expected["scores"], qnn.load("scores")) + 6
    )
    scale, zero = encoding_of(qdq_path, "features")
    steps = np.rint((qnn.load("features") - cpu_features) / scale)
    assert 0 < np.count_nonzero(steps) < 0.2 * steps.size and np.abs(steps).max() == 1
    assert abs(steps.sum()) >= 0.7 * np.count_nonzero(steps)  # nearly all one way
    p_scale, p_zero = encoding_of(qdq_path, "pooled")  # the mean on pooled's 8-bit grid
    mean = qnn.load("features").mean(axis=(2, 3), keepdims=True)
    grid = (np.clip(np.rint(mean / p_scale) + p_zero, 0, 255) - p_zero) * p_scale
    assert np.abs(qnn.load("pooled") - grid).max() <= 1.01 * p_scale
    first = res.culprits[0]
    assert (first.name, first.kind) == ("features", "backend"), res.findings
    assert "found by halving the layers where QNN differs" in first.cause


def test_how_the_backend_parts_says_bias_or_a_different_computation():
    """The backend's integers against the fake-quant's, in steps: one step nearly always the
    same way is a rounding bias; larger steps are not; both ways is not a bias. The standing
    layer's cause carries it."""
    from accdbg.algorithms.diagnosis.divergence import Divergences, how_they_part

    steps = np.zeros(1000)
    steps[:60] = -1  # 6 % of the values one step below...
    steps[60:62] = 1  # ...and two above: 97 % one way
    assert how_they_part(steps) == (
        "QNN's integers differ on 6.2% of the values by one step, 97% of them below the "
        "fake-quant's (a rounding bias)"
    )
    steps[:60] = -3
    assert how_they_part(steps) == (
        "QNN's integers differ on 6.2% of the values by up to 3 steps, 97% of them below the "
        "fake-quant's"
    )
    both = np.zeros(100)
    both[:10], both[10:20] = -1, 1
    assert how_they_part(both) == "QNN's integers differ on 20% of the values by one step"
    assert how_they_part(np.zeros(10)) == ""
    names = [f"l{i}" for i in range(31)]
    rng = np.random.default_rng(5)
    ev = {n: _ev(n, 36 + rng.normal(0, 1)) for n in names}
    div = Divergences()
    for n in names[:30]:
        div[n] = 10 ** (-(44 + rng.normal(0, 2)) / 10)
    div["l30"] = 10 ** (-23 / 10)
    div.how["l30"] = how_they_part(-np.ones(5))
    cause = rank(ev, names, divergence=div).columns["l30"]["cause"]
    assert cause.endswith(
        ": QNN's integers differ on 100% of the values by one step, 100% of "
        "them below the fake-quant's (a rounding bias)"
    ), cause


def test_floor_and_spread_are_the_median_and_scaled_mad():
    names = ["a", "b", "c", "d", "e"]
    dbs = [30.0, 32.0, 34.0, 36.0, 50.0]
    ev = {n: _ev(n, d) for n, d in zip(names, dbs, strict=True)}
    r = rank(ev, names)
    med = np.median(dbs)
    assert r.floor_db == pytest.approx(med)
    assert r.spread_db == pytest.approx(1.4826 * np.median(np.abs(np.array(dbs) - med)))


@pytest.fixture(scope="module")
def outlier_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("outlier")
    out = {}
    for scale in (0.0, 60.0):
        built = models.outlier_chain(tmp, scale=scale)
        inp = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
        out[scale] = (built, run_oneshot("onnx", built.path, inp, working_dir=tmp / f"w{scale:g}"))
    return out


@pytest.mark.slow
def test_compensated_outlier_leaves_the_float_function_unchanged(outlier_runs):
    clean, planted = outlier_runs[0.0][0], outlier_runs[60.0][0]
    x = np.fromfile(clean.input_path, np.float32).reshape(clean.dims)
    outs = [
        ort.InferenceSession(str(b.path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        for b in (clean, planted)
    ]
    assert outs[1] == pytest.approx(outs[0], rel=1e-4, abs=1e-4)


@pytest.mark.slow
def test_activation_outlier_blames_the_producer_not_the_consumer(outlier_runs):
    built, res = outlier_runs[60.0]
    planted = built.expected["planted"]
    s = res.summary.set_index("Name")
    # per tensor the carrier looks healthy; per channel it is not
    assert s.loc[planted, "SQNR"] > s.loc[planted, "SQNR ch_median"] + 10
    ranked = res.summary.dropna(subset=["culprit_rank"]).sort_values("culprit_rank")
    assert list(ranked["Name"])[:1] == [planted], ranked[["Name", "cause"]]
    cause = s.loc[planted, "cause"]
    assert "activation range" in cause and "channel 0" in cause, cause
    consumer = f"layer{int(planted[-1]) + 1}"
    assert pd_isna(s.loc[consumer, "culprit_rank"])
    # the evidence knows which output channel the producer's weights make loud, and how loud:
    # the largest magnitude of each output channel's float weights, over the median channel's
    import onnx
    from onnx import numpy_helper

    from accdbg.algorithms.diagnosis.culprits import prepared_model
    from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder, float_weights_of
    from accdbg.core.tensor_store import TensorFolder

    qdq_path = next(res.engine_run.glob("*.qdq.onnx"))
    ev = EvidenceBuilder(
        onnx.load(str(qdq_path)),
        TensorFolder(res.golden_dir),
        lambda n: n,
        float_weights_of(onnx.load(str(prepared_model(qdq_path)))),
    ).build()
    graph = onnx.load(str(built.path)).graph  # the planted layer: a Conv, then its Relu
    conv = next(n for n in graph.node if n.output[0] == planted.replace("layer", "conv"))
    w = next(numpy_helper.to_array(i) for i in graph.initializer if i.name == conv.input[1])
    widest = np.abs(w).reshape(w.shape[0], -1).max(axis=1)
    assert ev[planted].loud_weights == 0
    assert ev[planted].loud_weights_ratio == pytest.approx(widest[0] / np.median(widest), rel=1e-3)


@pytest.mark.slow
def test_clean_chain_names_nothing(outlier_runs):
    _, res = outlier_runs[0.0]
    assert res.summary["culprit_rank"].isna().all(), res.findings
    assert any(f.startswith("no single layer stands out") for f in res.findings) or any(
        f.startswith("the outputs meet") for f in res.findings
    )


@pytest.mark.slow
def test_the_ranking_prepared_beside_the_run_is_the_ranking_done_after_it(
    outlier_runs, tmp_path, monkeypatch
):
    """Oneshot prepares the ranking's evidence, sensitivity and reach while QNN runs; the
    ranking after the run then measures nothing again, and it is the same as one done wholly
    after the run - also when the worst input is not the one prepared (its evidence built
    again, the sensitivity, pooled over the same inputs, kept)."""
    import json
    import os
    import shutil
    import threading

    from accdbg.algorithms.diagnosis import culprits as culprits_mod
    from accdbg.algorithms.diagnosis import sensitivity as sensitivity_mod
    from accdbg.verifiers.pairing import find_results

    built, res = outlier_runs[60.0]
    qdq = next(res.engine_run.glob("*.qdq.onnx"))
    (golden,) = find_results(res.golden_dir, "golden")[0].values()  # its one input's folder
    mapping = json.loads((res.engine_run / "tensor_mapping.json").read_text())
    x = {"x": np.fromfile(built.input_path, np.float32).reshape(built.dims)}
    table = res.summary.drop(columns=[c for c in ranking_mod.COLUMNS if c in res.summary])

    def ranked(prefetch=None):
        r = culprits_mod.find_culprits(
            qdq,
            golden,
            table,
            "Name",
            {"CosineSimilarity": get_verifier("CosineSimilarity"), "SQNR": get_verifier("SQNR")},
            feeds=x,
            float_model=culprits_mod.prepared_model(qdq),
            golden_name=mapping,
            target=res.engine_run / "output" / "Result_0",
            prefetch=prefetch,
        )
        return r.findings, r.columns

    after = ranked()

    def named(findings):
        return [f.split(" (")[0] for f in findings if f.startswith("culprit #")]

    # oneshot itself ran with the prefetch (and then verified its culprits on QNN)
    assert named(after[0]) == named(res.findings)
    assert after[0][1].startswith(f"culprit #1: {built.expected['planted']}")
    measured: list[tuple[str, str]] = []  # (thread, what): the prefetch has its own thread
    real_share, real_reach = sensitivity_mod.Sensitivity.share, culprits_mod.OutlierReach.__call__
    nice: dict[str, int] = {}  # thread -> its scheduling priority while it measured
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def share(self, *a, **k):
        measured.append((threading.current_thread().name, "share"))
        nice[threading.current_thread().name] = os.getpriority(
            os.PRIO_PROCESS, threading.get_native_id()
        )
        return real_share(self, *a, **k)

    def reach(self, *a, **k):
        measured.append((threading.current_thread().name, "reach"))
        return real_reach(self, *a, **k)

    monkeypatch.setattr(sensitivity_mod.Sensitivity, "share", share)
    monkeypatch.setattr(culprits_mod.OutlierReach, "__call__", reach)
    # waited for however busy the machine (the other test worker may take both cores; giving
    # up on a starved thread has its own test)
    monkeypatch.setattr(culprits_mod.IdleThread, "wait", lambda self: self.join() or True)

    def after_the_run():
        return sorted({w for who, w in measured if who == threading.main_thread().name})

    prefetch = culprits_mod.Prefetch(qdq, golden, mapping, x, ())
    assert ranked(prefetch) == after and after_the_run() == []  # nothing measured twice
    assert {w for _, w in measured} == {"share", "reach"}  # all of it beside
    # on the cores the backend leaves idle: the lowest priority, the main thread's untouched
    assert nice == {"accdbg-ranking-prefetch": 19}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice
    # prepared for another input's golden (a copy elsewhere): evidence and reach again, the
    # pooled sensitivity kept
    other = tmp_path / "Result_0"
    shutil.copytree(golden, other)
    measured.clear()
    prefetch = culprits_mod.Prefetch(qdq, other, mapping, x, ())
    assert ranked(prefetch) == after and after_the_run() == ["reach"]
    # stopped: it ends at the next question, and the ranking does everything itself
    prefetch = culprits_mod.Prefetch(qdq, golden, mapping, x, ())
    prefetch.close()
    assert ranked(prefetch) == after


def test_the_ranking_waits_for_its_work_beside_the_run_only_while_that_work_runs(monkeypatch):
    """The work beside the run is at the lowest priority: on a machine whose cores other
    processes take it gets no CPU, and the ranking must not wait for it then (it does the work
    itself) - but it waits for a thread that computes, however long."""
    import threading
    import time
    from pathlib import Path

    from accdbg.algorithms.diagnosis import culprits as culprits_mod
    from accdbg.core import cpu_session

    release = threading.Event()

    class Starved:  # blocked, as a thread the scheduler never runs: it uses no CPU
        def __init__(self, *args):
            release.wait(30)

        def rank_alone(self):
            pass

    class Busy(Starved):  # computes for three of the waiter's polls, then is done
        def __init__(self, *args):
            end = time.thread_time() + 1.6
            while time.thread_time() < end:
                pass

    args = (Path("m.qdq.onnx"), Path("golden"), {}, {}, ())
    monkeypatch.setattr(cpu_session, "idle_priority", lambda: None)  # as neighbours let it
    monkeypatch.setattr(culprits_mod, "_BeforeBackend", Busy)
    assert isinstance(culprits_mod.Prefetch(*args).take(), Busy)
    monkeypatch.setattr(culprits_mod, "_BeforeBackend", Starved)
    prefetch = culprits_mod.Prefetch(*args)
    t = time.perf_counter()
    assert prefetch.take() is None and prefetch._thread.is_alive()
    assert time.perf_counter() - t < 10  # not the 30 s it stays blocked
    release.set()
    prefetch.close()
    assert not prefetch._thread.is_alive()


def test_a_thread_asked_to_stop_stops_at_its_next_cpu_session(tmp_path):
    """The work beside the run stops at a short step (a starved thread is waited for that
    long at the run's end), and no handler turning a failed measure into "not measured"
    swallows the stop."""
    import threading

    import onnx

    from accdbg.core.cpu_session import Stopped, exact_session, stops_on

    model = onnx.load(str(models.mlp(tmp_path).path))
    stop, swallowed = threading.Event(), []
    with stops_on(stop):
        exact_session(model)  # not asked yet
        stop.set()
        with pytest.raises(Stopped):
            try:
                exact_session(model)
            except Exception as exc:  # a measure's own handler
                swallowed.append(exc)
    assert swallowed == []
    exact_session(model)  # outside the block the event asks nothing


def test_waiting_for_an_idle_thread_that_has_ended_is_safe():
    """Threads end before anyone waits for them (the ranking's work beside a QNN run usually
    does): their CPU clock must not be asked of the thread's freed descriptor then (a
    segfault in glibc, which took a test worker down), so a fresh Python waits for many."""
    from tests.helpers import fresh_python

    code = (
        "import numpy as np\n"
        "from accdbg.core.cpu_session import IdleThread\n"
        "for _ in range(200):\n"
        "    ts = [IdleThread(lambda: np.ones(10**5).sum(), 't') for _ in range(8)]\n"
        "    [t.start() for t in ts]; [t.join() for t in ts]\n"
        "    assert all(t.wait() for t in ts)\n"
    )
    fresh_python(code)


def pd_isna(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in ("<NA>", "nan")


@pytest.mark.parametrize("algorithm", ["layerwise", "cumulative"])
@pytest.mark.slow
def test_snooping_blames_the_producer_and_says_so(outlier_runs, tmp_path, algorithm):
    from accdbg.algorithms.cumulative import run_cumulative_layerwise
    from accdbg.algorithms.layerwise import run_layerwise

    built, oneshot = outlier_runs[60.0]
    run = run_layerwise if algorithm == "layerwise" else run_cumulative_layerwise
    inp = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    res = run(
        built.path,
        inp,
        golden_dir=oneshot.golden_dir,
        verifiers=["SQNR", "CosineSimilarity"],
        working_dir=tmp_path / "w",
    )
    ranked = res.report.dropna(subset=["culprit_rank"]).sort_values("culprit_rank")
    assert list(ranked["O/P Name"])[:1] == [built.expected["planted"]], ranked
    assert res.findings and res.findings[0].startswith(f"culprit #1: {built.expected['planted']}")
    csv = (res.csv).read_text()
    assert "culprit_rank" in csv.splitlines()[0]


@pytest.fixture(scope="module")
def long_chain(tmp_path_factory):
    """A clean 14-layer chain run on QNN: enough layers that differ from the CPU fake-quant by
    a rounding step to make a floor of them."""
    tmp = tmp_path_factory.mktemp("long")
    built = models.outlier_chain(tmp, layers=14)
    inp = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    return built, run_oneshot("onnx", built.path, inp, working_dir=tmp / "w")


@pytest.mark.slow
def test_a_layer_wrong_only_on_the_backend_is_named_where_qnn_parts_from_its_own_inputs(
    long_chain, tmp_path, monkeypatch
):
    """A QNN dump made wrong at one layer (as a faulty kernel would) parts from the CPU
    fake-quant of that layer fed QNN's own inputs, and nowhere else: it is a backend culprit
    when QNN's kernels carry most of the outputs' error, a note in its cause otherwise."""
    import shutil

    import onnx

    from accdbg.algorithms.diagnosis import divergence as divergence_mod
    from accdbg.algorithms.diagnosis.culprits import find_culprits, prepared_model
    from accdbg.algorithms.diagnosis.divergence import KernelRuns, local_divergence
    from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder
    from accdbg.core.tensor_store import TensorFolder

    built, res = long_chain
    result = tmp_path / "Result_0"
    shutil.copytree(res.engine_run / "output" / "Result_0", result)
    target = TensorFolder(result)
    wrong = "layer13"  # the last layer: no later layer of the dump read the right values
    raw = result / target.records[wrong].file
    (np.fromfile(raw, np.float32) * 0.6).astype(np.float32).tofile(raw)  # a kernel off by 40 %
    qdq_path = next(res.engine_run.glob("*.qdq.onnx"))
    builder = EvidenceBuilder(onnx.load(str(qdq_path)), TensorFolder(res.golden_dir), lambda n: n)
    x = {"x": np.fromfile(built.input_path, np.float32).reshape(built.dims)}
    div = local_divergence(onnx.load(str(qdq_path)), builder.layers, x, TensorFolder(result))
    # numpy: the corrupted layer against the same layer computed right is 0.4 of the signal
    assert _db(div[wrong]) == pytest.approx(-20 * math.log10(0.4), abs=1.5)
    others = [_db(v) for n, v in div.items() if n != wrong and v > 0]
    assert len(others) >= 8 and min(others) > 30  # every other layer: a rounding step apart
    # in integers: 40 % off is many steps (a different computation); the others round: the
    # values that part do so by one step (median), a few by more
    assert div.steps[wrong] > 10 and max(v for n, v in div.steps.items() if n != wrong) == 1
    ev = builder.build()
    names = [e.name for e in builder.layers]
    r = rank(ev, names, divergence=div, kernels_added=ADDS_90)
    assert r.culprits == []  # not measured: a note
    assert r.columns[wrong]["cause"].startswith("backend: fed the backend's own inputs")
    # 0.6 of each value: the backend's integers sit below the fake-quant's, by many steps
    assert "steps, 100% of them below the fake-quant's" in r.columns[wrong]["cause"]
    assert (
        "QNN's kernels add 90% to the outputs' error: out at 10.0 dB SQNR on QNN, 20.0 dB"
        in (r.findings[-2])
    )
    # what the difference costs the outputs, measured on the CPU fake-quant: the wrong layer is
    # the output, so it is its own difference, 0.4 of the signal in amplitude
    effect = KernelRuns(
        onnx.load(str(qdq_path)), builder.layers, x, TensorFolder(result), [wrong], [wrong]
    ).each()
    assert _db(effect[wrong][wrong]) == pytest.approx(-20 * math.log10(0.4), abs=1.5)
    # the whole path: the CPU runs and the shares measured by find_culprits
    ranking = find_culprits(
        qdq_path,
        res.golden_dir,
        res.summary,
        "Name",
        {"SQNR": get_verifier("SQNR")},
        feeds=x,
        float_model=prepared_model(qdq_path),
        target=result,
    )
    assert [(c.name, c.kind) for c in ranking.culprits] == [(wrong, "backend")]
    # what the kernels add, from the files: QNN's output error and the CPU's (onnxruntime run
    # here with every Q/DQ as written), each against the float golden
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    out = onnx.load(str(qdq_path)).graph.output[0].name
    cpu = ort.InferenceSession(str(qdq_path), so, providers=["CPUExecutionProvider"]).run([out], x)[
        0
    ]
    g = TensorFolder(res.golden_dir).load(wrong).astype(np.float64).ravel()
    q = target.load(wrong).astype(np.float64).ravel()
    c = cpu.astype(np.float64).ravel()
    q_db, c_db = (10 * math.log10(g @ g / ((v - g) @ (v - g))) for v in (q, c))
    added = 100 * (1 - 10 ** ((q_db - c_db) / 10))
    line = next(f for f in ranking.findings if f.startswith("QNN's kernels add"))
    assert line.startswith(f"QNN's kernels add {added:.0f}% to the outputs' error: {wrong} at ")
    assert f"at {q_db:.1f} dB SQNR on QNN, {c_db:.1f} dB in onnxruntime's CPU fake-quant" in line
    # in parts of one layer's dump each (as a model too big to hold does): each part's run is
    # fed only the dumps it reads, and every figure is the same
    one_layer = target.records["layer0"].size  # 8-bit: a byte per value
    fed_sizes = []
    real_run = divergence_mod._run

    def spy(model, outputs, feeds):
        fed_sizes.append(sum(v.nbytes for k, v in feeds.items() if k.endswith("::backend")))
        return real_run(model, outputs, feeds)

    monkeypatch.setattr(divergence_mod, "_run", spy)
    parts = local_divergence(
        onnx.load(str(qdq_path)), builder.layers, x, TensorFolder(result), held=one_layer
    )
    monkeypatch.undo()
    assert dict(parts) == dict(div) and parts.how == div.how
    assert len(fed_sizes) >= 14 and max(fed_sizes) <= 2 * one_layer  # its own input, at most two


def test_a_slice_of_a_model_keeps_what_its_outputs_read():
    """``sliced``: the nodes a tensor depends on, and only the graph inputs they read - a run of
    it is fed those alone and gives the whole model's value."""
    from onnx import TensorProto, helper, numpy_helper

    from accdbg.core.onnx_model import sliced

    two = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["a", "two"], ["a2"]),
            helper.make_node("Add", ["a2", "b"], ["s"]),
            helper.make_node("Relu", ["s"], ["r"]),
            helper.make_node("Neg", ["c"], ["nc"]),
            helper.make_node("Add", ["r", "nc"], ["out"]),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "abc"],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3])],
        [two],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    part = sliced(m, ["r"])  # its output untyped, as with_outputs leaves it: onnxruntime types it
    assert [n.op_type for n in part.graph.node] == ["Mul", "Add", "Relu"]
    assert [i.name for i in part.graph.input] == ["a", "b"]
    assert [o.name for o in part.graph.output] == ["r"]
    a, b = np.array([1, -2, 3], np.float32), np.array([0.5, 1, -10], np.float32)
    sess = ort.InferenceSession(part.SerializeToString(), providers=["CPUExecutionProvider"])
    (r,) = sess.run(["r"], {"a": a, "b": b})
    np.testing.assert_array_equal(r, np.maximum(2 * a + b, 0))
    assert len(m.graph.node) == 5 and [o.name for o in m.graph.output] == ["out"]  # untouched


def test_a_softmax_output_is_judged_at_its_logits(tmp_path):
    """A layer that wrecks the scores of a confident classifier barely moves its softmax (both
    saturate to the same one-hot), so its share of the output error must be measured before the
    Softmax - looked for through a constant rescale - and on the QDQ model after the logits'
    own Q/DQ pair."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_static

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity, dequantized, scores

    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    w[:, 0] *= 40  # one very confident class
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
            helper.make_node("Mul", ["prob", "one"], ["scaled"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(1.0), "one")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert scores(model) == ["logits"]
    fp = tmp_path / "m.onnx"
    onnx.save(model, str(fp))
    x = np.abs(rng.normal(size=(1, 4))).astype(np.float32) + 0.5

    class Reader:
        def __init__(self):
            self.items = iter([{"x": x}])

        def get_next(self):
            return next(self.items, None)

    qp = tmp_path / "q.onnx"
    quantize_static(
        str(fp), str(qp), Reader(), activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8
    )
    q = onnx.load(str(qp))
    fetched = dequantized(q, "logits")
    assert fetched != "logits" and fetched in {o for n in q.graph.node for o in n.output}
    s = Sensitivity(model, q, {"x": x})
    logits = x.astype(np.float64) @ w.astype(np.float64)
    assert np.allclose(s.golden[0], logits, rtol=1e-5)
    assert s.whole_noise[0] > 1e-6 * float(np.sum(logits**2))  # not the saturated softmax's ~0


def _matmul_chain(
    tmp_path,
    w1: np.ndarray,
    w2: np.ndarray,
    relu: bool = False,
    side: np.ndarray | None = None,
    sigmoid: bool = False,
):
    """x[8,6] @ w1 (then a Relu) @ w2, saved: (model, its path, the path to quantize it to).
    ``side``: another output ``z`` = x @ side, a branch of its own (the first output);
    ``sigmoid``: y is the Sigmoid of that product, ``logits``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    mid = "r" if relu else "a"
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"])]
    nodes += [helper.make_node("Relu", ["a"], ["r"])] if relu else []
    nodes += [helper.make_node("MatMul", [mid, "w2"], ["logits" if sigmoid else "y"])]
    nodes += [helper.make_node("Sigmoid", ["logits"], ["y"])] if sigmoid else []
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    if side is not None:
        nodes.append(helper.make_node("MatMul", ["x", "w3"], ["z"]))
        # listed first: the output a share is of is not simply the first
        outputs.insert(0, helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, side.shape[1]]))
        inits.append(numpy_helper.from_array(side, "w3"))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 6])],
        outputs,
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    fp, qp = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(fp))
    return model, fp, qp


def _qdq_np(v, s, z):
    """ONNX's QuantizeLinear then DequantizeLinear in uint8, in numpy."""
    return (np.clip(np.round(v / s) + z, 0, 255) - z) * s


def _matmul_layer(q, weight: str, out: str):
    """The Exposed layer of the quantized chain's MatMul reading ``weight`` and making ``out``."""
    from accdbg.core.onnx_model import topological_nodes
    from accdbg.engines.exposure import Exposed

    nodes = topological_nodes(q.graph)
    made_by = {o: n for n in nodes for o in n.output}
    index = next(
        i
        for i, n in enumerate(nodes)
        if n.op_type == "MatMul" and made_by[n.input[1]].input[0] == f"{weight}_quantized"
    )
    return Exposed(out, out, nodes[index].name, "MatMul", index, out, native_dtype="uint8")


class _Feeds:
    """onnxruntime's calibration reader over one input."""

    def __init__(self, x: np.ndarray):
        self.items = iter([{"x": x}])

    def get_next(self):
        return next(self.items, None)


class _Quantized:
    """The chain quantized by onnxruntime (uint8 activations and weights, per tensor), read
    back for numpy: each activation's (scale, zero point) and each weight's dequantized values."""

    def __init__(self, fp, qp, x: np.ndarray):
        import onnx
        from onnx import numpy_helper
        from onnxruntime.quantization import QuantType, quantize_static

        quantize_static(
            str(fp),
            str(qp),
            _Feeds(x),
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QUInt8,
        )
        self.model = q = onnx.load(str(qp))
        self.inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
        self.enc = {}  # tensor -> (scale, zero point) of its QuantizeLinear
        for n in q.graph.node:
            if n.op_type == "QuantizeLinear":
                # a graph output's producer is renamed "<name>_QuantizeLinear_Input"
                self.enc[n.input[0].removesuffix("_QuantizeLinear_Input")] = (
                    self.inits[n.input[1]],
                    self.inits[n.input[2]],
                )

    def weight(self, name: str) -> np.ndarray:
        dq = next(
            n
            for n in self.model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] == f"{name}_quantized"
        )
        i = self.inits
        return (i[dq.input[0]].astype(np.float64) - i[dq.input[2]]) * i[dq.input[1]]


class _ThreeConvs:
    """Three 1x1 Convs without bias (x -> a -> b -> y, 6 channels) quantized by onnxruntime,
    and numpy's view of them: an activation's integers and values on its encoding, a Conv with
    its dequantized weights."""

    def __init__(self, tmp_path, seed: int, scale: dict[str, np.ndarray] | None = None):
        """``scale``: a weight name -> a factor its random weights are multiplied by."""
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        self.rng = rng = np.random.default_rng(seed)
        ws = {f"w{i}": rng.normal(size=(6, 6, 1, 1)).astype(np.float32) for i in (1, 2, 3)}
        for k, factor in (scale or {}).items():
            ws[k] = (ws[k] * factor).astype(np.float32)
        self.weights = ws
        g = helper.make_graph(
            [
                helper.make_node("Conv", ["x", "w1"], ["a"]),
                helper.make_node("Conv", ["a", "w2"], ["b"]),
                helper.make_node("Conv", ["b", "w3"], ["y"]),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
            [numpy_helper.from_array(v, k) for k, v in ws.items()],
        )
        fp, qp = tmp_path / "m.onnx", tmp_path / "q.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(fp))
        self.x = x = rng.normal(size=(1, 6, 8, 8)).astype(np.float32)
        self.quantized = _Quantized(fp, qp, x)

    def ints(self, v: np.ndarray, name: str) -> np.ndarray:
        s, z = (float(t) for t in self.quantized.enc[name])
        return np.clip(np.rint(v / s) + z, 0, 255)

    def deq(self, q: np.ndarray, name: str) -> np.ndarray:
        s, z = (float(t) for t in self.quantized.enc[name])
        return (q - z) * s

    def conv(self, v: np.ndarray, w: str) -> np.ndarray:
        return np.einsum("oc,nchw->nohw", self.quantized.weight(w)[:, :, 0, 0], v)


def test_the_channel_blowing_a_weight_range_is_measured_against_the_next_widest_on_its_axis(
    tmp_path,
):
    """Evidence.outlier_next: w1's output channels spread as trained weights do (ranges about
    1, 1, 2, 4, 16 and 24 - the widest far beyond the median, 1.5x the next), w2's input
    channel 2 is 30x the others (what a compensated pair leaves), w3 one weight 60x the rest
    (too few weights to call one an outlier by: its output channel is alone). Each ratio is
    the widest over the next widest on the axis that blows the range, from the float weights
    in numpy."""
    from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder, float_weights_of
    from accdbg.core.tensor_store import TensorFolder, TensorWriter

    spread = np.array([1, 1, 2, 4, 16, 24], np.float32).reshape(6, 1, 1, 1)
    pair = np.ones((1, 6, 1, 1), np.float32)
    pair[0, 2] = 30
    single = np.ones((6, 6, 1, 1), np.float32)
    single[4, 1] = 60
    convs = _ThreeConvs(tmp_path, seed=5, scale={"w1": spread, "w2": pair, "w3": single})
    ws = convs.weights
    values = {"x": convs.x.astype(np.float64)}
    for src, w, out in (("x", "w1", "a"), ("a", "w2", "b"), ("b", "w3", "y")):
        values[out] = np.einsum("oc,nchw->nohw", ws[w][:, :, 0, 0], values[src])
    writer = TensorWriter(tmp_path / "golden")
    for n in "aby":
        writer.write(n, values[n].astype(np.float32))
    writer.save_manifest()
    import onnx

    weights = float_weights_of(onnx.load(str(tmp_path / "m.onnx")))
    ev = EvidenceBuilder(
        convs.quantized.model, TensorFolder(tmp_path / "golden"), lambda n: n, weights
    ).build()

    def next_widest(w: np.ndarray, axis: int) -> float:
        ranges = np.sort(np.abs(w).max(axis=tuple(a for a in range(4) if a != axis)))
        return float(ranges[-1] / ranges[-2])

    assert ev["a"].weight_outlier == "output channel"
    assert ev["a"].outlier_next == pytest.approx(next_widest(ws["w1"], 0), rel=1e-6)
    assert ev["a"].outlier_next < 4  # a trained spread
    assert ev["b"].weight_outlier == "input channel"
    assert ev["b"].outlier_next == pytest.approx(next_widest(ws["w2"], 1), rel=1e-6)
    assert ev["b"].outlier_next > 4
    # 36 weights: no percentile to call one weight an outlier by; its channel is alone
    assert ev["y"].weight_outlier == "output channel"
    assert ev["y"].outlier_next == pytest.approx(next_widest(ws["w3"], 0), rel=1e-6)
    assert ev["y"].outlier_next > 4
    assert ev["a"].weight_per_channel is False


def test_a_layer_alone_on_the_cpu_is_fed_the_golden_of_its_nearest_inputs(tmp_path):
    """Layerwise's CPU reference: three 1x1 Convs quantized by onnxruntime; a layer run alone
    in the CPU fake-quant reads the golden of its input (not what the model computes from
    its input), quantized with that input's encoding; with no golden for its input, it reads
    the nearest golden upstream and computes the layers between as quantized. Expected values
    in numpy from the QDQ model's encodings and dequantized weights."""
    from accdbg.algorithms.diagnosis.divergence import golden_alone
    from accdbg.core.tensor_store import TensorFolder, TensorWriter
    from accdbg.engines.exposure import select

    convs = _ThreeConvs(tmp_path, seed=3)
    quantized, x, rng, conv = convs.quantized, convs.x, convs.rng, convs.conv
    enc = quantized.enc

    def qdq_of(v, name):
        return convs.deq(convs.ints(v, name), name)

    # golden values unrelated to what the model computes from x: only they can explain a match
    golden = {n: (3 * rng.normal(size=(1, 6, 8, 8))).astype(np.float32) for n in "ab"}
    layers = select(quantized.model, {"a", "b", "y"})
    for kept, asked in (("ab", ["b", "y"]), ("a", ["y"])):
        w = TensorWriter(tmp_path / f"golden_{kept}")
        for n in kept:
            w.write(n, golden[n])
        w.save_manifest()
        folder = TensorFolder(tmp_path / f"golden_{kept}")
        held = golden_alone(quantized.model, layers, asked, {"x": x}, folder, lambda n: n)
        got = {e.name: e.dequantize(held[e.name]) for e in layers if e.name in held}
        b = qdq_of(conv(qdq_of(golden["a"], "a"), "w2"), "b")
        expected = {
            "b": b,
            "y": qdq_of(conv(qdq_of(golden["b"], "b") if "b" in kept else b, "w3"), "y"),
        }
        assert sorted(got) == sorted(asked)
        for n in asked:
            step = float(enc[n][0])
            diff = np.abs(got[n].astype(np.float64) - expected[n])
            assert diff.max() <= 1.01 * step  # float32 against float64: a rounding tie at most
            assert np.mean(diff < step / 2) > 0.99, (kept, n)


def test_a_layers_error_in_the_cpu_fake_quant_of_the_whole_model_matches_numpy(tmp_path):
    """A full run's CPU reference: each asked layer's whole-tensor error against its golden in
    onnxruntime's CPU fake-quant of the whole model, fed the model's input - numpy computes
    the same chain from the QDQ model's encodings and dequantized weights."""
    from accdbg.algorithms.diagnosis.culprits import _CpuReference
    from accdbg.algorithms.diagnosis.evidence import EvidenceBuilder
    from accdbg.core.tensor_store import TensorFolder, TensorWriter
    from accdbg.verifiers import get_verifier

    convs = _ThreeConvs(tmp_path, seed=9)
    x, ints, deq, conv = convs.x, convs.ints, convs.deq, convs.conv
    a = deq(ints(conv(deq(ints(x, "x"), "x"), "w1"), "a"), "a")
    b = deq(ints(conv(a, "w2"), "b"), "b")
    # golden near the quantized values: the error measured is theirs, not the golden's size
    noise = {n: 0.05 * convs.rng.normal(size=(1, 6, 8, 8)) for n in "ab"}
    golden = {n: (v + noise[n]).astype(np.float32) for n, v in (("a", a), ("b", b))}
    w = TensorWriter(tmp_path / "golden")
    for n, v in golden.items():
        w.write(n, v)
    w.save_manifest()
    builder = EvidenceBuilder(convs.quantized.model, TensorFolder(tmp_path / "golden"), lambda n: n)
    cpu = _CpuReference(convs.quantized.model, builder, {"x": x}, get_verifier("SQNR"), False)
    got = cpu.in_run(["a", "b"])
    for n, v in (("a", a), ("b", b)):
        g = golden[n].astype(np.float64)
        assert got[n] == pytest.approx(np.sum((v - g) ** 2) / np.sum(g**2), rel=1e-3)


def test_a_kernel_difference_measured_alone_is_added_where_its_layer_computes(tmp_path):
    """Layerwise's kernel cost: a difference between the backend's and the CPU's result of a
    layer run alone (here +3 integer steps on channel 0 of the middle Conv) added to the CPU
    fake-quant of the whole model moves the output as numpy computes it from the QDQ model's
    encodings: the shifted integers, clipped to uint8, carried through the last Conv."""
    from accdbg.algorithms.diagnosis.divergence import KernelRuns
    from accdbg.engines.exposure import select

    convs = _ThreeConvs(tmp_path, seed=5)
    quantized, x, ints, deq, conv = convs.quantized, convs.x, convs.ints, convs.deq, convs.conv

    a = deq(ints(x, "x"), "x")
    b = ints(conv(deq(ints(conv(a, "w1"), "a"), "a"), "w2"), "b")
    moved = b.copy()
    moved[:, 0] = np.clip(moved[:, 0] + 3, 0, 255)
    base, shifted = (deq(ints(conv(deq(v, "b"), "w3"), "y"), "y") for v in (b, moved))
    expected = np.sum((shifted - base) ** 2) / np.sum(base**2)

    layers = select(quantized.model, {"a", "b", "y"})
    cpu = b.astype(np.uint8)  # the CPU's integers of b; the backend's 3 steps above on channel 0
    backend = cpu.astype(np.int32)
    backend[:, 0] += 3
    pairs = {"b": (np.clip(backend, 0, 255).astype(np.uint8), cpu)}
    runs = KernelRuns.of_differences(quantized.model, layers, {"x": x}, pairs, ["y"])
    effect = runs.each()["b"]["y"]
    assert effect == pytest.approx(expected, rel=0.02)
    assert expected > 1e-4  # the shift reaches the output: not two zeros agreeing


def test_taking_one_layer_out_of_the_quantized_model_matches_numpy(tmp_path):
    """The leave-one-out measure: the whole QDQ model with one layer's quantizers taken out
    (float weights, no output Q/DQ) against the same chain computed in numpy from the QDQ
    model's encodings. Layer 1's output crushes a channel that layer 2's weights amplify, so
    taking layer 1 out removes most of the error."""

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity
    from accdbg.core.onnx_model import topological_nodes
    from accdbg.engines.exposure import Exposed

    rng = np.random.default_rng(4)
    w1 = rng.normal(size=(6, 5)).astype(np.float32)
    w1[:, 0] *= 1 / 100  # channel 0 of `a` is tiny: crushed by a's range...
    w2 = rng.normal(size=(5, 4)).astype(np.float32)
    w2[0] *= 100  # ...and amplified again by the next weights
    model, fp, qp = _matmul_chain(tmp_path, w1, w2)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    quantized = _Quantized(fp, qp, x)
    q, enc, w_np = quantized.model, quantized.enc, quantized.weight

    def _qdq_np(v, t):
        s, z = enc[t]
        return (np.clip(np.round(v / s) + z, 0, 255) - z) * s

    def chain(x, keep_1: bool):
        """(golden, the QDQ chain, or with layer 1's quantizers taken out) in numpy."""
        x64 = x.astype(np.float64)
        xq = _qdq_np(x64, "x")
        a = _qdq_np(xq @ w_np("w1"), "a") if keep_1 else xq @ w1.astype(np.float64)
        return x64 @ w1 @ w2, _qdq_np(a @ w_np("w2"), "y")

    golden, whole = chain(x, True)
    _, without_1 = chain(x, False)

    nodes = topological_nodes(q.graph)
    made_by = {o: n for n in nodes for o in n.output}
    index = next(  # the MatMul reading w1's DequantizeLinear output
        i
        for i, n in enumerate(nodes)
        if n.op_type == "MatMul" and made_by[n.input[1]].input[0] == "w1_quantized"
    )
    layer = Exposed(
        "a",
        "a",
        nodes[index].name,
        "MatMul",
        index,
        "a",
        scale=float(enc["a"][0]),
        zero_point=int(enc["a"][1]),
        native_dtype="uint8",
    )
    s = Sensitivity(model, q, {"x": x})
    noise = lambda t: float(np.sum((golden - t) ** 2))  # noqa: E731
    assert s.whole_noise[0] == pytest.approx(noise(whole), rel=1e-3)
    assert s.removed_noise([layer])[0] == pytest.approx(noise(without_1), rel=1e-3)
    share = s.share(layer)
    assert share.removed == pytest.approx(1 - noise(without_1) / noise(whole), abs=1e-3)
    assert share.removed > 0.5  # the crushed channel is most of the error
    # a first measure that settles the verdict spares the second (a session of the QDQ model)
    assert math.isnan(s.share(layer, enough=share.alone).removed)
    # several inputs: the error powers are summed over them before the share is taken
    x2 = (0.5 * rng.normal(size=(8, 6))).astype(np.float32)
    both = Sensitivity(model, q, [{"x": x}, {"x": x2}])

    def power(x, keep_1):
        g, t = chain(x, keep_1)
        return float(np.sum((g - t) ** 2))

    assert both.whole_noise[0] == pytest.approx(power(x, True) + power(x2, True), rel=1e-3)
    pooled = 1 - (power(x, False) + power(x2, False)) / (power(x, True) + power(x2, True))
    assert both.share(layer).removed == pytest.approx(pooled, abs=1e-3)
    # the layer named up front: one model with its encodings behind a switch answers both
    # measures, with the same figures (only layer 1's weights and output quantized, in numpy)
    shared = Sensitivity(model, q, {"x": x}, [layer])
    assert shared._removed.covers([layer]) and shared._alone.covers([layer])
    assert np.array_equal(shared.golden[0][0], s.golden[0][0])
    assert shared.whole_noise[0] == pytest.approx(noise(whole), rel=1e-3)
    assert shared.removed_noise([layer])[0] == pytest.approx(noise(without_1), rel=1e-3)
    only_1 = _qdq_np(x.astype(np.float64) @ w_np("w1"), "a") @ w2.astype(np.float64)
    assert shared.alone_noise([layer])[0] == pytest.approx(noise(only_1), rel=1e-3)
    assert shared.alone_noise([layer])[0] == pytest.approx(s.alone_noise([layer])[0], rel=1e-6)
    # a group naming a layer twice (a row and the layer whose weights it stands for, also a
    # partner) is that layer once - in a model of its own too (one switch input each)
    assert s.share([layer, layer]) == s.share(layer)
    twice = Sensitivity(model, q, {"x": x})
    assert twice.removed_noise([layer, layer])[0] == pytest.approx(noise(without_1), rel=1e-3)
    assert twice.alone_noise([layer, layer])[0] == pytest.approx(noise(only_1), rel=1e-3)
    # a layer the float model does not have: the shared models are built without switches,
    # the golden still comes, and only that layer's question fails (the others are answered)
    from dataclasses import replace

    ghost = replace(layer, name="ghost", qdq_tensor="ghost", index=0)
    plain = Sensitivity(model, q, {"x": x}, [layer, ghost])
    assert not plain._alone.covers([layer])
    assert np.array_equal(plain.golden[0][0], s.golden[0][0])
    assert plain.alone_noise([layer])[0] == pytest.approx(noise(only_1), rel=1e-3)
    with pytest.raises(KeyError):
        plain.alone_noise([ghost])


def test_a_share_says_which_output_it_is_of_when_the_model_has_several(tmp_path):
    """A model with two outputs: y after two MatMuls, z from a branch of its own (x @ w3).
    Layer 1's encodings reach y only, so both its measures are of y's error - the cause names
    that output; with one output there is nothing to name. (MediaPipe's hand_landmark_full: a
    convolution taken out removes 89 % of the handedness logit's error, 9.5 % of the world
    landmarks' - the output QNN is worst at.)"""
    from accdbg.algorithms.diagnosis.ranking.measures import _both
    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity

    rng = np.random.default_rng(4)
    w1 = rng.normal(size=(6, 5)).astype(np.float32)
    w1[:, 0] *= 1 / 100  # channel 0 of `a` is crushed by a's range and amplified after
    w2 = rng.normal(size=(5, 4)).astype(np.float32)
    w2[0] *= 100
    x = rng.normal(size=(8, 6)).astype(np.float32)
    model, fp, qp = _matmul_chain(tmp_path, w1, w2, side=rng.normal(size=(6, 3)).astype(np.float32))
    q = _Quantized(fp, qp, x).model
    share = Sensitivity(model, q, {"x": x}).share(_matmul_layer(q, "w1", "a"))
    assert share.removed > 0.1  # the crushed channel is much of y's error
    assert (share.alone_at, share.removed_at, share.at) == ("y", "y", "y")
    assert _both(share).endswith("; of the output y's error")
    (tmp_path / "one").mkdir()
    model, fp, qp = _matmul_chain(tmp_path / "one", w1, w2)
    q = _Quantized(fp, qp, x).model
    one = Sensitivity(model, q, {"x": x}).share(_matmul_layer(q, "w1", "a"))
    assert one.at == "" and "of the output" not in _both(one)
    # an output a Sigmoid makes is judged at its logits, and named as the model's output
    (tmp_path / "sig").mkdir()
    side = rng.normal(size=(6, 3)).astype(np.float32)
    model, fp, qp = _matmul_chain(tmp_path / "sig", w1, w2, side=side, sigmoid=True)
    q = _Quantized(fp, qp, x).model
    squashed = Sensitivity(model, q, {"x": x})
    assert squashed.outputs == ["z", "logits"]
    assert squashed.share(_matmul_layer(q, "w1", "a")).at == "y"
    # the larger measure's output is named
    assert _both(Share(0.2, 0.8, "y", "z")) == (
        "alone 20%, taken out of the quantized model 80%; of the output z's error"
    )


def test_a_layers_encodings_applied_alone_include_its_bias(tmp_path):
    """Two 1x1 Convs with biases, quantized by onnxruntime (int32 biases at the input's scale
    times the weights'): the float model with a layer's encodings applied uses its weights,
    its bias and its output as the QDQ model has them (numpy, from the QDQ model's own
    encodings). Left in float, the biases move some outputs across a rounding step, which a
    model amplifying small differences turns into many times the quantized model's error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity
    from accdbg.core.onnx_model import topological_nodes
    from accdbg.engines.exposure import Exposed

    rng = np.random.default_rng(7)
    w1 = rng.normal(size=(6, 4, 1, 1)).astype(np.float32)
    w2 = rng.normal(size=(3, 6, 1, 1)).astype(np.float32)
    b1 = rng.normal(0, 0.5, size=6).astype(np.float32)
    b2 = rng.normal(0, 0.5, size=3).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
            helper.make_node("Conv", ["a", "w2", "b2"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])],
        [
            numpy_helper.from_array(v, k)
            for k, v in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2))
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    fp, qp = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(fp))
    x = (30 * rng.normal(size=(1, 4, 32, 32))).astype(np.float32)
    quantized = _Quantized(fp, qp, x)
    q, enc, inits = quantized.model, quantized.enc, quantized.inits
    nodes = topological_nodes(q.graph)
    convs = [i for i, n in enumerate(nodes) if n.op_type == "Conv"]
    layers = [
        Exposed(
            t,
            t,
            nodes[i].name,
            "Conv",
            i,
            nodes[i].output[0],  # the graph output's is renamed "y_QuantizeLinear_Input"
            scale=float(enc[t][0]),
            zero_point=int(enc[t][1]),
            native_dtype="uint8",
        )
        for i, t in zip(convs, ("a", "y"), strict=True)
    ]
    s = Sensitivity(model, q, {"x": x})

    def _qdq_np(v, t):
        sc, z = enc[t]
        return (np.clip(np.round(v / sc) + z, 0, 255) - z) * sc

    def conv(v, w, b):  # a 1x1 convolution
        return np.einsum("oi,nihw->nohw", w[:, :, 0, 0], v) + b[None, :, None, None]

    def bias(name):  # its int32 integers at their scale
        dq = next(
            n
            for n in q.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] == f"{name}_quantized"
        )
        return inits[dq.input[0]].astype(np.float64) * inits[dq.input[1]]

    x64 = x.astype(np.float64)  # the graph input's encoding is no layer's
    golden = conv(conv(x64, w1, b1), w2, b2)

    def noise(b1_, b2_):
        a = _qdq_np(conv(x64, quantized.weight("w1"), b1_), "a")
        return float(np.sum((golden - _qdq_np(conv(a, quantized.weight("w2"), b2_), "y")) ** 2))

    both = noise(bias("b1"), bias("b2"))
    assert s.alone_noise(layers)[0] == pytest.approx(both, rel=1e-5)
    assert abs(noise(b1, b2) / both - 1) > 1e-4  # with float biases it would differ


def test_an_output_of_few_values_whose_shares_do_not_add_up_is_not_judged_on():
    """Hand-set error powers: a 64-value map and a one-value flag over three inputs. Three
    standouts, each alone, cost the flag 2.5, 0.3 and 0.1 times its error (2.9 in sum, over
    twice it): the flag's shares do not add up, so a share is the map's (layer 1: 3/10 there,
    not 2.5). At 1.5 in sum the flag is judged on too; a map of many values always is."""
    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity, Share

    def sens(flag_costs):
        s = object.__new__(Sensitivity)
        s.outputs = ["map", "flag"]
        s._output_of = {"map": "map", "flag": "flag"}  # each judged at itself
        s.golden = [[np.zeros((1, 64)), np.zeros((1, 1))]] * 3  # 192 and 3 values
        s.golden_power = np.array([100.0, 5.0])
        s.whole_noise = np.array([10.0, 1.0])
        per = {
            k: np.array([m, f])
            for k, m, f in zip((1, 2, 3), (3.0, 4.0, 9.0), flag_costs, strict=True)
        }
        s.alone_noise = lambda group: per[group[0]]
        s.removed_noise = lambda group: s.whole_noise  # nothing goes when taken out
        s._adds = s._additive([[1], [2], [3]])
        return s

    apart = sens((2.5, 0.3, 0.1))
    assert list(apart._adds) == [True, False]
    assert apart.share([1]) == Share(pytest.approx(0.3), pytest.approx(0.0))
    adding = sens((1.2, 0.2, 0.1))
    assert list(adding._adds) == [True, True]
    assert adding.share([1]).alone == pytest.approx(1.2)
    assert list(sens((2.5, 0.3, 0.1))._additive([[1]])) == [True, True]  # one standout: no sum


def test_several_culprits_losing_the_same_thing_are_called_one_pattern():
    """Three layers whose activation range each destroys their data are named one by one, and
    a finding says they are one problem with one change across them; two weight culprits are
    too few for a pattern."""
    rng = np.random.default_rng(7)
    names = [f"l{i}" for i in range(40)]
    ev = {n: _ev(n, 36 + rng.normal(0, 2)) for n in names}
    for n in ("l5", "l15", "l25"):
        ev[n] = Evidence(n, "Conv", [], output_nsr=10 ** (-2 / 10), output_note="8-bit")
    for n in ("l8", "l18"):
        ev[n] = _ev(n, 2.0)
    r = rank(ev, names, impact=_Impact({n: 0.6 for n in names}))
    assert len(r.culprits) == 5
    pattern = [f for f in r.findings if "alike" in f]
    assert pattern == [
        "3 culprits lose their activation range alike (l5, l15, l25): one change across them - "
        "16-bit activations on their outputs - may be the fix rather than one layer"
    ]
    assert r.findings.index(pattern[0]) == len(r.culprits)  # after the culprit lines


def test_a_clipping_layer_is_measured_though_its_noise_power_looks_healthy():
    """Clipping 3% of a layer's values costs little noise power (a local SQNR near the floor)
    but removes the largest values: the layer goes to the sensitivity step, and is named when
    it matters. A resize after it keeps the same range and clips as much: it is carried, not a
    second culprit. A model whose calibration clips a little everywhere raises the bar."""
    names, ev = _chain(11)
    for e in ev.values():
        e.clipped = 0.0  # min/max calibration on the debugged input: no layer clips

    def clipping(n, inputs, clipped, db=30.0, weights=True):
        e = Evidence(n, "Conv" if weights else "Resize", inputs, output_nsr=10 ** (-db / 10))
        e.output_nsr_tensor, e.clip_nsr, e.clipped = e.output_nsr, e.output_nsr, clipped
        if weights:
            e.weight_nsr, e.weight_note = 10 ** (-40 / 10), "w"
        return e

    ev["l10"] = clipping("l10", ["l9"], 0.03)
    ev["l11"] = clipping("l11", ["l10"], 0.03, weights=False)
    impact = _Impact({"l10": 0.7})
    r = rank(ev, names, impact=impact)
    assert [c.name for c in r.culprits] == ["l10"]
    assert r.culprits[0].cause.startswith("clipping: 3% of values outside the encoding")
    assert r.columns["l11"]["cause"] == "clipping carried in from l10 (the same range)"
    assert set(impact.asked) == {"l10"}
    # the same layer when it does not matter to the outputs: measured, not named
    assert rank(ev, names, impact=_Impact({"l10": 0.1})).culprits == []
    # every layer clips 0.5%: 3% is not ten times that, nothing goes to the sensitivity step
    for n in names:
        if n not in ("l10", "l11"):
            ev[n].clipped = 0.005
    impact = _Impact({"l10": 0.7})
    assert rank(ev, names, impact=impact).culprits == [] and impact.asked == []


def test_weight_evidence_counts_an_offset_the_bias_cancels_as_numpy_measures_it():
    """A 1x1 convolution (a matrix product) whose input channel 3 carries a constant of 200 that
    the bias cancels: the output's error from quantized weights, measured on the output itself,
    matches the evidence's estimate - and is far above what weighing each channel by its power
    alone would say (the offset is not signal)."""
    from accdbg.algorithms.diagnosis.evidence import _weighted_nsr

    rng = np.random.default_rng(11)
    w = rng.normal(0, 1, (6, 8))
    x = rng.normal(0, 1, (8, 20000))
    x[3] += 200.0
    b = -200.0 * w[:, 3]
    scale = np.abs(w).max() / 127
    wq = qdq(w.copy(), scale, 0, np.dtype(np.int8))
    y, yq = w @ x + b[:, None], wq @ x + b[:, None]
    truth = np.median(((yq - y) ** 2).mean(axis=1) / (y**2).mean(axis=1))
    stats = np.stack([(x**2).mean(axis=1), x.mean(axis=1)])
    got, dc_share = _weighted_nsr(w, wq - w, 0, 1, stats, bias=b)
    assert _db(got) == pytest.approx(_db(truth), abs=0.5)
    assert dc_share > 0.9
    power_only = np.median(((wq - w) ** 2 @ stats[0]) / (w**2 @ stats[0]))
    assert _db(power_only) - _db(truth) > 20


def test_output_evidence_matches_numpy_on_a_hand_built_tensor():
    """The output encoding's loss, clipping and range used, against the formulas written out in
    numpy: uint8, scale 0.1, zero point 10 (range -1.0 .. 24.5); channel 1 holds values beyond
    the range on both sides, one of them within half a step of it (clipped in value, not
    counted among the clipped values)."""
    from accdbg.algorithms.diagnosis.evidence import Evidence, output_evidence
    from accdbg.engines.exposure import Exposed

    rng = np.random.default_rng(3)
    g = rng.uniform(0.0, 3.0, size=(1, 2, 4, 4))
    g[0, 1, 0, :4] = [27.0, 30.0, -1.5, 24.53]
    e = Exposed("t", "t", "n", "Conv", 0, "t", scale=0.1, zero_point=10, native_dtype="uint8")
    ev = Evidence("t", "Conv", [])
    output_evidence(e, (g, "NCHW"), ev)
    q = (np.clip(np.round(g / 0.1) + 10, 0, 255) - 10) * 0.1  # ties are measure-zero here
    vmin, vmax = -1.0, 24.5
    assert ev.output_nsr_tensor == pytest.approx(np.sum((q - g) ** 2) / np.sum(g**2), rel=1e-9)
    assert ev.clipped == pytest.approx(3 / 32)  # 27, 30 and -1.5; not 24.53
    clip = np.clip(g, vmin, vmax) - g
    assert ev.clip_nsr == pytest.approx(np.sum(clip**2) / np.sum(g**2), rel=1e-9)
    assert ev.range_used == pytest.approx((30.0 + 1.5) / (vmax - vmin))
    per = [np.sum((q - g)[0, c] ** 2) / np.sum(g[0, c] ** 2) for c in (0, 1)]
    assert ev.output_nsr == pytest.approx(np.median(per), rel=1e-9)
    assert "9.38% of values clipped" in ev.output_note
    empty = Evidence("t", "Conv", [])
    output_evidence(e, (np.zeros((1, 2, 0, 4)), "NCHW"), empty)  # nothing to judge
    assert math.isnan(empty.output_nsr)


def test_taking_out_a_layer_whose_relu_the_quantizer_folded_keeps_the_relu(tmp_path):
    """QNN's QDQ model drops a Relu/Clip whose output encoding starts at 0 (the QuantizeLinear's
    saturation does its work). Taking that layer's quantizers out must keep the Relu: the
    leave-one-out model matches the numpy chain relu(x @ w1) in float, then layer 2 quantized."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import quantize

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity
    from accdbg.core.onnx_model import topological_nodes
    from accdbg.engines.exposure import Exposed

    rng = np.random.default_rng(7)
    w1 = rng.normal(size=(6, 5)).astype(np.float32)
    w2 = rng.normal(size=(5, 4)).astype(np.float32)
    model, fp, qp = _matmul_chain(tmp_path, w1, w2, relu=True)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    quantize(str(fp), str(qp), qnn_quantization().get_qnn_qdq_config(str(fp), _Feeds(x)))
    q = onnx.load(str(qp))
    assert not any(n.op_type == "Relu" for n in q.graph.node), "the quantizer kept the Relu"
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}

    def enc(t):
        qn = next(
            n
            for n in q.graph.node
            if n.op_type == "QuantizeLinear"
            and n.input[0].removesuffix("_QuantizeLinear_Input") == t
        )
        return inits[qn.input[1]].astype(np.float64), inits[qn.input[2]].astype(np.float64)

    def _qdq_np(v, t):
        s, z = enc(t)
        return (np.clip(np.round(v / s) + z, 0, 255) - z) * s

    def w_np(name):
        dq = next(
            n
            for n in q.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0].startswith(name)
        )
        return (inits[dq.input[0]].astype(np.float64) - inits[dq.input[2]]) * inits[dq.input[1]]

    x64 = x.astype(np.float64)
    golden = np.maximum(x64 @ w1, 0) @ w2
    without_1 = _qdq_np(np.maximum(_qdq_np(x64, "x") @ w1, 0) @ w_np("w2"), "y")
    nodes = topological_nodes(q.graph)
    index = next(i for i, n in enumerate(nodes) if n.op_type == "MatMul" and "r" in n.output)
    s, z = enc("r")
    layer = Exposed(
        "r",
        "r",
        nodes[index].name,
        "MatMul",
        index,
        "r",
        scale=float(s),
        zero_point=int(z),
        native_dtype="uint8",
    )
    sens = Sensitivity(model, q, {"x": x})
    assert sens.removed_noise([layer])[0] == pytest.approx(
        float(np.sum((golden - without_1) ** 2)), rel=1e-3
    )


@pytest.mark.slow
@pytest.mark.parametrize("bias", [True, False])
def test_weights_of_a_gemm_the_qnn_preprocessing_hides_between_reshapes_are_judged(tmp_path, bias):
    """A MatMul with a bias on a 3-D input becomes Reshape, Gemm, Reshape in QNN's model; the
    Gemm's output has no golden value, the last Reshape's does. The Gemm's weights are that
    row's: a weight 40x its tensor's largest is seen there, and named. A MatMul without a
    bias stays one (its 2-D weight's input axis is 0: magika's dense layer had no evidence)."""
    built = models.dense_chain(tmp_path, outlier=40.0, bias=bias)
    inp = [parse_input_tensor(["x", "1,12,16", str(built.input_path)])]
    res = run_oneshot("onnx", built.path, inp, working_dir=tmp_path / "w")
    s = res.summary.set_index("Name")
    planted = built.expected["planted"]
    if bias:
        assert s.loc[planted, "LayerType"] == "Reshape"  # the row is the reshape after the Gemm
    else:
        assert s.loc[planted, "LayerType"] == "MatMul"  # its Relu fused into it
    assert s.loc[planted, "weight SQNR"] < 20, s["weight SQNR"]
    others = s.drop(index=planted)["weight SQNR"].dropna()
    assert len(others) >= 5 and (others > s.loc[planted, "weight SQNR"] + 10).all(), others
    ranked = res.summary.dropna(subset=["culprit_rank"]).sort_values("culprit_rank")
    # ranked first by the CPU measures; QNN confirms it (named) or finds its region in fp16
    # gains under a dB at outputs that meet their thresholds (said so, nothing named instead)
    first = f"not a culprit on QNN: {planted} - ranked #1"
    unconfirmed = any(f.startswith(first) for f in res.findings)
    assert list(ranked["Name"])[:1] == [planted] or (unconfirmed and ranked.empty), (
        ranked[["Name", "cause"]],
        res.findings,
    )
    # the outlier named: the weight, or its row (input channel 5) or column (output channel 9)
    cause = s.loc[planted, "cause"]
    assert any(t in cause for t in ("weight [5, 9]", "input channel 5 ", "output channel 9 ")), (
        cause
    )


def test_what_the_kernels_add_is_the_errors_difference_not_the_runs_distance():
    """Two runs rounding differently part by as much as either is from float: QNN is then no
    worse, whatever their distance; the share is that of QNN's error the CPU's lacks."""
    rng = np.random.default_rng(3)
    g = rng.normal(size=10_000)
    cpu, qnn = g + 0.1 * rng.normal(size=g.size), g + 0.1 * rng.normal(size=g.size)
    nsr = lambda x: float(((x - g) ** 2).sum() / (g**2).sum())  # noqa: E731
    assert nsr(qnn - cpu + g) > 0.9 * nsr(qnn)  # the runs are as far apart as from float
    same = KernelsAdded("out", nsr(qnn), nsr(cpu))
    assert same.share < 0.05 and "add nothing measurable" in same.line()
    worse = KernelsAdded("out", nsr(qnn) * 4, nsr(qnn))  # QNN's error four times the CPU's
    assert worse.share == pytest.approx(0.75) and worse.line().startswith("QNN's kernels add 75%")
    assert f"{10 * math.log10(1 / (4 * nsr(qnn))):.1f} dB SQNR on QNN" in worse.line()
    picked = KernelsAdded.worst({"a": (0.01, 0.01), "b": (0.02, 0.005), "c": (0.0, 0.0)})
    assert (picked.output, picked.share) == ("b", 0.75)
    assert KernelsAdded.worst({}) is None


def test_an_fp16_run_is_compared_with_the_cpu_float_run_and_says_so():
    """A float model QNN ran in fp16 has no fake-quant: the CPU reference is its float run."""
    rng = np.random.default_rng(5)
    names = [f"l{i}" for i in range(31)]
    ev = {n: _ev(n, 36 + rng.normal(0, 1)) for n in names}
    dbs = [44 + rng.normal(0, 2) for _ in range(30)] + [23.0]
    div = {n: 10 ** (-d / 10) for n, d in zip(names, dbs, strict=True)}
    added = KernelsAdded("out", 0.01, 0.0001, quantized=False)
    r = rank(
        ev,
        names,
        divergence=div,
        kernels_added=added,
        quantized=False,
        kernel_share=lambda ns: {n: 0.8 for n in ns},
    )
    assert r.culprits[0].name == "l30"
    assert "onnxruntime's CPU run of this layer and QNN part at 23.0 dB" in r.culprits[0].cause
    assert "added to the CPU float run, costs the outputs 80%" in r.culprits[0].cause
    assert "fake-quant" not in " ".join(r.findings) + r.culprits[0].cause
    assert (
        "99% to the outputs' error: out at 20.0 dB SQNR on QNN, 40.0 dB in onnxruntime's CPU "
        "run of the same float model" in r.findings[-2]
    )


def test_a_few_weights_far_beyond_their_tensor_are_counted_as_numpy_counts_them():
    from accdbg.algorithms.diagnosis.evidence import few_outliers

    rng = np.random.default_rng(11)
    w = rng.normal(scale=0.1, size=(16, 32, 1, 1))
    p99 = np.percentile(np.abs(w), 99)
    w[5, 7, 0, 0] = 40 * p99
    count, rest, ratio, note = few_outliers(w)
    p99_after = np.percentile(np.abs(w), 99)
    assert count == 1 and ratio == pytest.approx(40 * p99 / p99_after)
    assert rest == pytest.approx(np.sort(np.abs(w).ravel())[-2])
    assert note.startswith("weight [5, 7, 0, 0] is ")
    scaled = w.copy()
    scaled[5, 7, 0, 0] = w[4, 7, 0, 0]
    scaled[3] *= 40  # a whole output channel: not "a few weights"
    assert few_outliers(scaled)[0] == 0
    assert few_outliers(w[:2, :40, 0, 0])[0] == 0  # under 100 weights: no percentile to trust


def test_weights_requantized_on_their_encodings_terms():
    """Symmetric int8 per output channel stays symmetric (scale max|w|/127 per channel);
    asymmetric uint8 per tensor takes the range with zero in it (ONNX QuantizeLinear's terms)."""
    from onnx import helper, numpy_helper

    from accdbg.algorithms.diagnosis.sensitivity import requantized

    rng = np.random.default_rng(12)
    w = rng.normal(size=(4, 3, 3, 3))
    inits = {
        "wq": numpy_helper.from_array(np.zeros(w.shape, np.int8), "wq"),
        "s": numpy_helper.from_array(np.ones(4, np.float32), "s"),
        "z": numpy_helper.from_array(np.zeros(4, np.int8), "z"),
    }
    dq = helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], axis=0)
    ints, scale, zp = (numpy_helper.to_array(t) for t in requantized(dq, inits, w))
    expected = np.abs(w).reshape(4, -1).max(axis=1) / 127
    assert scale == pytest.approx(expected, rel=1e-6) and not zp.any()
    back = ints.astype(np.float64) * scale.reshape(4, 1, 1, 1)
    assert np.abs(back - w).max() <= expected.max() / 2 + 1e-6

    inits = {
        "wq": numpy_helper.from_array(np.zeros(w.shape, np.uint8), "wq"),
        "s": numpy_helper.from_array(np.float32(1.0), "s"),
        "z": numpy_helper.from_array(np.uint8(128), "z"),
    }
    dq = helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"])
    ints, scale, zp = (numpy_helper.to_array(t) for t in requantized(dq, inits, w))
    lo, hi = min(w.min(), 0.0), max(w.max(), 0.0)
    assert float(scale) == pytest.approx((hi - lo) / 255, rel=1e-6)
    assert int(zp) == round(-lo / ((hi - lo) / 255))
    back = (ints.astype(np.float64) - int(zp)) * float(scale)
    assert np.abs(back - w).max() <= float(scale) / 2 + 1e-6


def test_an_outlier_weight_is_named_by_what_the_model_loses_without_it_not_its_own_encodings():
    """A layer at the noise floor whose one weight is 40x its tensor's 99th percentile: alone
    and taken out it costs 1 %, without that weight the outputs lose 80 % of their error - it is
    the culprit, asked together with the other such layers first. Under POLICY.blown_ratio, or when
    the outputs hardly change, nothing is named."""

    class Clamping(_Impact):
        def __init__(self, shares, clamped):
            super().__init__(shares)
            self.clamp_answers, self.clamp_asked = clamped, []

        def clamped(self, levels):
            key = tuple(sorted(levels))
            self.clamp_asked.append((key, dict(levels)))
            return self.clamp_answers.get(key, 0.0)

    def model(ratio_a: float, ratio_b: float):
        ev = {f"c{i}": _ev(f"c{i}", 30 + (i % 3)) for i in range(12)}
        for name, ratio in (("c4", ratio_a), ("c9", ratio_b)):
            ev[name].few_outliers, ev[name].rest_max, ev[name].few_ratio = 1, 0.25, ratio
            ev[name].few_note = f"weight [1, 2] is {ratio:g}x the tensor's 99th percentile"
        return ev

    ev = model(40, 20)
    impact = Clamping({}, {("c4", "c9"): 0.85, ("c4",): 0.8, ("c9",): 0.05})
    r = rank(ev, list(ev), impact=impact)
    assert [c.name for c in r.culprits] == ["c4"]
    assert "outlier weight: weight [1, 2] is 40x" in r.culprits[0].cause
    assert "the outputs lose 80% of their error" in r.culprits[0].cause
    assert impact.clamp_asked[0] == (("c4", "c9"), {"c4": 0.25, "c9": 0.25})  # together first
    assert r.culprits[0].kind == ranking_mod.FEW

    assert not any("outlier weights of" in f for f in r.findings)

    quiet = Clamping({}, {("c4", "c9"): 0.3})
    r = rank(ev, list(ev), impact=quiet)
    assert r.culprits == [] and not any("outlier weights of" in f for f in r.findings)
    assert [k for k, _ in quiet.clamp_asked] == [("c4", "c9")]  # not one by one

    # together they matter, neither alone: no culprit, a finding of the model as a whole
    spread = Clamping({}, {("c4", "c9"): 0.63, ("c4",): 0.35, ("c9",): 0.4})
    r = rank(ev, list(ev), impact=spread)
    assert r.culprits == []
    assert (
        "the outlier weights of 2 layers (c4, c9; up to 40x their tensor's 99th percentile) "
        "together cost the outputs 63% of their error, none of them alone half" in r.findings[-2]
    )

    # many such layers: one by one only the POLICY.one_by_one farthest outliers (two sessions each)
    many = {f"c{i}": _ev(f"c{i}", 30 + (i % 3)) for i in range(20)}
    for i, name in enumerate(many):
        many[name].few_outliers, many[name].rest_max = 1, 0.25
        many[name].few_ratio, many[name].few_note = 17.0 + i, f"weight [{i}] is far"
    wide = Clamping({}, {tuple(sorted(many)): 0.9, ("c19",): 0.7})
    r = rank(many, list(many), impact=wide)
    one_by_one = [k for k, _ in wide.clamp_asked[1:]]
    expected = [(f"c{i}",) for i in range(19, 19 - POLICY.one_by_one, -1)]
    assert one_by_one == expected and [c.name for c in r.culprits] == ["c19"]

    mild = Clamping({}, {("c4",): 0.9})
    ev = model(POLICY.blown_ratio * 0.9, 3)
    assert rank(ev, list(ev), impact=mild).culprits == [] and mild.clamp_asked == []


def test_the_model_without_its_outlier_weight_is_measured_as_numpy_computes_it(tmp_path):
    """Sensitivity.clamped_share against the same chain in numpy: layer 2's weight [3, 2] is
    100x the rest, so output column 2 carries channel 3 of layer 1's quantized output 100 times
    over. With that weight brought to the rest's range (in float, and requantized over the
    range left), each model judged against its own float, most of the error power goes."""

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity

    rng = np.random.default_rng(5)
    w1 = rng.normal(size=(6, 40)).astype(np.float32)
    w2 = rng.normal(scale=0.1, size=(40, 4)).astype(np.float32)
    w2[3, 2] = 100 * np.abs(w2).max()
    model, fp, qp = _matmul_chain(tmp_path, w1, w2)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    quantized = _Quantized(fp, qp, x)
    q, enc, w_np = quantized.model, quantized.enc, quantized.weight

    def uint8_weights(w):  # ONNX QuantizeLinear's asymmetric per-tensor terms, zero included
        lo, hi = min(w.min(), 0.0), max(w.max(), 0.0)
        s = (hi - lo) / 255
        return _qdq_np(w, s, np.round(-lo / s))

    def noise(w2_float, w2_quantized):
        x64 = x.astype(np.float64)
        golden = x64 @ w1.astype(np.float64) @ w2_float
        a = _qdq_np(_qdq_np(x64, *enc["x"]) @ w_np("w1"), *enc["a"])
        return float(np.sum((golden - _qdq_np(a @ w2_quantized, *enc["y"])) ** 2))

    level = float(np.sort(np.abs(w2).ravel())[-2])
    clamped = np.clip(w2.astype(np.float64), -level, level)
    expected = 1 - noise(clamped, uint8_weights(clamped)) / noise(w2.astype(np.float64), w_np("w2"))

    layer = _matmul_layer(q, "w2", "y")
    share = Sensitivity(model, q, {"x": x}).clamped_share([(layer, level)])
    assert share == pytest.approx(expected, abs=1e-3)
    assert share > 0.5


def test_an_outlier_output_channel_is_named_by_what_the_model_loses_without_it():
    """A standout costing the outputs little alone whose weights have one output channel 12x
    the next widest: brought to that channel's range the outputs lose 70 % of their
    noise-to-signal - it is a culprit (kind "outlier weights"), asked together with the other
    such layers first. A channel 3x the next (a wide spread of trained channels, which
    per-channel weights answer) is not asked, nor a channel 12x the next in a layer at the
    noise floor (its loud weights make no loud output); when together they cost little, none
    is asked alone."""

    class Channels(_Impact):
        def __init__(self, answers):
            super().__init__({})
            self.answers, self.questions = answers, []

        def channels(self, levels):
            key = tuple(sorted(levels))
            self.questions.append((key, dict(levels)))
            return self.answers.get(key, 0.0)

    ev = {f"c{i}": _ev(f"c{i}", 12 if i in (3, 10) else 30 + (i % 3)) for i in range(12)}
    for name, ratio, channel in (("c3", 12.0, 5), ("c8", 3.0, 1), ("c10", 4.5, 0), ("c5", 12.0, 2)):
        ev[name].lone_channel, ev[name].lone_ratio, ev[name].lone_level = channel, ratio, 0.5
    impact = Channels({("c10", "c3"): 0.75, ("c3",): 0.7, ("c10",): 0.1})
    r = rank(ev, list(ev), impact=impact)
    assert [c.name for c in r.culprits] == ["c3"]
    assert r.culprits[0].kind == ranking_mod.FEW
    assert "outlier output channel: channel 5 of its weights spans 12x the next" in (
        r.culprits[0].cause
    )
    assert "lose 70% of their noise-to-signal" in r.culprits[0].cause
    # together first (c8's 3x and c5 at the floor are not asked), then the farthest first
    assert impact.questions == [
        (("c10", "c3"), {"c3": (5, 0.5), "c10": (0, 0.5)}),
        (("c3",), {"c3": (5, 0.5)}),
        (("c10",), {"c10": (0, 0.5)}),
    ]
    quiet = Channels({("c10", "c3"): 0.2})
    assert rank(ev, list(ev), impact=quiet).culprits == [] and len(quiet.questions) == 1


def test_an_outlier_output_channel_at_the_noise_floor_is_asked_where_the_outputs_are_judged():
    """A head at the noise floor whose one output channel of weights spans 27x the next (a
    dense layer making a model output, one of whose outputs multiplies its inputs' error 27
    times): its loud channel is loud where it counts, so it is asked - and named when without
    it the outputs lose 96 % of their noise-to-signal. The same layer anywhere else is not
    asked (its test above), nor is it named when the question finds little."""

    class Channels(_Impact):
        def __init__(self, answers):
            super().__init__({})
            self.answers, self.questions = answers, []

        def channels(self, levels):
            self.questions.append(tuple(sorted(levels)))
            return self.answers.get(tuple(sorted(levels)), 0.0)

    ev = {f"c{i}": _ev(f"c{i}", 30 + (i % 3)) for i in range(12)}
    ev["c11"].lone_channel, ev["c11"].lone_ratio, ev["c11"].lone_level = 9, 27.0, 0.5
    asked = Channels({("c11",): 0.96})
    r = rank(ev, list(ev), impact=asked, judged=["c11"])
    assert [c.name for c in r.culprits] == ["c11"] and set(asked.questions) == {("c11",)}
    assert "channel 9 of its weights spans 27x the next widest" in r.culprits[0].cause
    assert "the outputs lose 96% of their noise-to-signal" in r.culprits[0].cause
    elsewhere = Channels({("c11",): 0.96})
    assert rank(ev, list(ev), impact=elsewhere, judged=["c10"]).culprits == []
    assert elsewhere.questions == []
    little = Channels({("c11",): 0.2})
    assert rank(ev, list(ev), impact=little, judged=["c11"]).culprits == []


def test_the_model_without_its_outlier_channel_is_measured_as_numpy_computes_it(tmp_path):
    """Sensitivity.channel_share against the same chain in numpy: output channel 7 of layer 1's
    weights is 30x the rest, so its output ``a`` has one loud column whose range crushes the
    others. With that channel brought to the next widest's range in float and in the QDQ model
    (weights requantized, each activation encoding's ends moved by what its tensor's ends move),
    each model judged against its own float, most of the noise-to-signal goes."""

    from accdbg.algorithms.diagnosis.sensitivity import Sensitivity

    rng = np.random.default_rng(3)
    w1 = rng.normal(size=(6, 40)).astype(np.float32)
    w1[:, 7] *= 30
    w2 = rng.normal(scale=0.1, size=(40, 4)).astype(np.float32)
    model, fp, qp = _matmul_chain(tmp_path, w1, w2)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    quantized = _Quantized(fp, qp, x)
    q, enc, w_np = quantized.model, quantized.enc, quantized.weight

    def terms(lo, hi):  # ONNX's asymmetric uint8 terms over [lo, hi], zero included
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        s = (hi - lo) / 255
        return s, np.round(-lo / s)

    def moved(name, before, after):  # the encoding's ends, moved as the tensor's ends move
        s, z = (float(v) for v in enc[name])
        lo, hi = -z * s, (255 - z) * s
        lo = lo * after.min() / before.min() if before.min() < 0 and after.min() < 0 else lo
        hi = hi * after.max() / before.max() if before.max() > 0 and after.max() > 0 else hi
        return terms(lo, hi)

    x64 = x.astype(np.float64)
    per = np.abs(w1).max(axis=0)
    level = float(np.sort(per)[-2])
    w1e = w1.astype(np.float64)
    w1e[:, 7] *= level / per[7]
    s1, z1 = terms(w1e.min(), w1e.max())
    a, ae = x64 @ w1, x64 @ w1e
    y, ye = a @ w2, ae @ w2

    def nsr(golden, target):
        return np.sum((golden - target) ** 2) / np.sum(golden**2)

    base = _qdq_np(_qdq_np(_qdq_np(x64, *enc["x"]) @ w_np("w1"), *enc["a"]) @ w_np("w2"), *enc["y"])
    ea = _qdq_np(_qdq_np(x64, *enc["x"]) @ _qdq_np(w1e, s1, z1), *moved("a", a, ae))
    edited = _qdq_np(ea @ w_np("w2"), *moved("y", y, ye))
    expected = 1 - nsr(ye, edited) / nsr(y, base)

    layer = _matmul_layer(q, "w1", "a")
    share = Sensitivity(model, q, {"x": x}).channel_share([(layer, 7, level)])
    assert share == pytest.approx(expected, abs=1e-3)
    assert share > 0.5


def test_the_lone_output_channel_is_measured_against_the_next_widest():
    """evidence.lone_channel: the widest channel over the next widest (not the median), dead
    channels ignored."""
    from accdbg.algorithms.diagnosis.evidence import lone_channel

    assert lone_channel(np.array([1.0, 2.0, 0.0, 40.0, 3.0])) == (3, pytest.approx(40 / 3), 3.0)
    channel, ratio, level = lone_channel(np.array([0.0, 5.0]))
    assert channel == -1 and math.isnan(ratio) and math.isnan(level)


def test_a_full_run_without_cpu_comparison_names_a_layer_whose_error_jumps():
    """Cumulative-layerwise runs the model on the backend with no CPU fake-quant beside it. A
    layer whose whole-tensor error jumps 10 dB or more beyond what its input brings in the same
    run plus its own encodings' error (the Pad whose padded channels read the encoding's
    minimum on HTP: 39 dB of encodings, 33 dB at its input, -1 dB out) is the backend's; a
    layer whose own weights explain its jump is not, nor one that inherits its error."""
    names, ev = _chain(7)
    ev["l10"] = _ev("l10", 12.0, inputs=["l9"])  # its weights lose 12 dB: its error is theirs
    run = {n: 10 ** (-(40 - 0.2 * i) / 10) for i, n in enumerate(names)}  # error adds slowly
    run["l10"] = 10 ** (-11.5 / 10)
    for i in range(11, 40):  # what comes after inherits it
        run[names[i]] = run["l10"] * 1.02 ** (i - 10)
    run["l25"] = 10 ** (1.0 / 10)  # -1 dB: the jump
    for i in range(26, 40):
        run[names[i]] = run["l25"]
    r = rank(ev, names, _Impact({}), observed_nsr=run, run_nsr=run)
    backend = [c for c in r.culprits if c.kind == "backend"]
    assert [c.name for c in backend] == ["l25"]
    # numpy: what explains l25 is l24's error in the run plus l25's own weights' (their SQNR)
    own = ev["l25"].weight_nsr  # the chain's layers: weights only
    explained = -10 * math.log10(run["l24"] + own)
    assert (
        f"where its inputs bring and its encodings explain {explained:.1f} dB" in backend[0].cause
    )
    # with a CPU comparison (oneshot) the jump is not what finds the backend's layers
    r = rank(ev, names, _Impact({}), observed_nsr=run, run_nsr=run, divergence={})
    assert not [c for c in r.culprits if c.kind == "backend"]


def test_a_full_runs_jump_that_the_cpu_fake_quant_makes_too_is_not_the_backends():
    """With no CPU comparison beside the run (cumulative-layerwise), a jump is set against the
    CPU fake-quant of the whole model: a layer whose error jumps there too (a sigmoid bringing
    values near 0, a Clip cutting the loud channel that carried its input's power), from 35 dB
    at its input to 5 dB, multiplies what its inputs bring by that factor, so the -1 dB it keeps
    on the backend is explained (numpy below), not the kernel's; a layer the CPU computes with
    no jump is still named."""
    names, ev = _chain(7)
    run = {n: 10 ** (-(40 - 0.2 * i) / 10) for i, n in enumerate(names)}  # error adds slowly
    run["l25"] = run["l30"] = 10 ** (1.0 / 10)  # -1 dB: the jumps
    cpu = {n: 10 ** (-35 / 10) for n in ("l24", "l29", "l30")}  # l30: no jump on the CPU
    cpu["l25"] = 10 ** (-5 / 10)
    asked = []

    def run_cpu(wanted):
        asked.append(sorted(wanted))
        return {n: cpu[n] for n in wanted if n in cpu}

    r = rank(ev, names, _Impact({}), observed_nsr=run, run_nsr=run, run_cpu=run_cpu)
    assert asked == [["l24", "l25", "l29", "l30"]]  # the jumping layers and their inputs
    assert [c.name for c in r.culprits if c.kind == "backend"] == ["l30"]
    own = ev["l25"].weight_nsr
    gain = cpu["l25"] / (own + cpu["l24"])  # what its input brings on the CPU, and its own
    then = -10 * math.log10(gain * (run["l24"] + own))  # ...applied to what it brings on QNN
    assert "culprit_rank" not in r.columns["l25"]
    cause = r.columns["l25"]["cause"]
    assert f"jumps there too, {10 * math.log10(gain):.1f} dB beyond what its inputs bring" in cause
    assert f"its inputs' error here explains {then:.1f} dB - not the kernel" in cause


def test_layerwise_names_a_layer_right_alone_whose_error_jumps_in_context():
    """Layerwise also runs each layer that is no kernel after its producers. A layer right
    alone (golden inputs: its error at the floor) whose error there jumps 10 dB or more beyond
    what its inputs there bring plus its own encodings' is the backend's; not a layer whose
    error there is its inputs', nor a Log (its error grows with its input's beyond any sum),
    nor one that jumps alone already (named once, for that), nor one whose context holds a
    standout (the convolution before it reads one: it reads that range as computed), nor one
    that turns its inputs' error into as much more there as it does alone (its gain)."""
    names, ev = _chain(3)
    alone = {n: ev[n].local_nsr for n in names}
    for n in ("l12", "l20", "l30"):
        ev[n] = Evidence(n, "Pad", [names[names.index(n) - 1]], output_nsr=10 ** (-38 / 10))
        alone[n] = ev[n].output_nsr
    ev["l30"].op_type = "Log"
    context = {n: (10 ** (-33 / 10), 10 ** (-33.5 / 10)) for n in names[1::3]}  # their inputs'
    context["l12"] = (10 ** (1.5 / 10), 10 ** (-34 / 10))  # the jump: -1.5 dB from 34 dB
    context["l20"] = (10 ** (-18 / 10), 10 ** (-18.5 / 10))  # inherited: its input is as bad
    context["l30"] = (10 ** (1.5 / 10), 10 ** (-34 / 10))
    alone["l5"] = 10 ** (5 / 10)  # jumps alone
    context["l5"] = (10 ** (5 / 10), 10 ** (-34 / 10))
    ev["l24"] = _ev("l24", 10.0, inputs=["l23"])  # a standout: its weights keep 10 dB
    alone["l24"] = ev["l24"].weight_nsr
    ev["l25"] = Evidence("l25", "Add", ["l24"], output_nsr=10 ** (-38 / 10))
    context["l25"] = (10 ** (1.5 / 10), 10 ** (-34 / 10))  # reads the standout's output
    ev["l36"] = _ev("l36", 10.0, inputs=["l35"])  # another standout, a kernel's input
    alone["l36"] = ev["l36"].weight_nsr
    ev["l38"] = Evidence("l38", "Sigmoid", ["l37"], output_nsr=10 ** (-38 / 10))
    context["l38"] = (10 ** (1.5 / 10), 10 ** (-34 / 10))  # its context, l37, reads l36
    # a hard sigmoid bringing values near 0: alone it turns its 43 dB of rounding into 31 dB
    # (a gain of 12 dB), so its inputs' 34 dB there explain 21.5 dB: at 17 dB, 4.5 dB more
    # (16.5 dB more than its inputs' error with no gain)
    ev["l33"] = Evidence("l33", "HardSigmoid", ["l32"], output_nsr=10 ** (-43 / 10))
    alone["l33"] = 10 ** (-31 / 10)
    context["l33"] = (10 ** (-17 / 10), 10 ** (-34 / 10))
    r = rank(ev, names, _Impact({}), observed_nsr=alone, local_observed=True, context_nsr=context)
    backend = [c for c in r.culprits if c.kind == "backend"]
    assert [c.name for c in backend] == ["l5", "l12"], [(c.name, c.cause) for c in r.culprits]
    explained = -10 * math.log10(10 ** (-34 / 10) + 10 ** (-38 / 10))  # numpy: inputs + own
    assert backend[1].cause.startswith("backend: run after its producers")
    assert f"explain {explained:.1f} dB" in backend[1].cause and "keeps -1.5 dB" in backend[1].cause
    assert backend[0].cause.startswith("backend: run alone")


def test_layerwise_names_a_jump_the_backend_only_where_the_cpu_fake_quant_does_not_make_it():
    """Layerwise expects a layer run alone to lose what its own encodings and its inputs' lose.
    A layer can multiply its input's rounding beyond that (a convolution whose loud output
    channel weighs it): onnxruntime's CPU fake-quant of the same layer, fed the same golden
    inputs, then loses as much as QNN - not the kernel, said in its cause and not named. Where
    QNN is 10 dB or more worse than that CPU run, it is named with both figures; a layer the
    CPU could not run keeps the composed expectation. A difference from the CPU costing the
    outputs under half of their error is a note, as in a full run."""
    names, ev = _chain(7)
    ev["l4"].output_nsr = 10 ** (-37 / 10)  # l5's input encoding
    alone = {n: ev[n].local_nsr for n in names}
    for n in ("l5", "l12", "l20", "l30"):
        alone[n] = 10 ** (-4 / 10)  # 4 dB alone where ~36 dB (its weights) + 36 dB (input) explain
    # l20: the CPU could not run it; l30: QNN parts from the CPU too, at little cost
    cpu = {"l5": 10 ** (-4.5 / 10), "l12": 10 ** (-33 / 10), "l30": 10 ** (-30 / 10)}
    asked = []

    class AloneCpu:
        def __call__(self, wanted):
            asked.append(sorted(wanted))
            return {n: cpu[n] for n in wanted if n in cpu}

        def kernel_share(self, wanted):  # what each difference costs the outputs
            asked.append(sorted(wanted))
            return {"l12": 0.8, "l30": 0.1}

    r = rank(ev, names, _Impact({}), observed_nsr=alone, local_observed=True, alone_cpu=AloneCpu())
    # the jumping layers, asked once; then those QNN parts from, what their difference costs
    assert asked == [["l12", "l20", "l30", "l5"], ["l12", "l30"]]
    backend = {c.name: c.cause for c in r.culprits if c.kind == "backend"}
    assert sorted(backend) == ["l12", "l20"], [(c.name, c.cause) for c in r.culprits]
    assert r.culprits[0].name == "l12"  # measured to cost the most
    assert backend["l12"] == (
        "backend: run alone on golden inputs it keeps 4.0 dB on the backend where onnxruntime's "
        "CPU fake-quant of the same QDQ layer keeps 33.0 dB (29.0 dB worse); that difference "
        "alone, added to the CPU fake-quant of the whole model, costs the outputs 80% of their "
        "error there"
    )
    assert "culprit_rank" not in r.columns["l30"]  # a difference costing 10 %: a note
    assert r.columns["l30"]["cause"].endswith("costs the outputs 10% of their error there")
    assert backend["l20"].startswith("backend: run alone on the backend it keeps 4.0 dB")
    # what l5's encodings and its input's explain: its weights' and l4's output noise powers
    explained = -10 * math.log10(ev["l5"].weight_nsr + 10 ** (-37 / 10))
    cause = r.columns["l5"]["cause"]
    assert "culprit_rank" not in r.columns["l5"]
    assert f"keeps 4.0 dB where its encodings and its inputs' explain {explained:.1f} dB" in cause
    assert "fed the same golden inputs, keeps 4.5 dB: not the kernel" in cause


def test_a_layer_the_cpu_computes_exactly_alone_is_all_the_backends_in_words():
    """openWakeWord's hey_jarvis: a Reciprocal the CPU fake-quant computes exactly alone (no
    error to divide by) where QNN keeps 11.9 dB - the jump had divided by zero and stopped
    layerwise. Its difference costs the outputs 6.6e5 times their tiny error in the CPU
    fake-quant: said as the dB it takes off their SQNR, not as 66031196%."""
    names, ev = _chain(7)
    alone = {n: ev[n].local_nsr for n in names}
    alone["l12"] = 10 ** (-11.9 / 10)

    class AloneCpu:
        def __call__(self, wanted):
            return {"l12": 0.0}

        def kernel_share(self, wanted):
            return {"l12": 660311.96}

    r = rank(ev, names, _Impact({}), observed_nsr=alone, local_observed=True, alone_cpu=AloneCpu())
    (backend,) = [c for c in r.culprits if c.kind == "backend"]
    assert backend.name == "l12"
    lost = 10 * math.log10(1 + 660311.96)  # numpy: the outputs' error 1 + share times theirs
    assert backend.cause == (
        "backend: run alone on golden inputs it keeps 11.9 dB on the backend where onnxruntime's "
        "CPU fake-quant of the same QDQ layer keeps no error at all (all of it is the "
        "backend's); that difference alone, added to the CPU fake-quant of the whole model, "
        f"takes {lost:.1f} dB off the outputs' SQNR there"
    )


def test_layerwise_checks_a_jump_in_context_against_the_cpu_and_the_whole_model():
    """A layer whose error jumps only run after its producers is run again: the same cut in
    onnxruntime's CPU fake-quant, and the model from its inputs on the backend. A jump the CPU
    makes too is the quantization's, one the whole model does not make is the cut's (its
    producers fed as graph inputs): said, not named. One QNN makes alone, in the deployed
    graph too, is named with those figures and what the difference costs the outputs -
    ordered by that cost, before a jump that could not be run again; costing under half of
    the outputs' error, it is a note. A layer reading a standout's output is judged so once
    run again (not run again, it is left out: its test above). A jump to an error the pass
    mark would not see (22 dB) stands by its measured cost: named when run again and costly,
    left out when it could not be run again. A jump the whole model does not make where its
    inputs there arrive destroyed (-10.5 dB: seal's Add.231, as much error as signal) is
    not the cut's - those inputs would hide it - and stands by its measured cost."""
    names, ev = _chain(3)
    alone = {n: ev[n].local_nsr for n in names}
    context = {n: (10 ** (-33 / 10), 10 ** (-33.5 / 10)) for n in names[1::3]}  # their inputs'
    for n in ("l5", "l12", "l20", "l30", "l35", "l38"):
        ev[n] = Evidence(n, "Pad", [names[names.index(n) - 1]], output_nsr=10 ** (-38 / 10))
        alone[n] = ev[n].output_nsr
        context[n] = (10 ** (1.5 / 10), 10 ** (-34 / 10))  # -1.5 dB there, from 34 dB
    # l25 reads the output of a standout whose cost was not measured: judged once run again
    ev["l24"] = _ev("l24", 10.0, inputs=["l23"])
    alone["l24"] = ev["l24"].weight_nsr
    ev["l25"] = Evidence("l25", "Add", ["l24"], output_nsr=10 ** (-38 / 10))
    context["l25"] = (10 ** (1.5 / 10), 10 ** (-34 / 10))
    for n in ("l8", "l16"):  # 12 dB worse than their inputs there, yet over the pass mark
        ev[n] = Evidence(n, "Pad", [names[names.index(n) - 1]], output_nsr=10 ** (-38 / 10))
        alone[n] = ev[n].output_nsr
        context[n] = (10 ** (-22 / 10), 10 ** (-34 / 10))
    # l5: not run again (its cut failed); l12: the CPU loses as much there; l20: QNN alone, in
    # the whole model too, costing 80 %; l30: costing 10 %; l35: right in the whole model
    jumps_too = {"l20": 10 ** (1.5 / 10), "l19": 10 ** (-30 / 10)}
    ran = {
        "l12": ContextCheck(10 ** (1.0 / 10)),
        "l20": ContextCheck(10 ** (-33 / 10), 0.8, jumps_too),
        "l30": ContextCheck(10 ** (-33 / 10), 0.1),
        "l35": ContextCheck(10 ** (-33 / 10), 0.9, {"l35": 10 ** (-30 / 10), "l34": 10**-3}),
        "l25": ContextCheck(10 ** (-33 / 10), 0.6, {"l25": 10 ** (1.5 / 10), "l24": 0.1}),
        "l8": ContextCheck(10 ** (-33 / 10), 0.7, {"l8": 10 ** (-22 / 10), "l7": 10**-3.4}),
        "l38": ContextCheck(10 ** (-33 / 10), 0.65, {"l38": 1.0, "l37": 10 ** (10.5 / 10)}),
    }
    asked = []

    class AloneCpu:
        def __call__(self, wanted):
            return {}

        def in_context(self, wanted):
            asked.append(sorted(wanted))
            return {n: ran[n] for n in wanted if n in ran}

    r = rank(
        ev,
        names,
        _Impact({}),
        observed_nsr=alone,
        local_observed=True,
        context_nsr=context,
        alone_cpu=AloneCpu(),
    )
    # every jump there, at once
    assert asked == [["l12", "l16", "l20", "l25", "l30", "l35", "l38", "l5", "l8"]]
    backend = [c for c in r.culprits if c.kind == "backend"]
    assert [c.name for c in backend] == ["l20", "l8", "l38", "l25", "l5"], [
        (c.name, c.cause) for c in r.culprits
    ]
    # in the whole model: l19's 30 dB brought, the Pad's 38 dB output encoding (numpy)
    explained = -10 * math.log10(10**-3 + 10 ** (-38 / 10))
    assert backend[0].cause.endswith(
        "onnxruntime's CPU fake-quant of the same cut, fed the same golden values, keeps 33.0 dB "
        "there; in the whole model on the backend it keeps -1.5 dB where its inputs there bring "
        f"and its encodings explain {explained:.1f} dB; that difference alone, added to the CPU "
        "fake-quant of the whole model, costs the outputs 80% of their error there"
    )
    assert "it keeps 22.0 dB" in backend[1].cause and backend[1].cause.endswith(
        "70% of their error there"
    )
    # l38: in the whole model 0.0 dB where its inputs bring -10.5 dB and its Pad's 38 dB;
    # its -1.5 dB jump added to those noise powers lifts them by `lift`
    brought = 10 ** (10.5 / 10) + 10 ** (-38 / 10)
    explained = -10 * math.log10(brought)
    lift = 10 * math.log10((10 ** (1.5 / 10) + brought) / brought)
    assert (
        f"in the whole model on the backend it keeps 0.0 dB where its inputs there bring and its "
        f"encodings explain {explained:.1f} dB - with its inputs' error there its jump would show "
        f"at most {lift:.1f} dB worse, under the 10 dB that tell the kernel's doing from the "
        "cut's; that difference alone"
    ) in backend[2].cause, backend[2].cause
    assert backend[4].cause.startswith("backend: run after its producers")
    assert "same cut" not in backend[4].cause
    assert "culprit_rank" not in r.columns["l16"]
    assert "culprit_rank" not in r.columns["l12"]
    assert r.columns["l12"]["cause"] == (
        "run after its producers it keeps -1.5 dB on the backend, but onnxruntime's CPU "
        "fake-quant of the same cut, fed the same golden values, keeps -1.0 dB: not the kernel - "
        "the layer turns its producers' rounding into more error than their encodings' own"
    )
    assert "culprit_rank" not in r.columns["l30"]
    assert r.columns["l30"]["cause"].endswith("costs the outputs 10% of their error there")
    assert "culprit_rank" not in r.columns["l35"]
    explained = -10 * math.log10(10**-3 + 10 ** (-38 / 10))
    assert r.columns["l35"]["cause"] == (
        "run after its producers it keeps -1.5 dB on the backend (onnxruntime's CPU fake-quant "
        "of the same cut 33.0 dB), but in the whole model on the backend it keeps 30.0 dB where "
        f"its inputs there bring and its encodings explain {explained:.1f} dB: the cut's doing - "
        "its producers fed golden values as graph inputs - not the deployed graph's"
    )


@pytest.mark.slow
def test_a_log_amplifying_its_inputs_rounding_blames_that_inputs_encoding(tmp_path):
    """A log spectrum: the filter bank's output looks fine by its power (its largest values
    carry it) while its small values get no 8-bit step of their own; the Log turns that into
    the outputs' error. The culprit is the Log's input encoding - measured: with only it
    quantized the outputs lose as much - not the Log, whose own encodings are fine. The same
    model with values spanning half a decade names nothing."""
    wide = models.log_spectrum(tmp_path, decades=6.0)
    inp = [parse_input_tensor(["x", "1,64,32", str(wide.input_path)])]
    res = run_oneshot("onnx", wide.path, inp, working_dir=tmp_path / "wide")
    s = res.summary.set_index("Name")
    assert s.loc["power", "SQNR"] > 30 and s.loc["logp", "SQNR"] < 15  # the jump is the Log's
    ranked = res.summary.dropna(subset=["culprit_rank"]).sort_values("culprit_rank")
    assert list(ranked["Name"]) == ["power"], (ranked[["Name", "cause"]], res.findings)
    assert s.loc["power", "cause"].startswith("activation range: Log logp amplifies"), s.loc[
        "power", "cause"
    ]
    # numpy, the mechanism: with the encoding QNN used, a third of the filter bank's values are
    # under half a step (they round to the zero point: the Log of them is lost)
    import onnx
    from onnx import numpy_helper

    qdq = onnx.load(str(next(res.engine_run.glob("*.qdq.onnx"))))
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "power")
    scale = next(
        float(numpy_helper.to_array(i)) for i in qdq.graph.initializer if i.name == q.input[1]
    )
    bank = next(
        numpy_helper.to_array(i)
        for i in onnx.load(str(wide.path)).graph.initializer
        if i.name == "bank"
    )
    power = np.fromfile(wide.input_path, np.float32).reshape(64, 32) @ bank
    assert np.mean(power < scale / 2) > 0.25
    # layerwise, the Log run alone on QNN fed golden values: the same input blamed, not the
    # Log's kernel (run alone, its error is far beyond what the encodings' noise explains)
    from accdbg.algorithms.layerwise import run_layerwise

    alone = run_layerwise(wide.path, inp, working_dir=tmp_path / "layerwise")
    assert alone.findings[0].startswith("culprit #1: power (MatMul) - activation range: Log"), (
        alone.findings
    )
    narrow = models.log_spectrum(tmp_path, decades=0.5)
    inp = [parse_input_tensor(["x", "1,64,32", str(narrow.input_path)])]
    res = run_oneshot("onnx", narrow.path, inp, working_dir=tmp_path / "narrow")
    assert res.summary["culprit_rank"].isna().all(), res.findings


def test_culprits_after_the_first_five_say_so_in_their_cause_and_the_findings():
    """Seven layers each cost the outputs 60-90 % of their error taken out: the five costing
    the most are ranked; the other two keep their cause (what they cost), which says they are
    culprits after the named, and a finding names them - none is left with an empty cause."""
    names, ev = _chain(8)
    costs = {f"l{5 * i}": 0.6 + 0.05 * i for i in range(1, 8)}  # l5: 65 % ... l35: 95 %
    for n in costs:
        ev[n] = _ev(n, 12.0, inputs=[f"l{int(n[1:]) - 1}"])
    r = rank(ev, names, impact=_Impact({n: Share(c, c) for n, c in costs.items()}))
    assert [c.name for c in r.culprits] == ["l35", "l30", "l25", "l20", "l15"]
    for n in ("l10", "l5"):
        assert "culprit_rank" not in r.columns[n]
        cause = r.columns[n]["cause"]
        assert f"it costs the outputs {round(100 * costs[n])}% of the whole model's error" in cause
        assert cause.endswith("after the 5 named: not ranked (fix those first, then debug again)")
    assert any(f.startswith("2 more layers (l10, l5) are culprits") for f in r.findings)


def test_several_outputs_are_named_in_the_verdict_and_the_kernels_line_names_the_logits_owner():
    """mtcnn's pnet has two outputs: "the outputs meet their thresholds (CosineSimilarity
    0.9961, SQNR 21.08, CosineSimilarity 1, SQNR 50.61)" did not say which was which. And a
    Softmax output is judged at its logits, a tensor the user does not know as an output: the
    kernels line says whose logits it is."""
    names, ev = _chain(3)
    verdicts = [
        ("prob", "CosineSimilarity", 0.9961, True),
        ("prob", "SQNR", 21.08, True),
        ("boxes", "CosineSimilarity", 1.0, True),
        ("boxes", "SQNR", 50.61, True),
    ]
    r = rank(ev, names, outputs=verdicts)
    assert r.findings[0] == (
        "the outputs meet their thresholds (prob: CosineSimilarity 0.9961, SQNR 21.08; "
        "boxes: CosineSimilarity 1, SQNR 50.61)"
    )
    one = rank(ev, names, outputs=verdicts[:2])
    assert (
        one.findings[0] == "the outputs meet their thresholds (CosineSimilarity 0.9961, SQNR 21.08)"
    )
    errors = {"fc/logits": (0.1, 0.01), "boxes": (0.001, 0.001)}
    worst = KernelsAdded.worst(errors, output_of={"fc/logits": "prob", "boxes": "boxes"})
    assert worst.line() == (
        "QNN's kernels add 90% to the outputs' error: fc/logits (the logits of prob) at 10.0 dB "
        "SQNR on QNN, 20.0 dB in onnxruntime's CPU fake-quant of the same QDQ model"
    )
    assert (
        "(the logits"
        not in KernelsAdded.worst({"boxes": (0.1, 0.01)}, output_of={"boxes": "boxes"}).line()
    )
