"""Executors: the same items give the same values on every executor; crashes are pinned on
their item and retried; the worker's own errors are not; nothing outlives close()."""

from __future__ import annotations

import builtins
import logging
import signal
import sys
import time
import types
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest

from accdbg.core.executors import EXECUTORS, ExecutorConfig, WorkerSpec, get_executor
from accdbg.core.executors.local import LocalExecutor
from accdbg.errors import AccdbgError

REPO = Path(__file__).resolve().parents[1]
TINY_CNN = REPO / "examples" / "tiny_cnn"
ITEMS = [(f"in{i}", i) for i in range(7)]


def numpy_expected(item: int, size: int = 64, rounds: int = 1) -> np.ndarray:
    x = np.random.default_rng(item).standard_normal((size, size))
    for _ in range(rounds):
        x = np.tanh(x @ x.T / size)
    return x


def run_all(config: ExecutorConfig, spec: WorkerSpec, items=ITEMS) -> dict:
    with get_executor(config) as ex:
        return {o.key: o for o in ex.map(spec, items)}


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_gone(pids: set[int], seconds: float = 10.0) -> set[int]:
    end = time.monotonic() + seconds
    alive = {p for p in pids if psutil.pid_exists(p)}
    while alive and time.monotonic() < end:
        time.sleep(0.1)
        alive = {
            p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
        }
    return alive


@pytest.mark.parametrize(
    "config",
    [ExecutorConfig("serial"), ExecutorConfig("local", 1), ExecutorConfig("local", 2)],
    ids=["serial", "local1", "local2"],
)
def test_every_item_gets_its_own_value(config):
    spec = WorkerSpec("tests.executor_workers:Numpy", {"size": 48})
    outcomes = run_all(config, spec)
    assert set(outcomes) == {k for k, _ in ITEMS}
    for key, item in ITEMS:
        o = outcomes[key]
        assert o.ok and o.attempts == 1, o.error
        np.testing.assert_array_equal(o.value["value"], numpy_expected(item, 48))
    # each worker was built once and served several items (a session is kept across items)
    calls: dict[int, int] = {}
    for o in outcomes.values():
        calls[o.value["pid"]] = max(calls.get(o.value["pid"], 0), o.value["calls"])
    assert sum(calls.values()) == len(ITEMS)
    if config.name == "local":
        assert 1 <= len(calls) <= config.workers
        import accdbg  # the workers import this very accdbg (a source tree is handed on)

        where = run_all(config, WorkerSpec("tests.executor_workers:Where"))
        assert {o.value for o in where.values()} == {accdbg.__file__}
        assert all(pid != __import__("os").getpid() for pid in calls)


def test_local_workers_are_kept_across_maps_of_the_same_spec():
    spec = WorkerSpec("tests.executor_workers:Numpy", {"size": 8})
    with get_executor(ExecutorConfig("local", 1)) as ex:
        first = [o.value for o in ex.map(spec, ITEMS[:2])]
        second = [o.value for o in ex.map(spec, ITEMS[2:4])]
        pids = set(ex.pids)
    assert {v["pid"] for v in first + second} == pids and len(pids) == 1
    assert sorted(v["calls"] for v in second) == [3, 4]


def test_a_worker_killed_mid_item_is_replaced_and_the_item_retried(tmp_path):
    marker = tmp_path / "killed"
    spec = WorkerSpec("tests.executor_workers:KillOnce", {"marker": str(marker), "victim": 3})
    outcomes = run_all(ExecutorConfig("local", 2), spec)
    assert marker.is_file()  # it did die (SIGKILL) once on item 3
    assert outcomes["in3"].ok and outcomes["in3"].value == 6 and outcomes["in3"].attempts == 2
    for key, item in ITEMS:
        assert outcomes[key].value == item * 2
        if item != 3:
            assert outcomes[key].attempts == 1


@pytest.mark.parametrize("retries", [1, 0])
def test_a_worker_crashing_on_one_item_fails_that_item_only(retries):
    spec = WorkerSpec("tests.executor_workers:CrashOn", {"bad": 4})
    outcomes = run_all(ExecutorConfig("local", 2, retries=retries), spec)
    bad = outcomes["in4"]
    assert not bad.ok and bad.attempts == retries + 1
    assert bad.error == f"the worker crashed with SIGSEGV on item in4 ({retries + 1} attempts)"
    assert "\n" not in bad.error
    assert all(outcomes[k].value == i * 2 and outcomes[k].ok for k, i in ITEMS if i != 4)


@pytest.mark.parametrize("name", ["serial", "local"])
def test_a_worker_exception_fails_its_item_without_retry(name):
    spec = WorkerSpec("tests.executor_workers:RaiseOn", {"bad": 2})
    outcomes = run_all(ExecutorConfig(name, 1), spec)
    bad = outcomes["in2"]
    assert bad.attempts == 1 and "item 2 is bad" in bad.error and "\n" not in bad.error
    assert "second line" not in bad.error
    assert all(outcomes[k].value == i * 2 for k, i in ITEMS if i != 2)


def test_an_unbuildable_worker_is_one_error():
    with pytest.raises(
        AccdbgError, match="RaiseOn.*could not be built: TypeError: .*missing 1 required"
    ):
        run_all(ExecutorConfig("local", 2), WorkerSpec("tests.executor_workers:RaiseOn", {}))
    with pytest.raises(AccdbgError, match="could not be built: RuntimeError: no session for you"):
        run_all(ExecutorConfig("local", 1), WorkerSpec("tests.executor_workers:Unbuildable"))


def test_close_leaves_no_child_process():
    before = children()
    ex = get_executor(ExecutorConfig("local", 2))
    list(ex.map(WorkerSpec("tests.executor_workers:Numpy", {"size": 8}), ITEMS))
    pids = set(ex.pids)
    assert len(pids) == 2 and pids <= children()
    ex.close()
    assert not wait_gone(pids) and children() <= before


def test_a_caller_stopping_early_or_interrupted_stops_the_workers():
    ex = LocalExecutor(ExecutorConfig("local", 2))
    stream = ex.map(WorkerSpec("tests.executor_workers:Numpy", {"size": 8}), ITEMS)
    next(stream)
    pids = set(ex.pids)
    assert pids
    stream.close()  # what a KeyboardInterrupt in the caller's loop does to the generator
    assert not ex.pids and not wait_gone(pids)
    ex.close()


def test_ctrl_c_in_the_parent_stops_every_worker(tmp_path):
    """A parent process mapping slow items is interrupted (SIGINT): it and its workers end."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import signal, sys, time\n"
        # Ctrl-C as in a terminal: a job started in the background by a shell inherits SIGINT
        # ignored, and so would this parent when the suite itself runs in the background
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from accdbg.core.executors import ExecutorConfig, WorkerSpec, get_executor\n"
        "ex = get_executor(ExecutorConfig('local', 2))\n"
        "items = [(str(i), i) for i in range(400)]\n"  # still busy when the signal comes
        "spec = WorkerSpec('tests.executor_workers:Numpy', {'size': 1500, 'rounds': 50})\n"
        "print(' '.join(map(str, ex.pids)), flush=True)\n"
        "with ex:\n"
        "    for o in ex.map(spec, items):\n"
        "        pass\n"
    )
    import subprocess

    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE)
    proc.stdout.readline()
    deadline = time.monotonic() + 30
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = {p.pid for p in psutil.Process(proc.pid).children()}
        time.sleep(0.1)
    assert len(workers) == 2
    time.sleep(1.0)  # busy on their items
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(timeout=30) != 0
    finally:
        proc.kill()
    assert not wait_gone(workers)


def test_what_workers_print_goes_to_the_log_not_the_console(caplog, capfd):
    with caplog.at_level(logging.INFO, logger="accdbg.native"):
        out = run_all(ExecutorConfig("local", 1), WorkerSpec("tests.executor_workers:Chatty"))
    assert [out[k].value for k, _ in ITEMS] == [i for _, i in ITEMS]
    logged = [r.getMessage() for r in caplog.records if r.name == "accdbg.native"]
    for _, i in ITEMS:
        assert f"[worker-0] native out {i}" in logged and f"[worker-0] native err {i}" in logged
    console = capfd.readouterr()
    assert "native" not in console.out and "native" not in console.err


def test_bad_configs_are_one_line_errors():
    with pytest.raises(AccdbgError, match=r"--executor 'dask': expected one of local, ray, serial"):
        get_executor(ExecutorConfig("dask"))
    with pytest.raises(AccdbgError, match=r"--workers 0: expected at least 1"):
        get_executor(ExecutorConfig("local", 0))
    assert {"serial", "local", "ray"} <= set(EXECUTORS)


def test_without_ray_the_error_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(AccdbgError) as err:
        get_executor(ExecutorConfig("ray", 2))
    assert str(err.value) == "--executor ray needs Ray: pip install 'accdbg[ray]'"


# ---------------------------------------------------------------- Ray and QNN (slow)


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (``num_cpus=2``) for the module's Ray tests."""
    ray = pytest.importorskip("ray", reason="the Ray executor needs pip install 'accdbg[ray]'")
    before = children()
    ex = get_executor(ExecutorConfig("ray", 2))
    assert ex.started_ray and ray.is_initialized()
    yield ex
    started = children() - before  # Ray's own processes (its actors are theirs)
    assert started
    ex.close()
    assert not ray.is_initialized()
    assert not wait_gone(started, 30)


@pytest.mark.slow  # starts Ray
def test_ray_gives_the_values_of_the_local_workers(ray_local):
    spec = WorkerSpec("tests.executor_workers:Numpy", {"size": 48})
    ray_out = {o.key: o for o in ray_local.map(spec, ITEMS)}
    local_out = run_all(ExecutorConfig("local", 2), spec)
    for key, item in ITEMS:
        assert ray_out[key].ok and ray_out[key].attempts == 1
        assert ray_out[key].value["value"].tobytes() == local_out[key].value["value"].tobytes()
        np.testing.assert_array_equal(ray_out[key].value["value"], numpy_expected(item, 48))
    # the actors run in their own processes, with this tree's accdbg and tests
    assert all(o.value["pid"] != __import__("os").getpid() for o in ray_out.values())
    import accdbg

    where = {o.value for o in ray_local.map(WorkerSpec("tests.executor_workers:Where"), ITEMS)}
    assert where == {accdbg.__file__}


@pytest.mark.slow  # starts Ray
def test_ray_retries_a_killed_actor_and_fails_a_crashing_item(ray_local, tmp_path):
    marker = tmp_path / "killed"
    spec = WorkerSpec("tests.executor_workers:KillOnce", {"marker": str(marker), "victim": 3})
    out = {o.key: o for o in ray_local.map(spec, ITEMS)}
    assert marker.is_file() and out["in3"].value == 6 and out["in3"].attempts == 2
    assert all(out[k].value == i * 2 for k, i in ITEMS)
    out = {
        o.key: o
        for o in ray_local.map(WorkerSpec("tests.executor_workers:CrashOn", {"bad": 4}), ITEMS)
    }
    assert out["in4"].attempts == 2 and out["in4"].error.startswith(
        "the Ray actor died on item in4 (2 attempts)"
    )
    assert "\n" not in out["in4"].error
    assert all(out[k].value == i * 2 for k, i in ITEMS if i != 4)
    out = {
        o.key: o
        for o in ray_local.map(WorkerSpec("tests.executor_workers:RaiseOn", {"bad": 2}), ITEMS)
    }
    assert out["in2"].attempts == 1 and out["in2"].error == "ValueError: item 2 is bad"


@pytest.fixture(scope="module")
def tiny_qdq(tmp_path_factory) -> Path:
    from accdbg.core.inputs import parse_input_tensor
    from accdbg.engines.options import EngineConfig
    from accdbg.engines.pipeline import Calibration, prepare_model

    model = onnx.load(str(TINY_CNN / "model.onnx"))
    x = parse_input_tensor(["image", "1,3,32,32", str(TINY_CNN / "input.raw")])
    out = tmp_path_factory.mktemp("tiny")
    prepared = prepare_model(
        model, "tiny", Calibration.from_inputs(model, None, [x]), EngineConfig(), out
    )
    return prepared.path


@pytest.mark.slow  # runs QNN HTP and Ray
def test_a_qnn_session_per_worker_gives_the_same_bytes_on_every_executor(
    tiny_qdq, ray_local, tmp_path
):
    spec = WorkerSpec(
        "tests.executor_workers:QnnSession",
        {"model_path": str(tiny_qdq)},
    )
    items = ITEMS[:4]
    runs = {
        "serial": run_all(ExecutorConfig("serial"), spec, items),
        "local1": run_all(ExecutorConfig("local", 1), spec, items),
        "local2": run_all(ExecutorConfig("local", 2), spec, items),
        "ray2": {o.key: o for o in ray_local.map(spec, items)},
    }
    ref = runs["serial"]
    assert all(o.ok for o in ref.values()) and len({o.value for o in ref.values()}) == len(items)
    for name, run in runs.items():
        assert {k: o.value for k, o in run.items()} == {k: o.value for k, o in ref.items()}, name


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], None),
        (["--executor", "serial"], ExecutorConfig("serial", 1)),
        (
            ["--executor", "ray", "--workers", "3", "--ray_address", "h:1"],
            ExecutorConfig("ray", 3, "h:1"),
        ),
        (["--workers", "2"], ExecutorConfig("local", 2)),
    ],
)
def test_the_command_line_hands_its_executor_to_snooping(tmp_path, monkeypatch, flags, expected):
    """--executor/--workers/--ray_address reach the snooping API as one ExecutorConfig, and
    nothing given leaves the algorithm its own default (None)."""
    import accdbg.algorithms.layerwise as layerwise
    from accdbg.cli.main import main

    seen = {}

    def fake_layerwise(model_path, inputs, **kwargs):
        seen.update(kwargs)
        html = tmp_path / "fake.html"
        return types.SimpleNamespace(
            html=html, run_dir=tmp_path, report=None, findings=[], culprits=[]
        )

    monkeypatch.setattr(layerwise, "run_layerwise", fake_layerwise)
    argv = ["-f", "onnx", "-m", str(TINY_CNN / "model.onnx"), "-i", "image", "1,3,32,32"]
    argv += [str(TINY_CNN / "input.raw"), "-r", "htp", "-w", str(tmp_path / "wd")]
    argv += ["--debugging_algorithm", "layerwise", *flags]
    assert main(argv) == 0
    assert seen["executor"] == expected
