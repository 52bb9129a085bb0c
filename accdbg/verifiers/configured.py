"""The verifiers one run applies: resolved from ``--default_verifier`` specs and
``--verifier_config``, each with its column label and the tensors it runs on.

Its own module because verification, its aggregation over inputs and dataset mode all need
the same resolved list, and it is checked before any run starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError
from accdbg.verifiers import get_verifier, make_verifier
from accdbg.verifiers.base import Verifier


@dataclass
class ConfiguredVerifier:
    """A verifier, its column label, and the tensors it runs on (None: every tensor)."""

    verifier: Verifier
    label: str
    tensors: list[list[str]] | None = None


def load_verifier_config(path: str | os.PathLike) -> list[tuple[Verifier, list[list[str]]]]:
    """``{"TopK": {"parameters": {...}, "tensors": [["a"], ["b"]]}, ...}`` -> verifiers."""
    what = f"--verifier_config {str(path)!r}"
    data = read_json(path, "--verifier_config")
    if not isinstance(data, dict):
        raise AccdbgError(f"{what} must be a JSON object keyed by verifier name")
    out = []
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise AccdbgError(
                f'{what}: {name!r} must map to {{"parameters": {{...}}, "tensors": [[...]]}}'
            )
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise AccdbgError(f"{what}: {name}.parameters must be an object")
        verifier = make_verifier(name, params)
        tensors = entry.get("tensors")
        n = verifier.tensors_per_side
        if (
            not isinstance(tensors, list)
            or not tensors
            or not all(
                isinstance(group, list)
                and len(group) == n
                and all(isinstance(t, str) for t in group)
                for group in tensors
            )
        ):
            example = '[["boxes", "classes"]]' if n == 2 else '[["tensor_a"], ["tensor_b"]]'
            raise AccdbgError(
                f"{what}: {name}.tensors must be a list of lists of {n} tensor name{'s' if n > 1 else ''}, e.g. {example}"
            )
        out.append((verifier, tensors))
    return out


def one_tensor_verifier(spec: Any, flag: str, advice: str) -> Verifier:
    """The verifier of ``spec`` when it compares one tensor per side; else a one-line error
    naming ``flag``, ended by ``advice`` (what to do with a boxes-and-classes verifier)."""
    v = get_verifier(spec)
    if v.tensors_per_side != 1:
        raise AccdbgError(
            f"{flag} {v.name} compares {v.tensors_per_side} tensors per side (boxes, classes)"
            f"{advice.format(name=v.name)}"
        )
    return v


def unique_label(verifier: Verifier, used: set[str]) -> str:
    """A column label no other verifier of the run has (its name, then the name with its
    parameters, then numbered); added to ``used``."""
    label = verifier.name if verifier.name not in used else verifier.label
    n = 2
    while label in used:
        label, n = f"{verifier.label}#{n}", n + 1
    used.add(label)
    return label


def _label_verifiers(
    items: list[tuple[Verifier, list[list[str]] | None]],
) -> list[ConfiguredVerifier]:
    used: set[str] = set()
    return [ConfiguredVerifier(v, unique_label(v, used), tensors) for v, tensors in items]


def configured_verifiers(
    default_verifiers: Sequence[Any], verifier_config: str | os.PathLike | None = None
) -> list[ConfiguredVerifier]:
    """The verifiers of a run with their column labels, as verification resolves them."""
    items: list[tuple[Verifier, list[list[str]] | None]] = []
    for spec in default_verifiers:
        v = one_tensor_verifier(
            spec,
            "--default_verifier",
            ': name them in --verifier_config, e.g. {{"{name}": {{"tensors": [["boxes", "classes"]]}}}}',
        )
        items.append((v, None))
    if verifier_config is not None:
        items.extend(load_verifier_config(verifier_config))
    if not items:
        raise AccdbgError(
            "no verifier: give --default_verifier (e.g. CosineSimilarity) or --verifier_config"
        )
    return _label_verifiers(items)


def check_verifiers(
    default_verifiers: Sequence[Any], verifier_config: str | os.PathLike | None = None
) -> None:
    """The verifier specs and ``--verifier_config``, checked before any run starts."""
    configured_verifiers(default_verifiers, verifier_config)
