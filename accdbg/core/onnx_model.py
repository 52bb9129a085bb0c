"""ONNX model handling shared by framework diagnosis, the QNN engine and the algorithms.

Loading with clear errors, fixing dynamic input dims, listing node outputs in topological
order, and exposing intermediates as graph outputs. Graph surgery uses onnx's own helpers.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from accdbg.errors import AccdbgError

if TYPE_CHECKING:
    from accdbg.core.inputs import InputTensor

TWO_GIB = 2**31 - 1024


def load_model(path: str | os.PathLike, what: str = "--model_path") -> onnx.ModelProto:
    """Load an ONNX model (external data included) or fail with a one-line reason."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AccdbgError(f"{what} {str(path)!r} does not exist")
    if not p.is_file():
        raise AccdbgError(f"{what} {str(path)!r} is not a file")
    try:
        model = onnx.load(str(p))
    except Exception as exc:  # protobuf raises several unrelated types
        raise AccdbgError(
            f"{what} {str(path)!r} is not a valid ONNX model ({type(exc).__name__}: {exc})"
        ) from None
    if not model.graph.node:
        raise AccdbgError(
            f"{what} {str(path)!r} is not a valid ONNX model (its graph has no nodes)"
        )
    return model


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer}


def constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant-node outputs, by name (not converted: read what you need)."""
    out = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    t = onnx.TensorProto()
                    t.CopyFrom(a.t)
                    t.name = n.output[0]
                    out[n.output[0]] = t
    return out


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old exporters list weights as inputs)."""
    inits = initializer_names(model)
    return [i for i in model.graph.input if i.name not in inits]


def dims_of(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def describe_inputs(model: onnx.ModelProto) -> str:
    parts = []
    for vi in real_inputs(model):
        dims = ",".join("?" if d is None else str(d) for d in dims_of(vi))
        parts.append(f"{vi.name} [{dims}]")
    return ", ".join(parts) or "(none)"


def elem_dtype(vi: onnx.ValueInfoProto) -> np.dtype | None:
    et = vi.type.tensor_type.elem_type
    if not et:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(et))


def check_given_inputs(model: onnx.ModelProto, given: Iterable[InputTensor]) -> None:
    """Each ``-i`` names an input of the model and reads it as the model's element type (a
    file read as float32 for an int32 input would reach onnxruntime as a type error)."""
    inputs = {vi.name: vi for vi in real_inputs(model)}
    for t in given:
        if t.name not in inputs:
            raise AccdbgError(
                f"--input_tensor {t.name!r} is not an input of the model; its inputs are: "
                f"{describe_inputs(model)}"
            )
        want = elem_dtype(inputs[t.name])
        if want is not None and want != t.dtype:
            raise AccdbgError(
                f"--input_tensor {t.name!r} is read as {t.dtype.name}, the model's input is "
                f"{want.name}: give its type ({' '.join(t.record()[:3])} {want.name})"
            )


def check_input_dims(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """The given inputs' dims agree with the model's rank and static dims."""
    by_name = {vi.name: vi for vi in real_inputs(model)}
    for name, dims in shapes.items():
        old = dims_of(by_name[name])
        if old and len(old) != len(dims):
            raise AccdbgError(
                f"--input_tensor {name!r}: dims {','.join(map(str, dims))} have rank {len(dims)}, "
                f"the model expects rank {len(old)} [{','.join('?' if d is None else str(d) for d in old)}]"
            )
        for i, (o, n) in enumerate(zip(old, dims, strict=False)):
            if isinstance(o, int) and o > 0 and o != n:
                raise AccdbgError(
                    f"--input_tensor {name!r}: dim {i} is {n}, the model fixes it to {o} "
                    f"(model input [{','.join('?' if d is None else str(d) for d in old)}])"
                )


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Set the given inputs' dims (dynamic or not), checked first (:func:`check_input_dims`).

    Stale ``value_info`` is dropped so shape inference recomputes it from the fixed dims.
    """
    check_input_dims(model, shapes)
    by_name = {vi.name: vi for vi in real_inputs(model)}
    for name, dims in shapes.items():
        shape = by_name[name].type.tensor_type.shape
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = int(d)
    del model.graph.value_info[:]


def branch_nodes(model: onnx.ModelProto) -> dict[str, int]:
    """The nodes inside each top-level node's subgraphs (If branches, Loop/Scan bodies), by the
    holding node's name: onnxruntime exposes no tensor of a subgraph, and its quantizer leaves
    those nodes in float, so they are neither dumped nor debugged."""

    def count(g: onnx.GraphProto) -> int:
        return sum(1 + sum(count(b) for b in _subgraphs(n)) for n in g.node)

    held = {}
    for i, n in enumerate(model.graph.node):
        inner = sum(count(b) for b in _subgraphs(n))
        if inner:
            held[node_name(n, i)] = inner
    return held


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [
        g
        for a in node.attribute
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))
    ]


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference, tolerant of ops it does not know (custom domains)."""
    try:
        if model.ByteSize() < TWO_GIB:
            return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is a best effort: unknown shapes only cost precision
        pass
    return model


@dataclass(frozen=True)
class TensorInfo:
    """A node output: who made it and what we know of it before running."""

    name: str
    node: str
    op_type: str
    index: int
    dtype: np.dtype | None
    shape: tuple[int, ...] | None

    @property
    def nbytes(self) -> int | None:
        if self.shape is None or self.dtype is None:
            return None
        return int(np.prod(self.shape)) * self.dtype.itemsize


def node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def topological_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in a dependency-respecting order (ONNX requires it, but not every exporter obeys)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            if all(i in available for i in n.input):
                ordered.append(n)
                available.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # a cycle or outer-scope names: keep file order
            ordered.extend(rest)
            break
        pending = rest
    return ordered


def tensor_infos(model: onnx.ModelProto, skip_op_types: Iterable[str] = ()) -> list[TensorInfo]:
    """Every node output in topological order, with dtype/shape where inference knows them."""
    skip = set(skip_op_types)
    known: dict[str, onnx.ValueInfoProto] = {}
    for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]:
        known[vi.name] = vi
    infos: list[TensorInfo] = []
    seen: set[str] = set()
    for i, node in enumerate(topological_nodes(model.graph)):
        if node.op_type in skip:
            continue
        for out in node.output:
            if not out or out in seen:
                continue
            seen.add(out)
            vi = known.get(out)
            dims = dims_of(vi) if vi is not None else []
            shape = (
                tuple(int(d) for d in dims)
                if vi is not None
                and vi.type.tensor_type.HasField("shape")
                and all(isinstance(d, int) for d in dims)
                else None
            )
            infos.append(
                TensorInfo(
                    name=out,
                    node=node_name(node, i),
                    op_type=node.op_type,
                    index=len(infos),
                    dtype=elem_dtype(vi) if vi is not None else None,
                    shape=shape,
                )
            )
    return infos


def with_outputs(
    model: onnx.ModelProto, names: Iterable[str], keep_existing: bool = False
) -> onnx.ModelProto:
    """A copy of the model whose graph outputs are exactly ``names`` (plus the old ones if asked).

    Outputs are added untyped when inference did not type them; onnxruntime fills that in.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    old = [o.name for o in m.graph.output]
    wanted = list(dict.fromkeys([*old, *names] if keep_existing else names))
    infos = _output_infos(m.graph, wanted)
    del m.graph.output[:]
    m.graph.output.extend(infos)
    return m


def _output_infos(graph: onnx.GraphProto, names: Sequence[str]) -> list[onnx.ValueInfoProto]:
    """Graph outputs for ``names``: typed as the graph knows them, else untyped."""
    typed = {vi.name: vi for vi in [*graph.value_info, *graph.output]}
    return [typed[n] if n in typed else onnx.ValueInfoProto(name=n) for n in names]


def _referenced(node: onnx.NodeProto) -> list[str]:
    """The names a node reads, its subgraphs' outer-scope reads included (an If/Loop body
    reads the enclosing graph's tensors by name)."""
    return [*(x for x in node.input if x), *outer_reads(node)]


def outer_reads(node: onnx.NodeProto) -> list[str]:
    """The enclosing graph's tensors a node's subgraphs read by name (not among its inputs),
    nested subgraphs' included: a part cut out of the graph must hold them too."""
    names: list[str] = []
    for g in _subgraphs(node):
        local = {i.name for i in g.input} | {i.name for i in g.initializer}
        local.update(o for n in g.node for o in n.output)
        names += [x for n in g.node for x in _referenced(n) if x not in local]
    return list(dict.fromkeys(names))


def sliced(model: onnx.ModelProto, outputs: Iterable[str]) -> onnx.ModelProto:
    """The part of the model that computes ``outputs``: the nodes they depend on, the graph
    inputs and initializers those read, and ``outputs`` as its only outputs. onnxruntime needs
    every graph input fed, so a run of the part needs only what the part reads."""
    wanted = list(dict.fromkeys(outputs))
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output if o}
    keep: set[int] = set()
    read: set[str] = set()
    stack = list(wanted)
    while stack:
        t = stack.pop()
        if t in read:
            continue
        read.add(t)
        i = producer.get(t)
        if i is not None and i not in keep:
            keep.add(i)
            stack += _referenced(model.graph.node[i])
    # built from the pieces kept, not a copy of the whole model cut down: a big model's
    # weights are not copied once per slice
    g = model.graph
    part = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    part.opset_import.extend(model.opset_import)
    part.functions.extend(model.functions)
    part.graph.name = g.name
    part.graph.node.extend(n for i, n in enumerate(g.node) if i in keep)
    part.graph.input.extend(x for x in g.input if x.name in read)
    part.graph.initializer.extend(x for x in g.initializer if x.name in read)
    part.graph.value_info.extend(x for x in g.value_info if x.name in read)
    part.graph.output.extend(_output_infos(g, wanted))
    return part


def all_tensor_names(model: onnx.ModelProto) -> list[str]:
    names = [i.name for i in model.graph.input]
    for n in model.graph.node:
        names.extend(o for o in n.output if o)
    return names


def check_tensor_names(model: onnx.ModelProto, names: Iterable[str], flag: str) -> None:
    """Each name must be a tensor of the graph; otherwise name the nearest ones."""
    known = all_tensor_names(model)
    known_set = set(known)
    for name in names:
        if name not in known_set:
            near = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f"; near matches: {', '.join(near)}" if near else ""
            raise AccdbgError(f"{flag} {name!r} is not a tensor of the model{hint}")


def serialize(model: onnx.ModelProto, scratch_dir: Path, stem: str = "model") -> bytes | str:
    """Bytes for onnxruntime, or a file path with external data when the model is over 2 GiB."""
    if model.ByteSize() < TWO_GIB:
        return model.SerializeToString()
    scratch_dir.mkdir(parents=True, exist_ok=True)
    path = scratch_dir / f"{stem}.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location=f"{stem}.data")
    return str(path)
