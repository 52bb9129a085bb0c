"""The inference graph's layers in execution order (``<model>_graph_struct.json``).

Verification uses it to order the summary rows and to name each row's layer type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError

GRAPH_STRUCT_FORMAT = "accdbg-graph-struct/1"


@dataclass(frozen=True)
class Layer:
    index: int
    name: str
    type: str
    outputs: tuple[str, ...]
    layouts: dict[str, str] = field(default_factory=dict, hash=False)


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
