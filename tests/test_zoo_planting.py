"""The fault zoo keeps only plantings the quantized outputs feel: a weak one is planted again
stronger, then at the next site nearest its depth, and left out when none hurts - on a small
hand-built CNN with a stand-in harm measure (no QNN run; the real measure runs in the slow tier).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest

from benchmarks.zoo import plant as zoo_plant
from benchmarks.zoo.harm import carrying, judged_outputs
from benchmarks.zoo.probe import FloatProbe, run
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


def test_a_channel_after_an_identity_is_scaled_and_offset_exactly():
    """A converted model may keep an ``Identity`` between a Conv's bias Add and the tensor a
    planting changes (one held-out zoo model does): it passes the channels as they are, so
    the scale and the offset land on the Conv and its bias, and the float model is unchanged
    once the consumer undoes them (numpy on onnxruntime's results)."""
    from onnx import TensorProto, helper, numpy_helper

    from benchmarks.zoo import edits
    from benchmarks.zoo.graph import Graph

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
            helper.make_node("Add", ["conv", "b"], ["conv_b"], name="bias"),
            helper.make_node("Identity", ["conv_b"], ["t"], name="identity"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4, 4, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feed = {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    (before,) = run(model, [feed], ["t"])[0].values()
    f, delta = np.array([1.0, 8.0, 1.0, 0.5]), np.array([0.0, 0.0, 5.0, 0.0])
    g = Graph(model)
    src = edits.find_source(g, "t", 4, 1, 4)
    assert [n.op_type for n in src.ops] == ["Add", "Identity"]
    edits.scale_channels(g, src, f)
    edits.offset_channels(g, src, delta)
    (after,) = run(g.model, [feed], ["t"])[0].values()
    expected = before * f.reshape(1, 4, 1, 1) + delta.reshape(1, 4, 1, 1)
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)


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


def _signed_net(tmp_path):
    """conv_net with Tanh for Relu: activations reach below zero (a zero point far from 0)."""
    built = conv_net(tmp_path, channels=8, size=8, layers=4)
    model = onnx.load(str(built.path))
    for n in model.graph.node:
        if n.op_type == "Relu":
            n.op_type = "Tanh"
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal(built.dims).astype(np.float32)} for _ in range(2)]
    return model, feeds


def _float_values(model: onnx.ModelProto, feed, names) -> list[np.ndarray]:
    """``names`` computed by onnxruntime's CPU provider, the model as written."""
    (got,) = run(model, [feed], names)
    return [got[n] for n in names]


def test_a_backend_divergence_pads_channels_the_float_model_does_not_see(tmp_path):
    """The planting inserts a channel Pad in front of a convolution whose input reaches below
    zero; the convolution's weights for the new channels copy channels it uses. In float the
    new channels are 0 and the outputs are unchanged."""
    model, feeds = _signed_net(tmp_path)
    probe = FloatProbe(model, feeds)
    sites = [s.tensor for s in zoo_plant.candidate_sites(model, probe, "backend_divergence", "mid")]
    # the Tanh outputs feed Conv_1..3; the graph input feeds no site
    assert sorted(sites) == ["relu0", "relu1", "relu2"], sites
    p = zoo_plant.plant("net", model, "backend_divergence", "mid", probe, feeds)
    assert not p.fault.excluded and p.fault.float_change == pytest.approx(0.0, abs=1e-6)
    pad = next(n for n in p.model.graph.node if n.name == p.fault.site)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in p.model.graph.initializer}
    pads = inits[pad.input[1]]
    k = int(pads[5])
    assert pad.op_type == "Pad" and k >= 1 and pads.tolist() == [0, 0, 0, 0, 0, k, 0, 0]
    assert p.fault.culprits == [pad.output[0]]
    conv = next(n for n in p.model.graph.node if pad.output[0] in n.input)
    w_old = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}[conv.input[1]]
    w = inits[conv.input[1]]
    assert w.shape == (8, 8 + k, 3, 3) and np.array_equal(w[:, :8], w_old)
    assert all(any(np.array_equal(w[:, j], w_old[:, c]) for c in range(8)) for j in range(8, 8 + k))
    x, padded, out = _float_values(p.model, feeds[0], [pad.input[0], pad.output[0], "pool"])
    assert np.array_equal(padded[:, :8], x) and not padded[:, 8:].any()
    assert x.min() <= -zoo_plant.NEGATIVE_SHARE * np.abs(x).max()
    (before,) = _float_values(model, feeds[0], ["pool"])
    np.testing.assert_allclose(out, before, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_qnn_htp_pads_channels_with_the_integer_0_not_the_zero_point(tmp_path):
    """What the backend_divergence kind rests on: QNN HTP fills a channel Pad's new channels
    with the integer 0, i.e. the encoding's minimum, where onnxruntime's CPU fake-quant of the
    same QDQ model gives 0 (the zero point). If onnxruntime-qnn ever fixes this, the kind
    plants nothing the backend does wrong and this test says so."""
    from accdbg.engines.base import get_engine
    from accdbg.engines.options import EngineConfig
    from accdbg.engines.pipeline import Calibration, prepare_model

    model, feeds = _signed_net(tmp_path)
    p = zoo_plant.plant("net", model, "backend_divergence", "mid", FloatProbe(model, feeds), feeds)
    pad = next(n for n in p.model.graph.node if n.name == p.fault.site)
    lines = []
    for i, f in enumerate(feeds):
        f["x"].tofile(tmp_path / f"x{i}.raw")
        lines.append(f"x:={tmp_path / f'x{i}.raw'}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    config = EngineConfig.from_keywords()
    cal = Calibration.from_inputs(p.model, tmp_path / "list.txt")
    qdq = onnx.load(str(prepare_model(p.model, "m", cal, config, tmp_path / "e").path))
    qdq.graph.output.extend([onnx.ValueInfoProto(name=pad.output[0])])
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer}
    q = next(
        n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == pad.output[0]
    )
    scale, zp = float(inits[q.input[1]]), int(inits[q.input[2]])
    assert zp >= 20  # the activation reaches well below 0: a zero point far from the integer 0
    qnn = get_engine("qnn").create_session(qdq.SerializeToString(), config.engine_options())
    (on_qnn,) = qnn.run([pad.output[0]], feeds[0])
    (on_cpu,) = _float_values(qdq, feeds[0], [pad.output[0]])
    np.testing.assert_allclose(on_cpu[:, 8:], 0.0, atol=1e-7)
    # the integer 0 (HTP's result lands within a step of it), not the zero point
    np.testing.assert_allclose(on_qnn[:, 8:], -zp * scale, atol=1.01 * scale)
    # the input's own channels: the same values up to the rounding of the layers before it
    assert np.median(np.abs(on_qnn[:, :8] - on_cpu[:, :8])) <= 1.01 * scale


def test_a_planting_is_reused_only_while_what_it_depends_on_is_the_same(net, tmp_path):
    """The planting cache hands back a case's folder only for the same prepared model, seed,
    gate and sites held by the kind's other depths, and only while its planted file is intact."""
    from benchmarks.zoo.runner import Plantings

    model = net[0]
    folder = tmp_path / "cases" / "net" / "weight_outlier_mid"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "fault.json").write_text(json.dumps({"model": "net", "kind": "weight_outlier"}))
    cache_dir = tmp_path / "models" / "net"
    cache_dir.mkdir(parents=True)
    cache = Plantings(cache_dir, model, seed=0, gate=True)
    key = cache.key("net/weight_outlier/mid", {"a:b"})
    sha = hashlib.sha1((folder / "model.onnx").read_bytes()).hexdigest()
    cache.put(key, {"folder": str(folder), "site": "c:d", "fingerprint": "f", "model_sha1": sha})

    again = Plantings(cache_dir, model, seed=0, gate=True)  # read back from its file
    got = again.get(again.key("net/weight_outlier/mid", {"a:b"}))
    assert got is not None and got["site"] == "c:d" and got["record"]["kind"] == "weight_outlier"
    assert got["folder"] == str(folder)
    stored = json.loads((cache_dir / "plantings.json").read_text())[key]["folder"]
    assert stored == "../../cases/net/weight_outlier_mid"  # relative: --out may move
    assert again.get(again.key("net/weight_outlier/mid", set())) is None  # other sites held
    assert Plantings(cache_dir, model, seed=1, gate=True).get(key.replace(":0:", ":1:")) is None
    other = Plantings(cache_dir, model, seed=0, gate=False)
    assert other.get(other.key("net/weight_outlier/mid", {"a:b"})) is None
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.name = "changed"
    moved = Plantings(cache_dir, changed, seed=0, gate=True)
    assert moved.get(moved.key("net/weight_outlier/mid", {"a:b"})) is None
    (folder / "model.onnx").write_bytes(b"not the planted model")
    assert again.get(again.key("net/weight_outlier/mid", {"a:b"})) is None
