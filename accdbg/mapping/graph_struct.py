"""The inference graph's layers in execution order (``<model>_graph_struct.json``): its one
reader and writer.

The inference engine writes it (:func:`write_graph_struct`); verification orders the summary
rows and names each row's layer type from it, and the ranking follows each layer's inputs
(:func:`inputs_of`), all through :func:`load_graph_struct`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from accdbg.core.jsonio import read_json
from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError

GRAPH_STRUCT_FORMAT = "accdbg-graph-struct/1"


@dataclass(frozen=True)
class Layer:
    index: int
    name: str
    type: str
    outputs: tuple[str, ...]
    layouts: dict[str, str] = field(default_factory=dict, hash=False)
    inputs: tuple[str, ...] = ()


def load_graph_struct(path: str | os.PathLike, what: str = "--graph_struct") -> list[Layer]:
    """Layers in execution order, from the ``{"layers": [...]}`` file (or a bare list)."""
    data = read_json(path, what)
    items = data.get("layers") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise AccdbgError(
            f'{what} {str(path)!r} is not a graph structure (expected {{"layers": [{{name, type, outputs}}, ...]}})'
        )
    layers = []
    for pos, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("outputs", []), list):
            raise AccdbgError(
                f"{what} {str(path)!r}: layer #{pos} must be an object with a list of outputs"
            )
        layers.append(
            Layer(
                index=int(item.get("index", pos)),
                name=str(item.get("name", "")),
                type=str(item.get("type", "")),
                outputs=tuple(str(o) for o in item.get("outputs", [])),
                layouts=dict(item.get("layouts") or {}),
                inputs=tuple(str(i) for i in item.get("inputs") or []),
            )
        )
    layers.sort(key=lambda layer: layer.index)
    return layers


def execution_order(layers: list[Layer]) -> dict[str, tuple[int, str]]:
    """Tensor name -> (position of its producer, layer type)."""
    order: dict[str, tuple[int, str]] = {}
    for pos, layer in enumerate(layers):
        for out in layer.outputs:
            order.setdefault(out, (pos, layer.type))
    return order


def inputs_of(layers: list[Layer]) -> dict[str, list[str]]:
    """Layer output -> the tensors its layer reads."""
    return {out: list(layer.inputs) for layer in layers for out in layer.outputs}


def write_graph_struct(path: str | os.PathLike, model: str, layers: list[dict]) -> None:
    """``{"format", "model", "layers": [{index, name, type, inputs, outputs, ...}]}``,
    atomically; ``layers`` in execution order."""
    write_json_atomic(
        Path(path), {"format": GRAPH_STRUCT_FORMAT, "model": model, "layers": list(layers)}
    )
