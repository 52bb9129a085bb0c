"""Reading JSON files users hand us, with errors that name the file, line and column."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accdbg.errors import AccdbgError


def read_json(path: str | os.PathLike, what: str) -> Any:
    """``json.load`` of ``path``; a missing, unreadable or malformed file is a one-line error.

    ``what`` says which input this is (e.g. ``--tensor_mapping``), for the message.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise AccdbgError(f"{what} {str(path)!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AccdbgError(f"{what} {str(path)!r} is not a UTF-8 text file") from None
    except OSError as exc:
        raise AccdbgError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AccdbgError(
            f"{what} {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
