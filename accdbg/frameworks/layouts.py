"""Tensor layouts, and how an ONNX tensor lines up with its framework tensor.

TFLite and TensorFlow activations are NHWC; converters to ONNX move 4-D activations to NCHW
where the ONNX operators need it and leave them NHWC elsewhere. Which one a given ONNX tensor
is cannot be told from its shape alone when H, W and C coincide, so layouts are propagated
through the ONNX graph from the inputs (channel-first operators make NCHW, Transpose permutes,
element-wise operators pass it on), and the shapes then confirm the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from accdbg.core import onnx_model as om
from accdbg.core.onnx_model import TensorInfo

NHWC = "NHWC"
NCHW = "NCHW"


@dataclass(frozen=True)
class LaidOutTensorInfo(TensorInfo):
    """A framework tensor with its own layout and manifest extras (e.g. quantization)."""

    layout: str | None = None
    extra: dict = field(default_factory=dict, hash=False, compare=False)


def permutation(src: str, dst: str) -> tuple[int, ...]:
    """Axes such that ``np.transpose(t, perm)`` turns a ``src``-laid tensor into ``dst``."""
    return tuple(src.index(axis) for axis in dst)


# ONNX operators whose 4-D data is NCHW by definition
_CHANNEL_FIRST = {
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool",
    "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "BatchNormalization",
    "InstanceNormalization", "LRN", "DepthToSpace", "SpaceToDepth", "MaxUnpool", "RoiAlign",
}  # fmt: skip
# ONNX operators whose output has the layout of their (first 4-D) data input
_LAYOUT_PRESERVING = {
    "Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu",
    "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Erf",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Sqrt", "Exp", "Log",
    "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Cast", "Identity",
    "Dropout", "Where", "Pad", "Concat", "Split", "Slice", "Resize", "Upsample",
    "QuantizeLinear", "DequantizeLinear", "Softmax", "LogSoftmax",
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL2",
}  # fmt: skip


def onnx_layouts(model: onnx.ModelProto, input_layouts: Mapping[str, str | None]) -> dict[str, str]:
    """Known layouts of the model's 4-D tensors, propagated from the inputs' layouts."""
    ranks = _ranks(model)
    layouts: dict[str, str] = {k: v for k, v in input_layouts.items() if v}
    for node in om.topological_nodes(model.graph):
        outs = [o for o in node.output if o and ranks.get(o) == 4]
        if not outs:
            continue
        layout: str | None = None
        if node.op_type in _CHANNEL_FIRST:
            layout = NCHW
        elif node.op_type == "Transpose":
            src = layouts.get(node.input[0])
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if src and perm and len(perm) == 4:
                layout = "".join(src[p] for p in perm)
        elif node.op_type in _LAYOUT_PRESERVING:
            layout = next((layouts[i] for i in node.input if i in layouts), None)
        if layout:
            for o in outs:
                layouts[o] = layout
    return layouts


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    ranks: dict[str, int] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Fully known shapes of the model's tensors (after shape inference)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = om.dims_of(vi)
        if vi.type.tensor_type.HasField("shape") and all(
            isinstance(d, int) and d > 0 for d in dims
        ):
            shapes[vi.name] = tuple(int(d) for d in dims)
    return shapes


def align(
    onnx_shape: Sequence[int] | None,
    onnx_layout: str | None,
    fw_shape: Sequence[int] | None,
    fw_layout: str | None,
) -> tuple[int, ...] | None:
    """The permutation taking the ONNX tensor to the framework tensor's layout, or None when
    their shapes cannot be the same tensor. Identity is ``()``."""
    candidates: list[tuple[int, ...]] = []
    if onnx_layout and fw_layout and len(onnx_layout) == len(fw_layout):
        candidates.append(permutation(onnx_layout, fw_layout))  # what propagation says
    candidates.append(tuple(range(len(fw_shape or onnx_shape or ()))))
    if fw_layout == NHWC:
        candidates.append(permutation(NCHW, NHWC))  # the converter's usual move
    if onnx_shape is None or fw_shape is None:  # nothing to confirm with: trust propagation
        return _identity_as_empty(candidates[0])
    for perm in candidates:
        if len(perm) == len(onnx_shape) == len(fw_shape):
            if tuple(onnx_shape[p] for p in perm) == tuple(fw_shape):
                return _identity_as_empty(perm)
    return None


def _identity_as_empty(perm: tuple[int, ...]) -> tuple[int, ...]:
    return () if perm == tuple(range(len(perm))) else perm
