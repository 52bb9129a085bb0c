"""Work for a child Python in test_progress.py: stages whose bars the parent must show."""

from __future__ import annotations

import time

from accdbg.core.progress import Progress


def counted(n: int, pause: float) -> int:
    """One stage of ``n`` items, ``pause`` seconds each (importable by the child)."""
    with Progress("child stage", n, "items") as bar:
        for _ in range(n):
            time.sleep(pause)
            bar.update()
    return n
