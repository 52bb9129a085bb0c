"""Tensor folders: ``.raw`` files named from tensor names, plus a ``tensors.json`` manifest.

The reference tool writes bare ``.raw`` files; a ``/`` in a tensor name makes sub-folders.
We keep that layout and add a manifest with each tensor's original name, file, dtype, shape
and producer, because raw files carry neither shape nor type.

Tensor names come from models, i.e. from strangers: every path component is sanitized so no
name can write outside the folder (``..``, absolute paths, NUL, over-long names), and
collisions after sanitizing get a numeric suffix. The original name is kept in the manifest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accdbg.core.jsonio import read_json
from accdbg.core.run_dir import write_bytes_atomic
from accdbg.errors import AccdbgError

if TYPE_CHECKING:
    import pandas as pd

MANIFEST_NAME = "tensors.json"
MANIFEST_FORMAT = "accdbg-tensors/1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@,-]")
_MAX_COMPONENT = 120
FLOAT32 = np.dtype("float32")


def _safe_component(part: str) -> str:
    clean = _UNSAFE.sub("_", part)
    if clean in {"", ".", ".."} or set(clean) == {"."}:
        clean = "_" + clean.replace(".", "_")
    if clean.startswith("."):  # no hidden files
        clean = "_" + clean[1:]
    if len(clean.encode()) > _MAX_COMPONENT:
        digest = hashlib.sha1(part.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        clean = clean[: _MAX_COMPONENT - 11] + "-" + digest
    return clean


def safe_relpath(name: str) -> str:
    """Relative path (without extension) for a tensor name: ``a/b:0`` -> ``a/b_0``.

    Leading slashes and empty components vanish, each component is sanitized, and the
    result never starts with ``/`` nor contains ``..``; so joining it to a folder stays inside.
    """
    parts = [p for p in name.replace("\\", "/").split("/") if p != ""]
    if not parts:
        parts = ["_"]
    return "/".join(_safe_component(p) for p in parts)


@dataclass
class TensorRecord:
    """One tensor in a folder: where it is and what it is."""

    name: str
    file: str
    dtype: str
    shape: list[int]
    native_dtype: str
    node: str | None = None
    op_type: str | None = None
    index: int | None = None
    layout: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


def _write_raw(arr: np.ndarray, path: Path) -> None:
    """numpy reports a full disk as a short write with no errno; give it the errno the console
    tells apart from a bug."""
    try:
        arr.tofile(path)
    except OSError as exc:
        if exc.errno is None and shutil.disk_usage(path.parent).free < arr.nbytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise


class TensorWriter:
    """Write tensors one at a time into ``root`` and keep their manifest.

    Tensors are converted to ``store_dtype`` (float32 unless native output is asked for);
    nothing is kept in memory but the records.
    """

    def __init__(self, root: Path, store_dtype: np.dtype | None = FLOAT32, meta=None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.store_dtype = store_dtype
        self.records: dict[str, TensorRecord] = {}
        self._used_paths: set[str] = set()
        self.meta: dict[str, Any] = dict(meta or {})

    def _unique_path(self, name: str) -> str:
        base = safe_relpath(name)
        rel, n = base, 0
        while (rel + ".raw").lower() in self._used_paths:
            n += 1
            rel = f"{base}__{n}"
        self._used_paths.add((rel + ".raw").lower())
        return rel + ".raw"

    def write(self, name: str, array: np.ndarray, **info: Any) -> TensorRecord:
        arr = np.asarray(array)
        if name in self.records:
            rec = self.records[name]
            rel = rec.file
        else:
            rel = self._unique_path(name)
        path = self.root / rel
        resolved = path.resolve()
        if self.root.resolve() not in resolved.parents:
            raise AccdbgError(f"tensor name {name!r} would write outside {str(self.root)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        out = arr if self.store_dtype is None else arr.astype(self.store_dtype, copy=False)
        _write_raw(np.ascontiguousarray(out), path)
        layout = info.pop("layout", None)
        rec = TensorRecord(
            name=name,
            file=rel,
            dtype=str(out.dtype),
            shape=[int(d) for d in arr.shape],
            native_dtype=str(arr.dtype),
            node=info.pop("node", None),
            op_type=info.pop("op_type", None),
            index=info.pop("index", None),
            layout=layout,
            extra=info,
        )
        self.records[name] = rec
        return rec

    def save_manifest(self) -> Path:
        """Write ``tensors.json`` with records sorted by topological index."""
        recs = sorted(self.records.values(), key=lambda r: (r.index is None, r.index or 0, r.name))
        data = {
            "format": MANIFEST_FORMAT,
            **self.meta,
            "tensors": [_record_dict(r) for r in recs],
        }
        path = self.root / MANIFEST_NAME
        write_bytes_atomic(path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))
        return path


def update_manifest(root: str | os.PathLike, annotate: Callable[[TensorRecord], None]) -> Path:
    """Annotate a written folder's ``tensors.json`` in place - the one way for a component to
    add to another's manifest (e.g. the engine's QNN names, a conversion's layouts).
    ``annotate`` changes a record's ``extra`` or ``layout``; names, files, dtypes and shapes
    stay. The manifest is rewritten atomically, in the writer's format."""
    folder = TensorFolder(root)
    if not folder.has_manifest:
        raise AccdbgError(f"{str(folder.root)!r} has no {MANIFEST_NAME} to update")
    for rec in folder:
        annotate(rec)
    data = {**folder.meta, "tensors": [_record_dict(r) for r in folder]}
    path = folder.root / MANIFEST_NAME
    write_bytes_atomic(path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))
    return path


def _record_dict(r: TensorRecord) -> dict[str, Any]:
    d = asdict(r)
    if not d["extra"]:
        d.pop("extra")
    return d


class TensorFolder:
    """Read a tensor folder written by any accdbg component (or a bare folder of ``.raw``).

    With a manifest, tensors are found by original name and memory-mapped with their shape.
    Without one (a folder from another tool), every ``*.raw`` is a float32 tensor named by its
    relative path without the extension, shape unknown (flat).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise AccdbgError(f"tensor folder {str(self.root)!r} does not exist or is not a folder")
        self.meta: dict[str, Any] = {}
        self.records: dict[str, TensorRecord] = {}
        manifest = self.root / MANIFEST_NAME
        if manifest.exists():
            data = read_json(manifest, "tensor manifest")
            for item in data.get("tensors", []):
                rec = TensorRecord(**item)
                self.records[rec.name] = rec
            self.meta = {k: v for k, v in data.items() if k != "tensors"}
        else:
            for path in sorted(self.root.rglob("*.raw")):
                rel = path.relative_to(self.root).as_posix()
                name = rel[: -len(".raw")]
                n = path.stat().st_size // 4
                self.records[name] = TensorRecord(
                    name=name, file=rel, dtype="float32", shape=[n], native_dtype="float32"
                )

    @property
    def has_manifest(self) -> bool:
        return (self.root / MANIFEST_NAME).exists()

    def __contains__(self, name: str) -> bool:
        return name in self.records

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)

    def names(self) -> list[str]:
        return list(self.records)

    def path(self, name: str) -> Path:
        return self.root / self.records[name].file

    def check(self, name: str) -> TensorRecord:
        """The tensor's record, once its file is known to hold what the record says (a
        tensor can be planned for without being read)."""
        if name not in self.records:
            raise AccdbgError(f"tensor {name!r} is not in {str(self.root)!r}")
        rec = self.records[name]
        path = self.root / rec.file
        expected = rec.size * np.dtype(rec.dtype).itemsize
        actual = path.stat().st_size if path.exists() else -1
        if actual != expected:
            raise AccdbgError(
                f"{path}: {actual} bytes on disk, expected {expected} for {rec.dtype}{rec.shape}"
            )
        return rec

    def load(self, name: str, mmap: bool = True) -> np.ndarray:
        """The tensor with its recorded shape; memory-mapped so big folders stay cheap."""
        rec = self.check(name)
        path = self.root / rec.file
        dtype = np.dtype(rec.dtype)
        if rec.size == 0:
            return np.zeros(rec.shape, dtype=dtype)
        if mmap and rec.shape:
            return np.memmap(path, dtype=dtype, mode="r", shape=tuple(rec.shape))
        return np.fromfile(path, dtype=dtype).reshape(rec.shape)


ENCODING_KEYS = ("scale", "offset", "bitwidth", "qnn_name")


def records_table(records: Iterable[TensorRecord]) -> pd.DataFrame:
    """A manifest as a table, in topological order; encoding columns when tensors have them."""
    import pandas as pd  # here: the engine's workers write tensor folders and need no pandas

    recs = list(records)
    keys = [k for k in ENCODING_KEYS if any(k in r.extra for r in recs)]
    rows = [
        {
            "name": r.name,
            "file": r.file,
            "op_type": r.op_type,
            "node": r.node,
            "index": r.index,
            "shape": r.shape,
            "native_dtype": r.native_dtype,
            "bytes": r.size * np.dtype(r.dtype).itemsize,
            **{k: r.extra.get(k) for k in keys},
        }
        for r in recs
    ]
    table = pd.DataFrame(rows)
    return table.sort_values("index", ignore_index=True) if rows else table
