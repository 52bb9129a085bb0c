"""Names of tensor element types, as users write them and as ONNX stores them."""

from __future__ import annotations

import numpy as np

from accdbg.errors import AccdbgError

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in (
        "float32",
        "float16",
        "float64",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "bool",
    )
}
ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "double": "float64",
    "int": "int32",
    "long": "int64",
}


def parse_dtype(text: str, what: str = "dtype") -> np.dtype:
    """``'float32'`` -> ``np.dtype('float32')``; an unknown name is a one-line error."""
    key = ALIASES.get(text.strip().lower(), text.strip().lower())
    if key not in DTYPES:
        raise AccdbgError(f"unknown {what} {text!r}; expected one of: {', '.join(DTYPES)}")
    return DTYPES[key]
