import json
import logging
import os
import threading

import pytest

from accdbg.core.run_dir import RunDir
from accdbg.errors import AccdbgError


def test_run_lands_with_latest_and_options(tmp_path):
    with RunDir(tmp_path, "framework_diagnosis") as run:
        run.write_options({"a": 1})
        assert run.path.name.startswith(".")  # staged while running
    root = tmp_path / "framework_diagnosis"
    assert run.path.parent == root and not run.path.name.startswith(".")
    assert os.readlink(root / "latest") == run.path.name
    assert json.loads((run.path / "framework_diagnosis_options.json").read_text()) == {"a": 1}
    assert (run.path / "log.txt").is_file()


def test_output_dirname_and_no_overwrite(tmp_path):
    with RunDir(tmp_path, "verification", "mine") as run:
        (run.path / "keep.txt").write_text("precious")
    with pytest.raises(AccdbgError, match="already exists"):
        RunDir(tmp_path, "verification", "mine")
    assert (tmp_path / "verification" / "mine" / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "latest"])
def test_bad_output_dirname(tmp_path, bad):
    with pytest.raises(AccdbgError, match="--output_dirname"):
        RunDir(tmp_path, "verification", bad)


def _run_together(root, barrier, paths: list, errors: list) -> None:
    try:
        barrier.wait()
        with RunDir(root, "framework_diagnosis") as run:
            (run.path / "marker").write_text(run.name)
        paths.append(run.path)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(repr(exc))


def test_same_second_runs_do_not_collide(tmp_path):
    """Eight runs started together, twenty times: each gets its own folder, none fails (a run
    finishing under a name another has just picked must not clobber or refuse it)."""
    for round_ in range(20):
        paths, errors = [], []
        args = (tmp_path / str(round_), threading.Barrier(8), paths, errors)
        threads = [threading.Thread(target=_run_together, args=args) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len({p.name for p in paths}) == 8
        for p in paths:
            assert (p / "marker").read_text() == p.name


def test_failed_run_is_not_complete_and_latest_unchanged(tmp_path):
    with RunDir(tmp_path, "framework_diagnosis", "good"):
        pass
    with pytest.raises(RuntimeError), RunDir(tmp_path, "framework_diagnosis", "bad"):
        raise RuntimeError("boom")
    root = tmp_path / "framework_diagnosis"
    assert not (root / "bad").exists()
    assert (root / "bad.failed" / "log.txt").exists()
    assert os.readlink(root / "latest") == "good"


def test_unwritable_working_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AccdbgError, match="not writable"):
        RunDir(blocker, "framework_diagnosis")


def _killed_run(tmp_path, name: str, resume: bool) -> None:
    """A real run of ``name`` whose process dies by SIGKILL in the middle of its ``with``."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import os, signal, sys\n"
        "from accdbg.core.run_dir import RunDir\n"
        f"run = RunDir(sys.argv[1], 'wrapper', {name!r}, resume={resume}).__enter__()\n"
        "(run.path / 'marker').write_text('from the killed run')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr


def test_a_killed_runs_folder_is_taken_over_and_a_live_one_refused(tmp_path):
    from accdbg.core.run_dir import KILLED, check_run_folder

    _killed_run(tmp_path, "run", resume=True)
    root = tmp_path / "wrapper"
    assert (root / ".run.partial" / "marker").exists() and not (root / "run").exists()
    with RunDir(tmp_path, "wrapper", "run", resume=True) as run:
        assert run.resumed == KILLED and run.path == root / ".run.partial"
        assert (run.path / "marker").read_text() == "from the killed run"
        # the same name while this run lives: refused, naming this process
        for attempt in (
            lambda: RunDir(tmp_path, "wrapper", "run", resume=True).__enter__(),
            lambda: check_run_folder(tmp_path, "wrapper", "run", resume=True),
        ):
            with pytest.raises(
                AccdbgError, match=f"being written by another run \\(pid {os.getpid()} "
            ):
                attempt()
    assert (root / "run" / "marker").exists() and not (root / ".run.partial").exists()
    assert not (root / "run" / ".lock").exists()
    assert os.readlink(root / "latest") == "run"


def test_a_new_run_keeps_a_killed_runs_folder_as_failed(tmp_path):
    _killed_run(tmp_path, "run", resume=False)
    root = tmp_path / "wrapper"
    with RunDir(tmp_path, "wrapper", "run") as run:
        assert run.resumed is None and not (run.path / "marker").exists()
    assert (root / "run.failed" / "marker").exists()
    last = (root / "run.failed" / "log.txt").read_text().splitlines()[-1]
    assert "stopped without closing" in last
    assert (root / "run").is_dir() and not (root / ".run.partial").exists()


def test_a_staging_folder_without_a_lock_is_not_guessed_dead(tmp_path):
    (tmp_path / "wrapper" / ".run.partial").mkdir(parents=True)  # as older versions left it
    with pytest.raises(AccdbgError, match="older accdbg.*remove it"):
        RunDir(tmp_path, "wrapper", "run", resume=True).__enter__()
    assert (tmp_path / "wrapper" / ".run.partial").is_dir()


def test_failed_run_log_ends_with_the_error_or_the_signal(tmp_path):
    from accdbg.errors import Interrupted

    cases = [
        ("bad", AccdbgError("the input is wrong"), "ERROR   accdbg.run: error: the input is wrong"),
        ("term", Interrupted("SIGTERM"), "ERROR   accdbg.run: interrupted by SIGTERM"),
        ("int", KeyboardInterrupt(), "ERROR   accdbg.run: interrupted by SIGINT"),
        ("bug", ZeroDivisionError("oops"), "internal error: ZeroDivisionError: oops"),
    ]
    for name, exc, last in cases:
        with pytest.raises(type(exc)), RunDir(tmp_path, "framework_diagnosis", name):
            logging.getLogger("accdbg.test").info("working on %s", name)
            raise exc
        lines = (tmp_path / "framework_diagnosis" / f"{name}.failed" / "log.txt").read_text()
        lines = lines.splitlines()
        assert lines[-1].endswith(last) and "working on" in lines[-2 if name != "bug" else 0]
        assert ("Traceback" in "\n".join(lines)) == (name == "bug")  # a bug keeps its traceback


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_signal_whose_raise_was_swallowed_still_ends_the_run_as_failed(tmp_path):
    """Python ignores an exception raised while a finalizer runs: a SIGTERM arriving then
    leaves the run going. The handler's record of it stops the run at the next journal row,
    and a run that got to its end anyway closes as NAME.failed with the signal, not as done."""
    import gc

    from accdbg.algorithms.checkpoint import Journal
    from accdbg.cli.main import _raise_interrupted, stop_signals_and_warnings
    from accdbg.errors import Interrupted

    class Finalized:
        def __del__(self):  # the signal lands here: its raise is printed and dropped
            _raise_interrupted(15, None)

    with stop_signals_and_warnings():
        with pytest.raises(Interrupted), RunDir(tmp_path, "cumulative_layerwise_snooping", "a"):
            Finalized()
            gc.collect()
            Journal(tmp_path / "journal.jsonl").append({"kind": "row"})  # the checkpoint
            pytest.fail("the run went on past a checkpoint")
        with pytest.raises(Interrupted), RunDir(tmp_path, "wrapper", "b"):
            Finalized()
            gc.collect()
        log = (tmp_path / "wrapper" / "b.failed" / "log.txt").read_text().splitlines()
        assert log[-1].endswith("ERROR   accdbg.run: interrupted by SIGTERM")
        assert not (tmp_path / "wrapper" / "b").exists()
    with RunDir(tmp_path, "wrapper", "c"):  # the next run, signals restored: nothing pending
        pass
    assert (tmp_path / "wrapper" / "c").is_dir()


def test_a_full_disk_ends_the_log_in_one_line_naming_the_file_where_it_ends_up(tmp_path):
    import errno

    with pytest.raises(OSError), RunDir(tmp_path, "inference_engine", "run") as run:
        raise OSError(errno.ENOSPC, "No space left on device", str(run.path / "Result_0" / "y.raw"))
    failed = tmp_path / "inference_engine" / "run.failed"
    log = (failed / "log.txt").read_text()
    assert log.splitlines()[-1].endswith(
        f"error: the disk is full (writing {failed / 'Result_0' / 'y.raw'}): free some space and rerun"
    )
    assert "Traceback" not in log  # the machine's state, not a bug


def test_run_folders_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with RunDir(tmp_path, "verification") as run:
            pass
    finally:
        os.umask(old)
    assert run.path.stat().st_mode & 0o777 == 0o755


def test_an_error_naming_a_file_of_the_run_names_it_where_it_ends_up(tmp_path):
    """A backend's failure points at its log inside the staging folder; the run is then kept as
    NAME.failed, and the message (raised and logged) points there."""
    with pytest.raises(AccdbgError) as info:
        with RunDir(tmp_path, "inference_engine", "run") as run:
            (run.path / "backend_log.txt").write_text("FinalizeGraphs started\n")
            raise AccdbgError(f"QNN failed (full backend log: {run.path / 'backend_log.txt'})")
    where = tmp_path / "inference_engine" / "run.failed" / "backend_log.txt"
    assert str(info.value) == f"QNN failed (full backend log: {where})"
    assert where.read_text() == "FinalizeGraphs started\n"
    last = (where.parent / "log.txt").read_text().splitlines()[-1]
    assert last.endswith(f"(full backend log: {where})")


def test_a_run_of_components_refused_in_one_of_them_leaves_nothing(tmp_path):
    """The end-to-end run (``discard_refused``) refused by a check only a component can make
    (another framework's model, loaded in a child): no folder stays, not even the working
    folder it created. Once a component started, or with anything else written, it failed:
    it stays as NAME.failed with its log."""
    work = tmp_path / "w"
    with pytest.raises(AccdbgError), RunDir(work, "wrapper", discard_refused=True) as run:
        run.write_options({"a": 1})
        raise AccdbgError("--input_tensor 'x': dims 3,8,8 have rank 3, the model expects rank 4")
    assert not work.exists()
    (work / "framework_diagnosis").mkdir(parents=True)
    with pytest.raises(AccdbgError), RunDir(work, "wrapper", "r1", discard_refused=True):
        with RunDir(work, "framework_diagnosis", "r1"):
            pass
        raise AccdbgError("the verifier config is wrong")
    assert (work / "wrapper" / "r1.failed" / "log.txt").is_file()
    with pytest.raises(AccdbgError), RunDir(work, "wrapper", "r2", discard_refused=True) as run:
        (run.path / "report.html").write_text("half")
        raise AccdbgError("late")
    assert (work / "wrapper" / "r2.failed" / "report.html").is_file()
    with pytest.raises(RuntimeError), RunDir(work, "wrapper", "r3", discard_refused=True):
        raise RuntimeError("a bug is a failure")
    assert (work / "wrapper" / "r3.failed").is_dir()
    # without discard_refused (a component: its checks run before its folder) it is kept
    with pytest.raises(AccdbgError), RunDir(work, "inference_engine", "r4"):
        raise AccdbgError("QNN failed")
    assert (work / "inference_engine" / "r4.failed").is_dir()


def test_a_dead_end_to_end_runs_finished_parts_are_replaced_when_taken_over(tmp_path):
    """The end-to-end run's components all use its name: a rerun taking over a dead one finds
    some of them finished. Inside ``taking_over`` they start again and replace the dead
    run's folder only when they finish (until then it stays, and `latest` with it);
    outside, a finished folder of that name is still refused."""
    from accdbg.core.run_dir import check_run_folder, taking_over, unfinished_run

    with RunDir(tmp_path, "framework_diagnosis", "run") as run:
        (run.path / "old.txt").write_text("the dead run's")
    root = tmp_path / "framework_diagnosis"
    assert not unfinished_run(tmp_path, "wrapper", "run")  # nothing of that name
    (tmp_path / "wrapper").mkdir()
    with pytest.raises(KeyboardInterrupt), RunDir(tmp_path, "wrapper", "run"):
        raise KeyboardInterrupt  # Ctrl-C: kept as run.failed
    assert unfinished_run(tmp_path, "wrapper", "run")
    with pytest.raises(AccdbgError, match="already exists"):
        check_run_folder(tmp_path, "framework_diagnosis", "run")
    with taking_over(tmp_path, "run"):
        check_run_folder(tmp_path, "framework_diagnosis", "run")
        with RunDir(tmp_path, "framework_diagnosis", "run") as again:
            assert again.path.name == ".run.partial"
            assert (root / "run" / "old.txt").is_file() and os.readlink(root / "latest") == "run"
            (again.path / "new.txt").write_text("this run's")
    assert sorted(p.name for p in (root / "run").iterdir() if p.suffix == ".txt") == [
        "log.txt",
        "new.txt",
    ]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "run"]  # nothing set aside left
    with pytest.raises(AccdbgError, match="already exists"):  # the scope is over
        RunDir(tmp_path, "framework_diagnosis", "run")
    with taking_over(tmp_path, "other"):  # another name's takeover changes nothing for this one
        with pytest.raises(AccdbgError, match="already exists"):
            RunDir(tmp_path, "framework_diagnosis", "run")
