"""TopK: do the target's largest values sit where the golden's do (classification outputs)."""

from __future__ import annotations

import numpy as np

from accdbg.verifiers.base import Param, TensorPair, Verifier, register


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first; ties go to the lower index.

    Linear time (np.partition finds the k-th value), so it stays cheap on big activations,
    and deterministic, so a constant golden and a constant target agree.
    """
    k = min(k, x.size)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    kth = np.partition(x, x.size - k)[x.size - k]
    above = np.flatnonzero(x > kth)
    ties = np.flatnonzero(x == kth)[: k - above.size]
    chosen = np.concatenate([above, ties])
    order = np.lexsort((chosen, -x[chosen]))  # by value descending, then index
    return chosen[order]


@register
class TopK(Verifier):
    """Percent of the golden top-k indices missing from the target's top-k (lower is better).

    On the flattened tensor. ``ordered true`` compares position by position instead (the
    i-th largest must be the same element); Qualcomm's tool accepts ``ordered`` but ignores
    it. Ties go to the lower index. Pass: 0 % (every golden top-k element found).
    """

    name = "TopK"
    params = {
        "k": Param(1, "how many of the largest values to compare"),
        "ordered": Param(False, "compare positions in order instead of as sets"),
    }
    threshold = 0.0
    unit = "% of k"

    def __init__(self, **params):
        super().__init__(**params)
        if self.values["k"] < 1:
            from accdbg.errors import AccdbgError

            raise AccdbgError(
                f"verifier TopK parameter 'k' must be at least 1, got {self.values['k']}"
            )

    def compute(self, pair: TensorPair):
        k = min(self.values["k"], pair.golden.size)
        g_top = top_k_indices(pair.golden, k)
        t_top = top_k_indices(pair.target, k)
        if self.values["ordered"]:
            wrong = int(np.count_nonzero(g_top != t_top))
        else:
            wrong = int(np.setdiff1d(g_top, t_top).size)
        return 100.0 * wrong / k, {
            "k": k,
            "ordered": self.values["ordered"],
            "golden_top_k": " ".join(map(str, g_top.tolist())),
            "target_top_k": " ".join(map(str, t_top.tolist())),
            "missing": wrong,
        }
