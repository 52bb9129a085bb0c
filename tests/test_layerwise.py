"""Layerwise snooping on the real QNN HTP backend: a synthetic model with two injected faults,
the encodings fragments run with, golden folders without manifest, and failure isolation."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.algorithms import backend as backend_module
from accdbg.algorithms import run_layerwise
from accdbg.algorithms.backend import PartReport, failure_status, run_part
from accdbg.algorithms.diagnosis.ranking import COLUMNS as RANKING_COLUMNS  # noqa: E402
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder, TensorWriter
from accdbg.engines import run_inference_engine
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests import models
from tests.helpers import run_cli

REPORT_COLUMNS = [
    "O/P Name",
    "Status",
    "Layer Type",
    "Shape",
    "Activations",
    "CosineSimilarity",
    "Info",
]
# layerwise's own: each layer that is no kernel run after its producers, and its worst input there
LAYERWISE_COLUMNS = [*REPORT_COLUMNS[:-1], "in-context SQNR", "in-context input SQNR", "Info"]
A, B = "ra", "b"  # the two faulty layers' outputs (ConvA+Relu, ConvB)


def two_fault_model(tmp: Path, size: int = 16) -> SimpleNamespace:
    """x -> ConvA -> Relu (ra) -> ConvM -> Relu (rm) -> Add(rm, ra) (s) -> MaxPool (p) -> ConvB (b).

    Fault A: ConvA's weights on input channel 2 are +-80 while that channel carries ~1e-3 of
    signal, so the per-tensor 8-bit weight grid is far too coarse for the useful weights.
    Fault B: an AIMET encodings override gives ConvB's output the range [-0.05, 0.05], far
    smaller than its values, so its output is clipped. Everything between A and B is benign.
    """
    rng = np.random.default_rng(5)
    wa = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    wa[:, 2] = np.sign(rng.standard_normal((8, 3, 3))) * 80.0
    weights = {
        "wa": wa,
        "ba": np.zeros(8, np.float32),
        "wm": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32),
        "bm": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "wb": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32),
        "bb": np.zeros(8, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"], pads=[1, 1, 1, 1], name="ConvA"),
        helper.make_node("Relu", ["a"], ["ra"], name="ReluA"),
        helper.make_node("Conv", ["ra", "wm", "bm"], ["m"], pads=[1, 1, 1, 1], name="ConvM"),
        helper.make_node("Relu", ["m"], ["rm"], name="ReluM"),
        helper.make_node("Add", ["rm", "ra"], ["s"], name="Residual"),
        helper.make_node(
            "MaxPool", ["s"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="Pool"
        ),
        helper.make_node("Conv", ["p", "wb", "bb"], ["b"], pads=[1, 1, 1, 1], name="ConvB"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_fault",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 8, size, size])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = tmp / "two_fault.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    x[:, 2] *= 1e-3
    x.tofile(tmp / "x.raw")
    enc = tmp / "b_tiny.encodings"
    enc.write_text(
        json.dumps(
            {
                "version": "0.6.1",
                "param_encodings": {},
                "activation_encodings": {
                    "b": [
                        {
                            "bitwidth": 8,
                            "dtype": "int",
                            "is_symmetric": "False",
                            "min": -0.05,
                            "max": 0.05,
                        }
                    ]
                },
            }
        )
    )
    inputs = [parse_input_tensor(["x", f"1,3,{size},{size}", str(tmp / "x.raw")])]
    return SimpleNamespace(path=path, inputs=inputs, encodings=enc, tmp=tmp)


def cosine(a, b) -> float:
    """Cosine similarity; two all-zero tensors agree (1), one all-zero shares no direction (0)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def oneshot_cosines(golden_dir: Path, result: Path) -> dict[str, float]:
    """Oneshot, computed here: every engine-dumped activation against its golden value."""
    g, t = TensorFolder(golden_dir), TensorFolder(result)
    return {
        r.name: cosine(g.load(r.name), t.load(r.name)) for r in sorted(t, key=lambda r: r.index)
    }


def dumped_outputs(run_dir: Path) -> dict[str, np.ndarray]:
    """The backend outputs the run wrote under output/, by layer."""
    out = {}
    for folder in sorted((run_dir / "output").iterdir()):
        f = TensorFolder(folder)
        out.update({n: np.asarray(f.load(n)) for n in f.names()})
    return out


def two_fault_prepared(tmp: Path) -> SimpleNamespace:
    """The two-fault model with its golden tensors and its QNN engine run (QDQ model) done."""
    m = two_fault_model(tmp)
    m.golden = run_framework_diagnosis("onnx", m.path, m.inputs, working_dir=tmp / "w").run_dir
    m.engine = run_inference_engine(
        m.path, input_tensors=m.inputs, quantization_overrides=m.encodings, working_dir=tmp / "w"
    )
    return m


@pytest.fixture(scope="module")
def two_fault(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_fault")
    m = two_fault_prepared(tmp)
    m.layerwise = run_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        working_dir=tmp / "w",
        dump_qnn_json=True,
    )
    return m


@pytest.mark.slow
def test_oneshot_blames_everything_after_a_layerwise_only_a_and_b(two_fault):
    m = two_fault
    oneshot = oneshot_cosines(m.golden, m.engine.results[0])
    order = list(oneshot)
    assert order[0] == A and order[-1] == B and len(order) == 5
    assert all(c < 0.99 for c in oneshot.values()), oneshot  # oneshot: every layer from A on fails
    df = m.layerwise.report
    assert list(df.columns) == LAYERWISE_COLUMNS + list(RANKING_COLUMNS)
    assert list(df["O/P Name"]) == order  # execution order
    # the ranking names both faults, each with its own cause, and nothing else
    ranked = df.dropna(subset=["culprit_rank"]).set_index("O/P Name")
    assert set(ranked.index) == {A, B}, df[["O/P Name", "culprit_rank", "cause"]]
    assert ranked.loc[A, "cause"].startswith("weight range")
    assert "clipping" in ranked.loc[B, "cause"]
    flagged = set(df.loc[df["CosineSimilarity"] < 0.99, "O/P Name"])
    assert flagged == {A, B}
    assert (df["Status"] == "").all()
    assert m.layerwise.sessions == 1  # five single-layer models, one QNN session
    info = dict(zip(df["O/P Name"], df["Info"], strict=True))
    assert "fails (pass >= 0.99)" in info[A] and info["s"] == ""


@pytest.mark.slow
def test_scores_and_activations_follow_from_the_dumped_outputs(two_fault):
    m = two_fault
    golden = TensorFolder(m.golden)
    outputs = dumped_outputs(m.layerwise.run_dir)
    df = m.layerwise.report
    for _, row in df.iterrows():
        g = np.asarray(golden.load(row["O/P Name"]), np.float64)
        assert row["CosineSimilarity"] == pytest.approx(
            cosine(g, outputs[row["O/P Name"]]), abs=1e-9
        )
        lo, hi, med = (float(v) for v in row["Activations"].strip("[]").split(","))
        np.testing.assert_allclose(
            [lo, hi, med], [g.min(), g.max(), np.median(g)], rtol=1e-3, atol=1e-6
        )
        assert row["Shape"] == list(g.shape)
    # the outputs are the backend's integers dequantized with the full model's encodings
    rec = TensorFolder(next((m.layerwise.run_dir / "output").iterdir())).records["s"]
    q = outputs["s"] / rec.extra["scale"] + rec.extra["zero_point"]
    np.testing.assert_allclose(q, np.rint(q), atol=1e-3)
    csv = pd.read_csv(m.layerwise.csv, keep_default_na=False)
    assert list(csv.columns) == LAYERWISE_COLUMNS + list(RANKING_COLUMNS) and len(csv) == len(df)
    np.testing.assert_allclose(csv["CosineSimilarity"].astype(float), df["CosineSimilarity"])
    html = m.layerwise.html.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", html) and "Plotly" in html  # offline: plotly embedded
    assert all(f">{name}<" in html for name in df["O/P Name"])


def sqnr_db(golden: np.ndarray, x: np.ndarray) -> float:
    g, x = np.asarray(golden, np.float64).ravel(), np.asarray(x, np.float64).ravel()
    return float(10 * np.log10((g @ g) / ((x - g) @ (x - g))))


@pytest.mark.slow
def test_a_layer_that_is_no_kernel_also_runs_after_its_producers(two_fault):
    """The Add and the MaxPool also run in context: after their producers back to the nearest
    convolutions, which here reach the graph input - so the context is the full model up to
    them, and their in-context SQNR is what the inference engine's full QNN run gives there;
    their worst input's is the full run's at the worse of their inputs. A convolution runs
    alone only."""
    m = two_fault
    golden, full = TensorFolder(m.golden), TensorFolder(m.engine.results[0])
    db = {n: sqnr_db(golden.load(n), full.load(n)) for n in ("ra", "rm", "s", "p")}
    df = m.layerwise.report.set_index("O/P Name")
    assert df.loc["s", "in-context SQNR"] == pytest.approx(db["s"], abs=0.01)
    assert df.loc["s", "in-context input SQNR"] == pytest.approx(min(db["ra"], db["rm"]), abs=0.01)
    assert df.loc["p", "in-context SQNR"] == pytest.approx(db["p"], abs=0.01)
    assert df.loc["p", "in-context input SQNR"] == pytest.approx(db["s"], abs=0.01)
    assert df.loc[[A, "rm", B], ["in-context SQNR", "in-context input SQNR"]].isna().all().all()
    # run in context the Add is fault A's error carried in, not its own: not named for it
    assert pd.isna(df.loc["s", "culprit_rank"]) and pd.isna(df.loc["p", "culprit_rank"])


@pytest.mark.slow
def test_a_pad_htp_gets_wrong_only_after_a_convolution_is_named_from_its_context(tmp_path):
    """The zoo's backend divergence: a channel Pad after Conv -> Tanh, whose new channels
    HTP fills with the integer 0 (the encoding's minimum) after a convolution, and right on a
    graph input. Alone, fed golden values, the Pad is right; run after the convolution it
    reads the minimum - at most the SQNR those wrong channels alone leave (numpy, from its
    golden value and its encoding) - and it is named first as the backend's."""
    from benchmarks.zoo import plant as zoo_plant
    from benchmarks.zoo.probe import FloatProbe
    from tests.test_zoo_planting import _signed_net

    model, feeds = _signed_net(tmp_path)
    p = zoo_plant.plant("net", model, "backend_divergence", "mid", FloatProbe(model, feeds), feeds)
    path = tmp_path / "padded.onnx"
    onnx.save(p.model, str(path))
    lines = []
    for i, f in enumerate(feeds):
        f["x"].tofile(tmp_path / f"x{i}.raw")
        lines.append(f"x:={tmp_path / f'x{i}.raw'}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    dims = ",".join(str(d) for d in feeds[0]["x"].shape)
    inputs = [parse_input_tensor(["x", dims, str(tmp_path / "x0.raw")])]
    res = run_layerwise(path, inputs, input_list=tmp_path / "list.txt", working_dir=tmp_path / "w")
    df = res.report.set_index("O/P Name")
    (padded,) = p.fault.culprits
    qdq = onnx.load(str(next((tmp_path / "w").rglob("*.qdq.onnx"))))
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == padded)
    scale, zp = float(inits[q.input[1]]), int(inits[q.input[2]])
    g = TensorFolder(tmp_path / "w" / "framework_diagnosis" / "latest").load(padded)
    new = g[:, 8:]  # 0 in float; HTP's integer 0 reads -zp * scale
    bound = 10 * np.log10(float((g.astype(np.float64) ** 2).sum()) / (new.size * (zp * scale) ** 2))
    assert df.loc[padded, "CosineSimilarity"] > 0.999  # alone: right
    assert df.loc[padded, "in-context SQNR"] <= bound + 0.1
    assert df.loc[padded, "in-context input SQNR"] > bound + 10
    assert df.loc[padded, "culprit_rank"] == 1
    cause = df.loc[padded, "cause"]
    assert cause.startswith("backend: run after its producers")
    # run again there in onnxruntime's CPU fake-quant, the same cut keeps the Pad right
    cpu = re.search(
        r"fake-quant of the same cut, fed the same golden values, keeps (\S+) dB", cause
    )
    assert cpu is not None and float(cpu.group(1)) > bound + 10, cause
    # and the model from its input on the backend, as deployed, reads the minimum there too
    whole = re.search(r"in the whole model on the backend it keeps (\S+) dB", cause)
    assert whole is not None and float(whole.group(1)) <= bound + 0.1, cause
    # what that costs the outputs: many times their tiny error in the CPU fake-quant, said in dB
    assert re.search(r"takes [\d.]+ dB off the outputs' SQNR there$", cause), cause
    assert df["culprit_rank"].notna().sum() == 1


def _qnn_encodings(path: Path) -> dict[str, tuple[float, int]]:
    tensors = json.loads(path.read_text())["graph"]["tensors"]
    out = {}
    for name, t in tensors.items():
        qp = t.get("quant_params", {})
        if qp.get("definition") == 1 and qp.get("encoding") == 0:
            out[name] = (qp["scale_offset"]["scale"], qp["scale_offset"]["offset"])
    return out


def _base(name: str) -> str:
    """A QNN tensor name back to the ONNX tensor it encodes (fragment prefix, Q suffixes off)."""
    name = re.sub(r"^f\d+/", "", name)
    return re.sub(r"_QuantizeLinear(_Output)?$", "", name)


def qnn_encodings_by_tensor(paths) -> dict[str, set[tuple[float, int]]]:
    out: dict[str, set[tuple[float, int]]] = {}
    for path in paths:
        for name, enc in _qnn_encodings(path).items():
            if "_token_" not in name:  # layout transposes QNN adds, named per graph
                out.setdefault(_base(name), set()).add(enc)
    return out


def fragment_json_files(run_dir: Path) -> list[Path]:
    files = [
        p for p in (run_dir / "qnn_json").rglob("*.json") if not p.name.endswith("_tensor_log.json")
    ]
    assert files
    return files


@pytest.mark.slow
def test_fragments_run_with_the_full_models_qnn_encodings(two_fault):
    m = two_fault
    full = qnn_encodings_by_tensor([m.engine.model_net_json])
    frag = qnn_encodings_by_tensor(fragment_json_files(m.layerwise.run_dir))
    # every activation (fragment inputs and outputs), every weight and bias
    expected = {
        "x",
        "ra",
        "rm",
        "s",
        "p",
        "b",
        "wa_quantized",
        "wm_quantized",
        "wb_quantized",
        "bm_quantized",
    }
    assert expected <= set(frag) and expected <= set(full)
    for name in set(frag) & set(full):
        assert len(full[name]) == 1
        assert frag[name] == full[name], name  # the same scale and offset everywhere
    ((b_scale, _),) = frag["b"]
    assert b_scale == pytest.approx(0.1 / 255, rel=1e-3)  # B's overridden range is what QNN got


def test_a_golden_folder_whose_manifest_names_missing_files_is_refused_in_one_line(tmp_path):
    """A tensor folder whose manifest lists a file that is gone was half deleted: every
    fragment fed from it would fail in the backend process. It is refused up front, naming
    the folder, how many files are missing and the first of them."""
    from accdbg.algorithms.golden import Golden

    w = TensorWriter(tmp_path / "golden")
    for name in ("a", "b/c"):
        w.write(name, np.ones((2, 3), np.float32))
    w.save_manifest()
    Golden(tmp_path / "golden", [], tmp_path / "scratch")  # complete: accepted
    gone = TensorFolder(tmp_path / "golden").path("b/c")
    gone.unlink()
    with pytest.raises(AccdbgError) as err:
        Golden(tmp_path / "golden", [], tmp_path / "scratch")
    message = str(err.value)
    assert "\n" not in message
    assert "1 of the 2 tensor files its manifest lists are missing" in message
    assert repr(str(gone)) in message and repr(str(tmp_path / "golden")) in message


@pytest.mark.slow
def test_aimet_style_folder_without_manifest_and_missing_tensors(two_fault, tmp_path):
    m = two_fault
    golden = TensorFolder(m.golden)
    bare = tmp_path / "layer_outputs_0"
    bare.mkdir()
    for name in golden.names():
        shutil.copyfile(golden.path(name), bare / f"{name}.raw")  # flat float32, no tensors.json
    res = run_layerwise(
        m.path, m.inputs, golden_dir=bare, qdq_model=m.engine.qdq_model, working_dir=tmp_path / "w"
    )
    ref = m.layerwise.report
    # shapes came from the model; the ranking's evidence needs the manifest's layouts, so only
    # the measured columns must agree
    pd.testing.assert_frame_equal(res.report[REPORT_COLUMNS], ref[REPORT_COLUMNS])
    (bare / "rm.raw").unlink()
    (bare / "p.raw").write_bytes((bare / "p.raw").read_bytes()[:-4])  # one value short
    res = run_layerwise(
        m.path, m.inputs, golden_dir=bare, qdq_model=m.engine.qdq_model, working_dir=tmp_path / "w"
    )
    status = dict(zip(res.report["O/P Name"], res.report["Status"], strict=True))
    info = dict(zip(res.report["O/P Name"], res.report["Info"], strict=True))
    assert status == {
        "ra": "",
        "rm": "err_COMPARE",
        "s": "err_part",
        "p": "err_COMPARE",
        "b": "err_part",
    }
    assert "no golden value for 'rm'" in info["rm"] and "no golden value for 'rm'" in info["s"]
    assert "holds 2047 values" in info["b"]
    judged = res.report[res.report["Status"] == ""]
    np.testing.assert_allclose(
        judged["CosineSimilarity"], ref.loc[judged.index, "CosineSimilarity"]
    )


@pytest.mark.slow  # runs QNN, and Ray when installed
@pytest.mark.parametrize("executor", ["serial", "local", "ray"])
def test_the_executor_does_not_change_the_table(two_fault, tmp_path, executor):
    """The parts run in this process, in 1 local worker, or on 2 Ray actors: the same table,
    to the bit, as the default (2 local workers)."""
    from accdbg.core.executors import ExecutorConfig

    if executor == "ray":
        pytest.importorskip("ray", reason="the Ray executor needs pip install 'accdbg[ray]'")
    m = two_fault
    config = ExecutorConfig(executor, 2 if executor == "ray" else 1)
    res = run_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        working_dir=tmp_path,
        executor=config,
    )
    ref = m.layerwise.report
    scores = ["O/P Name", "Status", "CosineSimilarity"]
    pd.testing.assert_frame_equal(res.report[scores], ref[scores])
    assert (res.report["Status"] == "").all()


def crash_on_pool(job):
    """A backend that dies with SIGSEGV while running any model holding the Pool layer."""
    model = onnx.load(job.model_path, load_external_data=False)
    if any(n.op_type == "MaxPool" for n in model.graph.node):
        Path(job.stage_file).write_text("run")
        Path(job.native_log).write_text("what the backend printed before it died\n")
        os.kill(os.getpid(), signal.SIGSEGV)
    return run_part(job)


def _run_again(m, tmp_path):
    """Layerwise on the two-fault model again (the backend patched by the test): the result,
    its table and the fixture's table, by layer."""
    res = run_layerwise(
        m.path, m.inputs, golden_dir=m.golden, qdq_model=m.engine.qdq_model, working_dir=tmp_path
    )
    return res, res.report.set_index("O/P Name"), m.layerwise.report.set_index("O/P Name")


def crash_on_pool_after_add(job):
    """A backend that dies with SIGSEGV on any model running a MaxPool and an Add: the
    context the Pool shares with the Add, not either alone."""
    ops = {n.op_type for n in onnx.load(job.model_path, load_external_data=False).graph.node}
    if {"MaxPool", "Add"} <= ops:
        Path(job.stage_file).write_text("run")
        os.kill(os.getpid(), signal.SIGSEGV)
    return run_part(job)


@pytest.mark.slow
def test_a_layer_whose_context_crashes_is_still_measured_alone(two_fault, tmp_path, monkeypatch):
    monkeypatch.setattr(backend_module.Backend, "job_fn", staticmethod(crash_on_pool_after_add))
    _, df, ref = _run_again(two_fault, tmp_path)
    assert (df["Status"] == "").all()
    np.testing.assert_allclose(df["CosineSimilarity"], ref["CosineSimilarity"])
    # the Add and the Pool share their context (both start at the graph input): it crashed
    for name in ("s", "p"):
        assert pd.isna(df.loc[name, "in-context SQNR"])
        assert df.loc[name, "Info"].startswith("not run in context: err_exec")
    assert not df.drop(index=["s", "p"])["Info"].str.contains("context").any()


@pytest.mark.slow
def test_a_crashing_layer_is_isolated_and_the_rest_judged(two_fault, tmp_path, monkeypatch):
    monkeypatch.setattr(backend_module.Backend, "job_fn", staticmethod(crash_on_pool))
    res, df, ref = _run_again(two_fault, tmp_path)
    assert df.loc["p", "Status"] == "err_exec" and "SIGSEGV" in df.loc["p", "Info"]
    # the verdict says which layer was not measured, and the Info's backend log is where it
    # says (the run's final folder, not the staging folder it was written in)
    assert res.findings[0].startswith(
        "1 layer(s) not measured on QNN: err_exec, running it failed: p (MaxPool)"
    )
    shown = Path(df.loc["p", "Info"].rsplit(" - see ", 1)[1])
    assert shown.is_file() and shown.parent.parent == res.run_dir
    others = df.drop(index="p")
    assert (others["Status"] == "").all()
    ref = ref.drop(index="p")
    np.testing.assert_allclose(others["CosineSimilarity"], ref["CosineSimilarity"])
    assert res.sessions > 1  # the batch was bisected


@pytest.mark.slow  # runs QNN
def test_a_layer_qnn_cannot_compile_is_named_and_the_rest_judged(tmp_path, capsys):
    """A quantized LSTM does not finalize on QNN HTP: the whole model's run fails in one line
    that says how to find the layer, and layerwise names it in its verdict and judges the rest."""
    built = models.lstm_after_matmul(tmp_path)
    code, _, err = run_cli(capsys, *built.flags(), "-w", tmp_path / "oneshot")
    assert code != 0 and len(err.strip().splitlines()) >= 1
    last = err.strip().splitlines()[-1]
    assert "Failed to finalize QNN graph" in last and "--debugging_algorithm layerwise" in last
    inputs = [parse_input_tensor(["x", ",".join(map(str, built.dims)), str(built.input_path)])]
    res = run_layerwise(built.path, inputs, working_dir=tmp_path / "w")
    df = res.report.set_index("O/P Name")
    assert df.loc["y", "Status"] == "err_cntx" and df.loc["mm", "Status"] == ""
    assert np.isfinite(float(df.loc["mm", "CosineSimilarity"]))
    assert res.findings[0].startswith(
        "1 layer(s) not measured on QNN: err_cntx, QNN could not finalize the graph: y (LSTM)"
    )


@pytest.mark.parametrize(
    "stage, error, status",
    [
        (
            "session",
            "QNN session creation failed: [ONNXRuntimeError] : 10 : INVALID_GRAPH : bad",
            "err_con",
        ),
        (
            "session",
            "QNN session creation failed: Failed to finalize QNN graph. Error code: 1002",
            "err_cntx",
        ),
        (
            "session",
            "QNN session creation failed: QnnModel::ComposeGraph: failed to add node",
            "err_lib",
        ),
        ("run", "QNN run failed: EP_FAIL", "err_exec"),
    ],
)
def test_failure_stage_maps_to_the_reference_status(stage, error, status):
    assert failure_status(PartReport(False, stage, error)) == status


@pytest.mark.slow
def test_span_and_skip_filters(two_fault, tmp_path):
    m = two_fault
    res = run_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        start_layer="rm",
        end_layer="p",
        engine_kwargs={"skip_layer_types": "Add"},
        working_dir=tmp_path,
    )
    df = res.report.set_index("O/P Name")
    assert list(df["Status"]) == ["skip", "", "skip", "", "skip"]
    assert df["CosineSimilarity"].isna().tolist() == [True, False, True, False, True]
    assert "outside --start_layer/--end_layer" in df.loc["ra", "Info"]
    ref = m.layerwise.report.set_index("O/P Name")
    assert df.loc["rm", "CosineSimilarity"] == pytest.approx(
        ref.loc["rm", "CosineSimilarity"], abs=1e-12
    )


@pytest.mark.slow
def test_bad_arguments_are_one_line_errors(two_fault, tmp_path):
    m = two_fault
    kw = dict(golden_dir=m.golden, qdq_model=m.engine.qdq_model, working_dir=tmp_path)
    with pytest.raises(
        AccdbgError, match=r"--start_layer 'r_m' is not the output of a layer.*near matches: rm"
    ):
        run_layerwise(m.path, m.inputs, start_layer="r_m", **kw)
    with pytest.raises(AccdbgError, match="comes after --end_layer"):
        run_layerwise(m.path, m.inputs, start_layer="p", end_layer="rm", **kw)
    with pytest.raises(AccdbgError, match="unknown verifier 'Cosine'"):
        run_layerwise(m.path, m.inputs, verifiers=["Cosine"], **kw)
    with pytest.raises(AccdbgError, match="engine option 'bogus' is not known"):
        run_layerwise(m.path, m.inputs, engine_kwargs={"bogus": 1}, **kw)
    with pytest.raises(AccdbgError, match="sealed"):
        run_layerwise(m.path, m.inputs, engine_kwargs={"stage": "compiled"}, **kw)
    with pytest.raises(AccdbgError) as info:
        run_layerwise(m.path, m.inputs, start_layer="r_m", **kw)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "layerwise_snooping").exists()  # refused before any folder was made


@pytest.fixture(scope="module")
def calibration_list(tmp_path_factory) -> SimpleNamespace:
    """A small CNN, three input-list lines with different ranges (the first is the -i file),
    the engine run on that list, and each float tensor's range per line (onnxruntime CPU)."""
    tmp = tmp_path_factory.mktemp("calibration_list")
    built = models.conv_net(tmp, channels=8, size=16, layers=3)
    x = np.fromfile(built.input_path, np.float32).reshape(1, 3, 16, 16)
    files = [built.input_path]
    for i, (gain, shift) in enumerate([(3.0, 0.5), (0.5, -2.0)], start=1):
        files.append(tmp / f"x{i}.raw")
        (x * gain + shift).astype(np.float32).tofile(files[-1])
    lst = tmp / "list.txt"
    lst.write_text("".join(f"{f}\n" for f in files))
    inputs = [parse_input_tensor(["x", "1,3,16,16", str(built.input_path)])]
    engine = run_inference_engine(
        built.path, input_list=lst, input_tensors=inputs, working_dir=tmp / "w"
    )
    float_model = onnx.load(str(built.path))
    names = [o for n in float_model.graph.node for o in n.output]
    del float_model.graph.output[:]
    float_model.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names
    )
    sess = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    ranges = []  # per line: float tensor -> (min, max)
    for f in files:
        feed = np.fromfile(f, np.float32).reshape(1, 3, 16, 16)
        values = dict(zip(names, sess.run(None, {"x": feed}), strict=True)) | {"x": feed}
        ranges.append({n: (float(v.min()), float(v.max())) for n, v in values.items()})
    return SimpleNamespace(
        built=built, list=lst, inputs=inputs, engine=engine, ranges=ranges, tmp=tmp
    )


def _activation_params(path: Path) -> dict[str, tuple[float, int]]:
    """Float activation -> (scale, zero point) of its QuantizeLinear in a QDQ model."""
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return {
        n.input[0].removesuffix("_QuantizeLinear_Input"): (
            float(inits[n.input[1]]),
            int(inits[n.input[2]]),
        )
        for n in m.graph.node
        if n.op_type == "QuantizeLinear"
    }


def _minmax_scale(ranges: list[tuple[float, float]]) -> float:
    """onnxruntime's MinMax uint8 scale over the given (min, max), the range widened to hold 0."""
    lo = min(0.0, *(r[0] for r in ranges))
    hi = max(0.0, *(r[1] for r in ranges))
    return (hi - lo) / 255


@pytest.mark.parametrize(
    "algorithm, folder",
    [
        ("layerwise", "layerwise_snooping"),
        ("cumulative-layerwise", "cumulative_layerwise_snooping"),
    ],
)
@pytest.mark.slow
def test_snooping_calibrates_on_every_input_list_line_like_the_engine(
    calibration_list, tmp_path, capsys, algorithm, folder
):
    c = calibration_list
    # the wrapper's -l reaches snooping; -i stays the golden input
    code, _, err = run_cli(
        capsys,
        *("-f", "onnx", "-m", c.built.path, "-i", "x", "1,3,16,16", c.built.input_path),
        *("-l", c.list, "-r", "htp", "--debugging_algorithm", algorithm),
        *("-w", tmp_path / "w", "--output_dirname", "run"),
    )
    assert code == 0, err
    run = tmp_path / "w" / folder / "run"
    options = json.loads(next(run.glob("*_options.json")).read_text())
    assert options["input_list"] == str(c.list)
    snooped = _activation_params(next(run.glob("*.qdq.onnx")))
    engine = _activation_params(c.engine.qdq_model)
    assert snooped == engine  # every QuantizeLinear: same scale, same zero point
    activations = [n for n in snooped if n in c.ranges[0]]
    assert len(activations) == 5  # x, the three ReLUs, the pooled output
    for name in activations:
        scale = snooped[name][0]
        every_line = _minmax_scale([r[name] for r in c.ranges])
        assert scale == pytest.approx(every_line, rel=1e-5), name
        assert abs(scale - _minmax_scale([c.ranges[0][name]])) > 0.2 * scale, name


@pytest.mark.slow
def test_a_given_qdq_model_still_pools_the_sensitivity_over_the_input_list(
    calibration_list, tmp_path, monkeypatch
):
    """With the QDQ model given, -l calibrates nothing, but a culprit must still matter on the
    user's other lines: they reach the ranking (the -i line once, as the debugged input)."""
    from accdbg.algorithms.diagnosis import culprits

    c = calibration_list
    seen: list[dict[str, np.ndarray]] = []
    real = culprits.find_culprits

    def spy(*args, more_feeds=(), **kw):
        seen.extend(more_feeds)
        return real(*args, more_feeds=seen, **kw)

    monkeypatch.setattr(culprits, "find_culprits", spy)
    # a line past the ones pooled is never read (a long calibration list costs nothing here):
    # its file has the wrong size, which reading it would refuse
    (tmp_path / "short.raw").write_bytes(b"\0" * 12)
    listed = tmp_path / "list.txt"
    listed.write_text(c.list.read_text() + f"{tmp_path / 'short.raw'}\n")
    run_layerwise(
        c.built.path,
        c.inputs,
        input_list=listed,
        qdq_model=c.engine.qdq_model,
        working_dir=tmp_path,
    )
    others = [p for p in c.list.read_text().split() if Path(p) != c.built.input_path]
    assert len(others) == 2
    assert len(seen) == 2
    for feed, path in zip(seen, others, strict=True):
        np.testing.assert_array_equal(
            feed["x"], np.fromfile(path, np.float32).reshape(1, 3, 16, 16)
        )


def test_pooled_lines_skip_the_debugged_input_and_stop_at_the_cap(tmp_path):
    from accdbg.algorithms.snooping import pooled_feeds

    debugged = tmp_path / "x0.raw"
    lines = []
    for i in range(6):
        p = tmp_path / f"x{i}.raw"
        if i < 5:  # the last line's file does not exist: past the cap it must not be read
            np.full((2, 3), i, np.float32).tofile(p)
        lines.append({"x": (str(p), (2, 3), "float32", "float32")})
    inputs = [parse_input_tensor(["x", "2,3", str(debugged)])]
    got = pooled_feeds(lines, inputs, most=3)
    assert [float(f["x"][0, 0]) for f in got] == [1.0, 2.0, 3.0]
    assert list(pooled_feeds(lines[:2], inputs, most=3))[0]["x"].shape == (2, 3)
    assert list(pooled_feeds(None, inputs)) == []


@pytest.mark.slow
def test_a_layer_qnn_preprocessing_splits_into_reshape_gemm_reshape_runs_alone_as_one(tmp_path):
    """A MatMul + Add on a 3-D input is Reshape -> Gemm -> Reshape in QNN's model: only the
    last Reshape's tensor is the model's (and has a golden value). That layer is run alone from
    its golden input through all three, QNN's result within a step of numpy's fake-quant of
    the three with the QDQ model's encodings; the tensors the pre-processing made are skipped,
    saying why, and the layer with the outlier weight, not its Gemm, is named."""
    from accdbg.algorithms.snooping import PREPROCESSED

    built = models.dense_chain(tmp_path, outlier=40.0)
    inp = [parse_input_tensor(["x", "1,12,16", str(built.input_path)])]
    res = run_layerwise(built.path, inp, working_dir=tmp_path / "w")
    r = res.report.set_index("O/P Name")
    source = {o for n in onnx.load(str(built.path)).graph.node for o in n.output}
    made = [n for n in r.index if n not in source]
    assert len(made) == 16 and set(r.loc[made, "Status"]) == {"skip"}  # 2 per layer
    assert set(r.loc[made, "Info"]) == {PREPROCESSED}
    kept = [n for n in r.index if n in source]
    assert kept == [f"act{i}" for i in range(7)] + ["y"]
    assert set(r.loc[kept, "Status"]) == {""}, r.loc[kept, ["Status", "Info"]]
    planted = built.expected["planted"]
    named = r["culprit_rank"].dropna().sort_values()
    assert list(named.index)[:1] == [planted], r[["culprit_rank", "cause"]]
    # numpy's fake-quant of act2 -> Reshape -> Gemm -> Reshape (+ Relu, folded into act3's
    # encoding), each tensor with its QuantizeLinear's scale and zero point in the QDQ model
    qdq = onnx.load(str(next(res.run_dir.glob("*.qdq.onnx"))))
    consts = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    made_by = {o: n for n in qdq.graph.node for o in n.output}

    def fq(x, tensor):
        q = next(
            n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor
        )
        s, z = float(consts[q.input[1]]), consts[q.input[2]]
        lo, hi = np.iinfo(z.dtype).min, np.iinfo(z.dtype).max
        return (np.clip(np.round(x / s) + int(z), lo, hi) - int(z)) * s, s

    def weight(name):
        if name in consts:
            return consts[name].astype(np.float64)
        dq = made_by[name]
        return (consts[dq.input[0]].astype(np.float64) - consts[dq.input[2]]) * consts[dq.input[1]]

    gemm = next(
        n for n in qdq.graph.node if n.op_type == "Gemm" and any("w3" in i for i in n.input)
    )
    golden = TensorFolder(next((tmp_path / "w" / "framework_diagnosis").iterdir()))
    a, _ = fq(np.asarray(golden.load("act2"), np.float64), "act2")
    g = a.reshape(12, 16) @ weight(gemm.input[1]) + weight(gemm.input[2])
    g, _ = fq(g, gemm.output[0])
    want, step = fq(g.reshape(1, 12, 16), planted)
    qnn = np.asarray(TensorFolder(res.run_dir / "output" / "batch_0001").load(planted))
    apart = np.abs(qnn - want) / step
    assert apart.max() <= 1.01 and (apart > 0.5).mean() < 0.1, (apart.max(), (apart > 0.5).mean())


def test_layers_not_measured_name_the_ops_their_fragments_ran():
    """silero-vad's LSTM output has no golden value: the rows QNN could not finalize are the
    Unsqueeze after it, whose fragment runs the LSTM. The verdict names the ops the failing
    fragments ran besides the layers' own, where the refused op may be."""
    from accdbg.algorithms.snooping import not_measured

    rows = [
        {
            "_position": 2,
            "Status": "err_cntx",
            "O/P Name": "u2",
            "Layer Type": "Unsqueeze",
            "_ops": ["Gather", "LSTM", "Squeeze", "Unsqueeze"],
        },
        {
            "_position": 1,
            "Status": "err_cntx",
            "O/P Name": "u1",
            "Layer Type": "Unsqueeze",
            "_ops": ["LSTM", "Squeeze", "Unsqueeze"],
        },
        {"_position": 0, "Status": "", "O/P Name": "conv", "Layer Type": "Conv"},
    ]
    assert not_measured(rows, "QNN") == (
        "2 layer(s) not measured on QNN: err_cntx, QNN could not finalize the graph: u1, u2 "
        "(Unsqueeze; their fragments run LSTM, Squeeze, Gather) - their error is unknown; each "
        "row's Info says why and where the backend log is"
    )


def test_a_layer_runs_in_context_after_its_nearest_producers_back_to_a_kernel():
    """The context of a layer that is no kernel: its producers back to the nearest kernel
    (included), the nearest CONTEXT_OPS at most - golden values enter where the walk stops.
    A kernel, or a layer reading only graph inputs, runs alone only."""
    from accdbg.algorithms.fragments import CONTEXT_OPS, QdqModel
    from accdbg.algorithms.layerwise import _context_cut

    n = CONTEXT_OPS + 3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv")]
    nodes.append(helper.make_node("Relu", ["x"], ["r"], name="relu"))  # reads the graph input
    prev = "c"
    for i in range(1, n + 1):
        nodes.append(helper.make_node("Add", [prev, "one"], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in (prev, "r")],
        [
            numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w"),
            numpy_helper.from_array(np.ones(1, np.float32), "one"),
        ],
    )
    qdq = QdqModel(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    ctx = SimpleNamespace(qdq=qdq)
    layer = {x.exposed.qdq_tensor: x for x in qdq.layers}
    assert _context_cut(ctx, layer["c"]) is None and _context_cut(ctx, layer["r"]) is None
    assert _context_cut(ctx, layer["a1"]) == ["x"]  # after the convolution
    assert _context_cut(ctx, layer[f"a{CONTEXT_OPS}"]) == ["x"]  # the conv is the 6th back
    # farther: the nearest CONTEXT_OPS Adds, golden entering at the one before them
    assert _context_cut(ctx, layer[f"a{n}"]) == [f"a{n - CONTEXT_OPS - 1}"]


def test_an_if_whose_branches_read_the_graph_by_name_is_cut_with_what_they_read():
    """openWakeWord's hey_jarvis: an If's branches read an activation and a Constant of the
    enclosing graph by name, which onnx's extractor does not follow - its fragment was an
    invalid model. The activation is the layer's input (fed golden), the Constant comes along,
    and the part computes the If as the model does (onnxruntime, numpy reference)."""
    from accdbg.algorithms.fragments import QdqModel

    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    then = helper.make_graph([helper.make_node("Mul", ["s", "k"], ["y_then"])], "then", [], [out])
    then.output[0].name = "y_then"
    other = helper.make_graph([helper.make_node("Neg", ["s"], ["y_else"])], "else", [], [out])
    other.output[0].name = "y_else"
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node(
            "Constant", [], ["k"], name="k", value=numpy_helper.from_array(np.float32(3.0))
        ),
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "if_reads_outer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.float32(0.0), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    qdq = QdqModel(model)
    (layer,) = [x for x in qdq.layers if x.exposed.qdq_tensor == "y"]
    assert set(layer.inputs) == {"cond", "s"}
    part = qdq.between(layer.inputs, [layer], "p/")
    onnx.checker.check_model(part.model, full_check=True)
    x = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
    s = 1 / (1 + np.exp(-x))
    sess = ort.InferenceSession(part.model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"p/cond": np.array(True), "p/s": s}
    assert set(part.inputs) == set(feeds)
    (y,) = sess.run(None, feeds)
    np.testing.assert_allclose(y, 3 * s, rtol=1e-6)


def test_no_standout_among_the_layers_measured_says_so():
    """arabic-name-romanizer's GRU encoder: both GRUs could not be finalized on QNN, and the
    verdict read "no single layer stands out ... diffuse" - of a model QNN cannot run. It
    holds for the layers measured, and says so; other lines are kept as they were."""
    from accdbg.algorithms.snooping import among_measured

    findings = [
        "no single layer stands out: the error is diffuse at the noise floor's level",
        "the model's noise floor: median local SQNR 40.0 dB, spread 2.0 dB",
    ]
    assert among_measured(findings, 49) == [
        "no single layer stands out among the 49 layer(s) measured: the error is diffuse at the "
        "noise floor's level",
        findings[1],
    ]


def test_a_run_that_measured_no_layer_names_none_and_says_so():
    """Every layer refused by the backend: the CPU ranking's culprit is dropped (nothing was
    compared on the backend), and the verdict says no layer was measured, not "diffuse"; with
    one layer measured, the verdict holds for it and the culprit stays."""
    from accdbg.algorithms.diagnosis.culprit import Culprit
    from accdbg.algorithms.diagnosis.ranking import Ranking
    from accdbg.algorithms.snooping import NOTHING_MEASURED, with_unmeasured

    def ranking():
        return Ranking(
            [Culprit(1, "c1", "Conv", "weight range")],
            40.0,
            1.0,
            ["culprit #1: c1 (Conv) - weight range", "no single layer stands out: diffuse"],
            {"c1": {"culprit_rank": 1}},
        )

    refused = {"Status": "err_cntx", "Layer Type": "Conv", "_ops": []}
    rows = [{**refused, "_position": i, "O/P Name": f"c{i}"} for i in range(2)]
    r = ranking()
    with_unmeasured(r, rows, "QNN")
    assert r.culprits == [] and r.columns == {}
    assert r.findings[0].startswith("2 layer(s) not measured on QNN") and r.findings[1:] == [
        NOTHING_MEASURED
    ]
    rows[1] = {"_position": 1, "Status": "", "O/P Name": "c1", "Layer Type": "Conv"}
    r = ranking()
    with_unmeasured(r, rows, "QNN")
    assert [c.name for c in r.culprits] == ["c1"]
    assert r.findings[0].startswith("1 layer(s) not measured on QNN")
    assert "among the 1 layer(s) measured" in r.findings[2]
