"""How far an outlier channel reaches (accdbg.algorithms.diagnosis.reach) and how the ranking uses it.

The reach is checked against a numpy forward pass of the same hand-built network, run with and
without the loud channel; the ranking with stand-in measures whose answers are set here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.algorithms.diagnosis.evidence import Evidence
from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.ranges import range_outputs, with_ranges
from accdbg.algorithms.diagnosis.ranking import rank
from accdbg.algorithms.diagnosis.reach import OutlierReach, Reach, _flag, _scale, _with_switches
from accdbg.algorithms.diagnosis.sensitivity import Share, scores
from accdbg.core.onnx_model import with_outputs
from accdbg.engines.exposure import Exposed
from tests.ranking_stubs import Impact as _Impact
from tests.ranking_stubs import evidence as _ev

RNG = np.random.default_rng(7)
W1 = RNG.normal(size=(8, 4)).astype(np.float32)
W1[3] *= 40.0  # output channel 3: a weight channel 40x the others
W2 = RNG.normal(size=(8, 8)).astype(np.float32)  # mixes channel 3 into every channel
W3 = RNG.normal(size=(6, 8)).astype(np.float32)
W3[:, 3] = 0.0  # the projection ignores channel 3: the outlier stops here
B = RNG.normal(size=(6, 4)).astype(np.float32)  # a side branch from the input
X = RNG.normal(size=(1, 4, 5, 5)).astype(np.float32)


def _conv(name: str, x: str, w: str, y: str) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w], [y], name=name)


def _model() -> onnx.ModelProto:
    """x -> c1 (1x1, channel 3 loud) -> relu -> c2 (mixes) ; c1 -> c3 (drops channel 3) ;
    x -> side ; side + c3 -> out."""
    inits = [
        numpy_helper.from_array(W1.reshape(8, 4, 1, 1), "w1"),
        numpy_helper.from_array(W2.reshape(8, 8, 1, 1), "w2"),
        numpy_helper.from_array(W3.reshape(6, 8, 1, 1), "w3"),
        numpy_helper.from_array(B.reshape(6, 4, 1, 1), "b"),
    ]
    nodes = [
        _conv("c1", "x", "w1", "t1"),
        helper.make_node("Relu", ["t1"], ["r1"], name="relu"),
        _conv("c2", "r1", "w2", "t2"),
        _conv("c3", "t1", "w3", "t3"),
        _conv("side", "x", "b", "s"),
        helper.make_node("Add", ["s", "t3"], ["out"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [
            helper.make_tensor_value_info("t2", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _layers() -> list[Exposed]:
    ops = [("t1", "Conv"), ("r1", "Relu"), ("t2", "Conv"), ("t3", "Conv"), ("s", "Conv")]
    ops.append(("out", "Add"))
    return [
        Exposed(t, t, t, op, i, t, scale=0.1, zero_point=0, native_dtype="uint8")
        for i, (t, op) in enumerate(ops)
    ]


def _numpy(scale3: float) -> dict[str, np.ndarray]:
    """The network in numpy, with channel 3 of t1 multiplied by ``scale3`` where its readers
    read it."""
    x = X[0].reshape(4, -1).astype(np.float64)
    t1 = W1 @ x
    read = t1.copy()
    read[3] *= scale3
    r1 = np.maximum(read, 0)
    return {
        "t1": t1,
        "r1": r1,
        "t2": W2 @ r1,
        "t3": W3 @ read,
        "s": B @ x,
        "out": B @ x + W3 @ read,
    }


def test_reach_is_the_layers_whose_range_the_loud_channel_blows_as_numpy_finds():
    values = _numpy(1.0)
    extent = np.abs(values["t1"]).max(axis=1)
    median = float(np.median(extent))
    assert extent[3] / median >= POLICY.loud  # the planted channel is the loud one
    cut = _numpy(median / float(extent[3]))
    expected = {
        n: np.ptp(values[n]) / np.ptp(cut[n])
        for n in ("r1", "t2", "t3", "s", "out")
        if np.ptp(values[n]) / np.ptp(cut[n]) >= POLICY.reach
    }
    assert {"r1", "t2"} <= set(expected) and "s" not in expected and "t3" not in expected

    got = OutlierReach(_model(), _layers(), {"x": X})(["t1", "s"])
    assert set(got) == {"t1"}  # the side branch has no channel 4x its median: no reach
    r = got["t1"]
    assert r.channel == 3 and r.ratio == pytest.approx(extent[3] / median, rel=1e-5)
    assert set(r.layers) == set(expected)
    for n, times in expected.items():
        assert r.layers[n] == pytest.approx(times, rel=1e-4)


def _chain(n: int = 40) -> tuple[list[str], dict[str, Evidence]]:
    names = [f"l{i}" for i in range(n)]
    return names, {
        x: _ev(x, 36 + RNG.normal(0, 2), [names[i - 1]] if i else []) for i, x in enumerate(names)
    }


def test_a_maker_is_measured_with_every_layer_its_outlier_blows_not_only_the_standouts():
    """The outlier of l10 blows the ranges of l11..l20; only l11 stands out. One quantizer at a
    time nothing matters; with all the layers it blows l10 does, and l11 says where its range
    went."""
    names, ev = _chain()
    ev["l10"] = _ev("l10", 12.0, ["l9"])
    ev["l11"] = _ev("l11", 13.0, ["l10"], owner="output")
    blown = {f"l{i}": 3.0 for i in range(11, 21)}
    group = ("l10", *blown)
    impact = _Impact({"l10": 0.05, group: 0.9})
    asked = []

    def reach(standouts):
        asked.append(list(standouts))
        return {"l10": Reach(5, 30.0, blown)}

    r = rank(ev, names, impact=impact, reach=reach)
    assert asked == [["l10", "l11"]]  # measured once, for the standouts
    assert [c.name for c in r.culprits] == ["l10"]
    assert group in impact.asked
    assert "channel 5, 30x the median channel" in r.culprits[0].cause
    assert "blows the ranges of 10 layer(s)" in r.culprits[0].cause
    assert "costs the outputs 90%" in r.culprits[0].cause
    assert r.columns["l11"]["cause"].startswith(
        "activation range blown by the outlier channel 5 of l10: 3x"
    )
    # measured, a standout outside every reach is no carrier, however near
    r = rank(ev, names, impact=_Impact({"l10": 0.05, "l11": 0.6}), reach=lambda s: {})
    assert [c.name for c in r.culprits] == ["l11"]


def test_a_standout_with_its_own_problem_is_not_measured_with_the_maker_upstream():
    """l30's weights are its own problem though l10's outlier blows its range: it is left out
    of l10's group (its cost is its own), and it follows l10 only when l10 causes most of the
    error itself."""
    names, ev = _chain()
    ev["l10"] = _ev("l10", 12.0, ["l9"])
    ev["l30"] = _ev("l30", 11.0, ["l29"])
    reach = {"l10": Reach(2, 50.0, {"l11": 4.0, "l30": 2.5})}
    impact = _Impact({"l10": 0.3, ("l10", "l11"): 0.6, "l30": 0.9})
    r = rank(ev, names, impact=impact, reach=lambda s: reach)
    assert ("l10", "l11", "l30") not in impact.asked and ("l10", "l11") in impact.asked
    # l10 with its carriers 60 %, l30 90 %: l10 causes most of the error, so it goes first
    assert [c.name for c in r.culprits] == ["l10", "l30"]
    assert "its input carries the outlier channel 2 of l10 (2.5x" in r.culprits[1].cause
    # l10 at 30 % with its carriers: no longer a root of the error, culprits by cost
    impact = _Impact({"l10": 0.3, ("l10", "l11"): 0.3, "l30": 0.9})
    ev["l10"] = _ev("l10", 4.0, ["l9"])  # destroys its information: named at 5 %
    r = rank(ev, names, impact=impact, reach=lambda s: reach)
    assert [c.name for c in r.culprits] == ["l30", "l10"]


def test_an_offset_channel_passed_on_in_place_is_carried_though_the_reach_stops():
    """A channel carrying a constant that the next layer's bias undoes: taking it away at its
    maker breaks that compensation, so the reach stops at the first residual add; the later add
    passing the same channel on, as loud, is still its carrier."""
    names, ev = _chain()
    ev["l10"] = _ev("l10", 12.0, ["l9"], owner="output")
    ev["l12"] = _ev("l12", 14.0, ["l10"], owner="output")
    ev["l14"] = _ev("l14", 15.0, ["l12"], owner="output")
    for n in ("l10", "l12", "l14"):
        ev[n].loud_channel, ev[n].loud_ratio, ev[n].channels = 7, 60.0, 32
    impact = _Impact({"l10": 0.1, ("l10", "l12", "l14"): 0.7})
    r = rank(ev, names, impact=impact, reach=lambda s: {"l10": Reach(7, 60.0, {"l12": 12.0})})
    assert [c.name for c in r.culprits] == ["l10"]
    assert r.columns["l14"]["cause"] == "activation outlier carried in from l12"
    # another channel loud in l14: its own
    ev["l14"].loud_channel = 3
    impact = _Impact({"l10": 0.1, ("l10", "l12"): 0.7, "l14": 0.02})
    r = rank(ev, names, impact=impact, reach=lambda s: {"l10": Reach(7, 60.0, {"l12": 12.0})})
    assert "l14" in impact.asked and "culprit_rank" not in r.columns["l14"]


def test_logits_behind_a_flatten_are_judged_where_they_were_compared():
    """onnxruntime's QNN pre-processing may put a Flatten between a Gemm and its Softmax: the
    Flatten's output was never compared, the Gemm's (same values) was."""
    g = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w"], ["fc"]),
            helper.make_node("Flatten", ["fc"], ["flat"]),
            helper.make_node("Softmax", ["flat"], ["prob"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")],
    )
    model = helper.make_model(g)
    assert scores(model) == ["flat"]
    assert scores(model, {"fc", "prob"}) == ["fc"]
    assert scores(model, {"prob"}) == ["fc"]  # not past an op that changes the values


def test_weights_scaling_a_loud_channel_back_are_measured_with_its_maker():
    """l10 makes channel 5 loud; l11 reads it with weights 27x smaller for that channel than
    for its others (they undo it: the float function is unchanged). Their rounding, coarse
    for such small weights, is multiplied by the loud channel: neither matters alone, the two
    together do. A reader whose small weights are for another channel is no partner."""
    names, ev = _chain()
    ev["l10"] = _ev("l10", 11.0, ["l9"], owner="output")
    ev["l10"].loud_channel, ev["l10"].loud_ratio, ev["l10"].channels = 5, 24.0, 32
    ev["l11"].quiet_input, ev["l11"].quiet_ratio = 5, 27.0
    impact = _Impact({"l10": Share(0.27, 0.37), ("l10", "l11"): 0.58})
    r = rank(ev, names, impact=impact, reach=lambda s: {})
    assert [c.name for c in r.culprits] == ["l10"]
    assert "the weights of l11 scale its channel 5 back" in r.culprits[0].cause
    assert "costs the outputs 58%" in r.culprits[0].cause
    # l11's weights lose enough to stand out on their own: still the maker's doing
    ev["l11"] = _ev("l11", 12.0, ["l10"])
    ev["l11"].quiet_input, ev["l11"].quiet_ratio = 5, 27.0
    r = rank(ev, names, impact=_Impact({"l10": 0.3, ("l10", "l11"): 0.6, "l11": 0.4}), reach=None)
    assert [c.name for c in r.culprits] == ["l10"]
    assert r.columns["l11"]["cause"].startswith("its weights scale back the loud channel 5 of l10")
    # small weights for another channel: nothing to do with l10's (l10 alone, the model's only
    # standout, under the quarter it then needs)
    ev["l11"] = _ev("l11", 36.0, ["l10"])
    ev["l11"].quiet_input, ev["l11"].quiet_ratio = 2, 27.0
    impact = _Impact({"l10": Share(0.17, 0.22)})
    assert rank(ev, names, impact=impact, reach=lambda s: {}).culprits == []
    assert impact.asked == ["l10"]


def _executed(model: onnx.ModelProto, feeds: dict, outputs: list[str], prefix: Path) -> list[str]:
    """The nodes onnxruntime ran, in its order (from its own profile)."""
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(prefix)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = with_outputs(model, outputs).SerializeToString()
    s = ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"])
    s.run(None, feeds)
    events = json.loads(Path(s.end_profiling()).read_text())
    suffix = "_kernel_time"
    return [
        e["name"].removesuffix(suffix)
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith(suffix)
    ]


def test_each_range_is_taken_before_the_model_goes_two_layers_on(tmp_path):
    """The ranges must not hold every tensor of the model at once: onnxruntime's own profile
    of the reach's two models shows each tensor's reductions run before the layer after its
    reader, in the plain and in the switched model."""
    n = 12
    x = RNG.normal(size=(1, 4, 6, 6)).astype(np.float32)
    w = numpy_helper.from_array(RNG.normal(size=(4, 4, 1, 1)).astype(np.float32), "w")
    nodes = [_conv(f"c{i}", f"t{i - 1}" if i else "x", "w", f"t{i}") for i in range(n)]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, None)],
        [w],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    tensors = [f"t{i}" for i in range(n)]
    ranges = range_outputs(tensors)
    plain = _executed(with_ranges(model, tensors), {"x": x}, ranges, tmp_path / "plain")
    switched = _with_switches(with_ranges(model, tensors), ["t3"])
    down = np.ones((1, 4, 1, 1), np.float32)
    on_feeds = {"x": x, _flag("t3"): np.array(True), _scale("t3"): down}
    on = _executed(switched, on_feeds, ranges, tmp_path / "on")
    for order in (plain, on):
        at = {name: i for i, name in enumerate(order)}
        for i in range(n - 2):
            for end in ("max", "min"):
                assert at[f"t{i}__reach_{end}"] < at[f"c{i + 2}"], order
