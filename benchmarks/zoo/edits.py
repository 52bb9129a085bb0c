"""Exact edits of a float model: change one channel of a tensor, compensate in its consumers.

A compensated fault changes how a tensor is distributed over its channels without changing
what the model computes. Two ways to change channel ``c`` of a tensor ``T`` exactly:

* **through its layer** (:class:`Source` with ``layer``): ``T = h(a*y + b)`` where ``y`` is a
  Conv/Gemm/MatMul output, ``a*y + b`` the per-channel affine ops after it (BatchNormalization,
  Mul/Add/Sub/Div by constants, PP-LCNet's learnable affine blocks) and ``h`` an optional Relu.
  Scaling ``T``'s channel by ``f`` = scaling the layer's weights of that channel by ``f`` and
  putting ``(f-1)*b`` back at the first additive slot; an offset ``B`` = ``B`` at that slot.
* **at an elementwise op** (``elementwise``): ``T = x * m`` or ``x / d`` (e.g. the ``/6`` of a
  hardswish) or ``x + k`` with a constant: that constant becomes per-channel.

Consumers then undo it: a Conv/Gemm/MatMul reading ``T`` (possibly through Relu, MaxPool,
Resize..., which commute with a positive scale) divides its input-channel weights by ``f``;
an offset is undone in a 1x1 unpadded Conv's (or a dense layer's) bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from benchmarks.zoo.graph import Graph, Layer, attr, layer_of

# ops a positive channel scale passes through unchanged (positively homogeneous, per channel)
SCALE_PASS = ("Relu", "MaxPool", "Resize", "Identity", "Dropout", "PRelu")
AFFINE = ("Mul", "Add", "Sub", "Div")


class NotEligible(Exception):
    """The site cannot carry this fault exactly."""


def per_channel(value: np.ndarray, rank: int, axis: int, channels: int) -> np.ndarray | None:
    """A constant as a vector over channels, if it broadcasts as a per-channel constant."""
    shape = (1,) * (rank - value.ndim) + tuple(value.shape)
    if len(shape) != rank:
        return None
    for i, d in enumerate(shape):
        if i != axis and d != 1:
            return None
    if shape[axis] not in (1, channels):
        return None
    flat = value.reshape(-1)
    return np.broadcast_to(flat[:1] if shape[axis] == 1 else flat, (channels,)).astype(np.float64)


def channel_shaped(vec: np.ndarray, rank: int, axis: int) -> np.ndarray:
    shape = [1] * rank
    shape[axis] = vec.shape[0]
    return vec.reshape(shape)


@dataclass
class Source:
    """How channel values of ``tensor`` are changed exactly (see the module docstring)."""

    tensor: str
    rank: int
    axis: int
    channels: int
    layer: Layer | None = None
    ops: list[onnx.NodeProto] = field(default_factory=list)  # affine ops, layer -> tensor
    relu: bool = False
    elementwise: onnx.NodeProto | None = None

    @property
    def rows(self) -> list[str]:
        """Tensors that carry the changed channel, first to last (what a ranking may name)."""
        if self.layer is None:
            return [self.tensor]
        out = [self.layer.node.output[0]] + [n.output[0] for n in self.ops]
        if self.relu:
            out.append(self.tensor)
        return out

    @property
    def site(self) -> str:
        return (self.layer.node if self.layer else self.elementwise).name


def _const_operand(g: Graph, node: onnx.NodeProto) -> tuple[int, str] | None:
    """(index of the variable input, constant input) of a binary op with one constant."""
    if len(node.input) != 2:
        return None
    a, b = (g.is_const(i) for i in node.input)
    if a == b:
        return None
    return (1, node.input[0]) if a else (0, node.input[1])


def find_source(g: Graph, tensor: str, rank: int, axis: int, channels: int) -> Source:
    """How to change ``tensor``'s channels exactly, or NotEligible."""
    src = Source(tensor, rank, axis, channels)
    t = tensor
    node = g.producer.get(t)
    if node is not None and node.op_type == "Relu" and g.sole_consumer(node.input[0]) is node:
        src.relu, t = True, node.input[0]
        node = g.producer.get(t)
    ops: list[onnx.NodeProto] = []
    while node is not None:
        layer = layer_of(g, node) if node.op_type in ("Conv", "Gemm", "MatMul") else None
        if layer is not None:
            if layer.kind == "dense" and axis != rank - 1:
                break
            w_out = g.const(layer.weight).shape[layer.out_axis]
            if w_out != channels:
                break
            src.layer, src.ops = layer, ops[::-1]
            return src
        if node.op_type == "BatchNormalization":
            if not all(g.private_const(i) for i in node.input[1:5]) or axis != 1:
                break
            nxt = node.input[0]
        elif node.op_type in AFFINE:
            co = _const_operand(g, node)
            if co is None or (node.op_type in ("Sub", "Div") and co[0] != 0):
                break
            if not g.private_const(co[1]):
                break
            if per_channel(g.const(co[1]), rank, axis, channels) is None:
                break
            nxt = node.input[co[0]]
        elif node.op_type == "Identity":
            nxt = node.input[0]
        else:
            break
        if g.sole_consumer(nxt) is not node:
            break
        ops.append(node)
        t = nxt
        node = g.producer.get(t)
    # at an elementwise op producing the tensor itself
    node = g.producer.get(tensor)
    if node is not None and node.op_type in AFFINE:
        co = _const_operand(g, node)
        if (
            co is not None
            and not (node.op_type in ("Sub", "Div") and co[0] != 0)
            and g.private_const(co[1])
            and per_channel(g.const(co[1]), rank, axis, channels) is not None
        ):
            return Source(tensor, rank, axis, channels, elementwise=node)
    raise NotEligible(f"no exact way to change the channels of {tensor}")


def _affine(g: Graph, src: Source) -> tuple[np.ndarray, np.ndarray, list[tuple[str, np.ndarray]]]:
    """``T_lin = a*y + b`` per channel, and the additive slots after ``y`` with the factor
    their constant is multiplied by on its way to ``T``: [(slot kind, factor)]."""
    c = src.channels
    a, b = np.ones(c), np.zeros(c)
    slots: list[tuple[onnx.NodeProto, np.ndarray]] = []
    for n in src.ops:
        if n.op_type == "BatchNormalization":
            gamma, beta, mean, var = (g.const(i).astype(np.float64) for i in n.input[1:5])
            s = gamma / np.sqrt(var + float(attr(n, "epsilon", 1e-5)))
            a, b = a * s, b * s + (beta - mean * s)
            slots.append((n, np.ones(c)))
            for i in range(len(slots) - 1):
                slots[i] = (slots[i][0], slots[i][1] * s)
            continue
        if n.op_type == "Identity":  # passes y as it is
            continue
        _, name = _const_operand(g, n)
        k = per_channel(g.const(name), src.rank, src.axis, c)
        if n.op_type == "Mul":
            a, b, mult = a * k, b * k, k
        elif n.op_type == "Div":
            a, b, mult = a / k, b / k, 1.0 / k
        else:
            b = b + k if n.op_type == "Add" else b - k
            slots.append((n, np.ones(c)))
            continue
        slots = [(s_, f * mult) for s_, f in slots]
    return a, b, slots


def _add_at_slot(g: Graph, src: Source, delta_t: np.ndarray, a: np.ndarray, slots) -> None:
    """Add ``delta_t`` (per channel, at T before the Relu) through the first additive slot."""
    if not np.any(delta_t):
        return
    layer = src.layer
    node = layer.node
    if node.op_type in ("Conv", "Gemm"):
        if layer.bias is None:
            layer.bias = _new_bias(g, node, src.channels)
        bias = g.const(layer.bias).astype(np.float64)
        g.set_const(layer.bias, bias + delta_t / a)
        return
    if not slots:
        raise NotEligible(f"{node.name}: no bias to carry a channel offset")
    slot, factor = slots[0]
    if slot.op_type == "BatchNormalization":
        beta = g.const(slot.input[2]).astype(np.float64)
        g.set_const(slot.input[2], beta + delta_t / factor)
        return
    _, name = _const_operand(g, slot)
    k = per_channel(g.const(name), src.rank, src.axis, src.channels)
    k = k + delta_t / factor if slot.op_type == "Add" else k - delta_t / factor
    _replace_const(g, name, channel_shaped(k, src.rank, src.axis))


def _new_bias(g: Graph, node: onnx.NodeProto, channels: int) -> str:
    """A zero bias input for a Conv/Gemm that has none."""
    name = g.add_init(f"{node.name}__zoo_bias", np.zeros(channels, np.float32))
    if len(node.input) == 2:
        node.input.append(name)
    else:
        node.input[2] = name
    g.refresh()
    return name


def _replace_const(g: Graph, name: str, value: np.ndarray) -> None:
    """Give a constant a new value and shape (scalar -> per channel)."""
    value = value.astype(np.float32)
    tensor = onnx.numpy_helper.from_array(value, name)
    if name in g.inits:
        g.inits[name].CopyFrom(tensor)
    else:
        for a_ in g.constant_nodes[name].attribute:
            if a_.name == "value":
                a_.t.CopyFrom(tensor)


def scale_channels(g: Graph, src: Source, f: np.ndarray) -> None:
    """Multiply channel ``i`` of ``src.tensor`` by ``f[i] > 0``, exactly."""
    if src.elementwise is not None:
        n = src.elementwise
        _, name = _const_operand(g, n)
        k = per_channel(g.const(name), src.rank, src.axis, src.channels)
        if n.op_type == "Mul":
            k = k * f
        elif n.op_type == "Div":
            k = k / f
        else:
            raise NotEligible(f"{n.name}: an Add/Sub of a constant cannot scale a channel")
        _replace_const(g, name, channel_shaped(k, src.rank, src.axis))
        return
    layer = src.layer
    a, b, slots = _affine(g, src)
    w = g.const(layer.weight).astype(np.float64)
    shape = [1] * w.ndim
    shape[layer.out_axis] = -1
    g.set_const(layer.weight, w * f.reshape(shape))
    if layer.bias is not None and layer.node.op_type in ("Conv", "Gemm"):
        g.set_const(layer.bias, g.const(layer.bias).astype(np.float64) * f)
    # y is now f*y, so T_lin = f*(a*y) + b: the missing (f-1)*b goes in at an additive slot
    # (a MatMul's bias is an Add among the affine ops, part of b)
    _add_at_slot(g, src, (f - 1.0) * b, a, slots)


def offset_channels(g: Graph, src: Source, delta: np.ndarray) -> None:
    """Add ``delta[i]`` to channel ``i`` of ``src.tensor``, exactly (no Relu may follow)."""
    if src.relu:
        raise NotEligible(f"{src.tensor}: an offset does not pass a Relu")
    if src.elementwise is not None:
        n = src.elementwise
        if n.op_type not in ("Add", "Sub"):
            raise NotEligible(f"{n.name}: a {n.op_type} cannot carry an offset")
        _, name = _const_operand(g, n)
        k = per_channel(g.const(name), src.rank, src.axis, src.channels)
        k = k + delta if n.op_type == "Add" else k - delta
        _replace_const(g, name, channel_shaped(k, src.rank, src.axis))
        return
    a, _, slots = _affine(g, src)
    _add_at_slot(g, src, delta, a, slots)


# ---------------------------------------------------------------- consumers


@dataclass
class Reach:
    """Where a tensor's channels end up: the layers reading them, and what passes them on."""

    consumers: list[Layer]
    through: list[str]  # outputs of pass-through ops between the tensor and its consumers


def _consumer_ok(g: Graph, layer: Layer | None, t: str, offset: bool) -> bool:
    if layer is None or layer.node.input[0] != t or t in layer.node.input[1:]:
        return False
    if layer.kind == "conv" and offset:
        return False
    if offset and layer.node.op_type == "Conv":
        pads = attr(layer.node, "pads", [0, 0, 0, 0])
        auto = attr(layer.node, "auto_pad", b"NOTSET")
        if any(pads) or auto not in (b"NOTSET", b"VALID", "NOTSET", "VALID"):
            return False
        if g.const(layer.weight).shape[2:] != (1, 1):
            return False
    if offset and layer.kind == "dense" and layer.bias is None:
        return False
    return True


def reach(
    g: Graph, tensor: str, offset: bool = False, shapes: dict[str, tuple] | None = None
) -> Reach:
    """The layers consuming ``tensor`` that can undo a channel change, or NotEligible.

    A scale passes the positively homogeneous ops of SCALE_PASS; an offset passes an ``Add``
    of two same-shaped tensors (a residual connection: the sum carries the same offset), which
    needs ``shapes``.
    """
    consumers: list[Layer] = []
    through: list[str] = []
    todo = [tensor]
    while todo:
        t = todo.pop()
        if t in g.outputs:
            raise NotEligible(f"{t} is a model output")
        users = g.consumers.get(t, [])
        if not users:
            raise NotEligible(f"{t} has no consumer")
        for n in users:
            layer = layer_of(g, n) if n.op_type in ("Conv", "Gemm", "MatMul") else None
            if _consumer_ok(g, layer, t, offset):
                consumers.append(layer)
            elif not offset and n.op_type in SCALE_PASS and n.input[0] == t:
                if n.op_type == "Resize" and attr(n, "mode", b"nearest") not in (
                    b"nearest",
                    b"linear",
                ):
                    raise NotEligible(f"{n.name}: Resize mode {attr(n, 'mode')}")
                through.append(n.output[0])
                todo.append(n.output[0])
            elif offset and _residual_add(g, n, t, shapes):
                if n.output[0] not in through:
                    through.append(n.output[0])
                    todo.append(n.output[0])
            else:
                raise NotEligible(f"{n.name} ({n.op_type}) reads {t} and cannot undo the change")
    if len({id(c.node) for c in consumers}) != len(consumers):
        raise NotEligible(f"a layer reads {tensor} twice")
    return Reach(consumers, through)


def _residual_add(g: Graph, n: onnx.NodeProto, t: str, shapes) -> bool:
    if n.op_type != "Add" or len(n.input) != 2 or shapes is None:
        return False
    a, b = n.input
    if g.is_const(a) or g.is_const(b) or a == b:
        return False
    return shapes.get(a) is not None and shapes.get(a) == shapes.get(b) == shapes.get(n.output[0])


def undo_scale(g: Graph, layer: Layer, f: np.ndarray, first: int = 0) -> None:
    """The consumer divides its weights of input channels ``first..first+len(f)`` by ``f``."""
    w = g.const(layer.weight).astype(np.float64)
    idx = np.arange(first, first + len(f))
    axis = layer.out_axis if layer.kind == "depthwise" else layer.in_axis
    sl = [slice(None)] * w.ndim
    sl[axis] = idx
    shape = [1] * w.ndim
    shape[axis] = -1
    w[tuple(sl)] = w[tuple(sl)] / f.reshape(shape)
    g.set_const(layer.weight, w)


def undo_offset(g: Graph, layer: Layer, delta: np.ndarray) -> None:
    """The consumer subtracts what the offset adds: bias -= W @ delta (1x1, no padding)."""
    w = g.const(layer.weight).astype(np.float64)
    if layer.kind == "depthwise":
        correction = w.reshape(w.shape[0], -1)[:, 0] * delta
    elif layer.node.op_type == "Conv":
        correction = w[:, :, 0, 0] @ delta
    else:
        correction = np.moveaxis(w, layer.in_axis, 1) @ delta
    if layer.bias is None:
        layer.bias = _new_bias(g, layer.node, correction.shape[0])
    if layer.node.op_type == "MatMul":  # bias in the Add after it
        bias = per_channel(g.const(layer.bias), 1, 0, correction.shape[0])
        _replace_const(g, layer.bias, bias - correction)
    else:
        g.set_const(layer.bias, g.const(layer.bias).astype(np.float64) - correction)
