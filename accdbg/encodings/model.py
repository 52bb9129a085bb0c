"""One tensor's quantization encoding, in AIMET's convention, and the conversions to it.

The offset sign convention
--------------------------
AIMET and QNN describe a grid of ``2**bw`` real values by ``scale`` and ``offset``::

    real = scale * (q + offset),   q = 0 .. 2**bw - 1          (unsigned storage)
    min  = scale * offset
    max  = scale * (offset + 2**bw - 1)
    offset = round(min / scale)   (<= 0 whenever the grid holds 0)

That is AIMET's encoding specification (e.g. ``min -2.109, scale 0.0185, offset -114``) and
the QNN API's ``Qnn_ScaleOffset_t`` (``real = (q + offset) * scale``). ONNX ``QuantizeLinear``
and onnxruntime use a zero point instead, ``real = scale * (q - zero_point)``, so:

* unsigned ONNX types (uint8, uint16, uint4):  ``offset = -zero_point``
* signed ONNX types (int8, int16, int4, int32): q is shifted by ``2**(bw-1)`` into unsigned
  storage, so ``offset = -zero_point - 2**(bw-1)`` (symmetric int8: zero point 0 -> -128)
* QNN signed fixed point (``SFIXED_POINT_n``) stores the signed-domain offset
  (``real = scale * (q_signed + qnn_offset)``), so ``offset = qnn_offset - 2**(bw-1)``;
  unsigned QNN types (``UFIXED_POINT_n``) store the AIMET offset itself.

The conversion is fixed by the data type; it is never guessed from a file's values. (Some
old examples in the QNN SDK guide print positive ``offset`` values; a file written that way
shows up as min/max that disagree with scale*offset, which the comparison reports.)

Per-channel and per-block encodings keep one value per channel/block in each list; a
per-tensor encoding has lists of length one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PARAM = "param"
ACTIVATION = "activation"

PER_TENSOR = "PER_TENSOR"
PER_CHANNEL = "PER_CHANNEL"
PER_BLOCK = "PER_BLOCK"


def number(value: Any) -> int | float:
    """An offset as the plain number it is: ``-128.0`` -> ``-128``, ``0.5`` stays."""
    f = float(value)
    return int(f) if f.is_integer() else f


def offset_from_zero_point(zero_point: int, bitwidth: int, signed: bool) -> int:
    """ONNX/onnxruntime zero point -> AIMET/QNN offset (see the module docstring)."""
    return -int(zero_point) - (2 ** (bitwidth - 1) if signed else 0)


def zero_point_from_offset(offset: float, bitwidth: int, signed: bool) -> int:
    """AIMET/QNN offset -> ONNX zero point for a signed or unsigned storage type."""
    return int(round(-float(offset) - (2 ** (bitwidth - 1) if signed else 0)))


def qnn_offset_to_aimet(qnn_offset: int, bitwidth: int, signed: bool) -> int:
    """QNN ``scale_offset.offset`` -> AIMET offset: signed QNN types store the signed-domain one."""
    return int(qnn_offset) - (2 ** (bitwidth - 1) if signed else 0)


def min_max(scale: float, offset: float, bitwidth: int) -> tuple[float, float]:
    """The grid's ends: ``min = scale*offset``, ``max = scale*(offset + 2**bw - 1)``."""
    s = float(scale)
    return s * float(offset), s * (float(offset) + 2**bitwidth - 1)


def scale_offset_from_min_max(lo: float, hi: float, bitwidth: int) -> tuple[float, int]:
    """AIMET's rule when a file gives only min/max: ``scale = (max-min)/(2**bw-1)``, offset rounded."""
    scale = (float(hi) - float(lo)) / (2**bitwidth - 1)
    offset = int(round(float(lo) / scale)) if scale else 0
    return scale, offset


@dataclass
class Encoding:
    """A tensor's encoding; ``offset`` in the AIMET convention whatever the source.

    ``source`` records provenance for reports (QNN tensor name, data type, tensor type,
    the ONNX quantized type...). ``values_known`` is False when the source names a
    quantized tensor but not its values (the QNN EP JSON dump of per-channel tensors).
    """

    name: str
    kind: str
    dtype: str = "int"
    bitwidth: int = 8
    is_symmetric: bool | None = None
    scale: tuple[float, ...] = ()
    offset: tuple[int | float, ...] = ()
    min: tuple[float, ...] = ()
    max: tuple[float, ...] = ()
    enc_type: str = PER_TENSOR
    axis: int | None = None
    block_size: int | None = None
    values_known: bool = True
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def channels(self) -> int:
        return len(self.scale) if self.values_known else int(self.source.get("channels", 1))

    @property
    def is_float(self) -> bool:
        return self.dtype == "float"

    @classmethod
    def from_scale_offset(
        cls,
        name: str,
        kind: str,
        scale,
        offset,
        bitwidth: int,
        is_symmetric: bool | None = None,
        axis: int | None = None,
        enc_type: str | None = None,
        block_size: int | None = None,
        source: dict | None = None,
    ) -> Encoding:
        """Build from scale/offset lists (or scalars); min/max follow from the formula."""
        scales = tuple(float(s) for s in np.atleast_1d(np.asarray(scale, dtype=np.float64)))
        offsets = tuple(number(o) for o in np.atleast_1d(np.asarray(offset, dtype=np.float64)))
        if len(offsets) == 1 and len(scales) > 1:
            offsets = offsets * len(scales)
        if len(scales) != len(offsets):
            raise ValueError(f"{len(scales)} scales but {len(offsets)} offsets")
        ends = [min_max(s, o, bitwidth) for s, o in zip(scales, offsets, strict=True)]
        if enc_type is None:
            enc_type = PER_TENSOR if len(scales) == 1 else PER_CHANNEL
        if is_symmetric is None:
            is_symmetric = all(o == -(2 ** (bitwidth - 1)) for o in offsets)
        return cls(
            name=name,
            kind=kind,
            dtype="int",
            bitwidth=int(bitwidth),
            is_symmetric=is_symmetric,
            scale=scales,
            offset=offsets,
            min=tuple(e[0] for e in ends),
            max=tuple(e[1] for e in ends),
            enc_type=enc_type,
            axis=axis,
            block_size=block_size,
            source=dict(source or {}),
        )

    @classmethod
    def float_encoding(
        cls, name: str, kind: str, bitwidth: int, source: dict | None = None
    ) -> Encoding:
        """A tensor kept in floating point (AIMET ``dtype: float``): only its bitwidth matters."""
        return cls(
            name=name,
            kind=kind,
            dtype="float",
            bitwidth=int(bitwidth),
            enc_type=PER_TENSOR,
            source=dict(source or {}),
        )

    def to_legacy(self) -> list[dict[str, Any]]:
        """AIMET 0.6.1 entries: one dict per channel (a one-element list when per tensor)."""
        if self.is_float:
            return [{"bitwidth": self.bitwidth, "dtype": "float"}]
        sym = "True" if self.is_symmetric else "False"
        return [
            {
                "bitwidth": self.bitwidth,
                "dtype": "int",
                "is_symmetric": sym,
                "max": _json_float(hi),
                "min": _json_float(lo),
                "offset": number(o),
                "scale": _json_float(s),
            }
            for s, o, lo, hi in zip(self.scale, self.offset, self.min, self.max, strict=True)
        ]

    def to_v1(self) -> dict[str, Any]:
        """An AIMET 1.0.0 entry."""
        if self.is_float:
            return {
                "name": self.name,
                "dtype": "FLOAT",
                "enc_type": PER_TENSOR,
                "bw": self.bitwidth,
            }
        entry: dict[str, Any] = {
            "name": self.name,
            "dtype": "INT",
            "enc_type": self.enc_type,
            "bw": self.bitwidth,
            "is_sym": bool(self.is_symmetric),
            "scale": [_json_float(s) for s in self.scale],
            "offset": [number(o) for o in self.offset],
        }
        if self.block_size is not None:
            entry["block_size"] = self.block_size
        return entry


def _json_float(x: float) -> float:
    """JSON cannot hold NaN/inf portably; a non-finite encoding value is a bug upstream."""
    f = float(x)
    if not math.isfinite(f):
        raise ValueError(f"non-finite encoding value {f}")
    return f
