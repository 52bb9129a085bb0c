"""Source stage: quantize a float model for QNN with onnxruntime's QNN QDQ tooling.

How the reference's quantizer flags map onto ``onnxruntime.quantization``:

=====================  ==========================================================
``--act_quantizer``    activation calibration
=====================  ==========================================================
``tf``                 ``CalibrationMethod.MinMax`` (plain min/max, asymmetric)
``enhanced``           ``CalibrationMethod.Entropy`` (range chosen to minimise the
                       information lost, the closest onnxruntime has to TF-enhanced's
                       noise-minimising search)
``adjusted``           ``CalibrationMethod.Percentile`` (99.999th percentile: outliers
                       clipped, like TF-adjusted's shrunken range)
``symmetric``          ``CalibrationMethod.MinMax`` with symmetric activations
=====================  ==========================================================

``--param_quantizer``: weights always take their min/max in onnxruntime; ``symmetric``
makes them symmetric, ``tf`` asymmetric; ``enhanced``/``adjusted`` fall back to min/max
(logged). Bitwidths: ``-abw 8|16`` -> uint8/uint16 activations, ``-wbw 8|16`` -> uint8/uint16
weights (int8/int16 when symmetric; ``-wbw 4``: per-channel int4 on Conv 1x1, Gemm and MatMul,
8-bit elsewhere, :mod:`accdbg.engines.int4`), ``-bbw 32`` -> int32 bias (the only bias QNN's QDQ path
takes; ``-bbw 8`` is refused with that reason).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantType, quantize

from accdbg.core.imports import qnn_quantization
from accdbg.core.inputs import count_nonfinite
from accdbg.engines.int4 import int4_plan
from accdbg.engines.integrity import check_wiring, own_biases
from accdbg.engines.source import load_feed
from accdbg.engines.static_inputs import (
    constant_inputs_to_keep,
    name_unnamed_nodes,
    restore_constants,
)
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")

ACT_CALIBRATION = {
    "tf": CalibrationMethod.MinMax,
    "enhanced": CalibrationMethod.Entropy,
    "adjusted": CalibrationMethod.Percentile,
    "symmetric": CalibrationMethod.MinMax,
}
QUANTIZERS = tuple(ACT_CALIBRATION)


class FeedsReader(CalibrationDataReader):
    """Calibration data: one feed per input-list line (:data:`~accdbg.engines.source.Feeds`),
    loaded lazily, as the engine feeds it (:func:`~accdbg.engines.source.load_feed`)."""

    def __init__(self, feeds: Sequence[dict[str, tuple]]):
        self.feeds = list(feeds)
        self._it = iter(self.feeds)
        self.served = 0  # inputs handed out since the last rewind: the calibration's progress

    def get_next(self):
        item = next(self._it, None)
        if item is None:
            return None
        self.served += 1
        return load_feed(item)

    def rewind(self):
        self._it = iter(self.feeds)
        self.served = 0

    def __len__(self) -> int:
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Only these lines next (onnxruntime's strided min/max calibration)."""
        self._it = iter(self.feeds[start_index:end_index])

    def nonfinite_note(self) -> str:
        """Why calibration may have failed: the first input file holding NaN or Inf."""
        for item in self.feeds:
            for p, _, _, stored in item.values():
                nan, inf, _ = count_nonfinite(p, np.dtype(stored))
                if nan or inf:
                    return f" (calibration input {str(p)!r} holds {nan} NaN and {inf} Inf value(s))"
        return ""


class _ToLog(logging.Filter):
    """onnxruntime's quantizer and pre-processing warn on the root logger (advice to
    pre-process, which accdbg did; a node named for it; a per-channel axis skipped; a tensor
    with no known type, left float): each record goes to accdbg's log at debug level (the
    run's log, the console with ``-v``), not to the console as a bare ``WARNING:root:`` line."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("onnxruntime: %s", record.getMessage())
        return False


@contextmanager
def root_records_to_log():
    """While onnxruntime quantizes or pre-processes: its root-logger records to the log."""
    f = _ToLog()
    root = logging.getLogger()
    root.addFilter(f)
    try:
        yield
    finally:
        root.removeFilter(f)


def quant_type(
    bits: int, symmetric: bool, what: str, allowed: tuple[int, ...] = (8, 16)
) -> QuantType:
    """The storage type of ``bits`` (``allowed``: what the flag takes; 4 for weights only, which
    are int4 on the layers HTP runs so and 8-bit elsewhere: :mod:`accdbg.engines.int4`)."""
    table = {
        (8, False): QuantType.QUInt8,
        (16, False): QuantType.QUInt16,
        (8, True): QuantType.QInt8,
        (16, True): QuantType.QInt16,
    }
    if bits not in allowed:
        expected = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise AccdbgError(f"{what} {bits} is not supported; expected {expected}")
    return table[(8 if bits == 4 else bits, symmetric)]


WEIGHT_BITS = (4, 8, 16)  # -wbw: 4 means int4 where HTP runs it, 8-bit weights elsewhere


def overrides_for_ort(overrides: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict:
    """``TensorQuantOverrides`` in JSON form (``quant_type`` as a name, e.g. ``"QUInt16"``; a
    fixed ``scale`` and ``zero_point`` as numbers: what a journal or ``best_overrides.json``
    holds) in onnxruntime's form."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, entries in overrides.items():
        conv = []
        for e in entries:
            e = dict(e)
            if isinstance(e.get("quant_type"), str):
                e["quant_type"] = QuantType[e["quant_type"]]
            if "scale" in e and "zero_point" in e:  # a fixed encoding: numpy, typed as stored
                stored = e.get("quant_type", QuantType.QUInt8).tensor_type
                e["scale"] = np.array(e["scale"], np.float32)
                e["zero_point"] = np.array(
                    e["zero_point"], onnx.helper.tensor_dtype_to_np_dtype(stored)
                )
            conv.append(e)
        out[name] = conv
    return out


def check_quantizer_options(
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    act_quantizer: str = "tf",
    param_quantizer: str = "tf",
) -> None:
    """The quantizer flags, checked before any run starts."""
    if int(bias_bitwidth) != 32:
        raise AccdbgError(
            f"-bbw/--bias_bitwidth {bias_bitwidth}: onnxruntime-qnn quantizes biases to int32, the only bias "
            "form QNN's QDQ path accepts; use -bbw 32"
        )
    for flag, value in (
        ("--act_quantizer", act_quantizer),
        ("-pq/--param_quantizer", param_quantizer),
    ):
        if value not in QUANTIZERS:
            raise AccdbgError(
                f"{flag} {value!r} is not known; expected one of: {', '.join(QUANTIZERS)}"
            )
    quant_type(int(act_bitwidth), False, "-abw/--act_bitwidth")
    quant_type(
        int(weights_bitwidth),
        param_quantizer == "symmetric",
        "-wbw/--weights_bitwidth",
        WEIGHT_BITS,
    )


MAX_STRIDE = 32


def calibration_stride(lines: int) -> int:
    """How many calibration lines min/max sees at a time: the largest divisor of ``lines`` up
    to :data:`MAX_STRIDE` (onnxruntime wants equal chunks). Ranges are merged chunk by chunk,
    a minimum of minima, so the encodings are the same bytes; without it onnxruntime keeps
    every line's reduced outputs until the end and the tool's memory grows with ``-l``.
    Histogram calibrators (enhanced, adjusted) are not chunked: their bins would move."""
    return max(d for d in range(1, min(lines, MAX_STRIDE) + 1) if lines % d == 0) if lines else 1


def quantize_for_qnn(
    float_model: Path,
    out_path: Path,
    reader: FeedsReader,
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    act_quantizer: str = "tf",
    param_quantizer: str = "tf",
    per_channel: bool = False,
    overrides: dict | None = None,
    notes: list[str] | None = None,
    keep_activations: bool = False,
    weight_block_size: int | None = None,
) -> Path:
    """Write the QDQ model for QNN; returns its path. Constants kept float because QNN takes
    them only as initializers are described in ``notes`` (logged when there is no ``notes``)."""
    get_qnn_qdq_config = qnn_quantization().get_qnn_qdq_config

    check_quantizer_options(
        act_bitwidth, weights_bitwidth, bias_bitwidth, act_quantizer, param_quantizer
    )
    if param_quantizer in ("enhanced", "adjusted"):
        log.info(
            "param quantizer %r: onnxruntime takes weight ranges from min/max", param_quantizer
        )
    w_sym = param_quantizer == "symmetric"
    a_sym = act_quantizer == "symmetric"
    extra: dict[str, Any] = {}
    calib = ACT_CALIBRATION[act_quantizer]
    float_model, float_proto = _named(float_model)
    init_overrides = dict(overrides or {})
    if int(weights_bitwidth) == 4:
        plan = int4_plan(float_proto, set(init_overrides), weight_block_size)
        init_overrides = {**plan.overrides, **init_overrides}  # given encodings stay as given
        if weight_block_size:
            # blocks are opset 21's DequantizeLinear (block_size): the quantizer upgrades the
            # model to it; com.microsoft's DequantizeLinear has no blocks
            extra.update({"BlockSize": int(weight_block_size), "UseQDQContribOps": False})
        if notes is None:
            log.info("%s", plan.line(weight_block_size))
        else:
            notes.append(plan.line(weight_block_size))
    config = get_qnn_qdq_config(
        str(float_model),
        reader,
        calibrate_method=calib,
        stride=calibration_stride(len(reader)) if calib == CalibrationMethod.MinMax else None,
        activation_type=quant_type(act_bitwidth, False, "-abw/--act_bitwidth"),
        weight_type=quant_type(weights_bitwidth, w_sym, "-wbw/--weights_bitwidth", WEIGHT_BITS),
        per_channel=per_channel,
        init_overrides=init_overrides or None,
        activation_symmetric=a_sym,
        weight_symmetric=w_sym,
    )
    if calib == CalibrationMethod.Percentile:
        extra["CalibPercentile"] = 99.999
    if overrides:
        # keep the given weight scales exactly, even when the int32 bias scale gets small
        extra["QDQDisableWeightAdjustForInt32Bias"] = True
    if keep_activations:
        extra["QDQKeepRemovableActivations"] = True
    config.extra_options.update(extra)
    reader.rewind()
    try:
        # a sentinel constant (-inf) makes the quantizer divide by an infinite scale: its
        # numpy warnings say nothing the defects check does not (accdbg.encodings.defects)
        with root_records_to_log(), np.errstate(invalid="ignore", over="ignore"):
            quantize(str(float_model), str(out_path), config)
    except AccdbgError:
        raise
    except Exception as exc:
        raise AccdbgError(
            f"quantization of {float_model.name} failed: {type(exc).__name__}: {exc}"
            f"{reader.nonfinite_note()}"
        ) from None
    _restore_qnn_constants(out_path, float_proto, float_model.parent, notes)
    check_wiring(float_proto, onnx.load(str(out_path), load_external_data=False))
    return out_path


def _named(float_model: Path) -> tuple[Path, onnx.ModelProto]:
    """The float model, rewritten beside the original only when a node whose constants QNN
    needs has no name to find it again by after quantization, or when Conv/Gemm nodes share a
    bias (the quantizer's copies of it could take an activation's name: each gets its own)."""
    model = onnx.load(str(float_model), load_external_data=False)
    unnamed = any(not k.node for k in constant_inputs_to_keep(model))
    renamed = name_unnamed_nodes(model) if unnamed else False
    if own_biases(model) or renamed:
        named = float_model.with_name(float_model.stem + ".named.onnx")
        onnx.save(model, str(named))
        return named, model
    return float_model, model


def _restore_qnn_constants(
    qdq_path: Path, float_model: onnx.ModelProto, base_dir: Path, notes: list[str] | None
) -> None:
    """Give QNN back, as initializers, the constants it takes only as such (see
    :mod:`accdbg.engines.static_inputs`), and say so."""
    kept = constant_inputs_to_keep(float_model)
    if not kept:
        return
    qdq = onnx.load(str(qdq_path), load_external_data=False)
    changed = restore_constants(qdq, float_model, kept, str(base_dir))
    if not changed:
        return
    onnx.save(qdq, str(qdq_path))
    for k in changed:
        if notes is None:
            log.info("quantization: %s", k.note())
        else:
            notes.append(f"quantization: {k.note()}")
