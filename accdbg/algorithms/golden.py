"""Golden values for the parts of a model: a tensor folder, plus the model inputs.

Names are matched exactly, then as the tensor store writes them (``safe_relpath``) and as
QNN-style tools sanitize them, so a bare folder of ``<tensor>.raw`` (an AIMET layer-output
dump, no manifest) works too; its flat tensors take their shape from the model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from accdbg.core.inputs import InputTensor
from accdbg.core.tensor_store import TensorFolder, safe_relpath
from accdbg.errors import AccdbgError
from accdbg.mapping.names import qnn_aliases


class GoldenError(Exception):
    """No usable golden value for a tensor."""


class Golden:
    """Golden values by QDQ-model tensor name: a tensor folder plus the model inputs.

    Names are matched exactly, then as the tensor store writes them (``safe_relpath``) and as
    QNN-style tools sanitize them, so a bare folder of ``<tensor>.raw`` (an AIMET layer-output
    dump, no manifest) works too; its flat tensors take their shape from the model.
    """

    def __init__(self, folder: str | os.PathLike, inputs: Sequence[InputTensor], scratch: Path):
        self.root = Path(folder)
        self.folder = TensorFolder(self.root)
        self.inputs = {t.name: t for t in inputs}
        self.scratch = scratch
        self._aliases: dict[str, str] = {}
        # a manifest naming files that are gone is a folder half deleted: say so, not the backend
        missing = [n for n in self.folder.names() if not self.folder.path(n).is_file()]
        if missing:
            raise AccdbgError(
                f"golden folder {str(self.root)!r}: {len(missing)} of the {len(self.folder)} tensor "
                f"files its manifest lists are missing (first: {str(self.folder.path(missing[0]))!r}); "
                "run framework diagnosis again, or give a folder of .raw files without tensors.json"
            )
        for name in self.folder.names():
            for alias in (safe_relpath(name), *qnn_aliases(name)):
                self._aliases.setdefault(alias, name)

    def name_for(self, *candidates: str | None) -> str | None:
        for c in candidates:
            if c and c in self.folder:
                return c
        for c in candidates:
            if not c:
                continue
            for alias in (safe_relpath(c), *qnn_aliases(c)):
                if alias in self._aliases:
                    return self._aliases[alias]
        return None

    def has(self, tensor: str, *aliases: str | None) -> bool:
        """A model input, or a tensor the folder holds under one of these names."""
        return tensor in self.inputs or self.name_for(tensor, *aliases) is not None

    def _record(self, tensor: str, shape: tuple[int, ...] | None, *aliases: str | None):
        name = self.name_for(tensor, *aliases)
        if name is None:
            raise GoldenError(f"no golden value for {tensor!r} in {str(self.root)!r}")
        rec = self.folder.records[name]
        if shape is not None and rec.size != int(np.prod(shape)):
            raise GoldenError(
                f"golden {name!r} holds {rec.size} values, the model's {tensor!r} has shape {list(shape)}"
            )
        return name, rec

    def feed(
        self, tensor: str, shape: tuple[int, ...] | None, dtype: np.dtype | None, *aliases: str
    ) -> tuple[str, tuple, str, str]:
        """``(raw file, dims, dtype, the file's dtype)`` feeding ``tensor`` (a model input or
        an activation; ``aliases``: other names it may have in the golden folder)."""
        if tensor in self.inputs:
            t = self.inputs[tensor]
            return str(t.path), tuple(t.dims), t.dtype.name, t.stored.name
        name, rec = self._record(tensor, shape, *aliases)
        dims = tuple(shape) if shape is not None else tuple(rec.shape)
        want = np.dtype(dtype or np.float32)
        if np.dtype(rec.dtype) == want:
            return str(self.folder.path(name)), dims, want.name, want.name
        # a file of another dtype is converted once into the scratch folder
        path = self.scratch / "golden" / (safe_relpath(name) + ".raw")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            np.asarray(self.folder.load(name), dtype=want).tofile(path)
        return str(path), dims, want.name, want.name

    def load(self, tensor: str, shape: tuple[int, ...] | None, *aliases: str | None) -> np.ndarray:
        if tensor in self.inputs:
            return self.inputs[tensor].load()
        name, rec = self._record(tensor, shape, *aliases)
        arr = np.asarray(self.folder.load(name))
        return arr.reshape(shape) if shape is not None else arr
