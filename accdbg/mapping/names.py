"""Tensor-name spellings: every rule that rewrites a name to find it under another tool's
spelling, in one place.

Tools rewrite tensor names differently, so these are several rules, not one:

* :func:`qnn_sanitize` - each non-word character becomes ``_``, and a ``_`` goes before a
  leading digit (``/conv/Conv_output_0`` -> ``_conv_Conv_output_0``): names as QNN-style
  dumps and graph JSONs write them; verification's tensor mapping, the QNN graph lookup and
  snooping's golden lookup try it.
* :func:`converter_sanitize` - the QNN converter's rule for C++ identifiers: every *run* of
  non-word characters becomes one ``_``, and a ``_`` goes before anything but a letter
  (``/2/22/Conv_output_0`` -> ``__2_22_Conv_output_0``); :func:`converter_loose` ignores the
  leading underscores (converter versions differ on the prefix). Compare encodings pairs
  AIMET's names with QNN's by these.
* :func:`match_key` - not a tool's rule but a last resort: letters and digits only, case
  ignored, for pairing an engine's names with a golden dump another tool wrote.

File names are another matter (:func:`accdbg.core.tensor_store.safe_relpath` keeps a name
inside its folder); snooping also tries that spelling, as the tensor store writes it.
"""

from __future__ import annotations

import re

_NON_WORD = re.compile(r"\W")
_NON_WORD_RUN = re.compile(r"\W+")
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def word_underscored(name: str) -> str:
    """Each non-word character replaced by ``_`` (no prefix)."""
    return _NON_WORD.sub("_", name)


def qnn_sanitize(name: str) -> str:
    """Tensor names as QNN's converters write them: non-word characters become ``_``."""
    clean = word_underscored(name)
    return "_" + clean if clean[:1].isdigit() else clean


def qnn_aliases(name: str) -> tuple[str, str]:
    """The QNN-style spellings a dump of ``name`` may carry: with and without the prefix."""
    return qnn_sanitize(name), word_underscored(name)


def converter_sanitize(name: str) -> str:
    """The QNN converter's tensor/node name sanitization (C++ identifiers)."""
    name = _NON_WORD_RUN.sub("_", name)
    return name if name[:1].isalpha() else "_" + name


def converter_loose(name: str) -> str:
    """:func:`converter_sanitize` without the leading underscores."""
    return converter_sanitize(name).lstrip("_")


def match_key(name: str) -> str:
    """Letters and digits only, lower case: a best-effort key for names of unknown origin."""
    return _NON_ALNUM.sub("_", name).lower()
