"""Which inputs' full tensors stay on disk: the K worst by final-output score, and named ones.

The parent tells each item, when it sends it, the K-th worst score known so far; the worker
writes its tensors only if it would rank before it (or the input is named). When results come
back, inputs pushed out of the K worst have their folders removed at once, so the disk holds
K inputs' tensors plus those of items in flight, and exactly K (plus the named) at the end.

An input that ends among the K worst always wrote its tensors: the K-th worst key only
worsens as more inputs are known, so at sending time fewer than K known inputs ranked before it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def rank_key(badness: float, index: int) -> tuple[float, int]:
    """Sort key, worst first: higher badness first, then the earlier input-list line."""
    return (-badness, index)


class KeepSet:
    """The kept inputs and their folders; prunes what falls out of the K worst."""

    def __init__(self, k: int, named: Iterable[int], folders_of):
        self.k = k
        self.named = set(named)
        self.folders_of = folders_of  # index -> the folders holding its tensors
        self.ranked: dict[int, tuple[float, int]] = {}  # every scored input: its key
        self.kept: set[int] = set()

    def threshold(self) -> dict[str, Any]:
        """What the next item is told: keep (fewer than K known), keep if before the K-th
        worst known, or never (K = 0)."""
        if self.k <= 0:
            return {"keep": "no"}
        if len(self.ranked) < self.k:
            return {"keep": "yes"}
        kth = sorted(self.ranked.values())[self.k - 1]
        return {"keep": "if_before", "before": [kth[0], kth[1]]}

    def item_fields(self, index: int) -> dict[str, Any]:
        return {"named": index in self.named, **self.threshold()}

    def add(self, index: int, badness: float, kept: bool) -> list[int]:
        """A scored input; returns the inputs whose folders were removed."""
        self.ranked[index] = rank_key(badness, index)
        if kept:
            self.kept.add(index)
        return self.prune()

    def worst(self) -> list[int]:
        """The K worst scored inputs, worst first."""
        return [i for i, _ in sorted(self.ranked.items(), key=lambda kv: kv[1])[: self.k]]

    def prune(self) -> list[int]:
        wanted = set(self.worst()) | self.named
        removed = sorted(i for i in self.kept if i not in wanted)
        for i in removed:
            for folder in self.folders_of(i):
                shutil.rmtree(folder, ignore_errors=True)
            self.kept.discard(i)
        return removed


def remove_unrecorded(root: Path, recorded: set[str], subdirs: Iterable[str]) -> list[str]:
    """Folders a killed run's items left half-written (no journal line): removed before
    those items run again."""
    gone = []
    for sub in subdirs:
        folder = root / sub
        if not folder.is_dir():
            continue
        for child in folder.iterdir():
            if child.is_dir() and child.name not in recorded:
                shutil.rmtree(child, ignore_errors=True)
                gone.append(child.name)
    return sorted(set(gone))
