"""Read and write AIMET encodings files, legacy (up to 0.6.1) and 1.0.0.

Legacy::

    {"version": "0.6.1",
     "activation_encodings": {"<tensor>": [{"bitwidth": 8, "dtype": "int", "is_symmetric": "False",
                                            "min": m, "max": M, "offset": o, "scale": s}, ...]},
     "param_encodings": {...}}

  one dict per channel; ``scale``/``offset`` may be omitted (then derived from min/max) and
  ``dtype: float`` entries carry only ``bitwidth``.

1.0.0::

    {"version": "1.0.0",
     "activation_encodings": [{"name": "<tensor>", "dtype": "INT", "enc_type": "PER_TENSOR",
                               "bw": 8, "is_sym": false, "scale": [s], "offset": [o]}, ...],
     "param_encodings": [... "enc_type": "PER_CHANNEL" | "PER_BLOCK" | "LPBQ", "block_size": n ...]}

Both use the same ``offset`` convention as QNN (see :mod:`accdbg.encodings.model`), so the
values are taken as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accdbg.encodings.model import (
    ACTIVATION,
    PARAM,
    PER_CHANNEL,
    PER_TENSOR,
    Encoding,
    min_max,
    number,
    scale_offset_from_min_max,
)
from accdbg.encodings.qnn_json import read_json
from accdbg.errors import AccdbgError

SECTIONS = {"activation_encodings": ACTIVATION, "param_encodings": PARAM}
EXPECTED = (
    "expected an AIMET encodings file: 'activation_encodings' and 'param_encodings' as dicts of "
    "lists of encodings (legacy, up to 0.6.1) or as lists of entries with 'name' (with 'version': '1.0.0')"
)
VERSIONS = ("0.6.1", "1.0.0")


@dataclass
class AimetEncodings:
    """The encodings of one AIMET file, split into parameters and activations."""

    path: Path | None
    version: str
    form: str  # "legacy" or "1.0.0"
    params: dict[str, Encoding]
    activations: dict[str, Encoding]

    def __len__(self) -> int:
        return len(self.params) + len(self.activations)

    def all(self) -> dict[str, Encoding]:
        return {**self.activations, **self.params}


def load_aimet(path: str | os.PathLike, what: str = "--aimet_encodings_json") -> AimetEncodings:
    """Read an AIMET encodings file; every problem is a one-line error naming file and tensor."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise AccdbgError(f"{what} {str(path)!r} does not exist or is not a file")
    data = read_json(p, what)
    enc = parse_aimet(data, f"{what} {str(p)!r}")
    enc.path = p
    if not len(enc):
        raise AccdbgError(
            f"{what} {str(p)!r} holds no encodings: 'activation_encodings' and 'param_encodings' are both empty"
        )
    return enc


def read_aimet(path: str | os.PathLike) -> AimetEncodings:
    """:func:`load_aimet` for ``-qo/--quantization_overrides`` (errors name that flag)."""
    return load_aimet(path, "-qo/--quantization_overrides")


def parse_aimet(data: Any, where: str = "AIMET encodings") -> AimetEncodings:
    """Parse an already-loaded AIMET JSON document (either form)."""
    if not isinstance(data, dict):
        raise AccdbgError(f"{where}: {EXPECTED}; found a JSON {type(data).__name__}")
    if isinstance(data.get("graph"), dict) and "tensors" in data["graph"]:
        raise AccdbgError(
            f"{where} is a QNN graph JSON (model_net.json), not AIMET encodings; pass it as --input"
        )
    version = str(data.get("version", ""))
    if "encodings" in data and not any(k in data for k in SECTIONS):
        raise AccdbgError(
            f"{where}: AIMET encoding version {version or '2.x'} ('encodings' list) is not supported; "
            "export with encoding_version '1.0.0' or '0.6.1'"
        )
    if not any(k in data for k in SECTIONS):
        found = ", ".join(map(str, list(data)[:8])) or "no keys"
        raise AccdbgError(f"{where}: {EXPECTED}; found {found}")
    sections = {k: data.get(k) for k in SECTIONS}
    is_list = [isinstance(v, list) for v in sections.values() if v]
    is_dict = [isinstance(v, dict) for v in sections.values() if v]
    out = AimetEncodings(None, version or "legacy", "", {}, {})
    if is_list and all(is_list):
        out.form = "1.0.0"
        for key, entries in sections.items():
            for i, entry in enumerate(entries or []):
                enc = _parse_v1(entry, SECTIONS[key], f"{where}: {key}[{i}]")
                _store(out, enc, where)
    elif not is_list or all(is_dict):
        out.form = "legacy"
        for key, entries in sections.items():
            for name, value in (entries or {}).items():
                enc = _parse_legacy(
                    str(name), value, SECTIONS[key], f"{where}: {key} {str(name)!r}"
                )
                _store(out, enc, where)
    else:
        raise AccdbgError(
            f"{where}: 'activation_encodings' and 'param_encodings' mix dicts and lists; {EXPECTED}"
        )
    return out


def _store(out: AimetEncodings, enc: Encoding, where: str) -> None:
    book = out.params if enc.kind == PARAM else out.activations
    if enc.name in book:
        raise AccdbgError(f"{where}: tensor {enc.name!r} has two {enc.kind} entries")
    book[enc.name] = enc


def _bool(value: Any, where: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise AccdbgError(f'{where}: is_symmetric must be true/false or "True"/"False", got {value!r}')


def _num(entry: dict, key: str, where: str) -> float:
    try:
        return float(entry[key])
    except (TypeError, ValueError):
        raise AccdbgError(f"{where}: {key!r} must be a number, got {entry[key]!r}") from None


def _bitwidth(entry: dict, key: str, where: str) -> int:
    if key not in entry:
        raise AccdbgError(f"{where}: missing {key!r}")
    try:
        bw = int(entry[key])
    except (TypeError, ValueError):
        raise AccdbgError(f"{where}: {key!r} must be an integer, got {entry[key]!r}") from None
    if not 1 <= bw <= 64:
        raise AccdbgError(f"{where}: {key!r} {bw} is not a bit width (1..64)")
    return bw


def _parse_legacy(name: str, value: Any, kind: str, where: str) -> Encoding:
    if (
        isinstance(value, dict)
        and ("input" in value or "output" in value)
        and not {"scale", "min", "bitwidth"} & set(value)
    ):
        raise AccdbgError(
            f"{where}: module-keyed entry ('input'/'output'): this is AIMET's *_torch.encodings; "
            "pass the tensor-keyed .encodings file exported next to the ONNX model"
        )
    entries = [value] if isinstance(value, dict) else value
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) for e in entries)
    ):
        raise AccdbgError(
            f"{where}: expected a non-empty list of encoding objects, got {str(value)[:80]}"
        )
    first = entries[0]
    dtype = str(first.get("dtype", "int")).lower()
    if dtype not in ("int", "float"):
        raise AccdbgError(f"{where}: dtype must be 'int' or 'float', got {first.get('dtype')!r}")
    bw = _bitwidth(first, "bitwidth", where)
    if dtype == "float":
        return Encoding.float_encoding(name, kind, bw, source={"format": "legacy"})
    scales, offsets, mins, maxs = [], [], [], []
    sym = _bool(first.get("is_symmetric"), where)
    for i, e in enumerate(entries):
        w = f"{where} channel {i}" if len(entries) > 1 else where
        if _bitwidth(e, "bitwidth", w) != bw:
            raise AccdbgError(f"{w}: channels disagree on bitwidth ({e['bitwidth']} vs {bw})")
        has_so = "scale" in e and "offset" in e
        has_mm = "min" in e and "max" in e
        if not has_so and not has_mm:
            raise AccdbgError(
                f"{w}: needs 'scale' and 'offset', or 'min' and 'max' (found {', '.join(e) or 'nothing'})"
            )
        if has_so:
            s, o = _num(e, "scale", w), number(_num(e, "offset", w))
        else:
            s, o = scale_offset_from_min_max(_num(e, "min", w), _num(e, "max", w), bw)
        lo, hi = (_num(e, "min", w), _num(e, "max", w)) if has_mm else min_max(s, o, bw)
        scales.append(s)
        offsets.append(o)
        mins.append(lo)
        maxs.append(hi)
    return Encoding(
        name=name,
        kind=kind,
        dtype="int",
        bitwidth=bw,
        is_symmetric=sym,
        scale=tuple(scales),
        offset=tuple(offsets),
        min=tuple(mins),
        max=tuple(maxs),
        enc_type=PER_TENSOR if len(entries) == 1 else PER_CHANNEL,
        source={"format": "legacy"},
    )


def _parse_v1(entry: Any, kind: str, where: str) -> Encoding:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise AccdbgError(
            f"{where}: expected an object with a 'name' (AIMET 1.0.0 entry), got {str(entry)[:80]}"
        )
    name = entry["name"]
    where = f"{where} ({name!r})"
    dtype = str(entry.get("dtype", "INT")).upper()
    bw = _bitwidth(entry, "bw", where)
    if dtype == "FLOAT":
        return Encoding.float_encoding(name, kind, bw, source={"format": "1.0.0"})
    if dtype != "INT":
        raise AccdbgError(f"{where}: dtype must be 'INT' or 'FLOAT', got {entry.get('dtype')!r}")
    for key in ("scale", "offset"):
        if key not in entry:
            raise AccdbgError(f"{where}: missing {key!r}")
    scale = entry["scale"] if isinstance(entry["scale"], list) else [entry["scale"]]
    offset = entry["offset"] if isinstance(entry["offset"], list) else [entry["offset"]]
    if not scale or len(offset) not in (1, len(scale)):
        raise AccdbgError(f"{where}: {len(scale)} scales but {len(offset)} offsets")
    try:
        scale_f = [float(s) for s in scale]
        offset_f = [float(o) for o in offset]
    except (TypeError, ValueError):
        raise AccdbgError(f"{where}: scale and offset must be numbers") from None
    enc_type = str(entry.get("enc_type", PER_TENSOR if len(scale) == 1 else PER_CHANNEL)).upper()
    block = entry.get("block_size")
    return Encoding.from_scale_offset(
        name,
        kind,
        scale_f,
        offset_f,
        bw,
        is_symmetric=_bool(entry.get("is_sym"), where),
        enc_type=enc_type,
        block_size=int(block) if block is not None else None,
        source={"format": "1.0.0"},
    )


def aimet_dict(encodings: Iterable[Encoding], version: str = "0.6.1") -> dict[str, Any]:
    """An AIMET document (``version`` '0.6.1' legacy or '1.0.0') for these encodings."""
    if version not in VERSIONS:
        raise AccdbgError(
            f"encoding version {version!r} is not supported; choose one of {', '.join(VERSIONS)}"
        )
    encs = list(encodings)
    if version == "1.0.0":
        return {
            "version": version,
            "activation_encodings": [e.to_v1() for e in encs if e.kind == ACTIVATION],
            "param_encodings": [e.to_v1() for e in encs if e.kind == PARAM],
        }
    return {
        "version": version,
        "activation_encodings": {e.name: e.to_legacy() for e in encs if e.kind == ACTIVATION},
        "param_encodings": {e.name: e.to_legacy() for e in encs if e.kind == PARAM},
    }
