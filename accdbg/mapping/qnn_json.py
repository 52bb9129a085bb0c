"""The QNN graph JSON (``model_net.json``): its one reader, :class:`QnnGraph`.

Both the JSON of Qualcomm's converter and the one onnxruntime's QNN execution provider
writes (``dump_json_qnn_graph``) have ``graph.tensors.<name>`` with ``dims``,
``axis_format``, ``src_axis_format``, ``data_type`` and ``quant_params``, and ``graph.nodes``.
:class:`QnnGraph` holds those objects by QNN name; :meth:`QnnGraph.find` gives what
verification needs of a tensor (dims, axis formats, its quantization step), and
:mod:`accdbg.encodings.qnn_json` reads the same object's encodings in AIMET's convention.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError
from accdbg.mapping.names import qnn_sanitize

QNN_DEFINITION_DEFINED = 1
# quant_params.encoding: 0 scale/offset, 1 per-axis, 2 bitwidth scale/offset, 3 bitwidth per-axis
_PER_AXIS = {1, 3}


@dataclass(frozen=True)
class StepEncoding:
    """A tensor's quantization step as verification uses it: ``scale`` is one step (an array
    for per-axis encodings). The full encoding, in AIMET's convention, is
    :class:`accdbg.encodings.model.Encoding`."""

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
    encoding: StepEncoding | None
    data_type: int | None


def bitwidth_of(data_type: Any) -> int | None:
    """QNN data types keep the bit width in their low byte as hex digits: 0x0408 -> 8."""
    try:
        low = int(data_type) & 0xFF
        return int(f"{low:x}")
    except (TypeError, ValueError):
        return None


def encoding_from_quant_params(
    qp: dict[str, Any] | None, data_type: Any = None
) -> StepEncoding | None:
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
        return StepEncoding(scale, offset, per.get("bitwidth", bw), int(per.get("axis", 0)))
    so = qp.get("scale_offset") or qp.get("bw_scale_offset") or {}
    scale = float(so.get("scale", 0.0) or 0.0)
    if scale <= 0:
        return None
    return StepEncoding(scale, int(so.get("offset", 0)), so.get("bitwidth", bw))


class QnnGraph:
    """A QNN graph JSON: ``tensors`` and ``nodes`` are its JSON objects by QNN name.

    ``QnnGraph(path)`` reads one file; ``QnnGraph(path, tensors, nodes)`` wraps objects
    already read (e.g. the QNN EP's partitions merged by
    :func:`accdbg.encodings.qnn_json.load_qnn_graph`)."""

    def __init__(
        self,
        path: str | os.PathLike | None,
        tensors: dict[str, Any] | None = None,
        nodes: dict[str, Any] | None = None,
        what: str = "--qnn_model_json_path",
    ):
        self.path = Path(path).expanduser() if path is not None else None
        if tensors is None:
            if self.path is None:
                raise AccdbgError(f"{what}: no QNN graph JSON given")
            data = read_json(self.path, what)
            graph = data.get("graph") if isinstance(data, dict) else None
            tensors = graph.get("tensors") if isinstance(graph, dict) else None
            if not isinstance(tensors, dict):
                raise AccdbgError(
                    f"{what} {str(path)!r} is not a QNN graph JSON (expected graph.tensors with dims and axis_format)"
                )
            nodes = graph.get("nodes") or {}
        self.tensors: dict[str, Any] = dict(tensors)
        self.nodes: dict[str, Any] = dict(nodes or {})
        self._typed: dict[str, QnnTensor] = {}

    def tensor(self, name: str) -> QnnTensor | None:
        """The tensor named ``name`` (its QNN name) with its dims, axis formats and step."""
        if name not in self._typed:
            t = self.tensors.get(name)
            if not isinstance(t, dict):
                return None
            self._typed[name] = QnnTensor(
                name=name,
                dims=tuple(int(d) for d in t.get("dims") or ()),
                axis_format=t.get("axis_format"),
                src_axis_format=t.get("src_axis_format"),
                encoding=encoding_from_quant_params(t.get("quant_params"), t.get("data_type")),
                data_type=t.get("data_type"),
            )
        return self._typed[name]

    def find(self, *names: str | None) -> QnnTensor | None:
        """The first of ``names`` found, by QNN name or as QNN's converters sanitize it."""
        for name in names:
            if not name:
                continue
            for candidate in (name, qnn_sanitize(name)):
                found = self.tensor(candidate)
                if found is not None:
                    return found
        return None
