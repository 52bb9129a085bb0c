"""What a planting costs the quantized model's outputs on QNN HTP, measured before a case is kept.

A planted change the deployed model does not feel is no fault of it: for its outputs the
faulted model *is* the clean model, and the right answer on it is the clean model's ("no
single layer stands out"). Counting it as a fault to be named would ask the ranking to name
what it must not name on clean models. So a planting is kept only when it costs the watched
outputs at least :data:`HARM_DB` of SQNR on the debugged input, against the model without it,
both run on QNN HTP exactly as the engine quantizes them (accdbg's own pre-processing and
calibration on the ``-l`` lines). The watched outputs are the model's, a Softmax/Sigmoid output
at its logits, judged as the ranking judges them: one of fewer than ``POLICY.few_values`` values over
the input list (a presence score, a handedness logit) only when no other is watched - the error
of one number is a signed amount, not a noise power - and not one the clean quantized model
already destroys (under 0 dB), which moves by chance, many dB either way, with any change
upstream. A weaker planting is made stronger, then moved to the next eligible site at the same
depth (:func:`benchmarks.zoo.plant.plant`); one that never hurts is left out and listed.

Each measure is one quantization and one plain QNN session (no tensor dumps): about 4 s on
det 160x160, cached by the planted model's bytes in ``<out>/models/<model>/harm_v2.json``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx

from accdbg.algorithms.diagnosis.policy import POLICY
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


def judged_outputs(golden: dict[str, np.ndarray], inputs: int = 1) -> list[str]:
    """The watched outputs harm is judged on: those of ``POLICY.few_values`` values or more over the
    ``inputs`` the ranking pools (the input list's lines), else all. One number's error is a
    signed amount: a planting can move a one-value logit by chance while the outputs of many
    values, where the ranking looks, do not feel it."""
    many = [w for w, g in golden.items() if np.asarray(g).size * inputs >= POLICY.few_values]
    return many or list(golden)


def carrying(clean: dict[str, float]) -> list[str]:
    """Of the judged outputs (their clean SQNRs), those the clean quantized model keeps above
    0 dB, else all. An output quantization already destroys (more error than signal) moves by
    chance with any change upstream, by many dB either way: it cannot say what a planting
    costs."""
    return [w for w, db in clean.items() if db > 0] or list(clean)


class HarmMeter:
    """The QNN output SQNR of plantings of one model, and what each costs against the clean one."""

    def __init__(self, prep: zoo_models.Prepared, cache_dir: Path):
        self.prep = prep
        # v2: per output; outputs of a few values, or destroyed in the clean model, left out
        self.cache = cache_dir / "harm_v2.json"
        self.known: dict[str, dict[str, float]] = (
            json.loads(self.cache.read_text()) if self.cache.is_file() else {}
        )

    @cached_property
    def _clean(self) -> tuple[list[str], float]:
        """The outputs judged (:func:`carrying`) and the worst one's SQNR, of the clean model."""
        clean = self.sqnrs(self.prep.model)
        judged = carrying(clean)
        return judged, min(clean[w] for w in judged)

    def loss(self, model: onnx.ModelProto, overrides: dict | None = None) -> float:
        """dB of SQNR the planting costs the worst judged output on the debugged input."""
        judged, clean = self._clean
        planted = self.sqnrs(model, overrides)
        return clean - min(planted[w] for w in judged)

    def sqnrs(self, model: onnx.ModelProto, overrides: dict | None = None) -> dict[str, float]:
        return self._known(fingerprint(model, overrides), model, overrides, False)

    def backend_gap(self) -> float:
        """dB the clean model's judged outputs lose on QNN HTP against onnxruntime's CPU
        fake-quant of the same QDQ model, on the input of the input list where they lose most
        (the verdict is about the worst of them): a clean model whose outputs lose ``HARM_DB``
        or more has a backend divergence of its own, which a ranking may rightly name."""
        key = "backend_gap_worst:" + fingerprint(self.prep.model, None)
        gaps = self._known(key, self.prep.model, None, True)
        return max(gaps[w] for w in self._clean[0])

    def _known(self, key: str, model, overrides, against_cpu: bool) -> dict[str, float]:
        if key not in self.known:
            self.known[key] = _qnn_sqnrs(self.prep, model, overrides, against_cpu)
            self.cache.write_text(json.dumps(self.known, indent=1))
        return {w: float(v) for w, v in self.known[key].items()}


def _qnn_sqnrs(
    prep: zoo_models.Prepared,
    model: onnx.ModelProto,
    overrides: dict | None,
    against_cpu: bool = False,
) -> dict[str, float]:
    """Quantize as the engine does, run once on QNN HTP; each judged output's SQNR against the
    same pre-processed float model on onnxruntime's CPU, on the debugged input.
    ``against_cpu``: instead, the CPU fake-quant's SQNR minus QNN's, the largest over every
    line of the input list."""
    from accdbg.engines.base import get_engine
    from accdbg.engines.options import EngineConfig
    from accdbg.engines.pipeline import Calibration, prepare_model

    spec = prep.spec
    first = [zoo_models.debugged_input(spec, prep.input_paths[0])]
    lines = prep.input_paths if against_cpu else prep.input_paths[:1]
    feed = load_feeds(lines, spec.input_name, spec.dims)
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
        golden = run(float_model, feed, watched)
        qdq = onnx.load(str(prepared.path))
        have = {o.name for o in qdq.graph.output}
        qdq.graph.output.extend(onnx.ValueInfoProto(name=w) for w in watched if w not in have)
        session = get_engine("qnn").create_session(qdq.SerializeToString(), config.engine_options())
        qnn = [
            {w: sqnr_db(g[w], v) for w, v in zip(watched, session.run(watched, f), strict=True)}
            for g, f in zip(golden, feed, strict=True)
        ]
        judged = judged_outputs({w: golden[0][w] for w in watched}, len(prep.input_paths))
        if not against_cpu:
            return {w: qnn[0][w] for w in judged}
        cpu = run(qdq, feed, watched)  # every Q/DQ as written
        return {
            w: max(sqnr_db(g[w], c[w]) - q[w] for g, c, q in zip(golden, cpu, qnn, strict=True))
            for w in judged
        }
