"""The quantizer settings the checker compares, each quantized by the inference engine's own
pipeline, so what is checked is what the engine would deploy.

A variant is one ``--act_quantizer``/``--param_quantizer`` value (the same for both, as in
Qualcomm's quantization checker) with or without ``--per_channel_quantization``. The float
model is pre-processed once (:func:`~accdbg.engines.prepare.prepare_float_model`, as the
engine's source stage does) and quantized once per variant with
:func:`~accdbg.engines.quantize.quantize_for_qnn`, calibrated on every feed. onnxruntime takes
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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accdbg.encodings.model import Encoding
from accdbg.encodings.qdq import qdq_encodings
from accdbg.engines.quantize import ACT_CALIBRATION, QUANTIZERS, FeedsReader, quantize_for_qnn
from accdbg.engines.source import Feeds
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


class _ToLog(logging.Filter):
    """onnxruntime's quantizer warns on the root logger (e.g. per-channel axes it skips):
    those records go to the run's log, not the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("onnxruntime: %s", record.getMessage())
        return False


@contextlib.contextmanager
def _root_records_to_log():
    f = _ToLog()
    root = logging.getLogger()
    root.addFilter(f)
    try:
        yield
    finally:
        root.removeFilter(f)


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
    feeds: Feeds,
    dims: dict[str, tuple[int, ...]],
    dtypes: dict[str, np.dtype],
    out_dir: Path,
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    overrides: dict | None = None,
) -> tuple[dict[Variant, dict[str, Encoding]], dict[Variant, Path], list[str]]:
    """Quantize the prepared model once per variant into ``out_dir/<variant>.qdq.onnx``;
    returns each variant's encodings (by float tensor name), model paths and the steps taken."""
    reader = FeedsReader([{n: Path(p) for n, (p, _, _) in f.items()} for f in feeds], dims, dtypes)
    encodings: dict[Variant, dict[str, Encoding]] = {}
    paths: dict[Variant, Path] = {}
    steps: list[str] = []
    for v in variants:
        target = out_dir / f"{v.name}.qdq.onnx"
        t = time.perf_counter()
        notes: list[str] = []
        chatter = io.StringIO()  # onnxruntime's calibrators print(); that goes to the log
        with contextlib.redirect_stdout(chatter), _root_records_to_log():
            quantize_for_qnn(
                prepared,
                target,
                reader,
                act_bitwidth,
                weights_bitwidth,
                bias_bitwidth,
                v.quantizer,
                v.quantizer,
                v.per_channel,
                overrides,
                notes=notes,
            )
        if chatter.getvalue().strip():
            log.debug("%s quantizer output:\n%s", v.name, chatter.getvalue().rstrip())
        encodings[v] = qdq_encodings(target)
        paths[v] = target
        steps += notes
        steps.append(
            f"{v.name}: quantized (A{act_bitwidth}W{weights_bitwidth}, {v.describe()}) "
            f"with {len(feeds)} calibration input(s) in {time.perf_counter() - t:.1f} s"
        )
        log.info("%s", steps[-1])
    return encodings, paths, steps
