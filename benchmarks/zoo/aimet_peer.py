"""The peer: AIMET's QuantAnalyzer per-layer sensitivity on a zoo case.

AIMET (``aimet-onnx``) builds its own simulation of the pre-processed float model accdbg's
engine quantized for QNN (set up as the engine quantizes, the case's clipping override loaded:
:func:`rank_case`) and scores the model with one layer's quantizers enabled at a time
(QuantAnalyzer's first per-layer analysis) and with one layer's quantizers disabled at a time
(its second). The score
is the outputs' SQNR against the float model (pooled over the case's inputs, the worst output,
judged at the logits of a Softmax/Sigmoid output as accdbg judges them). Each analysis ranks
every layer: the lowest score with only it enabled, the highest with only it disabled. AIMET has
no verdict: it always ranks every layer, so on a clean model it always names some.

Runs where ``aimet_onnx`` imports (``pip install --no-deps aimet-onnx`` and its dependencies but
``onnx2torch``, which would pull a CUDA build of torch).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd

from accdbg.algorithms.diagnosis.sensitivity import scores
from accdbg.core import onnx_model as om
from benchmarks.zoo import scoring

ANALYSES = {"aimet_enabled": True, "aimet_disabled": False}  # algorithm -> layer enabled alone


def _sqnr_db(golden: Sequence[Sequence[np.ndarray]], runs) -> float:
    """The worst output's SQNR, signal and noise powers summed over the inputs (each output's
    values of every input, end to end)."""

    def pooled(per_input, k: int) -> np.ndarray:
        return np.concatenate([np.ravel(out[k]) for out in per_input])

    return min(scoring.sqnr_db(pooled(golden, k), pooled(runs, k)) for k in range(len(golden[0])))


def rank_case(
    float_path: Path,
    feeds: Sequence[Mapping[str, np.ndarray]],
    overrides: Path | None = None,
    analyses: Sequence[str] = tuple(ANALYSES),
) -> dict[str, pd.DataFrame]:
    """Per analysis, a table ``Name`` (every output tensor of the layer), ``culprit_rank`` (all
    layers ranked) and ``aimet score`` (outputs' SQNR, dB). The simulation is AIMET's own, set
    up as accdbg's engine quantizes for QNN: 8-bit per-tensor asymmetric weights and
    activations, min/max over the case's inputs, and the case's ``-qo`` overrides."""
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.quant_analyzer import QuantAnalyzer
    from aimet_onnx.quantsim import QuantizationSimModel, load_encodings_to_sim

    float_model = onnx.load(str(float_path))
    judged = scores(float_model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    model = om.with_outputs(float_model, judged)
    fold_all_batch_norms_to_weight(model)  # as onnxruntime's quantizer folds them for QNN
    gold_sess = ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    golden = [gold_sess.run(judged, dict(f)) for f in feeds]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "per_tensor_asymmetric.json"
        config.write_text(json.dumps(CONFIG))
        sim = QuantizationSimModel(
            model,
            param_type="int8",  # 8 bits; asymmetric by CONFIG, as the engine's uint8 + offset
            activation_type="int8",
            quant_scheme="min_max",
            config_file=str(config),
        )
    sim.compute_encodings([dict(f) for f in feeds])
    if overrides is not None:  # only these tensors' encodings; every other quantizer kept
        load_encodings_to_sim(
            sim, _with_scale(overrides), strict=False, disable_missing_quantizers=False
        )
    outs = [o.name for o in sim.model.model.graph.output]
    names = [n if n in outs else next((o for o in outs if o.startswith(n)), n) for n in judged]

    def evaluate(session: ort.InferenceSession) -> float:
        return _sqnr_db(golden, [session.run(names, dict(f)) for f in feeds])

    analyzer = QuantAnalyzer(sim.model, dict(feeds[0]), lambda *_: None, evaluate)
    producer_outputs = {n.name: list(n.output) for n in sim.model.model.graph.node}
    tables = {}
    for algo in analyses:
        enabled = ANALYSES[algo]
        if enabled:
            per_op = analyzer.perform_per_layer_analysis_by_enabling_quantizers(sim)
        else:
            per_op = analyzer.perform_per_layer_analysis_by_disabling_quantizers(sim)
        # enabled alone: the lowest SQNR is the most harmful; disabled alone: the highest
        order = sorted(per_op, key=lambda op: per_op[op] if enabled else -per_op[op])
        rows = []
        for rank, op in enumerate(order, start=1):
            for out in producer_outputs.get(op, [op]):
                rows.append({"Name": _plain(out), "culprit_rank": rank, "aimet score": per_op[op]})
        tables[algo] = pd.DataFrame(rows)
    return tables


# AIMET's default configuration with asymmetric weights: per-tensor 8-bit as accdbg's engine
CONFIG = {
    "defaults": {
        "ops": {"is_output_quantized": "True"},
        "params": {"is_quantized": "True", "is_symmetric": "False"},
        "strict_symmetric": "False",
        "per_channel_quantization": "False",
    },
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {},
    "supergroups": [
        {"op_list": ["Conv", "Relu"]},
        {"op_list": ["Conv", "Clip"]},
        {"op_list": ["Gemm", "Relu"]},
        {"op_list": ["MatMul", "Add"]},
    ],
    "model_input": {"is_input_quantized": "True"},
    "model_output": {},
}


def _with_scale(path: Path) -> dict:
    """A ``-qo`` file given by min/max, with the scale and offset AIMET's reader wants."""
    enc = json.loads(path.read_text())
    for kind in ("activation_encodings", "param_encodings"):
        for entries in enc.get(kind, {}).values():
            for e in entries:
                if "scale" not in e:
                    e["scale"] = (e["max"] - e["min"]) / (2 ** e["bitwidth"] - 1)
                    e["offset"] = round(e["min"] / e["scale"]) if e["scale"] else 0
    return enc


def _plain(name: str) -> str:
    """A sim tensor's float model name (AIMET suffixes the tensors its quantizers write)."""
    for suffix in ("_updated", "_qdq"):
        name = name.removesuffix(suffix)
    return name
