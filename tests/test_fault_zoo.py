"""The fault zoo is valid: compensated faults leave the float model as it was, every planted
fault hurts the quantized model on the real QNN HTP backend, and culprit sets name real
tensors. Also the zoo's ranking goal on its quick subset.

Slow tier (``pytest -m slow``): planting on the four real models, and QNN runs of the quick
subset (oneshot and layerwise).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import numpy_helper

from accdbg.core.tensor_store import TensorFolder
from benchmarks.zoo import models as zoo_models
from benchmarks.zoo import plant as zoo_plant
from benchmarks.zoo import runner
from benchmarks.zoo.probe import FloatProbe, load_feeds
from benchmarks.zoo.scoring import HARM_DB

pytestmark = pytest.mark.slow

TOL = 1e-3  # a tensor is unchanged when max|after - before| <= TOL * max|before|


# ---------------------------------------------------------------- helpers (numpy/onnxruntime only)


def all_tensors(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float node output of the model on one input, by name (no graph optimization)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node if n.op_type != "Constant" for o in n.output if o]
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in s.get_outputs()]
    values = dict(zip(outs, s.run(outs, feed), strict=True))
    return {k: v for k, v in values.items() if isinstance(v, np.ndarray) and v.dtype == np.float32}


def changed(before: dict, after: dict) -> set[str]:
    out = set()
    for name, b in before.items():
        a = after.get(name)
        if a is None or a.shape != b.shape:
            continue
        scale = max(float(np.abs(b).max()), 1e-12)
        if float(np.abs(a.astype(np.float64) - b).max()) > TOL * scale:
            out.add(name)
    return out


def descendants(model: onnx.ModelProto, tensors: set[str]) -> set[str]:
    """Tensors computed from ``tensors`` (excluding them)."""
    reached, out = set(tensors), set()
    for n in model.graph.node:  # topological order
        if any(i in reached for i in n.input):
            reached.update(n.output)
            out.update(n.output)
    return out


def weights_as_quantized(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """A Conv/Gemm/MatMul's weights with a directly following BatchNormalization folded in, as
    onnxruntime folds it before quantization."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    w = consts[node.input[1]].astype(np.float64)
    users = [n for n in model.graph.node if node.output[0] in n.input]
    if node.op_type == "Conv" and len(users) == 1 and users[0].op_type == "BatchNormalization":
        bn = users[0]
        gamma, var = consts[bn.input[1]], consts[bn.input[4]]
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        w = w * (gamma / np.sqrt(var + eps)).reshape(-1, 1, 1, 1)
    return w


def channel_absmax(x: np.ndarray) -> np.ndarray:
    axis = 1 if x.ndim == 4 else x.ndim - 1
    return np.abs(x).max(axis=tuple(a for a in range(x.ndim) if a != axis))


def sqnr(g: np.ndarray, t: np.ndarray) -> float:
    g, t = g.astype(np.float64).ravel(), t.astype(np.float64).ravel()
    noise = float(((g - t) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((g**2).sum()) / noise)


# ---------------------------------------------------------------- planting (float only)


@pytest.fixture(scope="module")
def zoo_models_prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo_models")
    prepared = {}
    for name, spec in zoo_models.MODELS.items():
        prep = zoo_models.prepare(spec, out)
        feeds = load_feeds(prep.input_paths, spec.input_name, spec.dims)
        prepared[name] = (prep, feeds, FloatProbe(prep.model, feeds))
    return prepared


@pytest.mark.parametrize("model_name", list(zoo_models.MODELS))
def test_compensated_faults_leave_the_float_model_unchanged(zoo_models_prepared, model_name):
    prep, feeds, probe = zoo_models_prepared[model_name]
    planted_any = 0
    # one input: a compensation is exact algebra (scales and offsets undone in the readers'
    # weights and biases), which a second input would only confirm
    feed = feeds[0]
    before = all_tensors(prep.model, feed)  # the same for every plant
    outputs = {o.name for o in prep.model.graph.output}
    for kind in zoo_plant.COMPENSATED:
        for depth in zoo_plant.DEPTHS:
            p = zoo_plant.plant(model_name, prep.model, kind, depth, probe, feeds)
            if p is None:
                continue
            assert not p.fault.excluded, p.fault
            planted_any += 1
            case = p.fault.case
            after = all_tensors(p.model, feed)
            diff = changed(before, after)
            assert not diff & outputs, (case, diff & outputs)
            assert diff, f"{case}: the planting changed nothing"
            # the change is undone by the checked layers: they and what follows them are
            # unchanged, except the culprit rows that carry it on purpose (an offset
            # channel along a residual path)
            checked = set(p.fault.checked)
            assert checked and not diff & checked, (case, diff & checked)
            leaked = diff & descendants(p.model, checked) - set(p.fault.culprits)
            assert not leaked, (case, leaked)
            # ...and it is the fault it claims to be, measured on the planted float model
            v = after
            if kind == "act_outlier_scale":
                cam = channel_absmax(v[p.site.tensor])
                top, rest = np.sort(cam)[-1], np.sort(cam)[-2]
                assert top >= 8 * rest, (case, top, rest)
            elif kind == "act_outlier_offset":
                x = v[p.site.tensor]
                axis = 1 if x.ndim == 4 else x.ndim - 1
                means = np.abs(x.mean(axis=tuple(a for a in range(x.ndim) if a != axis)))
                c = int(np.argmax(means))
                others = np.delete(channel_absmax(x), c)
                assert means[c] >= 5 * others.max(), (case, means[c], others.max())
            elif kind == "conv_pair_scaled":
                node = next(n for n in p.model.graph.node if n.name == p.fault.site)
                w = weights_as_quantized(p.model, node)
                axis = 0 if w.shape[1] == 1 and w.ndim == 4 else 1  # depthwise: per output channel
                per = np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(1)
                top = np.sort(per)
                assert top[-1] >= 8 * top[-2], (case, top[-3:])
                assert node.input[0] in diff or any(t in diff for t in p.site.source.rows), case
            elif kind == "concat_unbalanced":
                concat = next(n for n in p.model.graph.node if n.output[0] == p.fault.culprits[0])
                ranges = [float(np.abs(v[t]).max()) for t in concat.input]
                assert max(ranges) >= 8 * sorted(ranges)[-2], (case, ranges)
    assert planted_any >= 3, f"{model_name}: only {planted_any} compensated faults"


@pytest.mark.parametrize("model_name", list(zoo_models.MODELS))
def test_every_kind_is_planted_at_several_depths(zoo_models_prepared, model_name):
    prep, feeds, probe = zoo_models_prepared[model_name]
    per_kind = defaultdict(set)
    for kind in zoo_plant.KINDS:
        if kind == "clean":
            continue
        for depth in zoo_plant.DEPTHS:
            p = zoo_plant.plant(model_name, prep.model, kind, depth, probe, feeds)
            if p is not None:
                per_kind[kind].add(p.fault.site + ":" + str(p.site.tensor))
                onnx.checker.check_model(p.model)
                names = {o for n in p.model.graph.node for o in n.output}
                assert p.fault.culprits and set(p.fault.culprits) <= names, p.fault
    for kind in (
        "weight_outlier",
        "weight_channel",
        "act_outlier_scale",
        "conv_pair_scaled",
        "clipping",
    ):
        assert len(per_kind[kind]) >= 2, (model_name, kind, per_kind[kind])


def test_weight_outliers_cover_pointwise_depthwise_and_dense(zoo_models_prepared):
    variants = set()
    for name, (prep, feeds, probe) in zoo_models_prepared.items():
        for depth in zoo_plant.DEPTHS:
            p = zoo_plant.plant(name, prep.model, "weight_outlier", depth, probe, feeds)
            variants.add(p.fault.variant)
            # one weight K x beyond the rest of its tensor
            node = next(n for n in p.model.graph.node if n.name == p.fault.site)
            w = np.abs(weights_as_quantized(p.model, node).ravel())
            top = np.sort(w)
            assert top[-1] >= 15 * top[-2], (p.fault.case, top[-2:])
    assert {"pointwise", "depthwise", "dense"} <= variants


# ---------------------------------------------------------------- QNN runs of the quick subset


# the quick cases layerwise runs on (the zoo benchmark measures its hit rates on all): a weight
# outlier it names first, the backend divergence it cannot see alone
LAYERWISE = {"cls/weight_outlier/early", "cls/backend_divergence/early"}


@pytest.fixture(scope="module")
def quick_zoo(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo_quick")
    cases, dropped = runner.build_cases(list(runner.QUICK), out)
    assert not dropped, dropped
    rows = []
    for case in cases:  # layerwise where its tests read it
        algorithms = ["oneshot", "layerwise"] if case.name in LAYERWISE else ["oneshot"]
        rows += runner.run_case(case, algorithms, out)
    return out, cases, pd.DataFrame(rows)


def _oneshot_dirs(case) -> tuple[Path, Path, pd.DataFrame]:
    w = case.folder / "w"
    golden = runner._line0(w / "framework_diagnosis" / "oneshot")
    result = w / "inference_engine" / "oneshot" / "output" / "Result_0"
    summary = pd.read_csv(w / "verification" / "oneshot" / "summary.csv", keep_default_na=False)
    return golden, result, summary


def test_quick_runs_finish(quick_zoo):
    _, cases, rows = quick_zoo
    assert len(cases) == len(runner.QUICK)
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][
        ["case", "algorithm", "status"]
    ]


def test_culprit_sets_name_tensors_of_the_golden_dump(quick_zoo):
    _, cases, _ = quick_zoo
    for case in cases:
        golden, _, summary = _oneshot_dirs(case)
        dumped = set(TensorFolder(golden).names())
        assert set(case.fault.culprits) <= dumped, (case.name, set(case.fault.culprits) - dumped)
        if case.fault.kind != "clean":
            assert set(case.fault.culprits) & set(summary["Name"]), case.name


def test_planted_faults_hurt_the_quantized_model(quick_zoo):
    """QNN HTP error, recomputed from the oneshot's dumped tensors: each kept fault costs the
    model's outputs at least HARM_DB of SQNR against the same model without the fault (the
    zoo keeps no planting the outputs do not feel), as its plain QNN run measured when it was
    planted."""
    _, cases, _ = quick_zoo
    clean = {c.fault.model: c for c in cases if c.fault.kind == "clean"}
    for case in cases:
        if case.fault.kind == "clean":
            continue
        ref = clean.get(case.fault.model)
        assert ref is not None, (
            f"{case.name}: the quick subset lacks {case.fault.model}'s clean case"
        )
        g, t, _ = _oneshot_dirs(case)
        g0, t0, _ = _oneshot_dirs(ref)
        g, t, g0, t0 = (TensorFolder(x) for x in (g, t, g0, t0))
        outputs = runner.watched_outputs(onnx.load(str(case.model_path), load_external_data=False))
        out_lost = [sqnr(g0.load(n), t0.load(n)) - sqnr(g.load(n), t.load(n)) for n in outputs]
        assert max(out_lost) >= HARM_DB, (case.name, out_lost)
        assert case.fault.harm_db >= HARM_DB and case.fault.tries, case.fault


def test_clipping_override_reaches_the_qdq_model(quick_zoo):
    _, cases, _ = quick_zoo
    clipping = [c for c in cases if c.fault.kind == "clipping"]
    assert clipping
    for case in clipping:
        enc = case.fault.overrides["activation_encodings"]
        ((tensor, [e]),) = enc.items()
        qdq = next((case.folder / "w" / "inference_engine" / "oneshot").glob("*.qdq.onnx"))
        m = onnx.load(str(qdq))
        init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
        scale = float(init[q.input[1]])
        assert scale == pytest.approx((e["max"] - e["min"]) / 255, rel=0.02), case.name


def test_clean_cls_names_no_culprit_and_its_faults_rank_first(quick_zoo):
    """What the ranking achieves today on the quick subset: nothing named on the clean cls
    model; its faults (each costs the outputs 9-55 dB; the early weight outlier's channel
    blows the ranges of the layers it flows into) named first, by oneshot (and by layerwise,
    where it runs).
    (The shipped face model is not clean at 8 bits: one activation channel of
    depthwise_conv2d_15 spans 228x the median channel's range and is named on some inputs.)"""
    _, cases, rows = quick_zoo
    for case in cases:
        _, _, summary = _oneshot_dirs(case)
        ranks = pd.to_numeric(summary["culprit_rank"], errors="coerce")
        if case.fault.kind == "clean" and case.fault.model == "cls":
            assert ranks.isna().all(), f"{case.name}: culprits named on a clean model"
    cls = rows[(rows["model"] == "cls") & ~rows["kind"].isin(["clean", "backend_divergence"])]
    assert len(cls) >= 4 and (cls["best_rank"] == 1).all(), cls[["case", "algorithm", "best_rank"]]
    assert "layerwise" in set(cls["algorithm"])


def test_a_backend_divergence_is_named_by_oneshot_and_run_alone_the_layer_is_right(quick_zoo):
    """cls's planted channel Pad: in the whole model on QNN HTP its new channels read the
    encoding's minimum, not 0 (tests/test_zoo_planting.py shows it on a small model). Oneshot
    feeds each layer's CPU fake-quant QNN's own inputs and names the Pad first, as the
    backend's. Layerwise runs the Pad alone, fed golden values: there HTP computes it right,
    so layerwise cannot see what only arises between the layers HTP runs together."""
    _, cases, rows = quick_zoo
    (case,) = [c for c in cases if c.fault.kind == "backend_divergence"]
    (pad,) = case.fault.culprits
    golden, result, summary = _oneshot_dirs(case)
    row = summary[summary["Name"] == pad].iloc[0]
    assert str(row["culprit_rank"]) == "1", summary[summary["culprit_rank"] != ""][["Name"]]
    assert row["cause"].startswith("backend: fed the backend's own inputs"), row["cause"]
    assert "inherited" not in row["cause"]
    # numpy, from the dumps: the padded channels are 0 in float and far below 0 on QNN
    g, q = TensorFolder(golden).load(pad), TensorFolder(result).load(pad)
    channels = int(re.search(r"padded with (\d+) zero channels", case.fault.detail).group(1))
    assert not g[:, -channels:].any() and q[:, -channels:].max() < -0.1 * np.abs(g).max()
    lw = pd.read_csv(
        next((case.folder / "w" / "layerwise_snooping").rglob("layerwise.csv")),
        keep_default_na=False,
    )
    alone = lw[lw["O/P Name"] == pad].iloc[0]
    assert float(alone["CosineSimilarity"]) > 0.999, alone


def test_a_case_whose_dumps_went_keeps_its_harm_figures_and_reruns_oneshot_for_the_others(
    quick_zoo, tmp_path, monkeypatch
):
    """Without --keep-tensors a planted case's dumps go once it ran: the SQNRs the summary
    needs (recomputed here from the dumps with numpy) stay; an algorithm asked later gets
    oneshot's golden tensors back from a new oneshot run, and the cached others stay."""
    import dataclasses
    import shutil

    out, cases, _ = quick_zoo
    case = next(c for c in cases if c.name == "cls/weight_outlier/early")
    folder = tmp_path / "case"
    shutil.copytree(case.folder, folder, symlinks=True)
    copy = dataclasses.replace(case, folder=folder, model_path=folder / "model.onnx")
    g, t, _ = (TensorFolder(x) if i < 2 else x for i, x in enumerate(_oneshot_dirs(copy)))
    outputs = runner.watched_outputs(onnx.load(str(copy.model_path), load_external_data=False))
    expected = {n: sqnr(g.load(n), t.load(n)) for n in outputs}
    culprits = [n for n in case.fault.culprits if n in set(g.names()) & set(t.names())]
    assert culprits  # some of a culprit set may be fused away on QNN, not all of it
    per_channel = {n: runner.channel_sqnr(g.load(n), t.load(n)) for n in culprits}
    layerwise_before = (folder / "result_layerwise.json").read_text()

    runner.run_case(copy, ["oneshot", "layerwise"], out, keep_tensors=False)
    assert not list((folder / "w").rglob("*.raw"))
    kept = runner.tensor_sqnrs(folder, outputs, per_channel=False)
    assert kept == pytest.approx(expected, abs=1e-9)
    assert runner.tensor_sqnrs(folder, list(case.fault.culprits), True) == per_channel

    seen = {}

    def cumulative(model, inputs, golden_dir, **kw):
        seen["raw files"] = len(list(Path(golden_dir).rglob("*.raw")))
        raise RuntimeError("not run here")

    import accdbg.algorithms.cumulative as cumulative_module

    monkeypatch.setattr(cumulative_module, "run_cumulative_layerwise", cumulative)
    rows = runner.run_case(copy, ["oneshot", "layerwise", "cumulative"], out)
    assert seen["raw files"] > 0  # oneshot ran again before it
    assert [r["status"] for r in rows[:2]] == ["ok", "ok"] and rows[2]["status"] != "ok"
    assert (folder / "result_layerwise.json").read_text() == layerwise_before
    assert (folder / "w" / "layerwise_snooping" / "layerwise").is_dir()
    assert not (folder / "harm_figures.json").exists()


def median_channel_sqnr_at_8_bits(xs: list[np.ndarray]) -> float:
    """numpy: a tensor's median channel (axis 1; channels that are not all zero) quantized to
    8 bits over the range it takes on all the calibration inputs (zero kept exact), as an 8-bit
    per-tensor activation encoding does: its SQNR on the worst input."""
    lo, hi = min(min(float(x.min()) for x in xs), 0.0), max(max(float(x.max()) for x in xs), 0.0)
    scale = (hi - lo) / 255
    zero = round(-lo / scale)
    worst = math.inf
    for x in xs:
        x = x.astype(np.float64)
        q = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
        axes = tuple(a for a in range(x.ndim) if a != 1)
        power, noise = (x**2).sum(axis=axes), ((q - x) ** 2).sum(axis=axes)
        alive = power > 0
        worst = min(worst, -10 * math.log10(float(np.median(noise[alive] / power[alive]))))
    return worst


def test_oneshot_ranking_names_the_quick_faults(quick_zoo):
    """The issue's goal on the quick subset: oneshot names every planted fault in its top three
    (``culprit_rank``); on a model as shipped it names a layer only when its 8-bit encoding
    destroys the layer's information - checked with numpy on the golden dumps: its median
    channel, quantized over the range of the calibration inputs, keeps under 6 dB. (The shipped face model
    has one: depthwise_conv2d_15, one channel 228x the median's; the README's clean-model
    table shows its 16-bit activation removing a third of the outputs' error on QNN.)"""
    _, cases, _ = quick_zoo
    hits, faults = 0, 0
    for case in cases:
        golden, _, summary = _oneshot_dirs(case)
        ranks = pd.to_numeric(summary["culprit_rank"], errors="coerce")
        if case.fault.kind == "clean":
            inputs = [TensorFolder(d) for d in sorted(golden.parent.glob("Result_*"))]
            for name in summary.loc[ranks.notna(), "Name"]:
                xs = [f.load(name) for f in inputs]
                assert xs[0].ndim == 4, f"{case.name}: {name} named on a model as shipped"
                db = median_channel_sqnr_at_8_bits(xs)
                assert db < 6, f"{case.name}: {name} named, its median channel at {db:.1f} dB"
            continue
        faults += 1
        mine = ranks[summary["Name"].isin(case.fault.culprits)]
        hits += bool((mine <= 3).any())
    assert hits >= 0.9 * faults, f"hit@3 {hits}/{faults}"
