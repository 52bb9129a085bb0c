"""The diagnosis' thresholds, in one frozen object: each one a named field with the reason
for its value, so that a reader finds every number the verdict depends on in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    """What the verdict asks of a culprit, and how its fix is chosen."""

    # the CPU fake-quant with every kernel difference added must part from its own outputs as QNN
    # does, within this factor of error power, for a layer's share of it to mean anything
    reproduced: float = 2.0

    # this share of the differing values on one side: a bias, not noise
    one_way: float = 0.9

    # this share of a Concat's far-off values are its inputs' integers: not requantized
    copied: float = 0.9

    # an input channel's mean this many times the median channel's RMS
    offset_ratio: float = 4.0

    # a weight or weight channel this many times the rest is an outlier
    outlier_ratio: float = 4.0

    # a weight outlier this many times the rest costs 4 of 8 bits: it is the cause
    blown_ratio: float = 16.0

    # a cause names every loss of its layer within this many dB of the worst one (a scaled
    # channel blows both its weights' and its output's range: both are said)
    cause_db: float = 6.0

    # this many culprits losing the same thing are one problem of the model as much as layers
    pattern_min: int = 3

    # QNN's error at a layer this far beyond what its encodings and inputs explain (or beyond
    # the CPU fake-quant's) is the kernel's: 10 dB, ten times the noise power
    backend_db: float = 10.0

    # layers where QNN and the CPU fake-quant differ at all, needed for their floor (many layers
    # of the models measured are bit-exact, and a floor of three rounding steps says nothing)
    min_diverging: int = 8

    # a layer whose differing integers part from the fake-quant's by this many steps (median) or
    # more computes something else; under it, the backend's requantization rounds differently
    different_steps: float = 2.0

    # what the kernels add to the outputs' error below this is not stated as a share
    noticed: float = 0.05

    # from ten times their error there a share reads as the SQNR the outputs lose
    times: float = 10.0

    # a layer stands out when its local SQNR sits this many robust spreads under the floor
    z_min: float = 3.5

    # ...and at least this many dB under it (a tight floor's spread is small: 10 dB is ten
    # times the median layer's noise power)
    gap_db: float = 10.0

    # a small model's spread is a weak estimate: 15 dB below the floor (30 times the median layer's
    # noise power) always stands out
    max_gap_db: float = 15.0

    # the SQNR verifier's pass mark: the layer's own encodings alone fail it
    abs_db: float = 20.0

    # a layer clipping one value in a hundred goes to the sensitivity step...
    clip_min: float = 0.01

    # ...when that is ten times what the model's median layer clips
    clip_ratio: float = 10.0

    # below this the median channel keeps a quarter of noise: information is gone
    destroyed_db: float = 6.0

    # a culprit alone causes at least this share of the whole model's output error...
    share: float = 0.5

    # ...and when none was measured to cause this much, the rest is the model's own
    most: float = 0.8

    # the model's only standout (every other layer at the floor) is a culprit from this share: the
    # rest of the error is spread over layers each costing a small part of it
    lone_share: float = 0.25

    # ...or destroys its information and still reaches the outputs measurably
    min_share: float = 0.05

    # how far back an activation outlier is looked for before it counts as new
    outlier_hops: int = 3

    # layers with outlier weights asked one by one, at most (the farthest first)
    one_by_one: int = 8

    # culprits named at most: past them, fix those first and debug again
    max_culprits: int = 5

    # a channel this many times the median channel's extent may reach further
    loud: float = 4.0

    # a layer whose range is at least this many times what it is without the channel
    reach: float = 2.0

    # layers whose errors, each measured alone, sum to more than this many times the whole
    # model's do not add up: no one of them is the cause
    adds_up: float = 2.0

    # an output with fewer values (over the inputs) is checked for that first
    few_values: int = 16

    # the debugged input clipped at this many layers (clip_min of their values or more each),
    # or at a graph input, says its encodings were calibrated on other data: a calibration
    # culprit (one layer clipping is its own range's problem)
    coverage_layers: int = 3

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
