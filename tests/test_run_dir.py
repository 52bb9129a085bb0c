import json
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
