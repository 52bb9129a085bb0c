"""The HTML report: findings, ranking columns, chart legend and axes, and how it reads at 1400 px.

The tables are built by hand - layer names as long as real models have, SQNR along a chain
with one broken layer - with and without the ranking's ``culprit_rank``/``cause`` columns.
"""

from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from accdbg.algorithms.diagnosis.attribution import Attribution
from accdbg.reports.chart import figure
from accdbg.reports.html_report import write_report
from accdbg.verifiers import get_verifier
from tests import browser

N = 240
BROKEN, SECOND, THIRD = 150, 40, 210
VERIFIERS = {"CosineSimilarity": get_verifier("CosineSimilarity"), "SQNR": get_verifier("SQNR")}
EVIL = '<img src=x onerror="alert(1)">'


def _name(i: int) -> str:
    if i == BROKEN:
        return "/backbone/stage3/block2/conv/Conv_output_0"
    return (
        f"/backbone/stage{i // 60}/block{i % 7}/conv{i}/Conv_output_0"
        if i % 3
        else f"conv2d_{i}.tmp_0"
    )


def table(ranked: bool) -> pd.DataFrame:
    """A verification summary in its column order (score columns far from the name)."""
    rng = np.random.default_rng(5)
    sqnr = 34 - np.cumsum(rng.random(N) * 0.05)
    sqnr[BROKEN:] -= 12
    cos = 1 - 10 ** (-sqnr / 10)
    names = [_name(i) for i in range(N)]
    failed = [", ".join(lab for lab, bad in (("SQNR", s < 20),) if bad) for s in sqnr]
    df = pd.DataFrame(
        {
            "Name": names,
            "LayerType": ["Conv"] * N,
            "Size": 409600,
            "Tensor_dims": [[1, 64, 80, 80]] * N,
            "CosineSimilarity": cos,
            "SQNR": sqnr,
            "golden_min": -3.25,
            "golden_max": 7.5,
            "target_min": -3.3,
            "target_max": 7.45,
            "Status": ["fail" if f else "ok" for f in failed],
            "Failed": failed,
            "Golden_name": names,
            "Layout": "",
            "Order": range(N),
            "CosineSimilarity drop": np.r_[0.0, -np.diff(cos)],
            "SQNR drop": np.r_[0.0, -np.diff(sqnr)],
            "CosineSimilarity error added": 0.0,
            "SQNR error added": 0.0,
            "first_crossing": "",
            "largest_drop": "",
        }
    )
    if ranked:
        rank = np.full(N, np.nan)
        rank[[BROKEN, SECOND, THIRD]] = [1, 2, 3]
        cause = np.where(np.isnan(rank), "", "weight range: output channel 7 spans 43x " + EVIL)
        df["culprit_rank"] = rank
        df["cause"] = cause
    return df


def marks() -> list[Attribution]:
    return [
        Attribution(lab, _name(BROKEN), [(_name(BROKEN), 12.0), (_name(SECOND), 0.1)])
        for lab in VERIFIERS
    ]


FINDINGS = [
    f"culprit #1: {_name(BROKEN)} (Conv) - weight range: output channel 7 spans 43x",
    f"culprit #2: {EVIL}",
]


def _write(tmp_path, ranked: bool, findings=FINDINGS):
    df = table(ranked)
    return write_report(
        tmp_path / f"report_{'ranked' if ranked else 'plain'}.html",
        df,
        VERIFIERS,
        marks(),
        title="accdbg oneshot-layerwise: det.onnx",
        meta="model det.onnx",
        failed=[bool(f) for f in df["Failed"]],
        findings=findings,
    )


def _headers(page: str) -> list[str]:
    thead = re.search(r"<thead>(.*?)</thead>", page, re.S).group(1)
    cells = re.findall(r"<th[^>]*>(.*?)</th>", thead, re.S)
    return [html.unescape(c.replace("<wbr>", "")) for c in cells]


def _rows(page: str) -> list[tuple[str, str]]:
    """(class, name) of every table row, in order."""
    return [
        (cls, html.unescape(name.replace("<wbr>", "")))
        for cls, name in re.findall(
            r'<tr id="row-\d+" class="([^"]*)"><th scope="row" class="name">(.*?)</th>', page
        )
    ]


def test_findings_head_the_page_escaped(tmp_path):
    page = _write(tmp_path, ranked=True).read_text()
    assert EVIL not in page  # neither in the findings nor in the cause cells
    box = re.search(r'<section class="findings".*?</section>', page, re.S).group(0)
    assert "<li>culprit #2: &lt;img src=x onerror=&quot;alert(1)&quot;&gt;</li>" in box
    assert page.index('class="findings"') < page.index('class="chart"')  # first thing read
    plain = _write(tmp_path, ranked=False, findings=()).read_text()
    assert 'class="findings"' not in plain  # no empty box


def test_ranking_columns_follow_the_name_and_culprits_are_highlighted(tmp_path):
    page = _write(tmp_path, ranked=True).read_text()
    head = _headers(page)
    assert head[:14] == [
        "Name",
        "culprit_rank",
        "cause",
        "LayerType",
        "CosineSimilarity",
        "SQNR",
        "CosineSimilarity drop",
        "SQNR drop",
        "CosineSimilarity error added",
        "SQNR error added",
        "first_crossing",
        "largest_drop",
        "Status",
        "Failed",
    ]
    assert set(head) == set(table(ranked=True).columns) | {"details"}  # nothing lost
    rows = _rows(page)
    assert [name for _, name in rows] == [_name(i) for i in range(N)]  # execution order kept
    culprit_rows = {name for cls, name in rows if "culprit" in cls.split()}
    assert culprit_rows == {_name(BROKEN), _name(SECOND), _name(THIRD)}
    # the rank cell right after the name
    row = re.search(r'<tr id="row-150".*?</tr>', page, re.S).group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert cells[0] == "1" and cells[1].startswith(
        "weight range: output channel 7 spans 43x &lt;img"
    )


def test_integer_ranks_with_missing_values(tmp_path):
    """A nullable integer rank column (pd.NA for non-culprits) reads as blanks and ranks."""
    df = table(ranked=True)
    df["culprit_rank"] = df["culprit_rank"].astype("Int64")
    page = write_report(tmp_path / "r.html", df, VERIFIERS, [], title="t").read_text()
    assert "&lt;NA&gt;" not in page and "<NA>" not in page
    ranks = {}
    for i in (0, SECOND, BROKEN, THIRD):
        row = re.search(rf'<tr id="row-{i}".*?</tr>', page, re.S).group(0)
        ranks[i] = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[0]
    assert ranks == {0: "", SECOND: "2", BROKEN: "1", THIRD: "3"}
    culprit = [t for t in figure(df, VERIFIERS).data if t.name == "culprit"][0]
    assert list(culprit.x) == [BROKEN, SECOND, THIRD]


def test_without_ranking_columns_the_report_is_todays(tmp_path):
    page = _write(tmp_path, ranked=False).read_text()
    head = _headers(page)
    assert head[:4] == ["Name", "LayerType", "CosineSimilarity", "SQNR"]
    assert not any("culprit" in cls.split() for cls, _ in _rows(page))
    fig = figure(table(ranked=False), VERIFIERS, marks())
    assert "culprit" not in {t.name for t in fig.data}


@pytest.mark.parametrize("ranked", [True, False])
def test_chart_one_legend_entry_per_mark_every_axis_titled(ranked):
    df = table(ranked)
    fig = figure(df, VERIFIERS, marks())
    shown = [t.name for t in fig.data if t.showlegend is not False]
    expected = ["score", "drop (error the layer adds)", "first crossing", "largest drops"]
    assert sorted(shown) == sorted(expected + (["culprit"] if ranked else []))
    # every trace of a kind toggles with its legend entry
    for t in fig.data:
        assert t.legendgroup == t.name
    layout = fig.layout.to_plotly_json()
    yaxes = {k: v for k, v in layout.items() if k.startswith("yaxis")}
    assert len(yaxes) == 4  # score and drop, per verifier
    titles = sorted(v["title"]["text"] for v in yaxes.values())
    assert titles == [
        "CosineSimilarity (cosine, -1..1)",
        "CosineSimilarity drop",
        "SQNR (dB)",
        "SQNR drop",
    ]
    xaxes = [v for k, v in layout.items() if k.startswith("xaxis")]
    assert any(v.get("title", {}).get("text") for v in xaxes)
    ticks = dict(zip(xaxes[0]["tickvals"], xaxes[0]["ticktext"], strict=True))
    assert len(ticks) <= 60
    # layer names, abbreviated to their tail; the broken layer is labelled (in bold)
    full = _name(BROKEN)
    assert ticks[BROKEN] == "<b>…" + full[len(full) - 19 :] + "</b>"  # 20 characters
    assert ticks[0] == "conv2d_0.tmp_0"
    hovers = [t for t in fig.data if t.name == "score"][0].text
    assert full in hovers[BROKEN]  # the full name on hover
    if ranked:
        culprit = [t for t in fig.data if t.name == "culprit"][0]
        assert list(culprit.x) == [BROKEN, SECOND, THIRD] and list(culprit.text) == [
            "#1",
            "#2",
            "#3",
        ]


@pytest.mark.slow
def test_report_at_1400_px_shows_the_culprit_and_scores_without_sideways_scroll(tmp_path):
    report = _write(tmp_path, ranked=True)
    top = _name(BROKEN)
    seen, errors = browser.layout(report, tmp_path, top)
    assert errors == []
    width = seen["viewport"]
    assert width == browser.WIDTH
    assert seen["page"] <= width  # the page itself never scrolls sideways
    right_edge = min(width, seen["wrap"]["right"])
    assert seen["findings"]["top"] < browser.HEIGHT and top in seen["findings"]["text"]
    name = seen["name"]
    assert name is not None and "culprit" in seen["row_class"].split()
    assert 0 <= name["left"] and name["right"] <= right_edge and name["text"] == top
    for col in ("culprit_rank", "cause", "CosineSimilarity", "SQNR", "SQNR drop"):
        head = seen["heads"][col]
        assert 0 <= head["left"] and head["right"] <= right_edge, (col, head, right_edge)
    # the table is wider than the page: the rest is scrolled inside the table's own box
    assert seen["heads"]["details"]["right"] > right_edge
    legend = seen["legend"]
    assert sorted(legend) == sorted(
        ["score", "drop (error the layer adds)", "first crossing", "largest drops", "culprit"]
    )
    png = browser.screenshot(report, tmp_path, top)
    img = Image.open(png).convert("RGB")
    assert img.size[0] == browser.WIDTH
    px = np.asarray(img)
    box = px[int(seen["wrap"]["top"]) :, : int(name["right"])]  # the table's name column
    purple = np.all(box == (0x6A, 0x1B, 0x9A), axis=-1)  # the culprit row's left border
    assert purple.sum() > 20, "the culprit row is not on screen at the left"
