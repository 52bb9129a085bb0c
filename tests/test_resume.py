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


def _default_sigint() -> None:
    """In the child: SIGINT back to its default, whatever this pytest inherited. A shell
    without job control starts background jobs with SIGINT ignored, and an ignored signal
    stays ignored across exec (the tool honours that, as POSIX asks); the test means to
    exercise the Ctrl-C of an interactive user."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        preexec_fn=_default_sigint,
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


from accdbg.algorithms.diagnosis.ranking import COLUMNS as RANKING_COLUMNS  # noqa: E402


def _check_partial_csv(folder: Path, stem: str, reference: pd.DataFrame) -> int:
    """The CSV a killed run left: parseable, whole rows, each equal to the uninterrupted run's."""
    csv = pd.read_csv(folder / f"{stem}.csv", keep_default_na=False)
    # the culprit ranking is written with the final report only
    assert list(csv.columns) == [c for c in reference.columns if c not in RANKING_COLUMNS]
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---------------------------------------------------------------- the command line, killed


def children_of(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def cumulative_ref(small):
    tmp, built, inp = small
    ref = run_cumulative_layerwise(
        built.path,
        [parse_input_tensor(inp)],
        verifiers=["CosineSimilarity,threshold,1.5"],
        working_dir=tmp / "cli_ref",
        workers=1,
    )
    assert (ref.report["Status"] == "part").all()
    return ref


def _command(small, work: Path) -> list[str]:
    tmp, built, inp = small
    return [
        sys.executable,
        "-m",
        "accdbg.cli.main",
        "-f",
        "onnx",
        "-m",
        str(built.path),
        "-i",
        *inp,
        "--debugging_algorithm",
        "cumulative-layerwise",
        "--default_verifier",
        "CosineSimilarity,threshold,1.5",
        "-w",
        str(work),
        "--output_dirname",
        "run",
    ]


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
        preexec_fn=_default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _mid_run(proc: subprocess.Popen, journal: Path, rows: int, timeout: float = 240) -> list[int]:
    """Wait until ``rows`` rows are journaled and a backend child is running; its pids."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint with a running backend child"
        kids = children_of(proc.pid)
        if kids and _rows_in(journal) >= rows:
            return kids
        time.sleep(0.02)


def _resumed_to_the_end(small, work: Path, ref) -> str:
    """Rerun the same command: it must take the run back and finish it like an uninterrupted one."""
    proc = subprocess.run(
        _command(small, work),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("resuming") == 1, proc.stderr
    for component in ("wrapper", "cumulative_layerwise_snooping"):
        names = sorted(p.name for p in (work / component).iterdir())
        assert names == ["latest", "run"], names  # nothing partial or failed left
    csv = pd.read_csv(work / "cumulative_layerwise_snooping" / "run" / "cumulative_layerwise.csv")
    pd.testing.assert_series_equal(csv["O/P Name"], ref.report["O/P Name"])
    assert (csv["Status"] == "part").all()
    np.testing.assert_allclose(csv["CosineSimilarity"], ref.report["CosineSimilarity"], atol=1e-9)
    return proc.stderr


@pytest.mark.slow
def test_sigkill_mid_run_then_the_same_command_resumes_and_a_live_run_is_refused(
    small, cumulative_ref, tmp_path
):
    work = tmp_path / "w"
    cmd = _command(small, work)
    staging = work / "cumulative_layerwise_snooping" / ".run.partial"
    proc = _start(cmd)
    try:
        _mid_run(proc, staging / JOURNAL, rows=1)
        # the same command while the first one lives: refused, nothing of it touched. The
        # first is held (SIGSTOP) meanwhile: its persistent workers would finish the run
        # while the second command starts up.
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(
                cmd,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert second.returncode == 2
        assert f"being written by another run (pid {proc.pid} " in second.stderr, second.stderr
        assert proc.poll() is None
        kids = _mid_run(proc, staging / JOURNAL, rows=2)
        os.kill(proc.pid, signal.SIGKILL)  # the tool only: its children must follow by themselves
        proc.wait(timeout=30)
        died = time.monotonic()
        while any(alive(k) for k in kids) and time.monotonic() < died + 1.0:
            time.sleep(0.02)
        assert not any(alive(k) for k in kids), "a backend child outlived the killed tool"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (work / "wrapper" / ".run.partial").is_dir() and staging.is_dir()
    _resumed_to_the_end(small, work, cumulative_ref)


@pytest.mark.slow
def test_sigterm_stops_cleanly_leaves_no_child_and_logs_the_signal(small, cumulative_ref, tmp_path):
    work = tmp_path / "w"
    staging = work / "cumulative_layerwise_snooping" / ".run.partial"
    proc = _start(_command(small, work))
    try:
        kids = _mid_run(proc, staging / JOURNAL, rows=2)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # as `kill PID` does
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        while any(alive(k) for k in kids) and time.monotonic() < sent + took + 1.0:
            time.sleep(0.02)
        assert not any(alive(k) for k in kids), "a backend child outlived the tool"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM and took < 10, (proc.returncode, took)
    assert err.strip().splitlines()[-1] == "qnn-accuracy-debugger: interrupted by SIGTERM"
    for component in ("wrapper", "cumulative_layerwise_snooping"):
        assert not (work / component / ".run.partial").exists()
        log = (work / component / "run.failed" / "log.txt").read_text().strip().splitlines()
        assert log[-1].endswith("ERROR   accdbg.run: interrupted by SIGTERM"), log[-3:]
    _resumed_to_the_end(small, work, cumulative_ref)


# ---------------------------------------------------------------- the end-to-end run, killed

TINY = REPO / "examples" / "tiny_cnn"


def _tiny_command(work: Path, *component: str) -> list[str]:
    model = ["-m", str(TINY / "model.onnx"), "-i", "image", "1,3,32,32", str(TINY / "input.raw")]
    if not component:
        model = ["-f", "onnx", *model, "-r", "htp"]
    return [sys.executable, "-m", "accdbg.cli.main", *component, *model, "-w", str(work),
            "--output_dirname", "run", "--no_model_explorer"]  # fmt: skip


def _tiny_env(tmp: Path) -> dict[str, str]:
    """The tool's environment, with a temporary folder of its own: the job folders left
    behind are this test's to count (other runs on the machine have theirs)."""
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), "ACCDBG_NO_PROGRESS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_end_to_end_run_killed_mid_run_is_taken_over_by_the_same_command(tmp_path, sig):
    """Killed while its inference engine runs (its QDQ model written, its QNN children up),
    the end-to-end run is taken over by the same command with the same --output_dirname:
    exit 0, every component finished under that name (framework diagnosis, which the killed
    run finished, done again and replaced), no staging folder and no job folder left."""
    work, tmp = tmp_path / "w", tmp_path / "tmp"
    env = _tiny_env(tmp)
    cmd = _tiny_command(work)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True,
                            preexec_fn=_default_sigint, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    mark = work / "inference_engine" / ".run.partial" / "model.qdq.onnx"
    deadline = time.monotonic() + 240
    try:
        while not mark.exists():
            assert proc.poll() is None, (
                f"the run ended before it could be killed: {proc.stderr.read()}"
            )
            assert time.monotonic() < deadline, "the engine never wrote its QDQ model"
            time.sleep(0.02)
        golden = work / "framework_diagnosis" / "run" / "tensors.json"
        first_golden = golden.stat().st_mtime_ns
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode in (-sig, 128 + sig), proc.returncode
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "taking over the end-to-end run 'run'" in again.stderr
    for component in ("wrapper", "framework_diagnosis", "inference_engine", "verification"):
        names = sorted(p.name for p in (work / component).iterdir())
        assert "run" in names and "latest" in names, (component, names)
        assert not [n for n in names if n.startswith(".")], (component, names)  # no staging
        assert os.readlink(work / component / "latest") == "run"
    assert golden.stat().st_mtime_ns > first_golden  # started again, not kept from the dead run
    assert (work / "verification" / "run" / "summary.csv").is_file()
    assert not list(tmp.glob("accdbg-job-*")) and not list(tmp.glob(".accdbg-newjob-*"))
