"""The fix search: candidate changes chosen from the diagnosis, each measured on QNN HTP."""

from accdbg.algorithms.fixes.search import FixSearchResult, run_fix_search

__all__ = ["FixSearchResult", "run_fix_search"]
