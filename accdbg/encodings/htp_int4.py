"""Where QNN HTP runs int4 weights: Conv with 1x1 kernels, Gemm, and MatMul with a static 2-D
weight (Qualcomm's documented list; per channel - the emulator refuses a per-tensor int4 Conv
weight at session creation). The one answer for the engine's ``-wbw 4``
(:mod:`accdbg.engines.int4`) and the encoding rules (:mod:`accdbg.encodings.rules`)."""

from __future__ import annotations

import onnx

INT4_OPS = "Conv 1x1, Gemm, MatMul"  # as the console says it


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def int4_axis(node: onnx.NodeProto, weight: onnx.TensorProto) -> int | None:
    """The output-channel axis of ``node``'s int4 weight, or None when HTP runs no int4 there
    (a Conv whose kernel is not 1x1 or that is grouped, a ConvTranspose, a weight not 2-D)."""
    dims = list(weight.dims)
    if node.op_type == "Conv":
        one_by_one = len(dims) >= 3 and all(d == 1 for d in dims[2:])
        return 0 if one_by_one and _attr(node, "group", 1) == 1 else None
    if len(dims) != 2:
        return None
    if node.op_type == "Gemm":
        return 0 if _attr(node, "transB", 0) else 1
    if node.op_type == "MatMul":
        return 1  # [K, N]: one scale per output column
    return None
