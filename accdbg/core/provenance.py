"""Which input files a tensor dump was computed from.

Every dump (a golden folder, an engine ``Result_N``) records its input files in its manifest
(``"inputs": {name: {path, bytes, sha256}}``), so that verification can refuse to compare a
golden and a target computed from different inputs: such a comparison looks like a broken
model (cosine 0.02) and sends the user after the wrong layer. Inputs are compared by content,
so the same data reached through another path (a copy, a symlink) still pairs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INPUTS_KEY = "inputs"
_CHUNK = 1 << 20
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: hash a file once


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file, remembered while its size and modification time stay the same."""
    p = Path(path).absolute()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        _digests[key] = h.hexdigest()
    return _digests[key]


def inputs_record(files: Mapping[str, str | os.PathLike]) -> dict[str, dict[str, Any]]:
    """``{input name: {"path", "bytes", "sha256"}}`` for a manifest's meta."""
    out: dict[str, dict[str, Any]] = {}
    for name, path in files.items():
        p = Path(path).absolute()
        out[str(name)] = {"path": str(p), "bytes": p.stat().st_size, "sha256": file_digest(p)}
    return out


def recorded_inputs(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The input files a manifest's meta records, or None (older dumps, other tools)."""
    rec = meta.get(INPUTS_KEY)
    if not isinstance(rec, dict) or not rec:
        return None
    if not all(isinstance(v, dict) and v.get("sha256") for v in rec.values()):
        return None
    return rec


def same_inputs(a: Mapping[str, dict], b: Mapping[str, dict]) -> bool:
    """Same data fed: input by input when both sides use the same names, else as a multiset
    (a converted model may rename its inputs, e.g. ``input:0`` -> ``input``)."""
    if set(a) == set(b):
        return all(a[n]["sha256"] == b[n]["sha256"] for n in a)
    return sorted(v["sha256"] for v in a.values()) == sorted(v["sha256"] for v in b.values())


def describe_inputs(rec: Mapping[str, dict], other: Mapping[str, dict] | None = None) -> str:
    """``x=/data/a.raw`` (one input: the path alone); with the content digest when ``other``
    names the same paths (the file changed between the two runs)."""
    same_paths = other is not None and sorted(v["path"] for v in rec.values()) == sorted(
        v["path"] for v in other.values()
    )

    def one(name: str, v: dict) -> str:
        text = v["path"] if len(rec) == 1 else f"{name}={v['path']}"
        return f"{text} (sha256 {v['sha256'][:12]})" if same_paths else text

    return ", ".join(one(n, v) for n, v in rec.items())


def input_files(rec: Mapping[str, dict] | None) -> str:
    """The recorded files for tables: ``/data/a.raw`` or ``x=/data/a.raw, y=/data/b.raw``."""
    return describe_inputs(rec) if rec else ""
