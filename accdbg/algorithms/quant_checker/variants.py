"""The quantizer settings the checker compares, each quantized by the inference engine's own
pipeline, so what is checked is what the engine would deploy.

A variant is one ``--act_quantizer``/``--param_quantizer`` value (the same for both, as in
Qualcomm's quantization checker) with or without ``--per_channel_quantization``. The float
model is pre-processed once (:func:`~accdbg.engines.pipeline.prepare_float`, the engine's
source stage) and quantized once per variant with
:func:`~accdbg.engines.pipeline.quantize_prepared`, calibrated on every feed. onnxruntime takes
weight ranges from min/max whatever the quantizer, so ``tf``, ``enhanced`` and ``adjusted``
share their weight encodings (their activation encodings differ); ``symmetric`` makes both
symmetric. Cross-layer equalization is not a variant: onnxruntime's quantizer has none (the
engine refuses ``--algorithms cle`` for the same reason), and an equalization written here
would not be what the engine deploys.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from accdbg.core.progress import progress
from accdbg.encodings.model import Encoding
from accdbg.encodings.qdq import qdq_encodings
from accdbg.engines.options import QuantOptions
from accdbg.engines.pipeline import Calibration, quantize_prepared
from accdbg.engines.quantize import ACT_CALIBRATION, QUANTIZERS, root_records_to_log
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.quant_checker")

PER_CHANNEL_CHOICES = ("both", "off", "on")


@dataclass(frozen=True)
class Variant:
    quantizer: str
    per_channel: bool

    @property
    def name(self) -> str:
        """Label and file stem: ``tf``, ``tf-pc`` ..."""
        return f"{self.quantizer}{'-pc' if self.per_channel else ''}"

    def describe(self) -> str:
        calib = ACT_CALIBRATION[self.quantizer].name
        act = f"{calib}{' symmetric' if self.quantizer == 'symmetric' else ''}"
        if self.per_channel:  # onnxruntime quantizes per-channel weights symmetrically
            return f"activations {act}; weights symmetric min/max, per-channel"
        sym = "symmetric" if self.quantizer == "symmetric" else "asymmetric"
        return f"activations {act}; weights {sym} min/max, per-tensor"

    def quant(self, base: QuantOptions) -> QuantOptions:
        """``base`` (bitwidths, ``-qo``) with this variant's quantizers and per-channel flag."""
        return replace(
            base,
            act_quantizer=self.quantizer,
            param_quantizer=self.quantizer,
            per_channel=self.per_channel,
        )


def parse_variants(quantizers: str | Sequence[str], per_channel: str = "both") -> list[Variant]:
    """``"tf,symmetric"`` x ``both|off|on`` -> variants, checked (one-line errors)."""
    names = (
        [q.strip() for q in quantizers.split(",")]
        if isinstance(quantizers, str)
        else [str(q).strip() for q in quantizers]
    )
    names = [q for q in names if q]
    if not names:
        raise AccdbgError(f"--quantizers: give at least one of {', '.join(QUANTIZERS)}")
    for q in names:
        if q not in QUANTIZERS:
            raise AccdbgError(
                f"--quantizers {q!r} is not known; expected a comma-separated list of: {', '.join(QUANTIZERS)}"
            )
    if per_channel not in PER_CHANNEL_CHOICES:
        raise AccdbgError(
            f"--per_channel_variants {per_channel!r} is not one of {', '.join(PER_CHANNEL_CHOICES)}"
        )
    flags = {"both": (False, True), "off": (False,), "on": (True,)}[per_channel]
    return [Variant(q, pc) for q in dict.fromkeys(names) for pc in flags]


def quantize_variants(
    prepared: Path,
    variants: Sequence[Variant],
    calibration: Calibration,
    out_dir: Path,
    base: QuantOptions,
) -> tuple[dict[Variant, dict[str, Encoding]], dict[Variant, Path], list[str]]:
    """Quantize the prepared model once per variant (``base`` with the variant's quantizers)
    into ``out_dir/<variant>.qdq.onnx``; returns each variant's encodings (by float tensor
    name), model paths and the steps taken."""
    encodings: dict[Variant, dict[str, Encoding]] = {}
    paths: dict[Variant, Path] = {}
    steps: list[str] = []
    for v in progress(variants, "quant checker: variants", unit="variants", line=False):
        chatter = io.StringIO()  # onnxruntime's calibrators print(); that goes to the log
        with contextlib.redirect_stdout(chatter), root_records_to_log():
            done = quantize_prepared(prepared, v.name, calibration, v.quant(base), out_dir)
        if chatter.getvalue().strip():
            log.debug("%s quantizer output:\n%s", v.name, chatter.getvalue().rstrip())
        encodings[v] = qdq_encodings(done.path)
        paths[v] = done.path
        steps += done.steps[:-1]  # the quantizer's notes, then what was done
        steps.append(f"{v.name}: {done.steps[-1]} ({v.describe()})")
        log.info("%s", steps[-1])
    return encodings, paths, steps
