"""Verifiers: one registered class per metric, looked up by name (case-insensitive).

``get_verifier("rtolatol,rtolmargin,0.01,atolmargin,0.01")``, ``get_verifier("TopK k 5")`` and
``get_verifier(["CosineSimilarity", "threshold", "0.98"])`` all give a ready verifier;
``verifier(golden, target)`` returns a :class:`VerifierResult`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accdbg.errors import AccdbgError
from accdbg.verifiers import error, mean_iou, similarity, tolerance, topk  # noqa: F401 - registers
from accdbg.verifiers.base import VERIFIERS, TensorPair, Verifier, VerifierResult

__all__ = [
    "VERIFIERS",
    "TensorPair",
    "Verifier",
    "VerifierResult",
    "get_verifier",
    "make_verifier",
    "parse_verifier_spec",
    "verifier_names",
]


def verifier_names() -> list[str]:
    """The verifiers' names as the reference spells them."""
    return sorted((cls.name for cls in VERIFIERS.values()), key=str.lower)


def make_verifier(name: str, params: Mapping[str, Any] | None = None) -> Verifier:
    cls = VERIFIERS.get(str(name).strip().lower())
    if cls is None:
        raise AccdbgError(
            f"unknown verifier {name!r}; valid verifiers: {', '.join(verifier_names())}"
        )
    return cls(**dict(params or {}))


def parse_verifier_spec(spec: str | Sequence[str]) -> tuple[str, dict[str, str]]:
    """``"rtolatol,rtolmargin,0.01"``, ``"TopK k 5"`` or ``["TopK", "k", "5"]`` -> ``(name, {param: value})``.

    Commas and spaces both separate items, so the reference's two syntaxes mix freely.
    """
    tokens = [spec] if isinstance(spec, str) else list(spec)
    items = [p for tok in tokens for p in str(tok).replace(",", " ").split()]
    shown = " ".join(str(t) for t in tokens)
    if not items:
        raise AccdbgError("--default_verifier needs a verifier name, e.g. CosineSimilarity")
    name, rest = items[0], items[1:]
    if len(rest) % 2:
        raise AccdbgError(
            f"--default_verifier {shown!r}: parameters go in name/value pairs after the verifier "
            f"name (e.g. rtolatol,rtolmargin,0.01,atolmargin,0.01; use '.' for decimals); "
            f"{rest[-1]!r} has no value"
        )
    params: dict[str, str] = {}
    for key, value in zip(rest[::2], rest[1::2], strict=True):
        if key.lower() in params:
            raise AccdbgError(f"--default_verifier {shown!r}: parameter {key!r} is given twice")
        params[key.lower()] = value
    return name, params


def get_verifier(spec: str | Sequence[str] | Verifier) -> Verifier:
    """A verifier from a command-line style spec (either syntax of the reference)."""
    if isinstance(spec, Verifier):
        return spec
    name, params = parse_verifier_spec(spec)
    return make_verifier(name, params)
