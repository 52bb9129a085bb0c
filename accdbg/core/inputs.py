"""Model inputs as users give them: ``-i name dims file [dtype]`` and qnn-net-run input lists."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from accdbg.core.dtypes import parse_dtype
from accdbg.errors import AccdbgError


@dataclass(frozen=True)
class InputTensor:
    """One ``--input_tensor``: name, dims, raw file and element type.

    ``dtype`` is what the model is fed; ``file_dtype``, when set, what the file holds (float32
    read and converted: qnn-net-run's files without ``--use_native_input_files``, see
    :func:`resolve_input_types`). ``dtype_given``: ``-i`` named the type (else float32 by
    default)."""

    name: str
    dims: tuple[int, ...]
    path: Path
    dtype: np.dtype
    file_dtype: np.dtype | None = None
    dtype_given: bool = True

    @property
    def stored(self) -> np.dtype:
        """The element type of the file."""
        return np.dtype(self.file_dtype if self.file_dtype is not None else self.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims)) * self.stored.itemsize

    def record(self) -> list[str]:
        """As the flag spells it, for options records: ``[name, "1,3,8,8", path, dtype]`` (the
        file's type)."""
        return [self.name, ",".join(map(str, self.dims)), str(self.path), self.stored.name]

    def load(self) -> np.ndarray:
        """Read the raw file (its size checked against dims x its type), as the model's type."""
        what = f"--input_tensor {self.name!r}"
        return read_input(self.path, self.dims, self.dtype, self.stored, what)

    def check(self, allow_nonfinite: bool = False) -> None:
        """Size, then NaN/Inf (:func:`check_finite`), without loading the tensor."""
        what = f"--input_tensor {self.name!r}"
        check_raw_size(self.path, self.dims, self.stored, what)
        check_finite(self.path, self.stored, what, allow_nonfinite, self.dims)


NATIVE_FLAG = "-nif/--use_native_input_files"


def read_input(
    path: str | os.PathLike, dims, dtype: np.dtype, stored: np.dtype | None, what: str
) -> np.ndarray:
    """A raw input file of type ``stored`` (its size checked), as ``dtype``: float32 values
    converted to the model's integer or float type, refused when they do not fit (not whole
    numbers, out of range), naming the file and the first bad element."""
    stored = np.dtype(stored if stored is not None else dtype)
    check_raw_size(Path(path), dims, stored, what)
    values = np.fromfile(path, dtype=stored).reshape(dims)
    dtype = np.dtype(dtype)
    if stored == dtype:
        return values
    with np.errstate(over="ignore", invalid="ignore"):  # what does not fit is named below
        converted = values.astype(dtype)
    if dtype.kind == "b":
        bad = (values != 0) & (values != 1)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        bad = (values != np.round(values)) | (values < info.min) | (values > info.max)
    else:
        bad = np.isfinite(values) & ~np.isfinite(converted)
    if bad.any():
        first = int(np.argmax(bad.ravel()))
        raise AccdbgError(
            f"{what}: raw file {str(path)!r} holds {stored.name} values that are no {dtype.name} "
            f"(the model's input type), first {values.ravel()[first]!r} at element {first}; give "
            f"the values in {dtype.name}'s range, or the file in {dtype.name} with {NATIVE_FLAG}"
        )
    return converted


def resolve_input_types(
    tensors: Sequence[InputTensor], model_types: dict[str, np.dtype], native: bool = False
) -> list[InputTensor]:
    """The ``-i`` tensors read as qnn-net-run reads input files: without ``native`` (``-nif``)
    a file is float32 (unless ``-i`` names its type) and is converted to the model input's
    type; with it a file is in the model input's type, and an ``-i`` type saying otherwise is
    refused. A tensor already resolved, or whose model type is unknown, stays as it is."""
    out = []
    for t in tensors:
        want = model_types.get(t.name)
        if want is None or t.file_dtype is not None:
            out.append(t)
            continue
        want = np.dtype(want)
        if native:
            if t.dtype_given and t.dtype != want:
                raise AccdbgError(
                    f"--input_tensor {t.name!r} names its file's type {t.dtype.name}, but "
                    f"{NATIVE_FLAG} reads files in the model input's type, {want.name}: drop the "
                    f"type from -i, or give the file in {want.name}"
                )
            out.append(replace(t, dtype=want))
        elif t.dtype == want:
            out.append(t)
        elif t.dtype == np.float32:
            out.append(replace(t, dtype=want, file_dtype=np.dtype(np.float32)))
        else:
            raise AccdbgError(
                f"--input_tensor {t.name!r} is read as {t.dtype.name}, the model's input is "
                f"{want.name}: give its type ({' '.join(t.record()[:3])} {want.name}), a "
                f"float32 file, or {NATIVE_FLAG}"
            )
    return out


def parse_dims(text: str, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in str(text).replace("x", ",").split(",") if d.strip() != "")
    except ValueError:
        raise AccdbgError(
            f"{what}: dims {text!r} must be comma-separated integers, e.g. 1,3,224,224"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise AccdbgError(f"{what}: dims {text!r} must be positive integers, e.g. 1,3,224,224")
    return dims


def parse_input_tensor(values: list[str]) -> InputTensor:
    """``["data", "1,3,224,224", "data.raw", "float32"]`` -> :class:`InputTensor`."""
    if len(values) not in (3, 4):
        raise AccdbgError(
            f'--input_tensor takes: name dims path [dtype], e.g. "data" 1,3,224,224 data.raw float32; got {values!r}'
        )
    name, dims, path = values[0], values[1], values[2]
    what = f"--input_tensor {name!r}"
    dtype = parse_dtype(values[3], f"{what} dtype") if len(values) == 4 else np.dtype("float32")
    p = Path(path).expanduser()
    if not p.is_file():
        raise AccdbgError(f"{what}: raw file {path!r} does not exist")
    return InputTensor(
        name=name,
        dims=parse_dims(dims, what),
        path=p.absolute(),
        dtype=dtype,
        dtype_given=len(values) == 4,
    )


def check_raw_size(path: Path, dims, dtype: np.dtype, what: str) -> None:
    expected = int(np.prod(dims)) * np.dtype(dtype).itemsize
    try:
        actual = os.path.getsize(path)
    except OSError:
        raise AccdbgError(
            f"{what}: raw file {str(path)!r} does not exist or cannot be read"
        ) from None
    if actual != expected:
        raise AccdbgError(
            f"{what}: raw file {str(path)!r} has {actual} bytes, expected {expected} "
            f"({'x'.join(map(str, dims))} x {np.dtype(dtype).name})"
        )


ALLOW_NONFINITE_FLAG = "--allow_nonfinite_inputs"
_SCAN_CHUNK = 1 << 22  # elements per read: memory stays bounded whatever the file's size
_scanned: dict[tuple, tuple[int, int, int]] = {}


def count_nonfinite(path: Path, dtype: np.dtype) -> tuple[int, int, int]:
    """``(NaN count, Inf count, flat index of the first of them or -1)`` of a raw file.

    Read in chunks through a memory map; remembered per (file, size, mtime), so the several
    components of one run scan each input once.
    """
    dtype = np.dtype(dtype)
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, dtype.str)
    if key in _scanned:
        return _scanned[key]
    nan = inf = 0
    first = -1
    count = st.st_size // dtype.itemsize
    if dtype.kind in "fc" and count:
        data = np.memmap(path, dtype=dtype, mode="r", shape=(count,))
        for start in range(0, count, _SCAN_CHUNK):
            chunk = data[start : start + _SCAN_CHUNK]
            bad = ~np.isfinite(chunk)
            if bad.any():
                n = int(np.isnan(chunk).sum())
                nan, inf = nan + n, inf + int(bad.sum()) - n
                if first < 0:
                    first = start + int(np.argmax(bad))
        del data
    _scanned[key] = (nan, inf, first)
    return nan, inf, first


def check_finite(
    path: Path, dtype: np.dtype, what: str, allow: bool = False, dims: tuple[int, ...] | None = None
) -> None:
    """Refuse a float input holding NaN or Inf (one line: the file, the counts, the first
    element), unless ``allow`` (``--allow_nonfinite_inputs``): a NaN image yields an all-NaN
    golden and a quantizer failing far from its cause."""
    if allow or np.dtype(dtype).kind not in "fc":
        return
    nan, inf, first = count_nonfinite(path, dtype)
    if not nan and not inf:
        return
    where = f"element {first}"
    if dims is not None and int(np.prod(dims)) > first:
        where += f", index [{', '.join(str(int(i)) for i in np.unravel_index(first, dims))}]"
    raise AccdbgError(
        f"{what}: raw file {str(path)!r} holds {nan} NaN and {inf} Inf value(s) (first at "
        f"{where}); fix the input, or pass {ALLOW_NONFINITE_FLAG} to run with them"
    )


@dataclass(frozen=True)
class InputListEntry:
    """One line of an input list: one inference. ``name`` is None for positional paths."""

    line_no: int
    items: tuple[tuple[str | None, Path], ...]


@dataclass(frozen=True)
class InputList:
    """A parsed input list; ``output_names`` are its ``#`` lines' tensors (``output_line``
    the first of those lines), qnn-net-run's way of naming the outputs to write."""

    path: Path
    entries: tuple[InputListEntry, ...]
    output_names: tuple[str, ...]
    output_line: int | None = None

    @property
    def outputs_where(self) -> str:
        """How a message names the ``#`` line: ``list.txt:1: '#' output tensor``."""
        return f"{self.path}:{self.output_line}: '#' output tensor"


def requested_outputs(
    output_tensors: Sequence[str] = (), input_list: InputList | None = None
) -> tuple[str, ...]:
    """The model's outputs a run is asked for: the ``-o/--output_tensor`` names, then those
    of the input list's ``#`` lines (qnn-net-run's convention), each once; empty when neither
    names any (the graph's outputs then)."""
    names = [*output_tensors, *(input_list.output_names if input_list is not None else ())]
    return tuple(dict.fromkeys(n for n in names if n))


def _resolve(raw: str, base: Path) -> Path:
    p = Path(raw).expanduser()
    if p.is_absolute() or p.exists():
        return p.absolute()
    return (base / p).absolute()


def parse_input_list(path: str | os.PathLike) -> InputList:
    """Parse a qnn-net-run input list.

    One inference per line: either paths in the model's input order, or ``name:=path`` pairs,
    separated by spaces - so no path can hold a space (such a path is refused, saying so). A
    line starting with ``#`` names output tensors (space separated): the run's outputs, with
    ``-o`` (:func:`requested_outputs`). Relative paths are taken from the current folder,
    else from the list's own folder.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise AccdbgError(f"--input_list {str(path)!r} does not exist")
    entries: list[InputListEntry] = []
    outputs: list[str] = []
    output_line = None
    for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            outputs.extend(t for t in text[1:].replace(",", " ").split() if t)
            output_line = output_line or no
            continue
        entries.append(_list_line(p, no, text))
    if not entries:
        raise AccdbgError(f"--input_list {str(p)!r} has no input lines")
    return InputList(p.absolute(), tuple(entries), tuple(outputs), output_line)


def _list_line(p: Path, no: int, text: str) -> InputListEntry:
    """One inference line's items; a bad line is one error naming the list and the line."""
    items: list[tuple[str | None, Path]] = []
    for tok in text.split():
        if ":=" in tok:
            name, _, file = tok.partition(":=")
            if not name or not file:
                _refuse_spaced_path(p, no, text)
                raise AccdbgError(f"{p}:{no}: {tok!r} must be name:=path")
            items.append((name, _resolve(file, p.parent)))
        else:
            items.append((None, _resolve(tok, p.parent)))
    if len({n is None for n, _ in items}) > 1:
        _refuse_spaced_path(p, no, text)
        raise AccdbgError(
            f"{p}:{no}: mixes plain paths and name:=path pairs; use one form per line"
        )
    for _, f in items:
        if not f.is_file():
            _refuse_spaced_path(p, no, text)
            raise AccdbgError(f"{p}:{no}: input file {str(f)!r} does not exist")
    return InputListEntry(no, tuple(items))


def _refuse_spaced_path(p: Path, no: int, text: str) -> None:
    """A line that does not parse because a path on it holds a space: say that, not what
    the split made of it. qnn-net-run separates a line's entries by spaces, so a path cannot
    hold one; the error names the file and what to do (a link or another name)."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    for i, (start, _) in enumerate(spans):
        for _, end in spans[i + 1 :]:
            joined = text[start:end]
            name, sep, file = joined.partition(":=")
            candidate = file if sep and name and " " not in name else joined
            if " " in candidate and _resolve(candidate, p.parent).is_file():
                link = Path(candidate).name.replace(" ", "_")
                raise AccdbgError(
                    f"{p}:{no}: the path {candidate!r} holds a space, and an input list "
                    "separates a line's entries by spaces (as qnn-net-run reads it), so a path "
                    f"cannot hold one: rename the file or give a link without spaces (ln -s "
                    f"{shlex.quote(str(_resolve(candidate, p.parent)))} {link})"
                )


def _same_input(listed: str, given: str) -> bool:
    """A list line may spell a TensorFlow input with or without its ``:0``."""
    return listed == given or listed.removesuffix(":0") == given.removesuffix(":0")


def line_files(
    entry,
    names: Sequence[str],
    where: str,
    known: str,
    same=lambda listed, name: listed == name,
) -> dict[str, Path]:
    """The files of one input-list line by input name: ``name:=path`` items matched with
    ``same``, plain paths in the order of ``names``; ``known`` says what a name must be."""
    if entry.items[0][0] is None:
        if len(entry.items) != len(names):
            raise AccdbgError(
                f"{where}: {len(entry.items)} file(s) for {len(names)} input(s) ({', '.join(names)})"
            )
        return {n: p for n, (_, p) in zip(names, entry.items, strict=True)}
    files: dict[str, Path] = {}
    for listed, path in entry.items:
        name = next((n for n in names if same(str(listed), n)), None)
        if name is None:
            raise AccdbgError(f"{where}: {listed!r} is not {known}")
        files[name] = path
    missing = [n for n in names if n not in files]
    if missing:
        raise AccdbgError(f"{where}: no file for input {missing[0]!r}")
    return files


def inputs_per_line(
    input_list: InputList, tensors: Sequence[InputTensor], order: Sequence[str] | None = None
) -> list[list[InputTensor]]:
    """Each list line as ``--input_tensor``s: the names, dims and types of ``tensors`` with the
    line's files. ``name:=path`` items are matched by name; plain paths follow ``order`` (the
    model's input order, as qnn-net-run reads them), else the order of ``tensors``."""
    given = {t.name: t for t in tensors}
    names = [n for n in (order or []) if n in given] or list(given)
    names += [n for n in given if n not in names]
    out: list[list[InputTensor]] = []
    for entry in input_list.entries:
        where = f"{input_list.path}:{entry.line_no}"
        files = line_files(
            entry,
            names,
            where,
            f"one of the -i/--input_tensor names ({', '.join(names)})",
            same=_same_input,
        )
        line = [replace(given[n], path=files[n]) for n in given]
        for t in line:
            check_raw_size(t.path, t.dims, t.stored, f"{where}: input {t.name!r}")
        out.append(line)
    return out
