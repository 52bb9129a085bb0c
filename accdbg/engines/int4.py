"""``-wbw 4``: which weights are quantized to int4, as onnxruntime tensor quant overrides.

QNN HTP runs int4 weights on Conv with 1x1 kernels, Gemm, and MatMul with a static 2-D weight
(checked on this host's HTP emulation: a per-tensor int4 Conv weight is refused at session
creation, a per-channel one runs). Those weights get an override keyed by their initializer's
name, ``{"quant_type": QuantType.QInt4, "symmetric": True, "axis": <output channels>}``, so
onnxruntime's quantizer itself writes them as per-channel symmetric int4; every other weight
keeps the run's 8-bit weight type (onnxruntime's ``weight_type``). Nothing is quantized by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import onnx

from accdbg.encodings.htp_int4 import INT4_OPS, int4_axis
from accdbg.errors import AccdbgError

# the ops whose weight initializer (input 1) makes a "weighted layer"
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")

BLOCK_FLAG = "--weight_block_size"


def _qnn_label() -> str:
    try:
        return f"onnxruntime-qnn {metadata.version('onnxruntime-qnn')}"
    except metadata.PackageNotFoundError:
        return "onnxruntime-qnn (not installed)"


def check_block_size(block: int | None, weights_bitwidth: int, act_bitwidth: int) -> None:
    """``--weight_block_size`` needs ``-wbw 4`` and, on this onnxruntime-qnn, ``-abw 16``
    (HTP refuses a block-quantized MatMul with 8-bit activations: checked on its emulation)."""
    if block is None:
        return
    if int(weights_bitwidth) != 4:
        raise AccdbgError(
            f"{BLOCK_FLAG} {block}: blocks are for int4 weights; expected -wbw 4 with it "
            f"(got -wbw {weights_bitwidth})"
        )
    if int(act_bitwidth) != 16:
        raise AccdbgError(
            f"{BLOCK_FLAG} {block}: the installed {_qnn_label()} has no block-quantized int4 "
            f"for QNN HTP with {act_bitwidth}-bit activations; expected -abw 16 with it"
        )


def block_axis(model: onnx.ModelProto, block: int) -> dict[str, int]:
    """The blocked axis (input channels) of each weight for ``--weight_block_size``, or a
    one-line refusal naming the layer. onnxruntime's ``BlockSize`` blocks every weight of the
    model and takes only 2-D ones without a bias; HTP (onnxruntime-qnn 2.7.0, checked on its
    emulation) runs them only on MatMul: a blocked Gemm is refused, a blocked Conv cannot be
    written."""
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = inits[node.input[1]]
        dims = list(w.dims)
        if node.op_type != "MatMul" or len(dims) != 2:
            raise AccdbgError(
                f"{BLOCK_FLAG} {block}: the installed {_qnn_label()} has no block-quantized "
                f"int4 for QNN on {node.op_type} (layer {node.name!r}, weight {w.name!r} "
                f"{dims}); onnxruntime blocks every weight, and HTP runs blocks only on MatMul "
                "with a 2-D weight"
            )
        if dims[0] % block:
            raise AccdbgError(
                f"{BLOCK_FLAG} {block}: layer {node.name!r} has {dims[0]} input channels "
                f"(weight {w.name!r} {dims}), not a multiple of {block}"
            )
        out[w.name] = 0  # [K, N]: blocks along K, one scale per block and output column
    return out


@dataclass
class Int4Plan:
    """The int4 weights of a model: overrides for onnxruntime, and how many layers have them."""

    overrides: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    layers: int = 0  # weighted layers whose weight is int4
    others: int = 0  # weighted layers keeping 8-bit weights

    def line(self, block: int | None = None) -> str:
        blocks = f" in blocks of {block} input channels" if block else ""
        return (
            f"int4 weights{blocks} on {self.layers} layers ({INT4_OPS}); {self.others} other "
            "weighted layers keep 8-bit weights: Qualcomm documents HTP's int4 weights for those only"
        )


def int4_plan(
    model: onnx.ModelProto,
    given: set[str] | frozenset[str] = frozenset(),
    block: int | None = None,
) -> Int4Plan:
    """Which weights of ``model`` become int4 (``given``: tensors whose encodings a ``-qo`` file
    sets, left as given). A weight shared with a layer HTP cannot run in int4 stays 8-bit.
    ``block``: ``--weight_block_size``, every weight blocked along its input channels."""
    from onnxruntime.quantization import QuantType

    float_inits = {
        i.name: i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT
    }
    axes: dict[str, set[int | None]] = {}
    layers: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        w = node.input[1]
        if w not in float_inits:
            continue
        axes.setdefault(w, set()).add(int4_axis(node, float_inits[w]))
        layers.setdefault(w, []).append(node.name)
    if block:
        axes = {w: {a} for w, a in block_axis(model, block).items()}
    plan = Int4Plan()
    for w, found in axes.items():
        axis = next(iter(found))
        if len(found) == 1 and axis is not None and w not in given:
            plan.overrides[w] = [{"quant_type": QuantType.QInt4, "symmetric": True, "axis": axis}]
            plan.layers += len(layers[w])
        else:
            plan.others += len(layers[w])
    return plan


def check_int4_overrides(
    overrides: dict[str, list[dict[str, Any]]], model: onnx.ModelProto, where: str
) -> None:
    """A ``-qo`` 4-bit weight HTP cannot run refused in one line naming the tensor and the op:
    a per-tensor (one-encoding) int4 weight of a Conv is refused by onnxruntime-qnn at session
    creation (checked on its emulation); per channel it runs, as do per-tensor Gemm/MatMul."""
    from onnxruntime.quantization import QuantType

    four = {QuantType.QInt4, QuantType.QUInt4}
    for node in model.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        entries = overrides.get(node.input[1]) or []
        if entries and entries[0].get("quant_type") in four and "axis" not in entries[0]:
            raise AccdbgError(
                f"-qo/--quantization_overrides {where!r}: parameter {node.input[1]!r} has one "
                f"4-bit encoding (per tensor) and feeds Conv {node.name!r}; HTP runs int4 Conv "
                "weights per channel only: give one encoding per output channel"
            )
