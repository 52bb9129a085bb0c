"""Make values safe for the places reports put them.

Tensor and layer names come from models, i.e. from strangers. In CSV and Excel a text cell
starting with ``=``, ``+``, ``-``, ``@``, tab or CR can be run as a formula by a spreadsheet;
we prefix such text with ``'``. Numbers are left alone (a negative number is not a formula).
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """Text that could start a formula gets a leading quote; anything else is unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose text cells (and column names) cannot become formulas."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col].dtype):
            out[col] = out[col].map(safe_cell)
    out.columns = [safe_cell(c) if isinstance(c, str) else c for c in out.columns]
    return out


def escape(value: Any) -> str:
    """HTML-escaped text of any value (quotes included, for attributes)."""
    return html.escape(str(value), quote=True)


def shorten(text: Any, limit: int) -> str:
    """One line of at most ``limit`` characters, an ellipsis where it was cut."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"
