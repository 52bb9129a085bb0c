"""Run backend work in a child process, so a native crash is a report, not our death.

The QNN backend is native code; a segfault in it would otherwise take the whole tool (and a
notebook kernel) down. The child is a fresh ``python -m accdbg.engines.isolate`` (no inherited
threads, no dependence on how the parent was started); the job and its result travel as
pickle files, and a signal death becomes an :class:`AccdbgError` naming the signal.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accdbg.errors import AccdbgError


class Isolated:
    """A started child computing ``fn(*args)``; :meth:`result` waits and returns or raises."""

    def __init__(self, fn: Callable[..., Any], *args: Any, what: str, log_hint: str = ""):
        self.what, self.log_hint = what, log_hint
        self._tmp = tempfile.TemporaryDirectory(prefix="accdbg-job-")
        job = Path(self._tmp.name) / "job.pkl"
        self._result = Path(self._tmp.name) / "result.pkl"
        job.write_bytes(pickle.dumps((fn.__module__, fn.__qualname__, args)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
        )
        cmd = [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "accdbg.engines.isolate",
            str(job),
            str(self._result),
        ]
        self._proc = subprocess.Popen(cmd, env=env)

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._tmp.cleanup()

    def result(self) -> Any:
        try:
            code = self._proc.wait()
            hint = f" - see {self.log_hint}" if self.log_hint else ""
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                raise AccdbgError(
                    f"the QNN backend crashed with {name} while {self.what}; the tool survived{hint}"
                )
            if not self._result.exists():
                raise AccdbgError(
                    f"the backend process exited with code {code} while {self.what}{hint}"
                )
            kind, *payload = pickle.loads(self._result.read_bytes())
        finally:
            self._tmp.cleanup()
        if kind == "ok":
            return payload[0]
        if kind == "user":
            raise AccdbgError(payload[0])
        raise RuntimeError(f"{payload[0]} (in the backend process)\n{payload[1]}")


def run_isolated(fn: Callable[..., Any], *args: Any, what: str, log_hint: str = "") -> Any:
    """``fn(*args)`` in a child Python; ``fn`` must be a module-level function, args picklable."""
    return Isolated(fn, *args, what=what, log_hint=log_hint).result()


def _main(job: str, result: str) -> int:
    module, name, args = pickle.loads(Path(job).read_bytes())
    fn = getattr(importlib.import_module(module), name)
    try:
        out: tuple = ("ok", fn(*args))
    except AccdbgError as exc:
        out = ("user", str(exc))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        out = ("bug", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    Path(result).write_bytes(pickle.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))
