"""Each verifier against values computed here, independently (hand-built tensors, numpy)."""

import math

import numpy as np
import pytest

from accdbg.errors import AccdbgError
from accdbg.verifiers import VERIFIERS, get_verifier, parse_verifier_spec, verifier_names
from accdbg.verifiers.topk import top_k_indices

RNG = np.random.default_rng(3)
G = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
T = (G + 0.05 * RNG.standard_normal(G.shape)).astype(np.float32)
g64, t64 = G.astype(np.float64).ravel(), T.astype(np.float64).ravel()

SINGLE = [n for n in verifier_names() if n != "MeanIOU"]


def test_all_ten_verifiers_registered_with_documented_threshold():
    assert sorted(verifier_names(), key=str.lower) == sorted(
        [
            "RtolAtol",
            "AdjustedRtolAtol",
            "TopK",
            "L1Error",
            "CosineSimilarity",
            "MSE",
            "MAE",
            "SQNR",
            "MeanIOU",
            "ScaledDiff",
        ],
        key=str.lower,
    )
    for cls in VERIFIERS.values():
        doc = cls.__doc__ or ""
        assert "Pass" in doc or "pass mark" in doc, cls.name  # the threshold is documented
        if cls.threshold is not None:
            assert (
                f"{cls.threshold:g}" in doc.replace(" %", "").replace(" dB", "")
                or cls.name == "MSE"
            )


# ------------------------------------------------------------------ formulas on random data


def test_cosine_similarity_formula():
    res = get_verifier("CosineSimilarity")(G, T)
    want = np.sum(g64 * t64) / (np.linalg.norm(g64) * np.linalg.norm(t64))
    assert res.value == pytest.approx(want, rel=1e-12)
    assert res.passed is bool(want >= 0.99) and res.status == "ok"


def test_sqnr_formula_and_target_signal_variant():
    res = get_verifier("SQNR")(G, T)
    assert res.value == pytest.approx(
        10 * np.log10(np.sum(g64**2) / np.sum((g64 - t64) ** 2)), rel=1e-12
    )
    old = get_verifier("SQNR signal target")(G, T)  # Qualcomm's: mean t^2 / mean err^2
    assert old.value == pytest.approx(
        10 * np.log10(np.mean(t64**2) / np.mean((g64 - t64) ** 2)), rel=1e-12
    )
    loud = get_verifier("SQNR")(g64, 3 * g64)
    loud_old = get_verifier("SQNR signal target")(g64, 3 * g64)
    assert loud.value == pytest.approx(10 * np.log10(1 / 4), rel=1e-9)  # error 2g: -6 dB
    assert loud_old.value == pytest.approx(10 * np.log10(9 / 4), rel=1e-9)  # flattered: +3.5 dB


def test_mse_mae_l1():
    d = g64 - t64
    assert get_verifier("mse")(G, T).value == pytest.approx(np.mean(d**2), rel=1e-12)
    assert get_verifier("MAE")(G, T).value == pytest.approx(np.mean(np.abs(d)), rel=1e-12)
    assert get_verifier("L1Error")(G, T).value == pytest.approx(np.sum(np.abs(d)), rel=1e-12)
    l1 = get_verifier("l1error,multiplier,2.5,scale,0.1")(G, T)
    assert l1.value == pytest.approx(np.sum(np.abs(d)) * 0.25, rel=1e-12)
    assert l1.passed is None  # no default pass mark for a sum
    assert get_verifier(f"l1error,threshold,{np.sum(np.abs(d)) * 2}")(G, T).passed is True


def test_rtol_atol_hand_built_and_against_isclose():
    g = np.array([1.0, 1.0, 1.0, 1.0, -2.0])
    t = np.array([1.005, 1.03, 1.0, 0.985, -2.031])
    # tolerance 0.01 + 0.01*|g| = 0.02 (0.03 for -2): outside are 1.03 and -2.031 -> 2 of 5
    res = get_verifier("rtolatol,rtolmargin,0.01,atolmargin,0.01")(g, t)
    assert res.value == pytest.approx(40.0)
    assert res.passed is False and res.details["elements_outside"] == 2
    for rtol, atol in ((0.01, 0.01), (0.1, 0.0), (0.0, 0.05)):
        res = get_verifier(["RtolAtol", "rtolmargin", str(rtol), "atolmargin", str(atol)])(G, T)
        want = 100 * np.mean(~np.isclose(t64, g64, rtol=rtol, atol=atol))
        assert res.value == pytest.approx(want, abs=1e-9)


def test_adjusted_rtol_atol():
    for levels in (4, 1, 10):
        res = get_verifier(f"AdjustedRtolAtol,levels_num,{levels}")(G, T)
        atol = levels * (g64.max() - g64.min()) / 255
        want = 100 * np.mean(~np.isclose(t64, g64, rtol=0.1, atol=atol))
        assert res.value == pytest.approx(want, abs=1e-9)
    assert (
        get_verifier("AdjustedRtolAtol,levels_num,1")(G, T).value
        >= get_verifier("AdjustedRtolAtol")(G, T).value
    )


def test_scaled_diff_per_tensor_per_axis_and_not_applicable():
    res = get_verifier("ScaledDiff")(G, T, scale=0.02)
    assert res.value == pytest.approx(np.mean(np.abs(g64 - t64)) / 0.02, rel=1e-12)
    steps = np.array([0.01, 0.02, 0.04]).reshape(1, 3, 1, 1)
    per_axis = get_verifier("ScaledDiff")(G, T, scale=steps)
    want = np.mean(np.abs(G.astype(np.float64) - T) / steps)
    assert per_axis.value == pytest.approx(want, rel=1e-12)
    none = get_verifier("ScaledDiff")(G, T)
    assert math.isnan(none.value) and none.passed is None
    assert none.status.startswith("not applicable")


def test_topk_hand_built():
    g = np.array([0.1, 0.5, 0.3, 0.9])
    t = np.array([0.9, 0.5, 0.3, 0.1])
    assert get_verifier("TopK")(g, t).value == 100.0  # argmax 3 vs 0
    assert get_verifier("TopK k 2")(g, t).value == 50.0  # {3,1} vs {0,1}
    assert get_verifier("TopK k 2 ordered true")(g, t).value == 50.0  # [3,1] vs [0,1]
    swapped = np.array([0.8, 0.9, 0.0, 0.1])
    base = np.array([0.9, 0.8, 0.0, 0.1])
    assert get_verifier("TopK k 2")(base, swapped).value == 0.0  # same set
    assert (
        get_verifier("TopK,k,2,ordered,true")(base, swapped).value == 100.0
    )  # both positions differ
    assert get_verifier("TopK k 10")(g, t).details["k"] == 4  # k capped at the size


def test_topk_against_argsort():
    for k in (1, 3, 17):
        gi = np.argsort(-g64, kind="stable")[:k]
        ti = np.argsort(-t64, kind="stable")[:k]
        assert list(top_k_indices(g64, k)) == list(gi)
        want = 100 * len(set(gi) - set(ti)) / k
        assert get_verifier(f"TopK k {k}")(G, T).value == pytest.approx(want)
        want_ordered = 100 * np.mean(gi != ti)
        assert get_verifier(f"TopK k {k} ordered true")(G, T).value == pytest.approx(want_ordered)


def _iou(a, b):
    ih = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iw = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ih * iw
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_mean_iou_hand_built():
    gb = np.array([[0, 0, 10, 10], [20, 20, 30, 40], [5, 5, 6, 6]], dtype=np.float32)
    gc = np.array([2, 3, 1], dtype=np.float32)  # the last one is background (1.0)
    tb = np.array([[20, 22, 30, 40], [1, 0, 11, 10], [50, 50, 60, 60]], dtype=np.float32)
    tc = np.array([3, 2, 1], dtype=np.float32)
    res = get_verifier("MeanIOU")([gb, gc], [tb, tc])
    want = (_iou(gb[0], tb[1]) + _iou(gb[1], tb[0])) / 2
    assert res.value == pytest.approx(want, rel=1e-9) and 0 <= res.value <= 1
    # an extra target detection of a real class counts as a miss
    tb2 = np.vstack([tb, [[70, 70, 80, 80]]])
    tc2 = np.append(tc, 2)
    res2 = get_verifier("MeanIOU")([gb, gc], [tb2, tc2])
    assert res2.value == pytest.approx((_iou(gb[0], tb[1]) + _iou(gb[1], tb[0])) / 3, rel=1e-9)
    # wrong class: no match at all
    assert get_verifier("MeanIOU")([gb, gc], [tb, np.array([4, 4, 1])]).value == 0.0
    # background parameter: with background 2 the class-2 pair is ignored
    res3 = get_verifier("MeanIOU background_classification 2")([gb, gc], [tb, tc])
    # left: class 3 pair and class 1 (golden [5,5,6,6] vs target [50,...]) -> (iou + 0) / 2
    assert res3.value == pytest.approx((_iou(gb[1], tb[0]) + 0.0) / 2, rel=1e-9)
    # nothing detected on either side agrees perfectly
    empty = np.zeros((0, 4))
    assert get_verifier("MeanIOU")([empty, np.zeros(0)], [empty, np.zeros(0)]).value == 1.0


def test_mean_iou_bad_shapes_are_statuses():
    gb = np.zeros((3, 4))
    res = get_verifier("MeanIOU")([gb, np.zeros(2)], [gb, np.zeros(3)])
    assert math.isnan(res.value) and "3 boxes but 2 classes" in res.status
    res = get_verifier("MeanIOU")([gb, np.zeros(3)], [np.full((3, 4), np.nan), np.zeros(3)])
    assert res.passed is False and "NaN" in res.status


# ------------------------------------------------------------------ edge cases, every verifier


@pytest.mark.parametrize("name", SINGLE)
def test_identical_constant_tensors_score_perfectly(name):
    c = np.full((4, 5), 3.25, dtype=np.float32)
    res = get_verifier(name)(c, c, scale=0.1)
    best = {"CosineSimilarity": 1.0, "SQNR": math.inf}.get(name, 0.0)
    assert res.value == best and res.status == "ok"
    if get_verifier(name).pass_mark is not None:
        assert res.passed is True


@pytest.mark.parametrize("name", SINGLE)
def test_zeros_never_nan(name):
    z = np.zeros(12, dtype=np.float32)
    one = np.arange(12, dtype=np.float32)
    for g, t in ((z, z), (z, one), (one, z)):
        res = get_verifier(name)(g, t, scale=0.5)
        assert not math.isnan(res.value), (name, g, t)
    cs = get_verifier("CosineSimilarity")
    assert cs(z, z).value == 1.0 and cs(z, one).value == 0.0 and cs(one, z).value == 0.0
    sq = get_verifier("SQNR")
    assert sq(z, z).value == math.inf and sq(z, one).value == -math.inf


@pytest.mark.parametrize("name", SINGLE)
def test_nan_in_target_is_reported_and_fails(name):
    g = np.arange(1, 11, dtype=np.float32)
    t = g.copy()
    t[[2, 5]] = np.nan
    t[7] = np.inf
    res = get_verifier(name)(g, t, scale=0.1)
    assert "NaN in target (2 elements)" in res.status and "Inf in target (1 element)" in res.status
    assert res.passed is False
    assert not math.isnan(res.value)  # computed on the 7 finite pairs, not poisoned


def test_nan_in_golden_and_matching_infinities():
    g = np.array([1.0, 2.0, np.inf, -np.inf, np.nan, 3.0])
    t = np.array([1.0, 2.0, np.inf, -np.inf, np.nan, 3.0])
    res = get_verifier("CosineSimilarity")(g, t)
    assert res.value == 1.0 and res.passed is True  # same non-finite values agree
    assert "identical non-finite values at 3 elements excluded" in res.status
    t2 = t.copy()
    t2[3] = 5.0  # golden -inf, target finite
    res2 = get_verifier("MSE")(g, t2)
    assert res2.passed is False and "Inf in golden (2 elements)" in res2.status
    assert res2.value == 0.0  # the remaining finite pairs agree exactly


def test_all_nan_target():
    res = get_verifier("CosineSimilarity")(np.ones(4), np.full(4, np.nan))
    assert math.isnan(res.value) and res.passed is False and "no finite values" in res.status


@pytest.mark.parametrize("name", SINGLE)
def test_size_mismatch_is_a_status(name):
    res = get_verifier(name)(np.ones(10), np.ones(12), scale=1.0)
    assert math.isnan(res.value) and res.passed is None
    assert res.status == "size mismatch: golden 10 elements, target 12 elements"


def test_empty_tensors():
    res = get_verifier("MSE")(np.zeros((0, 3)), np.zeros((0, 3)))
    assert math.isnan(res.value) and "empty" in res.status


# ------------------------------------------------------------------ specs and parameters


def test_both_spec_syntaxes_and_case():
    assert parse_verifier_spec("rtolatol,rtolmargin,0.01,atolmargin,0.02") == (
        "rtolatol",
        {"rtolmargin": "0.01", "atolmargin": "0.02"},
    )
    assert parse_verifier_spec(["CosineSimilarity", "threshold", "0.5"]) == (
        "CosineSimilarity",
        {"threshold": "0.5"},
    )
    v = get_verifier(["RTOLATOL", "RtolMargin", "0.2"])
    assert v.name == "RtolAtol" and v.values["rtolmargin"] == 0.2 and v.values["atolmargin"] == 0.01
    assert get_verifier("topk k 3 ordered TRUE").values == {"k": 3, "ordered": True}


def test_threshold_override_changes_verdict():
    g, t = np.array([1.0, 0.0]), np.array([1.0, 0.2])
    value = get_verifier("CosineSimilarity")(g, t).value  # ~0.98
    assert get_verifier("CosineSimilarity")(g, t).passed is False
    assert get_verifier(f"CosineSimilarity,threshold,{value - 1e-6}")(g, t).passed is True
    assert get_verifier("MSE threshold 0.001")(g, t).passed is False
    assert get_verifier("MSE threshold 0.05")(g, t).passed is True


@pytest.mark.parametrize(
    "spec, expect",
    [
        (
            "Cosine",
            "unknown verifier 'Cosine'; valid verifiers: AdjustedRtolAtol, CosineSimilarity",
        ),
        (
            ["CosineSimilarity", "param1", "1", "param2", "2"],
            "verifier CosineSimilarity has no parameter 'param1'; valid parameters: threshold",
        ),
        ("rtolatol,rtol,0.1", "valid parameters: atolmargin, rtolmargin, threshold"),
        ("rtolatol,rtolmargin,0.01,atolmargin,0,01", "name/value pairs"),
        ("rtolatol,rtolmargin,abc", "'abc' is not a number"),
        ("TopK k 2.5", "'2.5' is not an integer"),
        ("TopK k 0", "at least 1"),
        ("TopK ordered maybe", "is not true or false"),
        ("SQNR signal noise", "not one of golden, target"),
        ("", "needs a verifier name"),
    ],
)
def test_bad_specs_are_one_line_errors(spec, expect):
    with pytest.raises(AccdbgError) as exc:
        get_verifier(spec)
    assert expect in str(exc.value)
    assert "\n" not in str(exc.value)


def test_huge_values_do_not_overflow_into_nan():
    g = np.array([1e200, -3e200, 2e200])
    t = g * 1.001
    cs = get_verifier("CosineSimilarity")(g, t)
    assert cs.value == pytest.approx(1.0) and cs.status == "ok"
    sq = get_verifier("SQNR")(g, t)
    assert sq.value == pytest.approx(10 * np.log10(1 / 0.001**2), rel=1e-9)


def test_spec_rebuilds_the_verifier():
    for spec in (
        "TopK k 3 ordered true",
        "rtolatol,rtolmargin,0.2",
        "SQNR signal target threshold 12",
        "MSE",
    ):
        v = get_verifier(spec)
        again = get_verifier(v.spec)
        assert again.values == v.values and again.pass_mark == v.pass_mark and again.name == v.name
