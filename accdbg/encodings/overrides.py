"""AIMET encodings -> onnxruntime ``TensorQuantOverrides``, for ``--quantization_overrides``.

onnxruntime's QDQ quantizer takes per-tensor overrides (``get_qnn_qdq_config(...,
init_overrides=...)`` or ``extra_options["TensorQuantOverrides"]``)::

    {"<tensor>": [{"quant_type": QuantType.QUInt8, "scale": np.float32(s), "zero_point": np.uint8(z)}],
     "<weight>": [{"axis": 0, "quant_type": QuantType.QInt8, "scale": ..., "zero_point": ...},  # per channel
                  ...one dict per channel...]}

The storage type follows the encoding: a symmetric encoding whose offset is ``-2**(bw-1)``
becomes the signed type with zero point 0 (what QNN HTP wants for per-channel weights);
anything else the unsigned type with ``zero_point = -offset`` (see :mod:`accdbg.encodings.model`).
32-bit (bias) encodings are left out: onnxruntime always derives a bias scale from its input
and weight scales. Float (``dtype: float``) and per-block encodings have no override form and
are left out with a warning, as are names that are not tensors of the model.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import onnx

from accdbg.encodings.aimet import AimetEncodings, load_aimet, parse_aimet
from accdbg.encodings.model import PER_BLOCK, Encoding, zero_point_from_offset
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.encodings")

# the per-channel axis onnxruntime's QNN config uses for a weight, by consumer op type
DEFAULT_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": None, "LayerNormalization": -1}


def _quant_types():
    from onnxruntime.quantization import QuantType

    return {
        (8, False): QuantType.QUInt8,
        (8, True): QuantType.QInt8,
        (16, False): QuantType.QUInt16,
        (16, True): QuantType.QInt16,
        (4, False): QuantType.QUInt4,
        (4, True): QuantType.QInt4,
    }


def _np_type(quant_type) -> np.dtype:
    from onnxruntime.quantization.quant_utils import ONNX_TYPE_TO_NP_TYPE

    return ONNX_TYPE_TO_NP_TYPE[quant_type.tensor_type]


def storage(enc: Encoding) -> tuple[int, bool]:
    """``(bitwidth, signed)`` onnxruntime should store this encoding in."""
    signed = bool(enc.is_symmetric) and all(o == -(2 ** (enc.bitwidth - 1)) for o in enc.offset)
    return enc.bitwidth, signed


def _per_channel_axis(
    enc: Encoding, init: onnx.TensorProto, consumers: list[onnx.NodeProto]
) -> int:
    dims = list(init.dims)
    n = len(enc.scale)
    fits = [a for a, d in enumerate(dims) if d == n]
    if not fits:
        raise AccdbgError(
            f"--quantization_overrides: {enc.name!r} has {n} per-channel encodings but no axis of its "
            f"shape {dims} has {n} channels"
        )
    for node in consumers:
        default = DEFAULT_AXIS.get(node.op_type, "none")
        if node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            default = 0 if trans_b else 1
        if isinstance(default, int):
            axis = default % len(dims) if dims else 0
            if axis in fits:
                return axis
    return fits[0]


def aimet_to_tensor_quant_overrides(
    aimet: dict | AimetEncodings | str | os.PathLike,
    model: onnx.ModelProto,
    model_label: str = "the model",
) -> dict[str, list[dict[str, Any]]]:
    """TensorQuantOverrides for ``model`` from AIMET encodings (a parsed document, or a path).
    ``model_label`` names it in the messages about names it lacks: a model pre-processed for
    QNN has lost tensors the user's model has."""
    if isinstance(aimet, AimetEncodings):
        encs = aimet
    elif isinstance(aimet, dict):
        encs = parse_aimet(aimet, "--quantization_overrides")
    else:
        encs = load_aimet(aimet, "--quantization_overrides")
    inits = {i.name: i for i in model.graph.initializer}
    known = set(inits) | {i.name for i in model.graph.input}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        known.update(o for o in node.output if o)
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    qtypes = _quant_types()
    out: dict[str, list[dict[str, Any]]] = {}
    unknown, skipped = [], []
    for enc in encs.all().values():
        if enc.name not in known:
            unknown.append(enc.name)
            continue
        if enc.is_float or enc.enc_type == PER_BLOCK or enc.bitwidth == 32:
            if enc.bitwidth != 32:
                skipped.append(f"{enc.name} ({'float' if enc.is_float else 'per-block'})")
            continue
        bw, signed = storage(enc)
        qt = qtypes.get((bw, signed))
        if qt is None:
            raise AccdbgError(
                f"--quantization_overrides: {enc.name!r} has bitwidth {bw}; onnxruntime quantizes to 4, 8 or 16 bits"
            )
        lo, hi = (-(2 ** (bw - 1)), 2 ** (bw - 1) - 1) if signed else (0, 2**bw - 1)
        np_t = _np_type(qt)
        entries = []
        for s, o in zip(enc.scale, enc.offset, strict=True):
            zp = zero_point_from_offset(o, bw, signed)
            if not lo <= zp <= hi:
                raise AccdbgError(
                    f"--quantization_overrides: {enc.name!r} offset {o} gives zero point {zp}, outside "
                    f"{lo}..{hi} of {bw}-bit {'signed' if signed else 'unsigned'} storage"
                )
            if not s > 0:
                raise AccdbgError(
                    f"--quantization_overrides: {enc.name!r} scale {s} is not positive"
                )
            entries.append(
                {
                    "quant_type": qt,
                    "scale": np.array(s, dtype=np.float32),
                    "zero_point": np.array(zp, dtype=np_t),
                }
            )
        if len(entries) > 1:
            if enc.name not in inits:
                raise AccdbgError(
                    f"--quantization_overrides: {enc.name!r} has per-channel encodings but is not a weight "
                    "(onnxruntime quantizes only initializers per channel)"
                )
            axis = _per_channel_axis(enc, inits[enc.name], consumers.get(enc.name, []))
            for e in entries:
                e["axis"] = axis
        out[enc.name] = entries
    if not out and unknown:
        raise AccdbgError(
            f"--quantization_overrides: none of its {len(unknown)} tensor names are tensors of "
            f"{model_label} (e.g. {', '.join(repr(n) for n in unknown[:3])})"
        )
    if unknown:
        log.warning(
            "quantization overrides: %d names are not tensors of %s, ignored: %s",
            len(unknown),
            model_label,
            ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else ""),
        )
    if skipped:
        log.warning(
            "quantization overrides: %d encodings have no onnxruntime override form, ignored: %s",
            len(skipped),
            ", ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else ""),
        )
    log.info("quantization overrides: %d tensors overridden", len(out))
    return out
