"""Workers for the executor tests and benchmark, importable by the worker processes and Ray
actors (the repository root is on their PYTHONPATH: the executors hand the source tree on)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np


class Numpy:
    """CPU-bound and deterministic: item ``i``'s value depends on ``i`` and ``size`` only."""

    def __init__(self, size: int = 64, rounds: int = 1):
        self.size, self.rounds = size, rounds
        self.calls = 0

    def __call__(self, item: int) -> dict:
        self.calls += 1
        x = np.random.default_rng(item).standard_normal((self.size, self.size))
        for _ in range(self.rounds):
            x = np.tanh(x @ x.T / self.size)
        return {"value": x, "pid": os.getpid(), "calls": self.calls}


class KillOnce:
    """Kills itself (SIGKILL) the first time it sees ``victim``: a marker file remembers."""

    def __init__(self, marker: str, victim: int):
        self.marker, self.victim = Path(marker), victim

    def __call__(self, item: int) -> int:
        if item == self.victim and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return item * 2


class CrashOn:
    """A native crash (SIGSEGV) on ``bad``, every time."""

    def __init__(self, bad: int):
        self.bad = bad

    def __call__(self, item: int) -> int:
        if item == self.bad:
            from tests.crashers import segfault

            segfault()
        return item * 2


class RaiseOn:
    """The worker's own error on ``bad``; counts its calls to prove there was no retry."""

    def __init__(self, bad: int):
        self.bad, self.seen = bad, []

    def __call__(self, item: int) -> int:
        self.seen.append(item)
        if item == self.bad:
            raise ValueError(f"item {item} is bad\nsecond line")
        return item * 2


class Unbuildable:
    def __init__(self):
        raise RuntimeError("no session for you")


class QnnSession:
    """One QNN HTP session, built once per worker, run on an input generated from the item."""

    def __init__(self, model_path: str):
        from accdbg.engines.base import EngineOptions, get_engine

        self.sess = get_engine("qnn").create_session(model_path, EngineOptions(runtime="htp"))
        self.input = self.sess.get_inputs()[0]
        assert "QNNExecutionProvider" in self.sess.get_providers()

    def __call__(self, item: int) -> bytes:
        x = np.random.default_rng(item).random((1, 3, 32, 32), dtype=np.float32)
        (out,) = self.sess.run(None, {self.input.name: x})
        return np.ascontiguousarray(out).tobytes()


class Chatty:
    """Writes to its native stdout and stderr, as QNN's libraries do."""

    def __call__(self, item: int) -> int:
        os.write(1, f"native out {item}\n".encode())
        os.write(2, f"native err {item}\n".encode())
        return item


class Where:
    """Which accdbg the worker imported."""

    def __call__(self, item: int) -> str:
        import accdbg

        return accdbg.__file__
