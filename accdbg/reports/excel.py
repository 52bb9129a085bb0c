"""Excel workbooks with openpyxl: one sheet per table, header frozen, filters on, flagged cells red.

A report builds :class:`Sheet` objects (a DataFrame, the cells to flag, header notes) and
:func:`write_workbook` renders them the same way everywhere. Text cells go through
:func:`accdbg.reports.cells.safe_cell`, so no tensor name can become a formula.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from openpyxl import Workbook
from openpyxl.comments import Comment
from openpyxl.styles import Font, PatternFill
from openpyxl.utils import get_column_letter

from accdbg.core.run_dir import atomic_path
from accdbg.reports.cells import safe_cell

RED = "FFC7CE"  # Excel's "light red fill"
RED_FILL = PatternFill(fill_type="solid", start_color=RED, end_color=RED)
HEADER_FILL = PatternFill(fill_type="solid", start_color="DDEBF7", end_color="DDEBF7")
MIN_WIDTH, MAX_WIDTH = 8, 60
_WIDTH_SAMPLE = 2000


@dataclass
class Sheet:
    """One worksheet: ``red`` holds ``(row position in frame, column name)`` cells to flag."""

    title: str
    frame: pd.DataFrame
    red: set[tuple[int, str]] = field(default_factory=set)
    notes: dict[str, str] = field(default_factory=dict)
    freeze: str = "A2"
    footer: list[tuple[Any, ...]] = field(default_factory=list)


def cell_value(v: Any) -> Any:
    """A value openpyxl can store, text made formula-safe."""
    if v is None:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, list | tuple):
        v = ", ".join(str(x) for x in v)
    if isinstance(v, bool | int | float):
        return v
    return safe_cell(str(v))


def is_red(cell) -> bool:
    """Whether a cell carries the red flag fill (for readers of the workbook, tests included)."""
    fill = cell.fill
    return (
        fill is not None and fill.fill_type == "solid" and str(fill.fgColor.rgb)[-6:].upper() == RED
    )


def _write_sheet(ws, sheet: Sheet) -> None:
    df = sheet.frame
    columns = [str(c) for c in df.columns]
    bold = Font(bold=True)
    for j, name in enumerate(columns, start=1):
        c = ws.cell(row=1, column=j, value=cell_value(name))
        c.font = bold
        c.fill = HEADER_FILL
        if name in sheet.notes:
            c.comment = Comment(sheet.notes[name], "accdbg", width=320, height=120)
    col_index = {name: j for j, name in enumerate(columns, start=1)}
    for i, row in enumerate(df.itertuples(index=False, name=None)):
        for j, v in enumerate(row, start=1):
            ws.cell(row=i + 2, column=j, value=cell_value(v))
    for i, name in sheet.red:
        if name in col_index:
            ws.cell(row=i + 2, column=col_index[name]).fill = RED_FILL
    last_row = len(df) + 1
    if columns:
        ws.auto_filter.ref = f"A1:{get_column_letter(len(columns))}{last_row}"
        ws.freeze_panes = sheet.freeze
    for j, name in enumerate(columns, start=1):
        sample = df.iloc[:_WIDTH_SAMPLE, j - 1] if len(df) else []
        longest = max([len(name)] + [len(str(cell_value(v) or "")) for v in sample])
        ws.column_dimensions[get_column_letter(j)].width = max(
            MIN_WIDTH, min(MAX_WIDTH, longest + 2)
        )
    if sheet.footer:
        r = last_row + 2
        for values in sheet.footer:
            for j, v in enumerate(values, start=1):
                ws.cell(row=r, column=j, value=cell_value(v))
            ws.cell(row=r, column=1).font = bold
            r += 1


def write_workbook(path: str | os.PathLike, sheets: Sequence[Sheet]) -> Path:
    """Write the sheets to ``path`` through a temporary file (no half-written workbook)."""
    path = Path(path)
    wb = Workbook()
    wb.remove(wb.active)
    for sheet in sheets:
        _write_sheet(wb.create_sheet(title=sheet.title[:31]), sheet)
    with atomic_path(path) as tmp:
        wb.save(tmp)
    return path
