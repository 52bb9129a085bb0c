"""Calibrated ranges: the min/max a target tensor's quantization encoding can represent.

Tensor inspection draws them beside the target's observed min/max, because a tensor whose
values pile up at a calibrated end was clipped, and one using a sliver of its range lost
precision. They come from one of two places, never mixed:

* ``--target_encodings``: an AIMET encodings file (legacy or 1.0.0) or a QNN graph JSON
  (``model_net.json``), read by :mod:`accdbg.encodings` and matched to the target's tensor
  names by :func:`accdbg.encodings.matching.match_names` (QNN renames tensors);
* otherwise the target folder's own manifest: the inference engine records each quantized
  tensor's ``scale``, ``zero_point`` (or ``offset`` = -zero point) and ``bitwidth``, so an
  engine run needs no extra file.

Every range is kept in AIMET's convention (``real = scale * (q + offset)``, q unsigned; see
:mod:`accdbg.encodings.model`), so ``min = scale*offset`` and ``max = scale*(offset + 2**bw - 1)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accdbg.core.tensor_store import TensorRecord
from accdbg.encodings.aimet import parse_aimet
from accdbg.encodings.matching import match_names
from accdbg.encodings.model import Encoding, min_max, offset_from_zero_point
from accdbg.encodings.qnn_json import QnnGraph, qnn_encodings, read_json
from accdbg.errors import AccdbgError

FLAG = "--target_encodings"


@dataclass(frozen=True)
class CalibratedRange:
    """What one target tensor's encoding says: its range, and how to undo the quantization.

    ``scale``/``offset`` are None for a per-channel encoding (the range is then the union of
    the channels' ranges).
    """

    min: float
    max: float
    bitwidth: int | None
    scale: float | None
    offset: float | None
    source: str
    channels: int = 1

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """Integers as the backend stored them -> real values (``scale * (q + offset)``).

        Signed storage (int8/int16) holds ``q - 2**(bw-1)``, so it is shifted back first.
        """
        if self.scale is None or self.offset is None or self.bitwidth is None:
            raise ValueError("a per-channel encoding cannot dequantize a flat tensor")
        shift = 2 ** (self.bitwidth - 1) if np.issubdtype(q.dtype, np.signedinteger) else 0
        return self.scale * (np.asarray(q, dtype=np.float64) + shift + self.offset)


def from_encoding(enc: Encoding, source: str) -> CalibratedRange | str:
    """An :class:`~accdbg.encodings.model.Encoding` -> its range, or why it has none."""
    if enc.is_float:
        return f"kept in float ({enc.bitwidth}-bit) by the encodings: no calibrated range"
    if not enc.values_known or not enc.min:
        return "encoding values unknown (per-channel encoding not serialized in the QNN JSON)"
    if len(enc.scale) == 1:
        return CalibratedRange(
            float(enc.min[0]),
            float(enc.max[0]),
            enc.bitwidth,
            float(enc.scale[0]),
            float(enc.offset[0]),
            source,
        )
    return CalibratedRange(
        float(min(enc.min)), float(max(enc.max)), enc.bitwidth, None, None, source, len(enc.scale)
    )


def from_record(record: TensorRecord) -> CalibratedRange | None:
    """The encoding an inference engine wrote into a manifest record's ``extra``, if any.

    ``zero_point`` is ONNX's (``real = scale*(q - zero_point)``) in the stored integer type
    ``native_dtype``; without it, ``offset`` is QNN's (``-zero_point``, unsigned storage).
    """
    extra = record.extra or {}
    scale, bits = extra.get("scale"), extra.get("bitwidth")
    if scale is None or bits is None or extra.get("quantized") is False:
        return None
    try:
        bits = int(bits)
        native = np.dtype(str(extra.get("native_dtype") or f"uint{bits}"))
        signed = np.issubdtype(native, np.signedinteger)
        if "zero_point" in extra and extra["zero_point"] is not None:
            zero_points = np.atleast_1d(np.asarray(extra["zero_point"], dtype=np.int64))
        else:
            zero_points = -np.atleast_1d(np.asarray(extra.get("offset", 0), dtype=np.int64))
            signed = False
        scales = np.atleast_1d(np.asarray(scale, dtype=np.float64))
    except (TypeError, ValueError):
        raise AccdbgError(
            f"target tensor {record.name!r}: tensors.json encoding is malformed "
            f"(scale {scale!r}, bitwidth {bits!r}, zero_point/offset "
            f"{extra.get('zero_point', extra.get('offset'))!r})"
        ) from None
    offsets = [
        offset_from_zero_point(int(z), bits, signed)
        for z in np.broadcast_to(zero_points, scales.shape)
    ]
    ends = [min_max(s, o, bits) for s, o in zip(scales.tolist(), offsets, strict=True)]
    if scales.size == 1:
        return CalibratedRange(
            ends[0][0], ends[0][1], bits, float(scales[0]), float(offsets[0]), "manifest"
        )
    return CalibratedRange(
        min(e[0] for e in ends),
        max(e[1] for e in ends),
        bits,
        None,
        None,
        "manifest",
        int(scales.size),
    )


def _load_file(path: Path) -> tuple[dict[str, Encoding], QnnGraph | None, str]:
    data = read_json(path, FLAG)
    graph = data.get("graph") if isinstance(data, dict) else None
    if isinstance(graph, dict):
        tensors = graph.get("tensors")
        if not isinstance(tensors, dict) or not all(isinstance(t, dict) for t in tensors.values()):
            raise AccdbgError(
                f"{FLAG} {str(path)!r}: graph.tensors must map tensor names to objects"
            )
        qnn = QnnGraph(path, tensors, graph.get("nodes") or {})
        return qnn_encodings(qnn, include_float=True), qnn, "qnn_json"
    aimet = parse_aimet(data, f"{FLAG} {str(path)!r}")
    return {**aimet.params, **aimet.activations}, None, f"aimet_{aimet.form}"


@dataclass
class TargetEncodings:
    """Calibrated ranges of the target tensors, by target tensor name.

    ``ranges`` holds the tensors with a range; ``notes`` says why a matched tensor has none;
    ``matched_by`` records the name-matching rule per tensor (for the log).
    """

    source: str
    ranges: dict[str, CalibratedRange]
    notes: dict[str, str]
    matched_by: dict[str, str]

    def get(self, name: str) -> CalibratedRange | None:
        return self.ranges.get(name)


def load_target_encodings(
    target_encodings: str | os.PathLike | None,
    target_records: dict[str, TensorRecord],
) -> TargetEncodings:
    """Ranges for the target tensors from the given file, else from the target's manifest."""
    if target_encodings is None:
        ranges = {}
        for name, rec in target_records.items():
            found = from_record(rec)
            if found is not None:
                ranges[name] = found
        return TargetEncodings("manifest", ranges, {}, dict.fromkeys(ranges, "manifest"))
    path = Path(target_encodings).expanduser()
    if not path.is_file():
        raise AccdbgError(
            f"{FLAG} {str(target_encodings)!r} does not exist or is not a file "
            "(expected an AIMET encodings JSON or a QNN model_net.json)"
        )
    encodings, graph, source = _load_file(path)
    pairs, _, _ = match_names(list(target_records), list(encodings), graph)
    out = TargetEncodings(source, {}, {}, {})
    for pair in pairs:
        if pair.aimet_name in out.matched_by:
            continue
        found = from_encoding(encodings[pair.qnn_name], source)
        out.matched_by[pair.aimet_name] = f"{pair.matched_by} ({pair.qnn_name})"
        if isinstance(found, str):
            out.notes[pair.aimet_name] = found
        else:
            out.ranges[pair.aimet_name] = found
    return out
