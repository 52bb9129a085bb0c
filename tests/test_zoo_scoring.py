"""The fault zoo's scoring: ranks of the culprit rows, hit rates by how much the fault costs the
outputs, false alarms - on hand-built tables (no model run)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from benchmarks.zoo import scoring


def test_score_reads_culprit_rank_and_names_the_best_culprit_row():
    table = pd.DataFrame(
        {
            "Name": ["a", "b", "c", "d"],
            "culprit_rank": pd.array([None, 2, 1, None], dtype="Int64"),
        }
    )
    s = scoring.score("oneshot", table, ["b", "d"])
    assert s["best_rank"] == 2 and not s["hit1"] and s["hit3"]
    assert s["n_named"] == 2 and s["named"] == "1:c | 2:b"
    with pytest.raises(KeyError):  # no stand-in ranking any more
        scoring.score("oneshot", table.drop(columns=["culprit_rank"]), ["b"])


def test_summary_gives_hit_rates_by_output_loss_and_false_alarms():
    rows = pd.DataFrame(
        [
            # kind, hit1, hit3, out_loss_db, n_named
            ("w", True, True, 5.0, 1),
            ("w", False, True, 4.0, 2),
            ("w", False, False, 3.0, 0),  # 3 dB is in the >= 3 dB band
            ("w", False, False, 2.0, 0),
            ("w", True, True, 0.5, 1),
            ("clean", False, False, 0.0, 1),
            ("clean", False, False, 0.0, 0),
        ],
        columns=["kind", "hit1", "hit3", "out_loss_db", "n_named"],
    ).assign(algorithm="oneshot", status="ok")
    t = scoring.summary_table(rows, ["w", "clean"]).set_index("fault kind")
    w = t.loc["w"]
    assert w["cases"] == 5
    assert w["hit@1"] == "40% (2/5)" and w["hit@3"] == "60% (3/5)"
    assert w["hit@3, outputs lose >= 3 dB"] == "67% (2/3)"
    assert w["hit@3, outputs lose 1-3 dB"] == "0% (0/1)"
    assert w["hit@3, outputs lose < 1 dB"] == "100% (1/1)"
    assert t.loc["clean", "false alarms"] == "1/2"


def test_the_peer_ranks_every_layer_so_it_always_names_some():
    """AIMET's per-layer sensitivity (benchmarks/aimet_peer.py) ranks every layer: scored the
    same way, its hit is where the culprit's layer falls, and a clean model is always an alarm;
    a failed case counts as no hit."""
    from benchmarks.zoo.aimet_peer import _sqnr_db

    table = pd.DataFrame({"Name": ["a", "a_relu", "b", "c"], "culprit_rank": [1, 1, 2, 3]})
    s = scoring.score("aimet_enabled", table, ["b"])
    assert s["best_rank"] == 2 and s["hit3"] and not s["hit1"] and s["n_named"] == 4
    clean = scoring.score("aimet_enabled", table, [])
    rows = pd.DataFrame(
        [
            {"kind": "w", "status": "ok"} | s,
            {"kind": "w", "status": "failed: no model"},
            {"kind": "clean", "status": "ok"} | clean,
        ]
    ).assign(algorithm="aimet_enabled", out_loss_db=5.0)
    t = scoring.summary_table(scoring.with_defaults(rows), ["w", "clean"]).set_index("fault kind")
    assert t.loc["w", "hit@3"] == "100% (1/1)" and t.loc["w", "failed runs"] == 1
    assert t.loc["clean", "false alarms"] == "1/1"
    # the score: the worst output's SQNR, powers summed over the inputs (numpy by hand)
    g = [[[1.0, 2.0], [3.0]], [[2.0, 0.0], [1.0]]]
    r = [[[1.5, 2.0], [3.0]], [[2.0, 0.5], [1.0]]]
    assert _sqnr_db(g, r) == pytest.approx(10 * math.log10((1 + 4 + 4) / (0.25 + 0.25)))


def test_a_clean_model_that_diverges_on_the_backend_may_have_its_backend_layer_named():
    """A clean run naming only backend culprits is no false alarm when the model's plain QNN
    run loses 3 dB or more against the CPU fake-quant; naming one quantization culprit beside
    it, or a gap under 3 dB, is still an alarm."""
    table = pd.DataFrame(
        {
            "Name": ["a", "b", "c"],
            "culprit_rank": pd.array([1, None, 2], dtype="Int64"),
            "cause": ["backend: fed the backend's own inputs", "inherited from a", "backend: x"],
        }
    )
    s = scoring.score("oneshot", table, [])
    assert (s["n_named"], s["n_backend"]) == (2, 2)
    mixed = table.assign(cause=["backend: fed", "", "weight range: 8-bit"])
    m = scoring.score("oneshot", mixed, [])
    assert (m["n_named"], m["n_backend"]) == (2, 1)
    rows = pd.DataFrame(
        [
            {"kind": "clean", "status": "ok", "backend_gap_db": 6.2} | s,  # not an alarm
            {"kind": "clean", "status": "ok", "backend_gap_db": 2.9} | s,  # under 3 dB
            {"kind": "clean", "status": "ok", "backend_gap_db": 6.2} | m,  # a layer besides
            {"kind": "clean", "status": "ok", "backend_gap_db": math.nan} | s,  # not measured
        ]
    ).assign(algorithm="oneshot", out_loss_db=math.nan)
    t = scoring.summary_table(scoring.with_defaults(rows), ["clean"]).set_index("fault kind")
    assert t.loc["clean", "false alarms"] == "3/4"
    assert list(scoring.real_backend(rows).index) == [0]


def test_clean_fixes_sets_each_named_layer_against_its_own_fix_on_the_backend():
    """benchmarks/clean_fixes.py: a named layer's best own candidate of round 1 over the
    baseline, as the share of error power it removes (1 - 10^(-gain/10), by hand here)."""
    from benchmarks.clean_fixes import rows

    table = pd.DataFrame(
        {
            "Name": ["a", "b", "c"],
            "culprit_rank": [2.0, None, 1.0],
            "output error share": [0.4, None, 0.9],
            "output error removed": [0.3, None, None],
        }
    )
    fixes = pd.DataFrame(
        {
            "round": [0, 1, 1, 1, 1, 2],
            "change": ["baseline", "pc a", "a16 a", "pc c", "global", "a16 c"],
            "scope": [None, "local", "local", "local", "global", "local"],
            "layer": [None, "a", "a", "c", None, "c"],
            "status": ["ok", "ok", "ok", "ok", "ok", "ok"],
            "SQNR mean": [10.0, 13.0, 11.0, 9.0, 12.0, 30.0],
        }
    )
    got = rows("m", table, fixes)
    assert [r["named"] for r in got] == ["#1 c", "#2 a"]  # by rank
    c, a = got
    assert a["own best fix"] == "pc a" and a["own gain dB"] == 3.0
    assert a["own removes"] == f"{1 - 10 ** (-0.3):.0%}" == "50%"
    assert a["alone"] == "40%" and a["taken out"] == "30%"
    # round 2's candidate (30 dB) is not the layer's own fix from the baseline
    assert c["own gain dB"] == -1.0 and c["taken out"] == "-"
    assert c["best global gain dB"] == 2.0
    assert rows("m", table.assign(culprit_rank=None), fixes) == [{"model": "m", "named": "-"}]
    # a zoo case: the planted culprit set is marked, and only it
    marked = [r["named"] for r in rows("m/k/mid", table, fixes, planted=["a", "z"])]
    assert marked == ["#1 c", "#2 a (planted)"]
    # a case the fix search did not take (planted through -qo encodings): named, not measured
    assert [r["own best fix"] for r in rows("m", table, pd.DataFrame())] == ["not searched"] * 2
