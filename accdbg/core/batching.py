"""Split a list of tensors into runs whose outputs fit a memory budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def plan_batches(
    items: Sequence[T], nbytes: Callable[[T], int | None], budget_bytes: int
) -> list[list[T]]:
    """Group items in order so each group's known size fits the budget.

    An item of unknown size counts as the largest known one (conservative); an item larger
    than the budget goes alone.
    """
    known = [s for s in (nbytes(i) for i in items) if s is not None]
    fallback = max(known) if known else budget_bytes
    batches: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        size = nbytes(item)
        size = fallback if size is None else size
        if current and used + size > budget_bytes:
            batches.append(current)
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        batches.append(current)
    return batches
