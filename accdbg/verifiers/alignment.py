"""How a golden and a target tensor are laid out alike before they are compared: each side's
shape, layout and quantization step, from its manifest record first, then the QNN graph
JSON, and what to do with bare ``.raw`` files that carry no shape.

Its own module because these rules (which source wins, when a layout applies) are the subtle
part of reading a pair; :mod:`accdbg.mapping.layout` then reconciles the two views.
"""

from __future__ import annotations

import logging

import numpy as np

from accdbg.core.tensor_store import TensorRecord
from accdbg.mapping.layout import Alignment, normalize_layout
from accdbg.mapping.qnn_json import QnnTensor, StepEncoding

log = logging.getLogger("accdbg.verification")


def fmt_shape(shape) -> list[int]:
    """A shape as plain ints (for the table and messages)."""
    return [int(d) for d in shape]


def target_view(
    rec: TensorRecord, qnn: QnnTensor | None
) -> tuple[tuple[int, ...], str | None, StepEncoding | None]:
    """The target's shape, layout and encoding, from its record first, then the QNN JSON.

    The QNN JSON describes the QNN tensor: its axis format applies to the dump only when the
    dump kept the QNN dims (an engine that transposed back to the ONNX layout did not).
    """
    shape = tuple(rec.shape)
    layout = normalize_layout(rec.layout, len(shape))
    encoding = None
    extra = rec.extra or {}
    if "scale" in extra and extra["scale"] is not None:
        scale = extra["scale"]
        encoding = StepEncoding(
            np.asarray(scale, dtype=np.float64) if isinstance(scale, list) else float(scale),
            extra.get("offset", 0),
            extra.get("bitwidth"),
            extra.get("axis"),
        )
    if qnn is not None:
        if (
            len(shape) <= 1
            and qnn.dims
            and int(np.prod(qnn.dims)) == rec.size
            and len(qnn.dims) > 1
        ):
            shape = qnn.dims  # bare .raw: the QNN JSON knows the shape
        if layout is None and tuple(qnn.dims) == shape:
            layout = normalize_layout(qnn.axis_format, len(shape))
        if (
            encoding is None
            and qnn.encoding is not None
            and (qnn.encoding.axis is None or tuple(qnn.dims) == shape)
        ):
            encoding = qnn.encoding
    return shape, layout, encoding


def golden_view(rec: TensorRecord, qnn: QnnTensor | None) -> tuple[tuple[int, ...], str | None]:
    """The golden's shape and layout: its record's, else the source layout the QNN JSON gives."""
    shape = tuple(rec.shape)
    layout = normalize_layout(rec.layout, len(shape))
    if layout is None and qnn is not None:
        layout = normalize_layout(qnn.src_axis_format, len(shape))
    return shape, layout


def scale_for(encoding: StepEncoding | None, target_shape, alignment: Alignment):
    """The quantization step broadcast to the aligned target (per-axis scales move with it)."""
    if encoding is None:
        return None
    try:
        step = encoding.step_array(target_shape)
    except ValueError as exc:
        log.debug("ignoring encoding: %s", exc)
        return None
    if isinstance(step, float):
        return step
    return alignment.apply(np.broadcast_to(step, target_shape))


def shapeless(golden, target, g_shape, t_shape, size) -> Alignment | None:
    """Bare ``.raw`` folders carry no shape: compare flat only when order cannot differ."""

    def spread(shape) -> int:
        return len([d for d in shape if d != 1])

    if golden.has_manifest and target.has_manifest:
        return None
    if (
        not golden.has_manifest
        and not target.has_manifest
        and len(g_shape) <= 1
        and len(t_shape) <= 1
    ):
        return Alignment("same", g_shape, t_shape, None, "flat (no shapes recorded on either side)")
    if not target.has_manifest and len(t_shape) <= 1 and spread(g_shape) > 1:
        return Alignment(
            "mismatch",
            g_shape,
            t_shape,
            None,
            f"target shape unknown (bare .raw, {size} values) for golden "
            f"{fmt_shape(g_shape)}: pass --qnn_model_json_path",
        )
    if not golden.has_manifest and len(g_shape) <= 1 and spread(t_shape) > 1:
        return Alignment(
            "mismatch",
            g_shape,
            t_shape,
            None,
            f"golden shape unknown (bare .raw without tensors.json) for target "
            f"{fmt_shape(t_shape)}: its layout cannot be told",
        )
    return None
