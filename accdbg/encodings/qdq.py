"""Export the encodings of a QDQ ONNX model as an AIMET encodings file.

Every quantized tensor of a QDQ model goes through a ``DequantizeLinear``; its scale and zero
point are the encoding (converted to AIMET's offset by :mod:`accdbg.encodings.model`).
Tensors are named as in the float model, so the file can be given back as
``--quantization_overrides`` when the float model is quantized again:

* a parameter is the DequantizeLinear's initializer input; onnxruntime's quantizer names it
  ``<float initializer>_quantized``, and that suffix is removed;
* an activation is the input of the QuantizeLinear feeding the DequantizeLinear, except for
  graph outputs, which onnxruntime renames ``<output>_QuantizeLinear_Input`` and restores as
  the DequantizeLinear's output; the graph output's name is used then.

A tensor quantized twice with different encodings (a mixed-precision "convert") keeps the
first one (its producer's); the others are logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from accdbg.core.onnx_model import constants, load_model
from accdbg.core.run_dir import write_json_atomic
from accdbg.encodings.aimet import aimet_dict
from accdbg.encodings.model import ACTIVATION, PARAM, PER_BLOCK, Encoding, offset_from_zero_point
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.encodings")

QUANT_SUFFIX = "_quantized"  # onnxruntime.quantization's TENSOR_NAME_QUANT_SUFFIX
# ONNX quantized element types -> (bits, signed)
QTYPES = {
    TensorProto.UINT8: (8, False),
    TensorProto.INT8: (8, True),
    TensorProto.UINT16: (16, False),
    TensorProto.INT16: (16, True),
    TensorProto.INT32: (32, True),
    TensorProto.UINT4: (4, False),
    TensorProto.INT4: (4, True),
}


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def qdq_encodings(model: onnx.ModelProto | str | os.PathLike) -> dict[str, Encoding]:
    """The encoding of every quantized tensor of a QDQ model, by float tensor name."""
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model, "QDQ model")
    consts = constants(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    found: dict[str, Encoding] = {}
    nodes = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    nodes += [
        n for n in model.graph.node if n.op_type == "QuantizeLinear"
    ]  # Q without a DQ: graph outputs
    dq_inputs = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    for node in nodes:
        if node.op_type == "QuantizeLinear" and node.output[0] in dq_inputs:
            continue
        enc = _node_encoding(node, consts, producer, outputs)
        if enc is None:
            continue
        old = found.get(enc.name)
        if old is None:
            found[enc.name] = enc
        elif (old.scale, old.offset, old.bitwidth) != (enc.scale, enc.offset, enc.bitwidth):
            log.warning(
                "tensor %r is quantized twice with different encodings (%s, %s); exporting the first",
                enc.name,
                _short(old),
                _short(enc),
            )
    if not found:
        raise AccdbgError(
            "the model has no QuantizeLinear/DequantizeLinear nodes with constant scale and "
            "zero point: not a QDQ model"
        )
    return found


def _short(e: Encoding) -> str:
    return f"scale {e.scale[0]:.6g} offset {e.offset[0]} bw {e.bitwidth}"


def _node_encoding(node, consts, producer, outputs) -> Encoding | None:
    x = node.input[0]
    if len(node.input) < 2 or node.input[1] not in consts:
        log.warning(
            "%s %r: scale %r is not a constant; skipped",
            node.op_type,
            node.name,
            node.input[1] if len(node.input) > 1 else "",
        )
        return None
    scale = numpy_helper.to_array(consts[node.input[1]]).astype(np.float32)
    has_zp = len(node.input) > 2 and node.input[2] in consts
    zp_proto = consts[node.input[2]] if has_zp else None
    if zp_proto is not None:
        qtype = zp_proto.data_type
    elif node.op_type == "DequantizeLinear" and x in consts:
        qtype = consts[x].data_type
    else:
        qtype = _attr(node, "output_dtype", 0) or TensorProto.UINT8
    if qtype not in QTYPES:
        log.warning(
            "%s %r: quantized type %s is not an integer type; skipped",
            node.op_type,
            node.name,
            TensorProto.DataType.Name(qtype),
        )
        return None
    bits, signed = QTYPES[qtype]
    zp = (
        numpy_helper.to_array(zp_proto).astype(np.int64)
        if zp_proto is not None
        else np.zeros(scale.shape, np.int64)
    )
    if node.op_type == "DequantizeLinear" and x in consts:
        kind = PARAM
        name = (
            x[: -len(QUANT_SUFFIX)]
            if x.endswith(QUANT_SUFFIX) and len(x) > len(QUANT_SUFFIX)
            else x
        )
        dims = list(consts[x].dims)
    else:
        kind = ACTIVATION
        if node.op_type == "DequantizeLinear":
            q = producer.get(x)
            src = q.input[0] if q is not None and q.op_type == "QuantizeLinear" else x
            name = node.output[0] if node.output[0] in outputs else src
        else:
            name = x
        dims = None
    scale_l = scale.ravel()
    zp_l = np.broadcast_to(zp.ravel(), scale_l.shape) if zp.size == 1 else zp.ravel()
    block = _attr(node, "block_size", 0) or None
    axis = int(_attr(node, "axis", 1)) if scale_l.size > 1 else None
    if axis is not None and axis < 0 and dims:
        axis += len(dims)
    offsets = [offset_from_zero_point(int(z), bits, signed) for z in zp_l]
    return Encoding.from_scale_offset(
        name,
        kind,
        scale_l,
        offsets,
        bits,
        is_symmetric=bool(signed and not np.any(zp_l)),
        axis=axis,
        enc_type=PER_BLOCK if block else None,
        block_size=block,
        source={"onnx_type": TensorProto.DataType.Name(qtype), "node": node.name},
    )


def export_qdq_encodings(
    model_path: str | os.PathLike,
    out_path: str | os.PathLike,
    version: str = "0.6.1",
    overwrite: bool = False,
    shown_as: tuple[str | os.PathLike, str | os.PathLike] | None = None,
) -> Path:
    """Write the QDQ model's encodings as an AIMET file; returns its path. Never overwrites by
    default. ``shown_as``: the (model, file) paths the log line names instead (where a run
    folder being written will be once finished)."""
    out = Path(out_path).expanduser()
    if out.exists() and not overwrite:
        raise AccdbgError(f"output {str(out)!r} already exists; choose another -o or remove it")
    if not out.parent.is_dir():
        raise AccdbgError(f"output folder {str(out.parent)!r} does not exist")
    encs = qdq_encodings(model_path)
    # a non-finite constant (a -inf mask) gets an infinite scale from onnxruntime's quantizer:
    # no AIMET file can hold it, and QNN computes that tensor from its own encoding anyway
    infinite = [
        n
        for n, e in encs.items()
        if not e.is_float
        and not np.isfinite(np.concatenate([e.scale, e.min, e.max]).astype(np.float64)).all()
    ]
    if infinite:
        log.warning(
            "%d encoding(s) not exported, not finite (a constant -inf or +inf): %s",
            len(infinite),
            ", ".join(infinite[:5]),
        )
        encs = {n: e for n, e in encs.items() if n not in infinite}
    doc = aimet_dict(encs.values(), version)
    write_json_atomic(out, doc)
    n_par = sum(e.kind == PARAM for e in encs.values())
    log.info(
        "exported %d encodings (%d params, %d activations) of %s to %s",
        len(encs),
        n_par,
        len(encs) - n_par,
        *(shown_as or (model_path, out)),
    )
    return out


# the ops whose input 1 is the layer's weight (what a weight_bitwidth column reports)
WEIGHT_INPUT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


OUTPUT_RENAMED = "_QuantizeLinear_Input"  # what onnxruntime's quantizer renames a graph output


def weight_bitwidths(model: onnx.ModelProto | str | os.PathLike) -> dict[str, int]:
    """Each weighted layer's weight bitwidth in a QDQ model, by the layer's output names:
    the storage type of the DequantizeLinear giving its weight (input 1) from an
    initializer (int4/uint4 -> 4, int8/uint8 -> 8, int16/uint16 -> 16). A float weight, or a
    weight computed at run time, has no entry."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    bits_of = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            qtype = QTYPES.get(inits[node.input[0]])
            if qtype is not None:
                bits_of[node.output[0]] = qtype[0]
    out = {}
    for node in model.graph.node:
        if node.op_type in WEIGHT_INPUT_OPS and len(node.input) > 1 and node.input[1] in bits_of:
            for name in node.output:
                if name:  # a graph output is renamed <output>_QuantizeLinear_Input
                    out[name] = out[name.removesuffix(OUTPUT_RENAMED)] = bits_of[node.input[1]]
    return out


@dataclass(frozen=True)
class InputQuantizer:
    """A graph input's QuantizeLinear (per tensor): what the backend is fed. onnxruntime runs
    a Q that reads a graph input on the CPU (the QNN EP does not take it), so these integers,
    rounded half to even and saturated, are exactly what QNN receives."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int

    @property
    def range(self) -> tuple[float, float]:
        return (self.qmin - self.zero_point) * self.scale, (
            self.qmax - self.zero_point
        ) * self.scale

    def fake_quant(self, x: np.ndarray) -> np.ndarray:
        """The input as the quantized model sees it, dequantized (float64)."""
        q = np.clip(np.rint(np.asarray(x, np.float64) / self.scale) + self.zero_point,
                    self.qmin, self.qmax)  # fmt: skip
        return (q - self.zero_point) * self.scale

    def clipped(self, x: np.ndarray) -> float:
        """The share of ``x`` outside the encoding's range (rounding to its ends is none)."""
        v = np.asarray(x, np.float64)
        if not v.size:
            return 0.0
        lo, hi = self.range
        half = self.scale / 2
        return float(np.mean((v < lo - half) | (v > hi + half)))


def input_quantizers(model: onnx.ModelProto) -> dict[str, InputQuantizer]:
    """Each graph input a QuantizeLinear reads directly, with a finite per-tensor encoding."""
    inputs = {i.name for i in model.graph.input}
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, InputQuantizer] = {}
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] not in inputs or len(q.input) < 3:
            continue
        if q.input[1] not in inits or q.input[2] not in inits:
            continue
        scale = numpy_helper.to_array(inits[q.input[1]]).ravel()
        zp = numpy_helper.to_array(inits[q.input[2]])
        if scale.size != 1 or not np.isfinite(scale[0]) or scale[0] <= 0:
            continue
        info = np.iinfo(zp.dtype)
        out[q.input[0]] = InputQuantizer(
            float(scale[0]), int(zp.ravel()[0]), int(info.min), int(info.max)
        )
    return out
