"""Every quantized tensor of every variant, checked against its float values.

Weights and biases are the float initializers of the pre-processed model (the values the
quantizer saw), each checked whole. Activations are the float model's own tensors on the
calibration inputs, computed by the framework runner a batch of tensors at a time within a
memory budget and folded into running sums (:mod:`.stats`), so a large model never holds all
its activations at once. Variants whose encodings of a tensor are equal share one computation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from accdbg.algorithms.diagnosis.evidence import WEIGHT_OUT_AXIS
from accdbg.algorithms.quant_checker.grid import Grid
from accdbg.algorithms.quant_checker.stats import ErrorSums, Moments
from accdbg.core.batching import plan_batches
from accdbg.core.inputs import InputTensor
from accdbg.core.progress import Progress
from accdbg.encodings.model import ACTIVATION, Encoding
from accdbg.encodings.qdq import QUANT_SUFFIX
from accdbg.frameworks.base import RunnerOptions, get_runner_class
from accdbg.verifiers.channels import channel_axis

log = logging.getLogger("accdbg.quant_checker")

WEIGHT, BIAS = "weight", "bias"
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
# (op, output-channel axis) -> input-channel axis of its weight: an outlier confined to one
# input channel sits in every output channel, where only the input channels' median shows it
IN_AXIS = {
    ("Conv", 0): 1,
    ("ConvTranspose", 1): 0,
    ("MatMul", -1): -2,
    ("Gemm", 0): 1,
    ("Gemm", 1): 0,
}


@dataclass
class Checked:
    """One tensor: what it is, its distribution, and each variant's grid and error."""

    name: str
    kind: str  # weight / bias / activation
    op_type: str
    node: str
    shape: tuple[int, ...]
    order: int
    ch_axis: int | None = None  # output channels (weights) / channels (activations)
    in_axis: int | None = None  # a weight's input channels
    source: str = ""  # a parameter's float initializer in the pre-processed model
    moments: Moments | None = None
    grids: dict[str, Grid] = field(default_factory=dict)  # variant name -> grid
    errors: dict[str, ErrorSums] = field(default_factory=dict)  # variant name -> sums
    note: str = ""

    def add_grids(self, encs: Mapping[str, Encoding]) -> None:
        """Each variant's grid; variants quantizing identically share one ErrorSums."""
        shared: dict[tuple, ErrorSums] = {}
        for v, enc in encs.items():
            grid = Grid.of(enc, len(self.shape))
            self.grids[v] = grid
            self.errors[v] = shared.setdefault(grid.key, ErrorSums(grid))

    def update(self, x: np.ndarray, chunks: int = 1) -> None:
        x = (
            np.asarray(x, np.float64).reshape(self.shape)
            if self.shape
            else np.asarray(x, np.float64)
        )
        self.moments.update(x, self.ch_axis, chunks, self.in_axis)
        for sums in {id(s): s for s in self.errors.values()}.values():
            sums.update(x, self.ch_axis, self.in_axis)


def _consumers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            out.setdefault(name, []).append((node, i))
    return out


@dataclass
class Role:
    """How a quantized parameter is used: by which node, at which input, along which axes."""

    kind: str
    op_type: str = ""
    node: str = ""
    index: int = -1
    out_axis: int | None = None
    in_axis: int | None = None


def _param_roles(qdq: onnx.ModelProto) -> dict[str, Role]:
    """Each quantized parameter's first consumer (by float name) and what that makes of it."""
    consumers = _consumers(qdq)
    roles: dict[str, Role] = {}
    for dq in qdq.graph.node:
        if dq.op_type != "DequantizeLinear":
            continue
        x = dq.input[0]
        name = x[: -len(QUANT_SUFFIX)] if x.endswith(QUANT_SUFFIX) else x
        for node, i in consumers.get(dq.output[0], []):
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                continue
            kind = BIAS if BIAS_INPUT.get(node.op_type) == i else WEIGHT
            axis = WEIGHT_OUT_AXIS.get(node.op_type) if kind == WEIGHT and i == 1 else None
            if node.op_type == "Gemm" and axis is not None:
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                axis = 0 if trans_b else 1
            in_axis = None if axis is None else IN_AXIS.get((node.op_type, axis))
            roles.setdefault(name, Role(kind, node.op_type, node.name, i, axis, in_axis))
            break
    return roles


def _float_source(
    name: str,
    role: Role,
    inits: Mapping[str, onnx.TensorProto],
    nodes: Mapping[str, onnx.NodeProto],
) -> str | None:
    """The float initializer a parameter was quantized from: itself, or - when the quantizer
    gave each consumer its own copy of a shared initializer (``b`` -> ``b0``, ``b1``) - the
    same input of the same node in the float model."""
    if name in inits:
        return name
    node = nodes.get(role.node)
    if node is not None and 0 <= role.index < len(node.input) and node.input[role.index] in inits:
        return node.input[role.index]
    return None


def catalog(
    prepared: onnx.ModelProto,
    qdq_models: Mapping[str, onnx.ModelProto],
    encodings: Mapping[str, Mapping[str, Encoding]],
    sample_size: int,
    seed: int,
) -> list[Checked]:
    """Every tensor some variant quantizes, in the model's order (activations by producer,
    parameters by first consumer), with each variant's grid."""
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in prepared.graph.initializer}
    producer = {o: (n, k) for k, n in enumerate(prepared.graph.node) for o in n.output}
    first_use: dict[str, int] = {}
    for k, n in enumerate(prepared.graph.node):
        for i in n.input:
            first_use.setdefault(i, k)
    shapes = {
        vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        for vi in [*prepared.graph.input, *prepared.graph.value_info, *prepared.graph.output]
    }
    names = list(dict.fromkeys(n for encs in encodings.values() for n in encs))
    out: list[Checked] = []
    roles = _param_roles(next(iter(qdq_models.values())))
    nodes = {n.name: n for n in prepared.graph.node if n.name}
    for name in names:
        per_variant = {v: encs[name] for v, encs in encodings.items() if name in encs}
        enc = next(iter(per_variant.values()))
        if enc.kind == ACTIVATION:
            node, k = producer.get(name, (None, -1))
            c = Checked(
                name,
                ACTIVATION,
                node.op_type if node is not None else "input",
                node.name if node is not None else "",
                shapes.get(name, ()),
                k,
            )
            c.ch_axis = channel_axis(c.shape, None, c.op_type) if c.shape else None
        else:
            role = roles.get(name, Role(WEIGHT))
            kind, op, node_name, axis, in_axis = (
                role.kind,
                role.op_type,
                role.node,
                role.out_axis,
                role.in_axis,
            )
            source = _float_source(name, role, inits, nodes)
            init = inits.get(source) if source else None
            shape = tuple(init.dims) if init is not None else ()
            c = Checked(name, kind, op, node_name, shape, first_use.get(name, -1))
            pc_axes = [e.axis for e in per_variant.values() if len(e.scale) > 1]
            if pc_axes and pc_axes[0] is not None:
                axis = pc_axes[0]
            if axis is not None and shape:
                axis = axis + len(shape) if axis < 0 else axis
                c.ch_axis = axis if len(shape) >= 2 and shape[axis] > 1 else None
            if in_axis is not None and len(shape) >= 2:
                in_axis = in_axis + len(shape) if in_axis < 0 else in_axis
                c.in_axis = in_axis if shape[in_axis] > 1 else None
            c.source = source or ""
            if init is None:
                c.note = "not an initializer of the float model: not checked"
        c.moments = Moments(sample_size, rng)
        if c.kind == ACTIVATION or not c.note:
            c.add_grids(per_variant)
        out.append(c)
    out.sort(key=lambda c: (c.order, c.kind != ACTIVATION))
    return out


def check_params(prepared: onnx.ModelProto, tensors: Sequence[Checked]) -> None:
    """Weights and biases: each float initializer against every variant's grid."""
    inits = {i.name: i for i in prepared.graph.initializer}
    for c in tensors:
        if c.kind == ACTIVATION or c.source not in inits or c.note:
            continue
        values = numpy_helper.to_array(inits[c.source])
        if values.dtype.kind != "f":
            c.note = f"a {values.dtype} initializer, not float: not checked"
            continue
        c.update(values)


def check_activations(
    prepared_path: Path,
    tensors: Sequence[Checked],
    lines: Sequence[Sequence[InputTensor]],
    memory_budget_mb: float,
    scratch: Path,
) -> int:
    """Activations on every calibration input, streamed; returns the number of runs."""
    acts = {c.name: c for c in tensors if c.kind == ACTIVATION}
    if not acts or not lines:
        return 0
    options = RunnerOptions(scratch_dir=scratch)
    runner = get_runner_class("onnx")(prepared_path, list(lines[0]), options)
    runner.activate()
    try:
        infos = [i for i in runner.tensors() if i.name in acts]
        for line in lines:  # model inputs are activations too
            for t in line:
                if t.name in acts:
                    acts[t.name].update(t.load(), chunks=len(lines))
        for info in infos:
            c = acts[info.name]
            if not c.shape and info.shape:
                c.shape = info.shape
        budget = int(memory_budget_mb * 2**20)
        batches = plan_batches(infos, lambda i: i.nbytes, budget)
        # the run's "checked ... (N float runs)" line ends the stage
        runs = len(batches) * len(lines)
        with Progress("quant checker: activations", runs, "float runs", line=False) as bar:
            for batch in batches:
                for line in lines:
                    values = runner.infer({t.name: t.load() for t in line}, [i.name for i in batch])
                    for info in batch:
                        arr = values.pop(info.name)
                        c = acts[info.name]
                        if tuple(arr.shape) != tuple(c.shape):
                            c.shape = tuple(arr.shape)
                            c.ch_axis = channel_axis(c.shape, None, c.op_type)
                        c.update(arr, chunks=len(lines))
                        del arr
                    del values
                    bar.update()
        missing = [n for n, c in acts.items() if c.moments.n == 0]
        for n in missing:
            acts[n].note = "not computed by the float model: not checked"
        return len(batches) * len(lines)
    finally:
        runner.deactivate()


def finite_or_nan(x: float) -> float:
    return x if isinstance(x, float) and math.isfinite(x) else math.nan
