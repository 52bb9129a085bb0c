"""Cumulative-layerwise snooping on the real QNN HTP backend, and both algorithms on the real
PP-OCRv4 det model."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from accdbg.algorithms import backend as backend_module
from accdbg.algorithms import run_cumulative_layerwise, run_layerwise
from accdbg.algorithms.backend import run_part
from accdbg.algorithms.diagnosis.ranking import COLUMNS as RANKING_COLUMNS  # noqa: E402
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines import exposure, run_inference_engine
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from tests.test_layerwise import (
    A,
    B,
    _base,
    fragment_json_files,
    oneshot_cosines,
    qnn_encodings_by_tensor,
    two_fault_prepared,
)

COLUMNS = [
    "O/P Name",
    "Status",
    "Layer Type",
    "Shape",
    "Activations",
    "CosineSimilarity",
    "Orig Outputs",
    "Info",
]


@pytest.fixture(scope="module")
def two_fault(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_fault_cumulative")
    m = two_fault_prepared(tmp)
    m.cumulative = run_cumulative_layerwise(
        m.path, m.inputs, golden_dir=m.golden, qdq_model=m.engine.qdq_model, working_dir=tmp / "w"
    )
    return m


def _orig(cell: str) -> dict:
    return json.loads(cell)


@pytest.mark.slow
def test_partitions_exactly_at_the_two_faults(two_fault):
    m = two_fault
    df = m.cumulative.report
    assert list(df.columns) == COLUMNS + list(RANKING_COLUMNS)
    oneshot = oneshot_cosines(m.golden, m.engine.results[0])
    assert list(df["O/P Name"]) == list(oneshot)
    assert set(df.loc[df["Status"] == "part", "O/P Name"]) == {A, B}
    between = df[~df["O/P Name"].isin([A, B])]
    assert (between["Status"] == "").all() and (between["CosineSimilarity"] >= 0.99).all()
    assert all(oneshot[n] < 0.99 for n in between["O/P Name"])  # where oneshot blamed them
    # one session per partition point (+1 unless the last one is the last layer), not one per layer
    assert m.cumulative.sessions == 2 and df["O/P Name"].iloc[-1] == B
    # the run from the model inputs is the full model: A's score and the model output's are oneshot's
    a = df.set_index("O/P Name").loc[A]
    assert a["CosineSimilarity"] == pytest.approx(oneshot[A], abs=1e-6)
    assert _orig(a["Orig Outputs"])["b"]["CosineSimilarity"] == pytest.approx(oneshot[B], abs=1e-6)
    # after the partition at A, the output's score is B's own (B is the model output)
    b = df.set_index("O/P Name").loc[B]
    assert _orig(b["Orig Outputs"])["b"]["CosineSimilarity"] == pytest.approx(
        b["CosineSimilarity"], abs=1e-6
    )
    assert oneshot[B] < b["CosineSimilarity"]  # A's error is gone from it


def crash_on_pool(job):
    """A backend that dies with SIGSEGV while running any model holding the Pool layer."""
    model = onnx.load(job.model_path, load_external_data=False)
    if any(n.op_type == "MaxPool" for n in model.graph.node):
        Path(job.stage_file).write_text("run")
        os.kill(os.getpid(), signal.SIGSEGV)
    return run_part(job)


@pytest.mark.slow
def test_a_layer_the_backend_cannot_run_becomes_an_error_partition(
    two_fault, tmp_path, monkeypatch
):
    m = two_fault
    monkeypatch.setattr(backend_module.Backend, "job_fn", staticmethod(crash_on_pool))
    res = run_cumulative_layerwise(
        m.path, m.inputs, golden_dir=m.golden, qdq_model=m.engine.qdq_model, working_dir=tmp_path
    )
    df = res.report.set_index("O/P Name")
    assert df["Status"].to_dict() == {"ra": "part", "rm": "", "s": "", "p": "err_exec", "b": "part"}
    assert "SIGSEGV" in df.loc["p", "Info"]
    ref = m.cumulative.report.set_index("O/P Name")
    np.testing.assert_allclose(
        df.loc[["ra", "rm", "s"], "CosineSimilarity"],
        ref.loc[["ra", "rm", "s"], "CosineSimilarity"],
    )
    # B runs after a partition at the failing layer: fed with golden p, it has its own error only
    lw = run_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        working_dir=tmp_path / "lw",
    )
    assert df.loc["b", "CosineSimilarity"] == pytest.approx(
        lw.report.set_index("O/P Name").loc["b", "CosineSimilarity"], abs=1e-9
    )


def _q_params(path: Path) -> dict[str, tuple]:
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return {
        n.output[0]: (float(inits[n.input[1]]), int(inits[n.input[2]]))
        for n in m.graph.node
        if n.op_type == "QuantizeLinear"
    }


@pytest.mark.slow
def test_quantizes_like_the_engine_and_runs_framework_diagnosis(two_fault, tmp_path):
    m = two_fault
    res = run_cumulative_layerwise(
        m.path,
        m.inputs,
        engine_kwargs={"quantization_overrides": m.encodings},
        working_dir=tmp_path,
    )
    qdq = next(res.run_dir.glob("*.qdq.onnx"))
    engine_q = _q_params(m.engine.qdq_model)
    assert _q_params(qdq) == engine_q and engine_q["b_QuantizeLinear_Output"][0] == pytest.approx(
        0.1 / 255, rel=1e-3
    )
    fd = [p for p in (tmp_path / "framework_diagnosis").iterdir() if p.name != "latest"]
    assert len(fd) == 1 and len(TensorFolder(fd[0])) == 7
    np.testing.assert_allclose(
        res.report["CosineSimilarity"], m.cumulative.report["CosineSimilarity"], atol=1e-9
    )
    assert list(res.report["Status"]) == list(m.cumulative.report["Status"])


@pytest.mark.slow
def test_start_and_end_layer(two_fault, tmp_path):
    m = two_fault
    res = run_cumulative_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        start_layer="rm",
        end_layer="p",
        working_dir=tmp_path,
    )
    df = res.report.set_index("O/P Name")
    assert df["Status"].to_dict() == {"ra": "skip", "rm": "", "s": "", "p": "", "b": "skip"}
    assert res.sessions == 1
    # the model is cut at the end layer: it stands for the model outputs
    for name in ("rm", "s", "p"):
        assert _orig(df.loc[name, "Orig Outputs"]) == {
            "p": {"CosineSimilarity": pytest.approx(df.loc["p", "CosineSimilarity"], abs=1e-6)}
        }
    # fed with golden ra, rm scores as it does alone
    ref = m.cumulative.report.set_index("O/P Name")
    assert df.loc["rm", "CosineSimilarity"] == pytest.approx(
        ref.loc["rm", "CosineSimilarity"], abs=1e-9
    )


# ---------------------------------------------------------------- the real PP-OCRv4 det model


@pytest.fixture(scope="module")
def ppocr(tmp_path_factory, ppocr_det, ppocr_small_input):
    tmp = tmp_path_factory.mktemp("ppocr_snooping")
    inputs = [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])]
    golden = run_framework_diagnosis("onnx", ppocr_det, inputs, working_dir=tmp / "w").run_dir
    engine = run_inference_engine(ppocr_det, input_tensors=inputs, working_dir=tmp / "w")
    kw = dict(golden_dir=golden, qdq_model=engine.qdq_model, working_dir=tmp / "w")
    layerwise = run_layerwise(ppocr_det, inputs, dump_qnn_json=True, **kw)
    cumulative = run_cumulative_layerwise(ppocr_det, inputs, **kw)
    return golden, engine, layerwise, cumulative


@pytest.mark.slow
def test_real_ppocr_det_layerwise_is_complete_and_uses_the_models_encodings(ppocr):
    golden, engine, layerwise, _ = ppocr
    df = layerwise.report
    layers = exposure.select(onnx.load(str(engine.qdq_model)), set(TensorFolder(golden).names()))
    assert list(df["O/P Name"]) == [e.name for e in layers] and len(df) > 250
    assert (df["Status"] == "").all() and df["CosineSimilarity"].notna().all()
    # a few sessions of at most BATCH_NODES nodes (with the layers' contexts), not one per layer
    assert 2 <= layerwise.sessions <= 10
    oneshot = oneshot_cosines(golden, engine.results[0])
    first = df["O/P Name"].iloc[0]  # the first layer's input is golden in oneshot too
    assert df["CosineSimilarity"].iloc[0] == pytest.approx(oneshot[first], abs=1e-6)
    full = qnn_encodings_by_tensor([engine.model_net_json])
    frag = qnn_encodings_by_tensor(fragment_json_files(layerwise.run_dir))
    common = set(full) & set(frag)
    assert {_base(e.q_output) for e in layers} <= common  # every layer output is compared
    assert all(frag[n] == full[n] for n in common)


@pytest.mark.slow
def test_real_ppocr_det_cumulative_is_complete_and_starts_where_oneshot_fails(ppocr):
    golden, engine, layerwise, cumulative = ppocr
    df = cumulative.report
    assert list(df["O/P Name"]) == list(layerwise.report["O/P Name"])
    assert set(df["Status"]) <= {"", "part"} and df["CosineSimilarity"].notna().all()
    parts = df.index[df["Status"] == "part"]
    assert len(parts) >= 1
    assert cumulative.sessions == len(parts) + (0 if parts[-1] == len(df) - 1 else 1)
    # the first run is the whole model from its inputs: up to the first partition point it
    # scores as oneshot, and the first partition point is oneshot's first failing layer
    oneshot = oneshot_cosines(golden, engine.results[0])
    first_fail = next(n for n, c in oneshot.items() if c < 0.99)
    assert df.loc[parts[0], "O/P Name"] == first_fail
    for _, row in df.iloc[: parts[0] + 1].iterrows():
        assert row["CosineSimilarity"] == pytest.approx(oneshot[row["O/P Name"]], abs=1e-5)
    # each partition point is the first failing layer of its run; the layers between pass
    judged = df[df["Status"] == ""]
    assert (judged["CosineSimilarity"] >= 0.99).all()
    assert (df.loc[parts, "CosineSimilarity"] < 0.99).all()
    # Orig Outputs: one value per run, the same on every row that run judged
    runs = np.split(df["Orig Outputs"].to_numpy(), parts + 1)
    assert all(len(set(r)) == 1 for r in runs if len(r))
    assert "sigmoid_0.tmp_0" in _orig(df["Orig Outputs"].iloc[0])
    assert cumulative.html.is_file() and (cumulative.run_dir / "cumulative_layerwise.csv").is_file()


@pytest.mark.slow
def test_a_small_memory_budget_judges_in_windows_with_the_same_result(two_fault, tmp_path):
    m = two_fault
    res = run_cumulative_layerwise(
        m.path,
        m.inputs,
        golden_dir=m.golden,
        qdq_model=m.engine.qdq_model,
        memory_budget_mb=1e-6,
        working_dir=tmp_path,
    )
    assert res.sessions == len(res.report)  # one layer's output per run
    ref = m.cumulative.report
    assert list(res.report["Status"]) == list(ref["Status"])
    np.testing.assert_allclose(res.report["CosineSimilarity"], ref["CosineSimilarity"], atol=1e-9)
    assert list(res.report["Orig Outputs"]) == list(
        ref["Orig Outputs"]
    )  # same run, window by window
