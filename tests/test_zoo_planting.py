"""The fault zoo keeps only plantings the quantized outputs feel: a weak one is planted again
stronger, then at the next site nearest its depth, and left out when none hurts - on a small
hand-built CNN with a stand-in harm measure (no QNN run; the real measure runs in the slow tier).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from benchmarks.zoo import plant as zoo_plant
from benchmarks.zoo.harm import carrying, judged_outputs
from benchmarks.zoo.probe import FloatProbe
from benchmarks.zoo.scoring import HARM_DB
from tests.models import conv_net


@pytest.fixture
def net(tmp_path):
    built = conv_net(tmp_path, channels=8, size=8, layers=7)
    model = onnx.load(str(built.path))
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal(built.dims).astype(np.float32)} for _ in range(2)]
    return model, feeds, FloatProbe(model, feeds)


def planted_peak(model: onnx.ModelProto, node: str) -> float:
    """The largest |w| of ``node``'s weights in the planted model, read back with numpy."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    conv = next(n for n in model.graph.node if n.name == node)
    return float(np.abs(inits[conv.input[1]]).max())


def test_sites_are_taken_nearest_the_depth_first():
    sites = list("abcdefg")  # stand-ins: only their order matters
    assert zoo_plant.by_nearness(sites, 0.5) == list("dcebfag")
    assert zoo_plant.by_nearness(sites, 0.0)[:3] == list("abc")
    assert zoo_plant.by_nearness(sites, 0.85)[0] == "f"  # round(0.85 x 6) = 5
    assert zoo_plant.by_nearness([], 0.5) == []


def test_a_planting_the_outputs_do_not_feel_is_made_stronger(net):
    model, feeds, probe = net
    first = zoo_plant.plant("net", model, "weight_outlier", "mid", probe, feeds)
    base = planted_peak(first.model, first.fault.site)
    seen = []

    def harm(m, overrides):  # felt only once the outlier is 4x what was drawn
        peak = planted_peak(m, first.fault.site)
        seen.append(peak / base)
        return 5.0 if peak >= 3.9 * base else 1.0

    p = zoo_plant.plant("net", model, "weight_outlier", "mid", probe, feeds, harm=harm)
    assert seen == pytest.approx([1.0, 2.0, 4.0], rel=1e-3)
    assert p.fault.site == first.fault.site and not p.fault.excluded
    assert p.fault.harm_db == 5.0 and len(p.fault.tries) == 3
    assert p.fault.strength == pytest.approx(4 * first.fault.strength)


def test_then_it_moves_to_the_next_site_and_is_left_out_when_none_hurts(net):
    model, feeds, probe = net
    sites = [s.node for s in zoo_plant.candidate_sites(model, probe, "weight_channel", "mid")]
    assert len(sites) >= 3
    tried = []

    def harm(m, overrides):
        changed = [s for s in sites if planted_peak(m, s) != planted_peak(model, s)]
        tried.append(changed[0])
        return 4.0 if changed[0] == sites[1] else 0.5

    p = zoo_plant.plant("net", model, "weight_channel", "mid", probe, feeds, harm=harm)
    assert tried == [sites[0]] * 3 + [sites[1]]
    assert p.fault.site == sites[1] and not p.fault.excluded

    never = zoo_plant.plant(
        "net", model, "weight_channel", "mid", probe, feeds, harm=lambda m, o: 0.0
    )
    assert never.fault.excluded.startswith(f"the outputs do not feel it on QNN (< {HARM_DB:g} dB)")
    assert len(never.fault.tries) == zoo_plant.SITE_TRIES * len(zoo_plant.STRONGER)

    # a site another depth holds is not used again
    held = zoo_plant.site_key(zoo_plant.candidate_sites(model, probe, "weight_channel", "mid")[0])
    other = zoo_plant.plant("net", model, "weight_channel", "mid", probe, feeds, taken={held})
    assert other.fault.site == sites[1]


def test_a_bias_added_by_a_reshaped_constant_is_part_of_the_layer():
    """PaddlePaddle exports a Conv's bias as ``Add(conv, Reshape(b))``: constant folding makes it
    the Conv's own bias and the quantized layer's output takes the Add's name, so a culprit set
    must hold that name too."""
    from onnx import TensorProto, helper, numpy_helper

    from benchmarks.zoo.graph import Graph, layer_of

    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    b = numpy_helper.from_array(np.ones(4, np.float32), "b")
    shape = numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
            helper.make_node("Reshape", ["b", "shape"], ["b4"], name="reshape"),
            helper.make_node("Add", ["conv", "b4"], ["conv_b"], name="add"),
            helper.make_node("Add", ["conv_b", "x1"], ["y"], name="residual"),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
            helper.make_tensor_value_info("x1", TensorProto.FLOAT, [1, 4, 4, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
        [w, b, shape],
    )
    g = Graph(helper.make_model(graph))
    layer = layer_of(g, g.node("conv"))
    assert layer.rows == ["conv", "conv_b"] and layer.out == "conv"
    # an Add of another activation is no bias
    residual = g.node("residual")
    assert not g.const_derived(residual.input[1]) and g.const_derived("b4")


def test_a_model_that_cannot_be_prepared_is_left_out_with_its_reason(tmp_path, monkeypatch):
    """A zoo model whose package is missing (or whose file the converter refuses) leaves its
    cases out with the first line of the reason, instead of stopping the whole zoo."""
    from benchmarks.zoo import models as zoo_models
    from benchmarks.zoo import runner

    def missing():
        raise zoo_models.ZooSetupError("nopkg==1.0 is not installed (pip install nopkg)\nmore")

    spec = zoo_models.ModelSpec("nomodel", missing, "onnx", "x", (1, 3, 8, 8), "NCHW", "page")
    monkeypatch.setitem(zoo_models.EVERY_MODEL, "nomodel", spec)
    cases, dropped = runner.build_cases(["nomodel/clean/-", "nomodel/clipping/mid"], tmp_path)
    assert cases == []
    assert dropped == [
        (n, "the model could not be prepared: nopkg==1.0 is not installed (pip install nopkg)")
        for n in ("nomodel/clean/-", "nomodel/clipping/mid")
    ]


def test_harm_is_judged_on_outputs_of_many_values_the_clean_model_keeps_when_there_are_any():
    landmarks, handedness = np.zeros((1, 63), np.float32), np.zeros((1, 1), np.float32)
    assert judged_outputs({"handedness": handedness, "landmarks": landmarks}) == ["landmarks"]
    # a model of one-value outputs only is judged on them all
    assert judged_outputs({"a": handedness, "b": np.zeros(3)}) == ["a", "b"]
    # values are counted over the inputs the ranking pools: 15 iris points on 3 inputs are many
    iris = np.zeros((1, 15), np.float32)
    assert judged_outputs({"iris": iris, "flag": handedness}, inputs=3) == ["iris"]
    assert judged_outputs({"iris": iris, "mesh": landmarks}, inputs=1) == ["mesh"]
    # an output the clean model already destroys (more error than signal) is left out
    assert carrying({"landmarks": 14.3, "world": -3.7}) == ["landmarks"]
    assert carrying({"a": -1.0, "b": -3.7}) == ["a", "b"]
