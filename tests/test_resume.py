"""Kill a snooping run for real (SIGKILL, SIGINT), start it again with the same
--output_dirname, and check it continues where it stopped and ends as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accdbg.algorithms import run_cumulative_layerwise, run_layerwise
from accdbg.algorithms.checkpoint import JOURNAL, Journal
from accdbg.core.inputs import parse_input_tensor
from accdbg.errors import AccdbgError
from tests import models

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import json, sys
from accdbg.algorithms import run_cumulative_layerwise, run_layerwise
from accdbg.core.inputs import parse_input_tensor
a = json.loads(sys.argv[1])
fn = run_layerwise if a["algorithm"] == "layerwise" else run_cumulative_layerwise
fn(a["model"], [parse_input_tensor(a["input"])], working_dir=a["working_dir"], output_dirname=a["name"], **a["kw"])
"""
TINY_BUDGET = 1e-6  # one fragment per batch: a checkpoint after every layer


def _rows_in(journal: Path) -> int:
    if not journal.exists():
        return 0
    return sum(len(r.get("rows", [])) for r in Journal(journal).records)


def start_and_kill(args: dict, sig: int, after_rows: int, timeout: float = 240) -> Path:
    """Run ``args`` in a fresh Python, send ``sig`` to its process group once the journal holds
    ``after_rows`` finished rows; returns the folder the killed run left."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(args)],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    root = Path(args["working_dir"]) / f"{args['algorithm']}_snooping"
    staging = root / f".{args['name']}.partial"
    deadline = time.monotonic() + timeout
    try:
        while _rows_in(staging / JOURNAL) < after_rows:
            assert proc.poll() is None, (
                f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
            )
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    left = staging if staging.exists() else root / f"{args['name']}.failed"
    assert left.is_dir() and not (root / args["name"]).exists()
    return left


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    built = models.conv_net(tmp, channels=8, size=16, layers=4)
    inp = ["x", "1,3,16,16", str(built.input_path)]
    return tmp, built, inp


def _check_partial_csv(folder: Path, stem: str, reference: pd.DataFrame) -> int:
    """The CSV a killed run left: parseable, whole rows, each equal to the uninterrupted run's."""
    csv = pd.read_csv(folder / f"{stem}.csv", keep_default_na=False)
    assert list(csv.columns) == list(reference.columns)
    records = [r for r in Journal(folder / JOURNAL).records if r.get("rows")]
    finished = sum(len(r["rows"]) for r in records)
    # the report follows the journal: a kill between the two leaves it one unit behind
    assert finished - len(records[-1]["rows"]) <= len(csv) <= finished < len(reference)
    assert len(csv) > 0
    ref = reference.set_index("O/P Name")
    for _, row in csv.iterrows():
        assert row["O/P Name"] in ref.index and row["Layer Type"] and row["Shape"].startswith("[")
        assert float(row["CosineSimilarity"]) == pytest.approx(
            ref.loc[row["O/P Name"], "CosineSimilarity"], abs=1e-12
        )
    return finished


def test_sigkill_mid_layerwise_resumes_from_the_last_finished_layer(small):
    tmp, built, inp = small
    kw = {"memory_budget_mb": TINY_BUDGET, "workers": 1}
    ref = run_layerwise(built.path, [parse_input_tensor(inp)], working_dir=tmp / "ref", **kw)
    assert ref.sessions == len(ref.report) >= 4
    args = {
        "algorithm": "layerwise",
        "model": str(built.path),
        "input": inp,
        "working_dir": str(tmp / "w"),
        "name": "run",
        "kw": kw,
    }
    left = start_and_kill(args, signal.SIGKILL, after_rows=2)
    done = _check_partial_csv(left, "layerwise", ref.report)
    qdq = next(left.glob("*.qdq.onnx"))
    qdq_mtime = qdq.stat().st_mtime_ns
    res = run_layerwise(
        built.path, [parse_input_tensor(inp)], working_dir=tmp / "w", output_dirname="run", **kw
    )
    assert res.run_dir == tmp / "w" / "layerwise_snooping" / "run" and not left.exists()
    pd.testing.assert_frame_equal(res.report, ref.report)
    assert res.sessions == len(ref.report) - done  # only the unfinished layers ran again
    # the set-up was reused: no second framework diagnosis, no second quantization
    assert (
        len([p for p in (tmp / "w" / "framework_diagnosis").iterdir() if p.name != "latest"]) == 1
    )
    assert next(res.run_dir.glob("*.qdq.onnx")).stat().st_mtime_ns == qdq_mtime
    assert (tmp / "w" / "layerwise_snooping" / "latest").resolve() == res.run_dir
    # starting a finished run again does nothing and returns the same report
    again = run_layerwise(
        built.path, [parse_input_tensor(inp)], working_dir=tmp / "w", output_dirname="run", **kw
    )
    assert again.sessions == 0
    pd.testing.assert_frame_equal(again.report, ref.report)
    with pytest.raises(AccdbgError, match="holds a run with another verifiers"):
        run_layerwise(
            built.path,
            [parse_input_tensor(inp)],
            verifiers=["SQNR"],
            working_dir=tmp / "w",
            output_dirname="run",
            **kw,
        )


def test_sigint_mid_cumulative_resumes(small):
    tmp, built, inp = small
    # a pass mark no layer meets: every layer becomes a partition point, one run each
    kw = {"verifiers": ["CosineSimilarity,threshold,1.5"], "workers": 1}
    ref = run_cumulative_layerwise(
        built.path, [parse_input_tensor(inp)], working_dir=tmp / "cref", **kw
    )
    assert (ref.report["Status"] == "part").all() and ref.sessions == len(ref.report)
    args = {
        "algorithm": "cumulative_layerwise",
        "model": str(built.path),
        "input": inp,
        "working_dir": str(tmp / "cw"),
        "name": "run",
        "kw": kw,
    }
    left = start_and_kill(args, signal.SIGINT, after_rows=2)
    assert left.name == "run.failed"  # SIGINT: the run closed itself as failed, its report intact
    done = _check_partial_csv(left, "cumulative_layerwise", ref.report)
    res = run_cumulative_layerwise(
        built.path, [parse_input_tensor(inp)], working_dir=tmp / "cw", output_dirname="run", **kw
    )
    pd.testing.assert_frame_equal(res.report, ref.report)
    assert res.sessions == len(ref.report) - done


def test_the_input_list_is_part_of_the_recorded_options(small):
    tmp, built, inp = small
    lists = []
    for i, gain in enumerate((2.0, 5.0)):
        line = tmp / f"line{i}.raw"
        (np.fromfile(built.input_path, np.float32) * gain).tofile(line)
        lists.append(tmp / f"list{i}.txt")
        lists[-1].write_text(f"{built.input_path}\n{line}\n")
    kw = {"working_dir": tmp / "lw", "output_dirname": "run", "workers": 1}
    first = run_layerwise(built.path, [parse_input_tensor(inp)], input_list=lists[0], **kw)
    assert first.sessions > 0
    again = run_layerwise(built.path, [parse_input_tensor(inp)], input_list=lists[0], **kw)
    assert again.sessions == 0  # the same run, finished: nothing to do
    for other in (lists[1], None):
        with pytest.raises(AccdbgError, match="holds a run with another input_list"):
            run_layerwise(built.path, [parse_input_tensor(inp)], input_list=other, **kw)
    # a bad list line and a misplaced input_list are one-line errors before any folder is made
    bad = tmp / "bad_list.txt"
    bad.write_text(f"{built.input_path}\n{tmp / 'bad_list.txt'}\n")
    kw["working_dir"] = tmp / "bad"
    with pytest.raises(AccdbgError, match=r"bad_list.txt:2: input 'x'"):
        run_layerwise(built.path, [parse_input_tensor(inp)], input_list=bad, **kw)
    with pytest.raises(AccdbgError, match="pass input_list="):
        run_layerwise(
            built.path, [parse_input_tensor(inp)], engine_kwargs={"input_list": bad}, **kw
        )
    assert not (tmp / "bad").exists()


def test_a_record_cut_short_by_a_kill_is_dropped(tmp_path):
    path = tmp_path / JOURNAL
    j = Journal(path)
    j.append({"kind": "rows", "rows": [{"_position": 0}]})
    j.append({"kind": "rows", "rows": [{"_position": 1}]})
    with open(path, "ab") as fh:
        fh.write(b'{"kind": "rows", "rows": [{"_posi')  # killed mid-write
    again = Journal(path)
    assert [r["rows"][0]["_position"] for r in again.records] == [0, 1]
    again.append({"kind": "done"})
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == [
        "rows",
        "rows",
        "done",
    ]
