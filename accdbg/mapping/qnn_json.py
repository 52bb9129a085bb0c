"""What verification needs from a QNN graph JSON (``model_net.json``): dims, axis formats
and activation encodings of each tensor.

Both the JSON of Qualcomm's converter and the one onnxruntime's QNN execution provider
writes (``dump_json_qnn_graph``) have ``graph.tensors.<name>`` with ``dims``,
``axis_format``, ``src_axis_format`` and ``quant_params``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError

QNN_DEFINITION_DEFINED = 1
# quant_params.encoding: 0 scale/offset, 1 per-axis, 2 bitwidth scale/offset, 3 bitwidth per-axis
_PER_AXIS = {1, 3}


@dataclass(frozen=True)
class Encoding:
    """A tensor's quantization: ``scale`` is one step (an array for per-axis encodings)."""

    scale: float | np.ndarray
    offset: int | np.ndarray = 0
    bitwidth: int | None = None
    axis: int | None = None  # for per-axis encodings, in the dims it was recorded with

    def step_array(self, shape) -> float | np.ndarray:
        """The step broadcastable to an array of ``shape`` laid out like the encoding."""
        if np.size(self.scale) == 1:
            return float(np.asarray(self.scale).ravel()[0])
        if self.axis is None:
            raise ValueError(f"{np.size(self.scale)} scales but no axis")
        scale = np.asarray(self.scale, dtype=np.float64)
        axis = self.axis % len(shape)
        if shape[axis] != scale.size:
            raise ValueError(f"{scale.size} per-axis scales for axis {axis} of {list(shape)}")
        view = [1] * len(shape)
        view[axis] = scale.size
        return scale.reshape(view)


@dataclass(frozen=True)
class QnnTensor:
    name: str
    dims: tuple[int, ...]
    axis_format: str | None
    src_axis_format: str | None
    encoding: Encoding | None
    data_type: int | None


def qnn_sanitize(name: str) -> str:
    """Tensor names as QNN's converters write them: non-word characters become ``_``."""
    clean = re.sub(r"\W", "_", name)
    return "_" + clean if clean[:1].isdigit() else clean


def bitwidth_of(data_type: Any) -> int | None:
    """QNN data types keep the bit width in their low byte as hex digits: 0x0408 -> 8."""
    try:
        low = int(data_type) & 0xFF
        return int(f"{low:x}")
    except (TypeError, ValueError):
        return None


def encoding_from_quant_params(qp: dict[str, Any] | None, data_type: Any = None) -> Encoding | None:
    if not isinstance(qp, dict) or qp.get("definition") != QNN_DEFINITION_DEFINED:
        return None
    bw = bitwidth_of(data_type)
    if qp.get("encoding") in _PER_AXIS:
        per = qp.get("axis_scale_offset") or qp.get("bw_axis_scale_offset") or {}
        items = per.get("scale_offsets") or []
        scales = per.get("scales")
        if items:
            scale = np.array([float(i["scale"]) for i in items])
            offset = np.array([int(i.get("offset", 0)) for i in items])
        elif scales:
            scale = np.asarray(scales, dtype=np.float64)
            offset = np.asarray(per.get("offsets") or [0] * len(scales))
        else:
            return None
        return Encoding(scale, offset, per.get("bitwidth", bw), int(per.get("axis", 0)))
    so = qp.get("scale_offset") or qp.get("bw_scale_offset") or {}
    scale = float(so.get("scale", 0.0) or 0.0)
    if scale <= 0:
        return None
    return Encoding(scale, int(so.get("offset", 0)), so.get("bitwidth", bw))


class QnnGraph:
    """The tensors of a QNN graph JSON, found by QNN name, ONNX name or sanitized name."""

    def __init__(self, path: str | os.PathLike, what: str = "--qnn_model_json_path"):
        self.path = Path(path).expanduser()
        data = read_json(self.path, what)
        graph = data.get("graph") if isinstance(data, dict) else None
        tensors = graph.get("tensors") if isinstance(graph, dict) else None
        if not isinstance(tensors, dict):
            raise AccdbgError(
                f"{what} {str(path)!r} is not a QNN graph JSON (expected graph.tensors with dims and axis_format)"
            )
        self.tensors: dict[str, QnnTensor] = {}
        for name, t in tensors.items():
            if not isinstance(t, dict):
                continue
            self.tensors[name] = QnnTensor(
                name=name,
                dims=tuple(int(d) for d in t.get("dims") or ()),
                axis_format=t.get("axis_format"),
                src_axis_format=t.get("src_axis_format"),
                encoding=encoding_from_quant_params(t.get("quant_params"), t.get("data_type")),
                data_type=t.get("data_type"),
            )

    def find(self, *names: str | None) -> QnnTensor | None:
        for name in names:
            if not name:
                continue
            for candidate in (name, qnn_sanitize(name)):
                if candidate in self.tensors:
                    return self.tensors[candidate]
        return None
