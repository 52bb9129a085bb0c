"""Which golden tensor each target tensor is compared with.

``tensor_mapping.json`` is ``{inference tensor name: framework tensor name}`` as the inference
engine writes it; the reference also accepts the reverse, so the direction is taken from the
names found in the two folders. Without a mapping, tensors are matched by exact name.
A mapping can also be built from the ONNX model (``-m``): every node output that exists on
both sides, the target name taken as is or as QNN's converters sanitize it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from accdbg.core import onnx_model as om
from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError
from accdbg.mapping.qnn_json import qnn_sanitize

log = logging.getLogger("accdbg.verification")


def load_tensor_mapping(
    path: str | os.PathLike, what: str = "--tensor_mapping"
) -> dict[str, str | None]:
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise AccdbgError(
            f"{what} {str(path)!r} must be a JSON object {{inference name: framework name}}"
        )
    for key, value in data.items():
        if value is not None and not isinstance(value, str):
            raise AccdbgError(
                f"{what} {str(path)!r}: the value for {key!r} must be a tensor name (string) or null, "
                f"got {type(value).__name__}"
            )
    return data


def build_tensor_mapping(
    model_path: str | os.PathLike,
    golden_names: set[str] | list[str],
    target_names: set[str] | list[str],
    framework: str = "onnx",
) -> dict[str, str]:
    """``{target name: golden name}`` for every node output of the model found on both sides."""
    if framework.lower() != "onnx":
        raise AccdbgError(
            f"-f/--framework {framework!r}: building a tensor mapping from -m supports onnx models only"
        )
    model = om.load_model(model_path, "-m/--model_path")
    golden, target = set(golden_names), set(target_names)
    mapping: dict[str, str] = {}
    for node in om.topological_nodes(model.graph):
        for out in node.output:
            if not out or out not in golden:
                continue
            for candidate in (out, qnn_sanitize(out)):
                if candidate in target:
                    mapping[candidate] = out
                    break
    return mapping


@dataclass
class Pairing:
    """Golden/target name pairs to compare; a None side is missing from its folder."""

    pairs: list[tuple[str | None, str | None]]
    golden_only: list[str] = field(default_factory=list)
    target_only: list[str] = field(default_factory=list)


def pair_tensors(
    golden_names: list[str],
    target_names: list[str],
    mapping: dict[str, str | None] | None = None,
) -> Pairing:
    """Mapped pairs first (in either direction), then exact-name matches of the rest."""
    golden, target = set(golden_names), set(target_names)
    pairs: list[tuple[str | None, str | None]] = []
    used_g: set[str] = set()
    used_t: set[str] = set()
    if mapping:
        forward = sum(1 for k, v in mapping.items() if v and k in target and v in golden)
        backward = sum(1 for k, v in mapping.items() if v and k in golden and v in target)
        for key, value in mapping.items():
            if not value:
                continue
            t_name, g_name = (value, key) if backward > forward else (key, value)
            has_t, has_g = t_name in target, g_name in golden
            if not has_t and not has_g:
                continue  # neither side dumped it (e.g. a constant): nothing to say
            if (has_t and t_name in used_t) or (has_g and has_t and (g_name, t_name) in pairs):
                continue
            pairs.append((g_name if has_g else None, t_name if has_t else None))
            used_g.add(g_name)
            used_t.add(t_name)
        if forward == backward == 0:
            log.warning(
                "tensor mapping names no pair found in both folders; matching by exact name"
            )
    for name in target_names:
        if name in golden and name not in used_t and name not in used_g:
            pairs.append((name, name))
            used_g.add(name)
            used_t.add(name)
    return Pairing(
        pairs,
        [n for n in golden_names if n not in used_g],
        [n for n in target_names if n not in used_t],
    )
