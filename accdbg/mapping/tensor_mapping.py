"""Which golden tensor each target tensor is compared with.

``tensor_mapping.json`` is ``{inference tensor name: framework tensor name}`` as the inference
engine writes it; the reference also accepts the reverse, so the direction is taken from the
names found in the two folders. Without a mapping, tensors are matched by exact name.
A mapping can also be built from the ONNX model (``-m``): every node output that exists on
both sides, the target name taken as is or as QNN's converters sanitize it.

This module owns the file: the inference engine builds its mapping with
:func:`map_to_golden` (and :func:`through_conversion` for a converted model) and writes it with
:func:`write_tensor_mapping`; verification and compare encodings read it with
:func:`load_tensor_mapping`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accdbg.core import onnx_model as om
from accdbg.core.jsonio import read_json
from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError
from accdbg.mapping.names import match_key, qnn_sanitize

MAPPING_FILE = "tensor_mapping.json"  # {engine name: framework name}, beside output/
ONNX_MAPPING_FILE = "tensor_mapping_onnx.json"  # the same to ONNX names, for a converted model

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


def write_tensor_mapping(path: str | os.PathLike, mapping: Mapping[str, str | None]) -> Path:
    """Write a ``{inference name: framework name}`` mapping (whole, atomically)."""
    write_json_atomic(Path(path), dict(mapping))
    return Path(path)


def map_to_golden(
    tensors: Iterable[tuple[str, str | None, Sequence[str]]],
    golden_names: set[str] | None,
) -> dict[str, str]:
    """Inference tensor name -> framework tensor name, for ``(name, known framework name,
    candidate names)`` triples: the known name when the float model gave one; else, best
    effort against a golden folder's names, each candidate exact, then equal by
    :func:`~accdbg.mapping.names.match_key`."""
    mapping: dict[str, str] = {}
    by_key = {match_key(n): n for n in (golden_names or set())}
    for name, known, candidates in tensors:
        if known:
            mapping[name] = known
            continue
        if golden_names is None:
            continue
        for cand in candidates:
            if cand in golden_names:
                mapping[name] = cand
                break
            if match_key(cand) in by_key:
                mapping[name] = by_key[match_key(cand)]
                break
    return mapping


def through_conversion(
    onnx_map: Mapping[str, str], framework_names: Mapping[str, str]
) -> dict[str, str]:
    """Engine name -> framework name, composed through a conversion's ONNX -> framework
    names (engine tensors the conversion does not name are left out)."""
    return {k: framework_names[v] for k, v in onnx_map.items() if v in framework_names}


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
