"""One fix candidate, measured on the backend: quantize, one QNN session, N plain runs.

:func:`measure` runs in an executor's worker process (:mod:`accdbg.core.executors`), so a
native crash of QNN is a result, not the end of the search. It quantizes the candidate's
float model with the engine's own pipeline (:func:`~accdbg.engines.pipeline.quantize_prepared`,
the same calibration and options as ``--inference_engine``), runs only the graph
outputs (no debug dump) over every ``-l`` line, and compares them with the float outputs.
The QNN graph JSON says whether the change *landed*: the datatype and encoding QNN holds for
each tensor the candidate changed.
"""

from __future__ import annotations

import math
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.algorithms.diagnosis.sensitivity import exposing
from accdbg.algorithms.fixes.candidates import ENCODING_OF
from accdbg.core import onnx_model as om
from accdbg.engines.base import EngineOptions
from accdbg.engines.options import QuantOptions
from accdbg.errors import AccdbgError
from accdbg.verifiers import channels

# QNN data type codes' class byte: 0x04 ufixed, 0x03 sfixed (low byte: bits in hex digits)
FIXED_CLASSES = (3, 4)


@dataclass
class Spec:
    """Everything a child needs to measure one candidate (picklable, paths as text)."""

    key: str
    float_model: str
    out_dir: str
    feeds: list  # per inference: name -> (path, dims, dtype name)
    reference: str  # .npz of the float outputs, o{i}_{j}: input i, output j
    options: EngineOptions
    quant: QuantOptions = field(default_factory=QuantOptions)
    overrides: dict = field(default_factory=dict)  # TensorQuantOverrides, JSON form
    # (what, tensor): what in act16|w16|w8|per_channel|"encoding of <layer>"
    landed: list = field(default_factory=list)
    judged: list = field(default_factory=list)  # the float tensors the outputs are judged at
    # a QDQ model already made (the run's own; a region of it in float): measured as it is
    model: str = ""


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """The whole output's SQNR in dB (the verifiers' convention: inf when exact)."""
    ref = ref.astype(np.float64).ravel()
    err = out.astype(np.float64).ravel() - ref
    return float(channels.sqnr_db(np.dot(ref, ref), np.dot(err, err)))


def cosine(ref: np.ndarray, out: np.ndarray) -> float:
    a, b = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def is_classifier(ref: np.ndarray) -> bool:
    """A [1, K] or [K] score vector (K > 1): its arg-max is the prediction."""
    shape = [d for d in ref.shape if d != 1]
    return len(shape) == 1 and shape[0] > 1


def judged_outputs(refs: list[list[np.ndarray]]) -> list[int]:
    """The outputs a candidate is scored on: those of ``POLICY.few_values`` values or more over the
    inputs, when there are any. One of a few values (a presence or handedness logit, one per
    input) is a few signed numbers, not a signal with noise: its SQNR swings with any rounding,
    and a search judged on the worst output would chase it (the ranking and the fault zoo's
    harm gate leave it aside likewise)."""
    sizes = np.sum([[np.asarray(r).size for r in ref_i] for ref_i in refs], axis=0)
    many = [j for j, n in enumerate(np.atleast_1d(sizes)) if n >= POLICY.few_values]
    return many or list(range(len(refs[0]) if refs else 0))


def output_scores(refs: list[list[np.ndarray]], outs: list[list[np.ndarray]]) -> dict[str, Any]:
    """SQNR and cosine over every input (mean and worst) of the outputs judged
    (:func:`judged_outputs`), classifier top-1 agreement, and the noise-to-signal power (the
    quantity 'gap closed' is measured on)."""
    sq, cos, nsr, top = [], [], [], []
    judged = judged_outputs(refs)
    for ref_i, out_i in zip(refs, outs, strict=True):
        # one number per input: the worst judged output of that input
        s_in = [sqnr_db(ref_i[j], out_i[j]) for j in judged]
        c_in = [cosine(ref_i[j], out_i[j]) for j in judged]
        sq.append(min(s_in))
        cos.append(min(c_in))
        nsr.append(max(10 ** (-s / 10) if math.isfinite(s) else 0.0 for s in s_in))
        for r, o in zip(ref_i, out_i, strict=True):
            if is_classifier(r):
                top.append(float(np.argmax(r) == np.argmax(o)))
    mean_nsr = float(np.mean(nsr))
    return {
        "SQNR mean": -10 * math.log10(mean_nsr) if mean_nsr > 0 else math.inf,
        "SQNR worst": float(min(sq)),
        "cosine mean": float(np.mean(cos)),
        "cosine worst": float(min(cos)),
        "top-1 agreement": float(np.mean(top)) if top else math.nan,
        "nsr": mean_nsr,
        "SQNR inputs": [float(x) for x in sq],  # per input (a change is judged input by input)
    }


def graph_facts(model_net: dict, landed: list, qdq: onnx.ModelProto) -> dict[str, Any]:
    """16-bit activation tensors and Convert ops QNN holds, and whether each change landed."""
    from accdbg.encodings.qnn_json import datatype_bits

    tensors = model_net.get("graph", {}).get("tensors", {})
    nodes = model_net.get("graph", {}).get("nodes", {})
    n16 = 0
    for t in tensors.values():
        code = t.get("data_type")
        if not isinstance(code, int) or t.get("type") == 4:  # 4: static (a parameter)
            continue
        cls, bits, _ = datatype_bits(code)
        if cls in ("ufixed", "sfixed") and bits == 16:
            n16 += 1
    converts = sum(
        1 for n in nodes.values() if str(n.get("type", "")).lower() in ("convert", "cast_convert")
    )
    checks = [_landed(what, name, tensors, qdq) for what, name in landed]
    return {"16-bit tensors": n16, "Convert ops": converts, "landed": checks}


def _qnn_tensor(name: str, tensors: dict) -> tuple[str, dict] | None:
    """The QNN tensor carrying float tensor ``name`` (the EP names it after the Q/DQ nodes)."""
    for cand in (
        name,
        f"{name}_QuantizeLinear_Output",
        f"{name}_quantized",
        f"{name}_DequantizeLinear_Output",
    ):
        if cand in tensors:
            return cand, tensors[cand]
    hits = [k for k in tensors if k.startswith(name + "_") and "QuantizeLinear" in k]
    return (hits[0], tensors[hits[0]]) if hits else None


# the encoding onnxruntime-qnn gives an int4 per-channel weight (its JSON dump: sfixed 8 storage,
# the bitwidth in the encoding); 8-bit weights are 0 (per tensor) or 1 (per channel)
QNN_BW_AXIS_SCALE_OFFSET = 3


def _landed(what: str, name: str, tensors: dict, qdq: onnx.ModelProto) -> dict[str, Any]:
    from accdbg.encodings.qnn_json import datatype_bits, datatype_name

    found = _qnn_tensor(name, tensors)
    if found is None:
        return {"what": what, "tensor": name, "ok": False, "qnn": "not in the QNN graph"}
    qname, t = found
    code = t.get("data_type")
    cls, bits, _ = datatype_bits(code) if isinstance(code, int) else ("?", 0, False)
    enc = (t.get("quant_params") or {}).get("encoding")
    if what in ("act16", "w16"):
        ok = bits == 16 and cls in ("ufixed", "sfixed")
    elif what == "w8":  # int4 shows as sfixed 8 with a bitwidth encoding: not that one
        ok = bits == 8 and cls in ("ufixed", "sfixed") and enc != QNN_BW_AXIS_SCALE_OFFSET
    elif what == "per_channel":
        ok = enc in (1, 3)  # QNN_QUANTIZATION_ENCODING_(BW_)AXIS_SCALE_OFFSET
    elif what.startswith(ENCODING_OF):  # the tensor holds that layer's scale and offset
        other = _qnn_tensor(what[len(ENCODING_OF) :], tensors)
        ok = other is not None and _scale_offset(t) == _scale_offset(other[1]) != (None, None)
    else:
        ok = False
    return {
        "what": what,
        "tensor": name,
        "ok": bool(ok),
        "qnn": f"{qname}: {datatype_name(code)}, encoding {enc}",
    }


def _scale_offset(tensor: dict) -> tuple[float | None, int | None]:
    so = (tensor.get("quant_params") or {}).get("scale_offset") or {}
    scale = so.get("scale")
    return (None if scale is None else round(float(scale), 9)), so.get("offset")


def float_outputs(model: onnx.ModelProto, names: list[str], feeds: list) -> list[list[np.ndarray]]:
    """The float model's tensors ``names`` - its outputs as judged
    (:func:`~accdbg.algorithms.diagnosis.sensitivity.scores`: a Softmax/Sigmoid output at its logits) -
    on onnxruntime's CPU for every feed (the reference)."""
    import onnxruntime as ort

    from accdbg.engines.source import load_feed

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(
        om.with_outputs(model, names).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return [list(sess.run(names, load_feed(f))) for f in feeds]


def judged_model(qdq: onnx.ModelProto, qdq_path: Path, judged: list[str]) -> tuple[Path, list[str]]:
    """The candidate's QDQ model with the float tensors ``judged`` exposed, dequantized (a
    Softmax/Sigmoid output's logits, as the ranking judges them: a saturated score hides what
    a fix does), and their names there; the model itself when they are outputs."""
    model, names = exposing(qdq, judged)
    if model is qdq:
        return qdq_path, names
    path = qdq_path.with_name(f"{qdq_path.stem}.judged.onnx")
    onnx.save(model, str(path))
    return path, names


def save_reference(path: Path, outs: list[list[np.ndarray]]) -> None:
    np.savez(path, **{f"o{i}_{j}": a for i, row in enumerate(outs) for j, a in enumerate(row)})


def load_reference(path: str, n_inputs: int) -> list[list[np.ndarray]]:
    with np.load(path) as data:
        return [
            [data[f"o{i}_{j}"] for j in range(sum(k.startswith(f"o{i}_") for k in data.files))]
            for i in range(n_inputs)
        ]


def _save_activation_encodings(qdq_path: Path, out: Path) -> None:
    """Each activation's encoding, so a change that moved none of them can be told."""
    import json

    from accdbg.encodings.model import PARAM
    from accdbg.encodings.qdq import qdq_encodings

    try:
        encs = qdq_encodings(qdq_path)
    except AccdbgError:
        return
    doc = {
        n: [[float(x) for x in e.scale], [int(o) for o in e.offset], e.bitwidth]
        for n, e in encs.items()
        if e.kind != PARAM
    }
    out.write_text(json.dumps(doc), encoding="utf-8")


def activation_changes(a: Path, b: Path) -> tuple[int, int] | None:
    """How many activation encodings differ between two candidates' folders (and of how many)."""
    import json

    try:
        x = json.loads((a / "activation_encodings.json").read_text(encoding="utf-8"))
        y = json.loads((b / "activation_encodings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return sum(1 for k in y if x.get(k) != y[k]), len(y)


def measure_many(specs: list[Spec]) -> list[dict[str, Any]]:
    """The candidates of one work item, in turn (the search sends one per item, so a native
    crash is its candidate's; the worker process is replaced and the item retried once)."""
    return [measure(s) for s in specs]


def measure(spec: Spec) -> dict[str, Any]:
    """Quantize, run on QNN, score. Never raises for a candidate QNN refuses: the refusal and
    QNN's reason are the result."""
    from accdbg.engines.artifacts import merge_qnn_json
    from accdbg.engines.pipeline import Calibration, quantize_prepared
    from accdbg.engines.worker import Job, JobReport, checked_run, checked_session

    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"key": spec.key, "status": "ok", "reason": ""}
    try:
        if spec.model:  # made already: measured as it is
            qdq_path = out / "candidate.qdq.onnx"
            if Path(spec.model) != qdq_path:
                shutil.copyfile(spec.model, qdq_path)
        else:
            # the pipeline quantizes a private copy in out/.quantize: the candidates
            # quantizing the same float model at once share no scratch file
            qdq_path = quantize_prepared(
                Path(spec.float_model),
                "candidate",
                Calibration.from_feeds(spec.feeds),
                spec.quant,
                out,
                spec.overrides,
                out / ".quantize",
            ).path
    except AccdbgError as exc:
        return {**rec, "status": "quantization failed", "reason": str(exc)}
    except Exception as exc:  # onnxruntime's quantizer refusing the overrides
        return {
            **rec,
            "status": "quantization failed",
            "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "trace": traceback.format_exc(limit=3),
        }
    rec["quantize s"] = time.perf_counter() - t0
    _save_activation_encodings(qdq_path, out / "activation_encodings.json")
    json_dir = out / "qnn_json"
    options = EngineOptions(**{**spec.options.__dict__, "json_graph_dir": str(json_dir)})
    job = Job(
        engine="qnn",
        options=options,
        model_path=str(qdq_path),
        exposed=[],
        feeds=spec.feeds,
        output_root=str(out),
        native_log=str(out / "backend_log.txt"),
    )
    report = JobReport()
    qdq = onnx.load(str(qdq_path), load_external_data=False)
    judged_path, names = judged_model(qdq, qdq_path, spec.judged)
    t1 = time.perf_counter()
    try:
        sess = checked_session(job, str(judged_path), options, "session creation", report)
        outs = []
        for feed in spec.feeds:
            values = checked_run(sess, names, feed, job, report)
            outs.append([values[n] for n in names])
        del sess
    except AccdbgError as exc:
        return {**rec, "status": "refused by QNN", "reason": str(exc), "sessions": 1}
    finally:
        if judged_path != qdq_path:  # the judged copy served its session
            judged_path.unlink(missing_ok=True)
    rec["qnn s"] = time.perf_counter() - t1
    rec["sessions"] = report.sessions
    rec["cpu nodes"] = len(
        [n for n in report.cpu_reasons if n["type"] not in ("QuantizeLinear", "DequantizeLinear")]
    )
    if rec["cpu nodes"]:
        rec["cpu reasons"] = "; ".join(
            f"{r['name']} ({r['type']}): {r.get('reason', '')}" for r in report.cpu_reasons[:5]
        )
    refs = load_reference(spec.reference, len(spec.feeds))
    rec.update(output_scores(refs, outs))
    net = merge_qnn_json(json_dir, out / "model_net.json", qdq_path) if json_dir.exists() else None
    if net is not None:
        import json

        rec.update(graph_facts(json.loads(net.read_text(encoding="utf-8")), spec.landed, qdq))
    else:
        rec.update({"16-bit tensors": math.nan, "Convert ops": math.nan, "landed": []})
    rec["seconds"] = time.perf_counter() - t0
    return rec
