"""Tensor names as users type them, and framework errors as one line."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def match_name(given: str, names: Sequence[str]) -> str | None:
    """A user-given tensor name, exactly or with/without the TensorFlow-style ``:0`` suffix."""
    if given in names:
        return given
    alt = given[:-2] if given.endswith(":0") else given + ":0"
    return alt if alt in names else None


def near(name: str, names: Sequence[str]) -> str:
    """``'; near matches: a, b'`` for an error message, or nothing."""
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.5)
    return f"; near matches: {', '.join(close)}" if close else ""


def first_line(exc: BaseException) -> str:
    """The gist of a framework's exception (they are often pages long)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
