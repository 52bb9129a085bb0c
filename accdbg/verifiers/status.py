"""The verification summary's ``Status`` column, kept in agreement with ``Failed``.

A row's Status is one of:

* ``ok``: the pair was compared and no verifier fails its threshold (``Failed`` is empty);
* ``fail``: the pair was compared and the verifiers named in ``Failed`` fail their threshold;
* a note saying why the comparison is incomplete or abnormal (``missing in target``,
  ``shape mismatch: golden [..] target [..]``, ``NaN in target (3 elements)``); when
  verifiers fail as well, the note follows ``fail; ``.

So a row reads ``ok`` only when nothing is wrong with it, and a non-empty ``Failed`` always
goes with a Status starting with ``fail``: the two columns cannot contradict each other.
"""

from __future__ import annotations

from collections.abc import Iterable

OK = "ok"
FAIL = "fail"
_FAIL_PREFIX = FAIL + "; "


def compose(failed: Iterable[str], notes: Iterable[str]) -> str:
    """The Status of a row failing ``failed`` verifiers with these notes (empty ones dropped)."""
    parts = ([FAIL] if any(failed) else []) + [n for n in notes if n]
    return "; ".join(parts) or OK


def note(status: str) -> str:
    """The note part of a Status (what is abnormal besides failing thresholds), or ''."""
    if status == OK or status == FAIL:
        return ""
    return status.removeprefix(_FAIL_PREFIX)


def split_failed(failed: object) -> list[str]:
    """The verifier labels of a ``Failed`` cell (empty for a blank or missing cell)."""
    return [f for f in failed.split(", ") if f] if isinstance(failed, str) else []
