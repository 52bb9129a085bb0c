"""Progress: bars with counts on a terminal (forced here: ``ACCDBG_PROGRESS=bars``), exactly one
plain line per stage elsewhere, and a child process's bars shown by its parent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accdbg.cli.main import setup_logging
from accdbg.core import progress as P
from accdbg.core.isolate import run_isolated
from tests import progress_child

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny_cnn"


@pytest.fixture
def console(capsys):
    """The CLI's console handler on (pytest's) stderr; returns a reader of what it got."""
    setup_logging(False)
    capsys.readouterr()
    return lambda: capsys.readouterr().err


@pytest.fixture
def bars(monkeypatch):
    monkeypatch.setenv(P.MODE_ENV, "bars")


@pytest.fixture
def lines(monkeypatch):
    monkeypatch.setenv(P.MODE_ENV, "lines")


def test_mode_follows_the_environment_and_the_stream(monkeypatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    for name in (P.MODE_ENV, P.EVENTS_ENV, "ACCDBG_NO_PROGRESS", "CI"):
        monkeypatch.delenv(name, raising=False)
    assert P.mode(Tty()) == "bars"
    with open(__file__) as file:  # a file, a pipe: no terminal
        assert P.mode(file) == "lines"
    monkeypatch.setenv("CI", "true")
    assert P.mode(Tty()) == "lines"
    monkeypatch.setenv(P.MODE_ENV, "bars")  # forced: a fake terminal
    assert P.mode(Tty()) == "bars"
    monkeypatch.setenv(P.EVENTS_ENV, "/nonexistent/events")  # a child relays, whatever else
    assert P.mode(Tty()) == "events"


def test_a_bar_on_a_terminal_shows_the_counts(bars, console) -> None:
    for _ in P.progress(range(7), "verification", unit="tensors"):
        pass
    err = console()
    assert "7/7 tensors" in err and "\r" in err
    # the bar is cleared; its stage's one plain line stays
    assert [x for x in re.split(r"[\r\n]", err) if x.startswith("verification: 7 ")] == [
        "verification: 7 tensors in 0.0 s"
    ]


def test_without_a_terminal_one_line_per_stage_and_no_redraw(lines, console) -> None:
    for _ in P.progress(range(5), "stage one", unit="inputs"):
        pass
    with P.Progress("stage two", 3, "candidates") as bar:
        bar.note("baseline")
        bar.update(3)
    with P.stage("stage three"):
        pass
    with P.Progress("its own line", 2, line=False) as bar:
        bar.update(2)
    with pytest.raises(ValueError), P.Progress("failed", 4) as bar:
        raise ValueError("stop")
    err = console()
    assert "\r" not in err and "|" not in err
    assert err.splitlines() == [
        "stage one: 5 inputs in 0.0 s",
        "stage two: 3 candidates in 0.0 s",
        "stage three in 0.0 s",
    ]


def test_a_stage_without_count_shows_its_elapsed_time(bars, console) -> None:
    """The ticker redraws a bar whose stage says nothing (a QNN graph finalize): the user sees
    the time move, never a silence."""
    with P.stage("graph finalize", line=False):
        time.sleep(P.REDRAW + 3 * P.TICK)
    assert "graph finalize [00:01]" in console()


def test_a_count_read_by_the_ticker(bars, console) -> None:
    done: list[int] = []
    with P.Progress("snooping", 4, "layers", line=False, count=lambda: len(done)):
        for i in range(4):
            done.append(i)
            time.sleep(2 * P.TICK)
    assert "4/4 layers" in console()


def test_a_loop_left_early_is_no_failure(lines, console) -> None:
    for i in P.progress(range(10), "budget", unit="candidates"):
        if i == 2:
            break
    assert console().splitlines() == ["budget: 2/10 candidates in 0.0 s"]


def test_a_log_line_during_a_bar_gets_its_own_line(bars, console) -> None:
    import logging

    with P.Progress("verification", 2, "inputs", line=False) as bar:
        bar.update()
        logging.getLogger("accdbg.test").info("a finding")
        bar.update()
    err = console()
    assert "\ra finding\n" in err  # the bar was cleared first, then drawn again below it


def test_a_child_process_bar_is_shown_by_its_parent(bars, console) -> None:
    assert run_isolated(progress_child.counted, 3, 0.4, what="a child") == 3
    err = console()
    assert "child stage:" in err and "3/3 items" in err
    assert "child stage: 3 items in" in err  # the child's line, logged by the parent


def test_a_child_process_stage_is_one_line_without_a_terminal(lines, console) -> None:
    run_isolated(progress_child.counted, 2, 0.0, what="a child")
    err = console()
    assert "\r" not in err
    # one line, its figures the child's own (the time a loaded host may stretch)
    assert re.findall(r"^child stage.*$", err, re.M) == [
        re.search(r"^child stage: 2 items in \d+\.\d s$", err, re.M).group(0)
    ]


@pytest.mark.slow
def test_the_example_on_a_terminal_and_in_a_log(tmp_path: Path) -> None:
    """The bundled example run twice: as on a terminal (bars forced) and as in a log. The log
    file gets plain lines only, either way; the console without a terminal gets no redraw and
    no line twice."""
    cmd = [sys.executable, "-m", "accdbg", "-f", "onnx", "-m", str(EXAMPLE / "model.onnx"),
           "-i", "image", "1,3,32,32", str(EXAMPLE / "input.raw"), "-r", "htp",
           "--no_model_explorer"]  # fmt: skip
    errs = {}
    for mode in ("bars", "lines"):
        env = {**os.environ, P.MODE_ENV: mode}
        run = subprocess.run(  # bytes: text mode would turn the bars' \r into newlines
            [*cmd, "-w", str(tmp_path / mode)], env=env, capture_output=True, timeout=600
        )
        errs[mode] = run.stderr.decode()
        assert run.returncode == 0, errs[mode]
        for log in (tmp_path / mode).rglob("log.txt"):
            text = log.read_bytes().decode()
            assert "\r" not in text and "%|" not in text, log
    bars, plain = errs["bars"], errs["lines"]
    assert "\r" in bars and "QNN graph" in bars and "1/1 inputs" in bars
    assert "\r" not in plain and "%|" not in plain
    shown = [x for x in plain.splitlines() if x.strip()]
    assert len(shown) == len(set(shown)), plain
    # on the terminal, once its bars are cleared, each stage's line stays, once
    drawn = re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", bars))
    kept = [x for x in drawn if x.strip() and not re.search(r"\[\d\d:\d\d", x)]  # no bar
    for start in ("wrote 13 tensors", "inference engine: ", "verification: ", "report: "):
        assert len([x for x in shown if x.startswith(start)]) == 1, (start, plain)
        assert len([x for x in kept if x.startswith(start)]) == 1, (start, bars)
