"""Progress bars on a terminal, silence in logs and CI."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    quiet = not sys.stderr.isatty() or os.environ.get("CI") or os.environ.get("ACCDBG_NO_PROGRESS")
    return iter(tqdm(items, desc=desc, total=total, disable=bool(quiet), leave=False, unit="t"))
