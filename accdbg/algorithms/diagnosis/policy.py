"""The diagnosis' thresholds, in one frozen object: each one a named field with the reason
for its value, so that a reader finds every number the verdict depends on in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    """What the verdict asks of a culprit, and how its fix is chosen."""

    # A culprit must be confirmed on the backend: its region (the layer and the tensors that
    # carry its error) kept in fp16 on HTP must raise the outputs' SQNR by this much. Under it
    # the layer, whatever the CPU measures said, is not what the outputs lose (1 dB: the
    # smallest gain a user sees as one, and well above a run-to-run change of QNN's results,
    # which is zero: the backend is deterministic).
    confirm_db: float = 1.0
    # The verified fix is the cheapest change whose gain comes within this much of the region
    # kept in fp16 (what fixing the layer can gain at most).
    within_db: float = 1.0
    # Culprits verified on QNN at most (each costs a QNN session per change tried).
    verify_max: int = 5
    # When no culprit is confirmed and the outputs fail, the model-wide changes are measured
    # instead; a change is reported as the fix when it gains at least this much.
    global_min_db: float = 0.5


POLICY = Policy()
