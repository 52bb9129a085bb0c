"""Read a QNN graph JSON: the converter's ``model_net.json`` or the QNN EP's graph dump.

Both have ``graph.tensors.<name>`` with ``data_type`` (a ``Qnn_DataType_t`` code), ``type``
(a ``Qnn_TensorType_t``: 0 APP_WRITE and 1 APP_READ are graph inputs/outputs, 3 NATIVE an
activation, 4 STATIC a parameter) and ``quant_params``::

    {"definition": 1,              # 1 DEFINED; 0 / 2147483647: no encoding
     "encoding": 0,                # 0 SCALE_OFFSET, 1 AXIS_SCALE_OFFSET, 2 BW_SCALE_OFFSET,
                                   # 3 BW_AXIS_SCALE_OFFSET, 4 BLOCK, 5 BLOCKWISE_EXPANSION
     "scale_offset": {"scale": s, "offset": o},
     "axis_scale_offset": {"axis": a, "num_scale_offsets": n, "scale_offsets": [{...}, ...]},
     "bw_scale_offset": {"bitwidth": b, "scale": s, "offset": o},
     "bw_axis_scale_offset": {"bitwidth": b, "axis": a, "num_elements": n,
                              "scales": [...], "offsets": [...] (omitted when all 0)}}

and ``graph.nodes.<name>`` with ``type``, ``input_names`` and ``output_names``.

The QNN EP (onnxruntime-qnn 2.x) dump writes every encoding as ``scale_offset``: for a
per-channel tensor (encoding 1) it prints the first bytes of the axis encoding as if they
were a scale/offset pair, i.e. ``scale`` holds the *bits* of the int32 axis and ``offset``
the channel count. We decode the axis and channel count from them and mark the values as
unknown; :func:`fill_per_channel_from_qdq` can fill them in from the QDQ model the EP was given.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from accdbg.core.jsonio import read_json  # noqa: F401  (re-exported)
from accdbg.encodings.model import (
    ACTIVATION,
    PARAM,
    PER_BLOCK,
    PER_CHANNEL,
    Encoding,
    qnn_offset_to_aimet,
)
from accdbg.errors import AccdbgError
from accdbg.mapping.qnn_json import QnnGraph

# Qnn_DataType_t codes: 0x0X.. class (0 int, 1 uint, 2 float, 3 sfixed, 4 ufixed, 5 bool), low byte = bits
DATATYPE_NAMES = {
    0x0008: "INT_8",
    0x0016: "INT_16",
    0x0032: "INT_32",
    0x0064: "INT_64",
    0x0108: "UINT_8",
    0x0116: "UINT_16",
    0x0132: "UINT_32",
    0x0164: "UINT_64",
    0x0216: "FLOAT_16",
    0x0232: "FLOAT_32",
    0x0264: "FLOAT_64",
    0x0304: "SFIXED_POINT_4",
    0x0308: "SFIXED_POINT_8",
    0x0316: "SFIXED_POINT_16",
    0x0332: "SFIXED_POINT_32",
    0x0404: "UFIXED_POINT_4",
    0x0408: "UFIXED_POINT_8",
    0x0416: "UFIXED_POINT_16",
    0x0432: "UFIXED_POINT_32",
    0x0508: "BOOL_8",
    0x0608: "STRING",
    0x7FFFFFFF: "UNDEFINED",
}
STATIC_TYPES = {4, 6}  # STATIC, UPDATEABLE_STATIC
DEFINED = 1
ENCODING_NAMES = {
    0: "SCALE_OFFSET",
    1: "AXIS_SCALE_OFFSET",
    2: "BW_SCALE_OFFSET",
    3: "BW_AXIS_SCALE_OFFSET",
    4: "BLOCK",
    5: "BLOCKWISE_EXPANSION",
    6: "VECTOR",
}
FILLED_MARK = "accdbg_filled_from"


def datatype_name(code: Any) -> str:
    try:
        return DATATYPE_NAMES.get(int(code), f"0x{int(code):04x}")
    except (TypeError, ValueError):
        return str(code)


def datatype_bits(code: int) -> tuple[str, int, bool]:
    """``(class, bits, signed)`` of a data type code: 0x0308 -> ('sfixed', 8, True)."""
    cls = {0: "int", 1: "uint", 2: "float", 3: "sfixed", 4: "ufixed", 5: "bool", 6: "string"}.get(
        (code >> 8) & 0xFF, "other"
    )
    bits = int(f"{code & 0xFF:x}")  # the low byte spells the bit count in hex digits: 0x32 -> 32
    return cls, bits, cls in ("int", "sfixed")


def resolve_qnn_json(path: str | os.PathLike) -> list[Path]:
    """A QNN JSON file, or a folder holding ``model_net.json`` (an inference engine run) or
    the QNN EP's ``QNNExecutionProvider_*.json`` dumps (one per partition)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AccdbgError(f"--input {str(path)!r} does not exist (expected a QNN model_net.json)")
    if p.is_file():
        return [p]
    if (p / "model_net.json").is_file():
        return [p / "model_net.json"]
    dumps = sorted(
        f for f in p.glob("QNNExecutionProvider_*.json") if not f.name.endswith("_tensor_log.json")
    )
    if dumps:
        return dumps
    raise AccdbgError(
        f"--input {str(path)!r} is a folder without model_net.json or QNNExecutionProvider_*.json graph dumps"
    )


def load_qnn_graph(path: str | os.PathLike) -> QnnGraph:
    """Load (and merge, for a folder of EP partitions) QNN graph JSON, checking its schema."""
    files = resolve_qnn_json(path)
    tensors: dict[str, dict] = {}
    nodes: dict[str, dict] = {}
    for f in files:
        data = read_json(f, "--input")
        check_qnn_schema(data, f)
        tensors.update(data["graph"]["tensors"])
        nodes.update(data["graph"].get("nodes") or {})
    return QnnGraph(files[0] if len(files) == 1 else Path(path), tensors, nodes)


def check_qnn_schema(data: Any, path: Path) -> None:
    if isinstance(data, dict) and ("activation_encodings" in data or "param_encodings" in data):
        raise AccdbgError(
            f"--input {str(path)!r} is an AIMET encodings file; pass it as --aimet_encodings_json "
            "and give --input the QNN model_net.json"
        )
    graph = data.get("graph") if isinstance(data, dict) else None
    if not isinstance(graph, dict) or not isinstance(graph.get("tensors"), dict):
        found = (
            ", ".join(map(str, list(data)[:8])) if isinstance(data, dict) else type(data).__name__
        )
        raise AccdbgError(
            f"--input {str(path)!r} is not a QNN graph JSON: expected the keys 'graph' -> 'tensors' "
            f"(and 'nodes') of a model_net.json; found {found or 'nothing'}"
        )
    for name, t in graph["tensors"].items():
        if not isinstance(t, dict):
            raise AccdbgError(f"--input {str(path)!r}: tensor {name!r} is not an object")


def _kind(tensor: dict) -> str:
    return PARAM if tensor.get("type") in STATIC_TYPES else ACTIVATION


def _int_from_float_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def tensor_encoding(name: str, tensor: dict[str, Any]) -> Encoding | None:
    """The encoding of one QNN tensor in AIMET's convention; None when it has none."""
    code = tensor.get("data_type")
    try:
        code = int(code)
    except (TypeError, ValueError):
        return None
    cls, bits, signed = datatype_bits(code)
    src = {
        "qnn_name": name,
        "data_type": datatype_name(code),
        "tensor_type": tensor.get("type"),
        "dims": tensor.get("dims"),
    }
    if tensor.get(FILLED_MARK):
        src["filled_from"] = tensor[FILLED_MARK]
    kind = _kind(tensor)
    if cls == "float":
        return Encoding.float_encoding(name, kind, bits, source=src)
    qp = tensor.get("quant_params") or {}
    if cls not in ("sfixed", "ufixed") or qp.get("definition") != DEFINED:
        return None
    enc = int(qp.get("encoding", 0))
    src["encoding"] = ENCODING_NAMES.get(enc, str(enc))

    def build(scales, qnn_offsets, bw, **kw) -> Encoding:
        """QNN scale/offset lists -> AIMET convention; symmetric = signed storage, offset 0."""
        qnn_offsets = list(qnn_offsets) or [0] * len(scales)
        return Encoding.from_scale_offset(
            name,
            kind,
            scales,
            [qnn_offset_to_aimet(o, bw, signed) for o in qnn_offsets],
            bw,
            is_symmetric=signed and all(int(o) == 0 for o in qnn_offsets),
            source=src,
            **kw,
        )

    try:
        if enc == 0 or (enc == 2 and "bw_scale_offset" not in qp):
            so = qp["scale_offset"]
            return build([so["scale"]], [so["offset"]], bits)
        if enc == 2:
            so = qp["bw_scale_offset"]
            return build([so["scale"]], [so["offset"]], int(so.get("bitwidth", bits)))
        if enc == 1 and "axis_scale_offset" in qp:
            aso = qp["axis_scale_offset"]
            pairs = aso["scale_offsets"]
            return build(
                [p["scale"] for p in pairs],
                [p["offset"] for p in pairs],
                bits,
                axis=int(aso["axis"]),
                enc_type=PER_CHANNEL,
            )
        if enc == 3 and "bw_axis_scale_offset" in qp:
            b = qp["bw_axis_scale_offset"]  # offsets are omitted when all 0
            return build(
                b["scales"],
                b.get("offsets") or [],
                int(b.get("bitwidth", bits)),
                axis=int(b["axis"]),
                enc_type=PER_CHANNEL,
            )
        block = qp.get("blockwise_expansion") or qp.get("block_encoding")
        if enc in (4, 5) and isinstance(block, dict) and block.get("scale_offsets"):
            pairs = block["scale_offsets"]
            return build(
                [p["scale"] for p in pairs],
                [p["offset"] for p in pairs],
                bits,
                axis=block.get("axis"),
                enc_type=PER_BLOCK,
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise AccdbgError(
            f"QNN tensor {name!r}: malformed quant_params ({type(exc).__name__}: {exc}); got {json.dumps(qp)[:200]}"
        ) from None
    # Values this file does not hold: keep what is known (bitwidth, type, channel count).
    unknown = Encoding(
        name=name,
        kind=kind,
        dtype="int",
        bitwidth=bits,
        is_symmetric=None,
        enc_type=PER_CHANNEL if enc in (1, 3) else PER_BLOCK,
        values_known=False,
        source=src,
    )
    so = qp.get("scale_offset")
    dims = tensor.get("dims") or []
    if enc == 1 and isinstance(
        so, dict
    ):  # the EP dump's misprinted axis encoding (module docstring)
        axis, count = _int_from_float_bits(so.get("scale", 0.0)), int(so.get("offset", 0))
        if 0 <= axis < len(dims) and dims[axis] == count:
            unknown.axis = axis
            unknown.source["channels"] = count
    unknown.source["unreadable"] = f"{ENCODING_NAMES.get(enc, enc)} values are not in this JSON" + (
        " (the QNN EP graph dump does not serialize per-channel encodings)"
        if isinstance(so, dict)
        else ""
    )
    return unknown


def qnn_encodings(graph: QnnGraph, include_float: bool = False) -> dict[str, Encoding]:
    """Every quantized tensor's encoding by QNN name (float tensors too, if asked)."""
    out: dict[str, Encoding] = {}
    for name, tensor in graph.tensors.items():
        enc = tensor_encoding(name, tensor)
        if enc is None or (enc.is_float and not include_float):
            continue
        out[name] = enc
    return out


def fill_per_channel_from_qdq(graph_json: dict[str, Any], qdq_model: onnx.ModelProto) -> int:
    """Write ``axis_scale_offset`` into a QNN EP dump's per-channel tensors, in place.

    The EP builds ``<initializer>_quantized`` static tensors straight from the QDQ model's
    DequantizeLinear scale/zero point, so those are the values QNN was given. The axis is the
    one the dump encoded (QNN layout). Returns how many tensors were filled; each is marked
    ``"accdbg_filled_from": "qdq_model"`` so reports can say where the values came from.
    """
    inits = {i.name: i for i in qdq_model.graph.initializer}
    dq_of = {n.input[0]: n for n in qdq_model.graph.node if n.op_type == "DequantizeLinear"}
    filled = 0
    for name, tensor in graph_json.get("graph", {}).get("tensors", {}).items():
        enc = tensor_encoding(name, tensor)
        if enc is None or enc.values_known or enc.axis is None or name not in dq_of:
            continue
        dq = dq_of[name]
        if len(dq.input) < 2 or dq.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32).ravel()
        zp = (
            numpy_helper.to_array(inits[dq.input[2]]).astype(np.int64).ravel()
            if len(dq.input) > 2 and dq.input[2] in inits
            else np.zeros_like(scale, dtype=np.int64)
        )
        if scale.size != enc.source.get("channels"):
            continue
        tensor["quant_params"]["axis_scale_offset"] = {
            "axis": enc.axis,
            "num_scale_offsets": int(scale.size),
            "scale_offsets": [
                {"scale": float(s), "offset": int(-z)} for s, z in zip(scale, zp, strict=True)
            ],
        }
        tensor["quant_params"].pop("scale_offset", None)
        tensor[FILLED_MARK] = "qdq_model"
        filled += 1
    return filled


__all__ = [
    "QnnGraph",
    "datatype_name",
    "fill_per_channel_from_qdq",
    "load_qnn_graph",
    "qnn_encodings",
    "read_json",
    "tensor_encoding",
]
