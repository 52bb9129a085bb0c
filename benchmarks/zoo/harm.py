"""What a planting costs the quantized model's outputs on QNN HTP, measured before a case is kept.

A planted change the deployed model does not feel is no fault of it: for its outputs the
faulted model *is* the clean model, and the right answer on it is the clean model's ("no
single layer stands out"). Counting it as a fault to be named would ask the ranking to name
what it must not name on clean models. So a planting is kept only when it costs the watched
outputs (logits for a softmax/sigmoid output) at least :data:`HARM_DB` of SQNR on the
debugged input, against the model without it, both run on QNN HTP exactly as the engine
quantizes them (accdbg's own pre-processing and calibration on the ``-l`` lines). A weaker
planting is made stronger, then moved to the next eligible site at the same depth
(:func:`benchmarks.zoo.plant.plant`); one that never hurts is left out and listed.

Each measure is one quantization and one plain QNN session (no tensor dumps): about 4 s on
det 160x160, cached by the planted model's bytes in ``<out>/models/<model>/harm.json``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import onnx

from benchmarks.zoo import models as zoo_models
from benchmarks.zoo.probe import load_feeds, run
from benchmarks.zoo.scoring import sqnr_db


def fingerprint(model: onnx.ModelProto, overrides: dict | None) -> str:
    """The planted model and its ``-qo`` encodings: what a cached result must match."""
    digest = hashlib.sha1(model.SerializeToString())
    digest.update(json.dumps(overrides, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def watched_outputs(model: onnx.ModelProto) -> list[str]:
    """The model outputs judged for harm; a Softmax/Sigmoid output is replaced by its input
    (the logits): a saturating output hides what happened to the scores."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for o in model.graph.output:
        t = o.name
        n = producer.get(t)
        while n is not None and n.op_type in ("Reshape", "Identity", "Flatten", "Squeeze"):
            t = n.input[0]
            n = producer.get(t)
        out.append(n.input[0] if n is not None and n.op_type in ("Softmax", "Sigmoid") else o.name)
    return out


class HarmMeter:
    """The QNN output SQNR of plantings of one model, and what each costs against the clean one."""

    def __init__(self, prep: zoo_models.Prepared, cache_dir: Path):
        self.prep = prep
        self.cache = cache_dir / "harm.json"
        self.known: dict[str, float] = (
            json.loads(self.cache.read_text()) if self.cache.is_file() else {}
        )
        self._clean: float | None = None

    def loss(self, model: onnx.ModelProto, overrides: dict | None = None) -> float:
        """dB of SQNR the planting costs the worst watched output on the debugged input."""
        if self._clean is None:
            self._clean = self.sqnr(self.prep.model)
        return self._clean - self.sqnr(model, overrides)

    def sqnr(self, model: onnx.ModelProto, overrides: dict | None = None) -> float:
        key = fingerprint(model, overrides)
        if key not in self.known:
            self.known[key] = _qnn_sqnr(self.prep, model, overrides)
            self.cache.write_text(json.dumps(self.known, indent=1))
        return float(self.known[key])

    def backend_gap(self) -> float:
        """dB the clean model's watched outputs lose on QNN HTP against onnxruntime's CPU
        fake-quant of the same QDQ model: a clean model whose outputs lose ``HARM_DB`` or more
        has a backend divergence of its own, which a ranking may rightly name."""
        key = "backend_gap:" + fingerprint(self.prep.model, None)
        if key not in self.known:
            self.known[key] = _qnn_sqnr(self.prep, self.prep.model, None, against_cpu=True)
            self.cache.write_text(json.dumps(self.known, indent=1))
        return float(self.known[key])


def _qnn_sqnr(
    prep: zoo_models.Prepared,
    model: onnx.ModelProto,
    overrides: dict | None,
    against_cpu: bool = False,
) -> float:
    """Quantize as the engine does, run once on QNN HTP; the worst watched output's SQNR against
    the same pre-processed float model on onnxruntime's CPU. ``against_cpu``: instead, the CPU
    fake-quant's SQNR minus QNN's, at the output where QNN loses the most."""
    from accdbg.engines.base import get_engine
    from accdbg.engines.options import EngineConfig
    from accdbg.engines.pipeline import Calibration, prepare_model

    spec = prep.spec
    first = [zoo_models.debugged_input(spec, prep.input_paths[0])]
    feed = load_feeds(prep.input_paths[:1], spec.input_name, spec.dims)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        keywords = {}
        if overrides:
            (d / "overrides.encodings").write_text(json.dumps(overrides))
            keywords["quantization_overrides"] = str(d / "overrides.encodings")
        config = EngineConfig.from_keywords(**keywords)
        cal = Calibration.from_inputs(model, prep.input_list, first)
        prepared = prepare_model(model, "m", cal, config, d / "engine")
        watched = watched_outputs(model)
        float_model = onnx.load(str(prepared.float_model))
        produced = {o for n in float_model.graph.node for o in n.output}
        if not produced.issuperset(watched):  # the pre-processing fused the logits away
            watched = watched_outputs(float_model)
        golden = run(float_model, feed, watched)[0]
        qdq = onnx.load(str(prepared.path))
        have = {o.name for o in qdq.graph.output}
        qdq.graph.output.extend(onnx.ValueInfoProto(name=w) for w in watched if w not in have)
        session = get_engine("qnn").create_session(qdq.SerializeToString(), config.engine_options())
        got = session.run(watched, feed[0])
        qnn = {w: sqnr_db(golden[w], v) for w, v in zip(watched, got, strict=True)}
        if not against_cpu:
            return min(qnn.values())
        cpu = run(qdq, feed, watched)[0]  # every Q/DQ as written
        return max(sqnr_db(golden[w], cpu[w]) - qnn[w] for w in watched)
