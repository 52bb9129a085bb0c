"""The ``local`` executor (the default): persistent, crash-isolated worker processes.

Each worker is a fresh ``python -m accdbg.core.executors.serve`` (the same ``accdbg`` as this
process: :func:`~accdbg.core.isolate.child_env`) that builds its worker once - e.g. opens one
QNN session - and then serves items one at a time over a pipe (the stdlib's
:mod:`multiprocessing.connection`), so a native crash is pinned on the item it was running.
A worker that dies is replaced and its item retried; what native code prints goes to the log
(logger ``accdbg.native``), never to the console. Workers live until :meth:`close` (or a new
worker spec), so consecutive :meth:`map` calls with the same spec pay their start-up once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from accdbg.core.executors.base import (
    Executor,
    ExecutorConfig,
    ItemOutcome,
    WorkerSpec,
    register_executor,
)
from accdbg.core.isolate import (
    MAX_NATIVE_LINES,
    JobFolder,
    _sweep_dead_jobs,
    child_env,
    exit_description,
    native_log,
)
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.executors")


@dataclass
class _Task:
    key: str
    item: Any
    attempts: int = 0


class _Process:
    """One worker process, its pipe, and the file its native output goes to."""

    def __init__(self, spec: WorkerSpec, name: str, folder: Path):
        self.name, self.task = name, None
        self.output = folder / f"{name}.txt"
        self._offset = self._logged = self._dropped = 0
        ours, theirs = multiprocessing.Pipe()
        cmd = [
            sys.executable,
            "-m",
            "accdbg.core.executors.serve",
            str(theirs.fileno()),
            str(os.getpid()),
        ]
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                env=child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        self.conn: Connection = ours
        self.conn.send(spec)

    def give(self, task: _Task) -> None:
        task.attempts += 1  # a send that fails is an attempt too: the process was dead
        self.task = task
        self.conn.send(task.item)

    def death(self) -> str:
        """How the process ended (it closed its pipe): ``crashed with SIGSEGV``, ``exited with code 1``."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # closed its pipe but lives on: it is of no use
            self.kill()
            code = self.proc.returncode
        return exit_description(code)

    def log_output(self, final: bool = False) -> None:
        """What the process printed since the last call (whole lines; everything when
        ``final``), into the log - the first ``MAX_NATIVE_LINES`` lines, then a count."""
        try:
            with open(self.output, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        self._offset += len(data)
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            if self._logged < MAX_NATIVE_LINES:
                native_log.info("[%s] %s", self.name, line.rstrip())
                self._logged += 1
            else:
                self._dropped += 1
        if final and self._dropped:
            native_log.info("[%s] ... %d more lines not kept", self.name, self._dropped)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


def _kill_all(processes: list[_Process]) -> None:
    for p in processes:
        p.kill()


@register_executor
class LocalExecutor(Executor):
    """``config.workers`` worker processes on this machine, each crash-isolated."""

    name = "local"

    def __init__(self, config: ExecutorConfig):
        super().__init__(config)
        self._spec: WorkerSpec | None = None
        self._procs: list[_Process] = []
        self._started = 0
        self._tmp: JobFolder | None = None
        # a forgotten executor (a notebook) still stops its processes
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)

    def _start(self, spec: WorkerSpec) -> _Process:
        if self._tmp is None:  # the processes' output files; also after a close()
            # held while this process lives: the folder of a killed parent is swept later
            self._tmp = JobFolder()
            _sweep_dead_jobs()
        folder = Path(self._tmp.name)
        proc = _Process(spec, f"worker-{self._started}", folder)
        self._started += 1
        self._procs.append(proc)
        log.debug("local executor: %s started (pid %d)", proc.name, proc.proc.pid)
        return proc

    def _drop(self, proc: _Process) -> None:
        proc.kill()
        proc.log_output(final=True)
        self._procs.remove(proc)

    def map(self, spec: WorkerSpec, items: Iterable[tuple[str, Any]]) -> Iterator[ItemOutcome]:
        if spec != self._spec:  # other workers: the old ones are of no use
            self._stop()
            self._spec = spec
        source = iter(items)
        retry: deque[_Task] = deque()
        exhausted = False
        try:
            while True:
                idle = [p for p in self._procs if p.task is None]
                while not exhausted or retry:
                    if not idle and len(self._procs) >= self.config.workers:
                        break
                    if retry:
                        task = retry.popleft()
                    else:
                        nxt = next(source, None)
                        if nxt is None:
                            exhausted = True
                            continue
                        task = _Task(*nxt)
                    proc = idle.pop() if idle else self._start(spec)
                    try:
                        proc.give(task)
                    except OSError:  # it died while idle (e.g. killed from outside)
                        outcome = self._died(proc, retry)
                        if outcome is not None:
                            yield outcome
                busy = {p.conn: p for p in self._procs if p.task is not None}
                if not busy:
                    return
                for conn in wait(list(busy)):
                    outcome = self._collect(busy[conn], retry)
                    if outcome is not None:
                        yield outcome
        except BaseException:  # interrupted, or the caller stopped early: no orphan, no waste
            self._stop()
            raise

    def _collect(self, proc: _Process, retry: deque[_Task]) -> ItemOutcome | None:
        task = proc.task
        assert task is not None
        try:
            reply = proc.conn.recv()
        except (EOFError, OSError):  # the process died while running the item
            return self._died(proc, retry)
        proc.task = None
        proc.log_output()
        kind, *payload = reply
        if kind == "unbuildable":
            target = self._spec.target if self._spec else "?"
            self._stop()
            log.debug("%s", payload[1])
            raise AccdbgError(f"the worker {target} could not be built: {payload[0]}")
        if kind == "ok":
            return ItemOutcome(task.key, payload[0], attempts=task.attempts, worker=proc.name)
        if payload[1]:
            log.debug("worker error on item %s:\n%s", task.key, payload[1])
        return ItemOutcome(task.key, error=payload[0], attempts=task.attempts, worker=proc.name)

    def _died(self, proc: _Process, retry: deque[_Task]) -> ItemOutcome | None:
        """A process died on its item: replaced, the item retried or, retries spent, failed."""
        task = proc.task
        assert task is not None
        how = proc.death()
        self._drop(proc)
        log.warning("local executor: %s %s on item %s", proc.name, how, task.key)
        if task.attempts <= self.config.retries:
            retry.append(task)
            return None
        return ItemOutcome(
            task.key,
            error=f"the worker {how} on item {task.key} ({task.attempts} attempts)",
            attempts=task.attempts,
            worker=proc.name,
        )

    def _stop(self) -> None:
        for proc in list(self._procs):
            self._drop(proc)
        self._spec = None

    @property
    def pids(self) -> list[int]:
        """The live worker processes (for tests and monitoring)."""
        return [p.proc.pid for p in self._procs]

    def close(self) -> None:
        self._stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
