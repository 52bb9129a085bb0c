"""A tensor's quantization grid, and what a quantize-dequantize round trip does to its data.

An :class:`~accdbg.encodings.model.Encoding` (AIMET convention: ``real = scale * (q + offset)``,
``q = 0 .. 2**bw - 1``) becomes numpy arrays shaped to broadcast against the tensor, so
per-tensor and per-channel encodings go through one code path. Rounding is half to even and
values saturate at the grid's ends, as ONNX QuantizeLinear does (signed types are the same
grid shifted by ``2**(bw-1)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accdbg.encodings.model import Encoding


@dataclass(frozen=True)
class Grid:
    """The grid of one encoding, broadcastable to a tensor of ``ndim`` dimensions."""

    scale: np.ndarray
    offset: np.ndarray
    levels: int  # 2**bw - 1
    axis: int | None  # the per-channel axis; None when per tensor
    bitwidth: int
    symmetric: bool
    key: tuple  # equal keys quantize identically (computations are shared)

    @classmethod
    def of(cls, enc: Encoding, ndim: int) -> Grid:
        scale = np.asarray(enc.scale, np.float64)
        offset = np.asarray(enc.offset, np.float64)
        axis = None
        if scale.size > 1:
            axis = int(enc.axis if enc.axis is not None else 0)
            axis = axis + ndim if axis < 0 else axis
            shape = [1] * ndim
            shape[axis] = scale.size
            scale, offset = scale.reshape(shape), offset.reshape(shape)
        key = (enc.bitwidth, axis, tuple(enc.scale), tuple(enc.offset))
        # symmetric: zero sits mid-grid (signed storage with zero point 0, or uint with 2**(bw-1))
        symmetric = all(float(o) == -(2 ** (enc.bitwidth - 1)) for o in enc.offset)
        return cls(scale, offset, 2**enc.bitwidth - 1, axis, enc.bitwidth, symmetric, key)

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def lo(self) -> np.ndarray:
        return self.scale * self.offset

    @property
    def hi(self) -> np.ndarray:
        return self.scale * (self.offset + self.levels)

    def qdq(self, x: np.ndarray) -> np.ndarray:
        """Quantize (round half to even, saturate) and dequantize ``x`` (float64)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.rint(x / self.scale) - self.offset, 0, self.levels)
        return (q + self.offset) * self.scale

    def channel_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """The grid's ends per channel (one value when per tensor), flat."""
        return self.lo.reshape(-1), self.hi.reshape(-1)

    def describe(self) -> str:
        kind = f"per-channel ({self.scale.size})" if self.per_channel else "per-tensor"
        sym = "symmetric" if self.symmetric else "asymmetric"
        return f"{kind} {self.bitwidth}-bit {sym}"
