"""Run backend work in a child process, so a native crash is a report, not our death.

The QNN backend is native code; a segfault in it would otherwise take the whole tool (and a
notebook kernel) down. The child is a fresh ``python -m accdbg.core.isolate`` (no inherited
threads, no dependence on how the parent was started); the job and its result travel as
pickle files, and a signal death becomes an :class:`AccdbgError` naming the signal.

The parent owns its children: they ignore SIGINT and SIGTERM (a Ctrl-C or a ``kill`` of the
process group reaches the parent, which stops them), and the kernel kills them the moment the
parent dies, whatever killed it (``PR_SET_PDEATHSIG``). What native code prints to the
child's stdout/stderr goes to a file and then to the run's log (logger ``accdbg.native``),
never to the console.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import pickle
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accdbg.core import progress
from accdbg.core.folder_lock import LOCK_NAME, FolderLock, holder
from accdbg.core.run_dir import write_bytes_atomic
from accdbg.errors import AccdbgError

native_log = logging.getLogger("accdbg.native")
PR_SET_PDEATHSIG = 1
JOB_PREFIX = "accdbg-job-"
NEW_JOB_PREFIX = ".accdbg-newjob-"  # a job folder being made, not yet locked
MAX_NATIVE_LINES = 400  # per child; the rest is summarised in one line
LOG_PREFIX = "##accdbg-log##"  # a child's log record in its output: prefix, logger, level, text
_swept = False  # the job folders of dead parents are swept once per process


class _RecordLine(logging.Formatter):
    """One log record on one line of the child's output, for the parent to log again."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", "\\n")
        return f"{LOG_PREFIX}\t{record.name}\t{record.levelno}\t{text}"


def _forward_logs() -> None:
    """The child's ``accdbg.*`` records go to its output, which the parent reads back."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RecordLine("%(message)s"))
    root = logging.getLogger("accdbg")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    root.propagate = False


def _site_dirs() -> set[Path]:
    """Where this interpreter imports installed packages from."""
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    paths.update(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        paths.add(site.getusersitepackages())
    return {Path(p).resolve() for p in paths}


def source_tree() -> Path | None:
    """The folder holding the ``accdbg`` package when it is not an installed one, else None.

    An installed accdbg (wheel, or pip install .) is found by the child on its own; a source
    tree (PYTHONPATH, sys.path.insert, pytest's rootdir) must be handed to it, or the child
    would import another accdbg than its parent - or none.
    """
    root = Path(__file__).resolve().parents[2]
    installed = root.name in ("site-packages", "dist-packages") or root in _site_dirs()
    return None if installed else root


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment (the parent's, or ``base``) of a child Python that imports this very
    ``accdbg``: the source tree first on PYTHONPATH when there is one. A child draws no bar
    (its output goes to a file): it relays its stages only where given a channel
    (:class:`Isolated`)."""
    env = dict(os.environ if base is None else base)
    env.pop(progress.MODE_ENV, None)
    env.pop(progress.EVENTS_ENV, None)
    tree = source_tree()
    if tree is not None:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(tree)]
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *rest])
    return env


def exit_description(code: int | None) -> str:
    """How a child ended, from its return code: ``crashed with SIGSEGV``, ``exited with code 1``."""
    if code is None or code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"crashed with {name}"


class JobFolder:
    """A folder of this process's children (their job, result and output files) under the
    temporary folder, held (:class:`FolderLock`) for as long as this process lives.

    It is locked before it gets its ``accdbg-job-`` name (made as ``.accdbg-newjob-*``,
    locked, renamed): a job folder nobody holds is a dead process's at once, so the sweep of
    the next run removes it (:func:`_sweep_dead_jobs`) - also right after a SIGKILL."""

    def __init__(self) -> None:
        made = Path(tempfile.mkdtemp(prefix=NEW_JOB_PREFIX))
        lock = FolderLock.take(made, create=True)
        self.path = made.with_name(JOB_PREFIX + made.name.removeprefix(NEW_JOB_PREFIX))
        os.rename(made, self.path)
        self._lock: FolderLock | None = lock

    @property
    def name(self) -> str:
        return str(self.path)

    def cleanup(self) -> None:
        """Remove the folder and let go of it; once."""
        if self._lock is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.release()
        self._lock = None


class Isolated:
    """A child Python computing ``fn(*args)``; :meth:`result` waits and returns or raises.

    ``Isolated(fn, *args)`` starts the work at once. :meth:`prestart` starts a child that
    first runs ``warm`` (``"module"`` or ``"module:function"``: imports and set-up) and then
    waits for :meth:`submit`, so its start-up overlaps whatever the parent does meanwhile.
    The child's progress bars are shown here (:class:`~accdbg.core.progress.Relay`); with
    ``shown``, ``what`` is a spinner while it has work and no bar of its own.
    """

    def __init__(
        self,
        fn: Callable[..., Any] | None,
        *args: Any,
        what: str,
        log_hint: str = "",
        warm: str = "",
        who: str = "the QNN backend",
        shown: bool = True,
    ):
        self.what, self.log_hint, self.who = what, log_hint, who
        # held while this parent lives: a job folder whose holder died is swept by later runs
        self._tmp = JobFolder()
        _sweep_dead_jobs()
        self._job = Path(self._tmp.name) / "job.pkl"
        self._result = Path(self._tmp.name) / "result.pkl"
        self._output = Path(self._tmp.name) / "output.txt"
        self._submitted = False
        # the child's stages (QNN session, runs per input) shown here while it runs
        events = Path(self._tmp.name) / "progress.jsonl"
        self._relay = progress.Relay(events, what if shown else None)
        if fn is not None:
            self.submit(fn, *args)
        env = child_env()
        env[progress.EVENTS_ENV] = str(events)
        cmd = [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "accdbg.core.isolate",
            str(self._job),
            str(self._result),
            warm,
            str(os.getpid()),
        ]
        try:
            with open(self._output, "wb") as out:
                self._proc = subprocess.Popen(
                    cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                )
        except BaseException:
            self._relay.stop()
            raise

    @classmethod
    def prestart(
        cls,
        warm: str,
        what: str,
        log_hint: str = "",
        who: str = "the QNN backend",
        shown: bool = True,
    ) -> Isolated:
        """A child that runs ``warm`` now and its work once :meth:`submit` gives it."""
        return cls(None, what=what, log_hint=log_hint, warm=warm, who=who, shown=shown)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Isolated:
        """Give the child its work: ``fn`` must be a module-level function, args picklable."""
        if self._submitted:
            raise RuntimeError(f"this child already has its work ({self.what})")
        write_bytes_atomic(self._job, pickle.dumps((fn.__module__, fn.__qualname__, args)))
        self._submitted = True
        self._relay.working()
        return self

    @property
    def pid(self) -> int:
        return self._proc.pid

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        self._relay.stop()
        self._log_output()
        self._tmp.cleanup()

    def _log_output(self) -> None:
        """What the child printed (native libraries' chatter, crash messages) into the log."""
        try:
            lines = self._output.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return
        lines = [line.rstrip() for line in lines if line.strip()]
        records = [line for line in lines if line.startswith(LOG_PREFIX)]
        for line in records:  # the child's own log records, as if logged here
            _, name, level, message = line.split("\t", 3)
            logging.getLogger(name).log(int(level), message.replace("\\n", "\n"))
        lines = [line for line in lines if not line.startswith(LOG_PREFIX)]
        for line in lines[:MAX_NATIVE_LINES]:
            native_log.info("[%s] %s", self.what, line)
        if len(lines) > MAX_NATIVE_LINES:
            native_log.info(
                "[%s] ... %d more lines not kept", self.what, len(lines) - MAX_NATIVE_LINES
            )

    def result(self) -> Any:
        if not self._submitted:
            raise RuntimeError(f"no work was submitted to this child ({self.what})")
        try:
            code = self._proc.wait()
        except BaseException:  # interrupted while waiting: the child must not outlive this
            self.kill()
            raise
        try:
            hint = f" - see {self.log_hint}" if self.log_hint else ""
            if code < 0:
                raise AccdbgError(
                    f"{self.who} {exit_description(code)} while {self.what}; the tool survived{hint}"
                )
            if not self._result.exists():
                raise AccdbgError(f"{self.who} exited with code {code} while {self.what}{hint}")
            kind, *payload = pickle.loads(self._result.read_bytes())
        finally:
            self._cleanup()
        if kind == "ok":
            return payload[0]
        if kind == "user":
            raise AccdbgError(payload[0])
        # the child's traceback is a note: printed with -v and logged, not on the one line
        error = RuntimeError(f"{payload[0].splitlines()[0]} (in the backend process)")
        error.add_note(f"the backend process's traceback:\n{payload[1]}")
        raise error


def guarded_module_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` that dies with this process (run it with :func:`child_env`)."""
    launcher = (
        "import runpy, sys; from accdbg.core.isolate import _die_with_parent; "
        f"_die_with_parent({os.getpid()}); sys.argv[0] = {module!r}; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", launcher, *args]


def _sweep_dead_jobs() -> None:
    """Remove the job folders of parents that died without cleaning up (SIGKILL): their
    children were killed with them (``PR_SET_PDEATHSIG``) before they could. A job folder is
    locked before it is named (:class:`JobFolder`), so one nobody holds is dead, however
    young; a folder still being made (``.accdbg-newjob-*``) is left alone for a minute."""
    global _swept
    if _swept:
        return
    _swept = True
    tmp = Path(tempfile.gettempdir())
    for folder in tmp.glob(f"{JOB_PREFIX}*"):
        if (folder / LOCK_NAME).exists() and holder(folder) is None:
            shutil.rmtree(folder, ignore_errors=True)
    now = time.time()
    for folder in tmp.glob(f"{NEW_JOB_PREFIX}*"):
        try:
            young = now - folder.stat().st_mtime < 60
        except OSError:
            continue
        if not young:
            shutil.rmtree(folder, ignore_errors=True)


def run_isolated(
    fn: Callable[..., Any], *args: Any, what: str, log_hint: str = "", who: str = "the QNN backend"
) -> Any:
    """``fn(*args)`` in a child Python; ``fn`` must be a module-level function, args picklable.
    ``who`` names the native code a crash is blamed on."""
    return Isolated(fn, *args, what=what, log_hint=log_hint, who=who).result()


def _die_with_parent(parent: int | None = None) -> None:
    """Let the kernel SIGKILL this process when its parent dies (Linux), and leave SIGINT and
    SIGTERM to the parent, which stops its children itself. With ``parent``, leave at once
    if that parent already died (before the kernel was told)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _main(job: str, result: str, warm: str = "", parent_pid: str = "") -> int:
    # The parent's pid comes from the parent: it may be gone before this line runs.
    parent, job_path = int(parent_pid or os.getppid()), Path(job)
    _die_with_parent()
    _forward_logs()
    if os.getppid() != parent:  # died before the kernel was told to kill us with it
        shutil.rmtree(job_path.parent, ignore_errors=True)
        return 0
    try:
        if warm:
            module, _, name = warm.partition(":")
            loaded = importlib.import_module(module)
            if name:
                getattr(loaded, name)()
        while not job_path.exists():
            if os.getppid() != parent or not job_path.parent.is_dir():
                shutil.rmtree(job_path.parent, ignore_errors=True)
                return 0  # the parent is gone or gave up on us: no work will come
            time.sleep(0.01)
        module, name, args = pickle.loads(job_path.read_bytes())
        fn = getattr(importlib.import_module(module), name)
        out: tuple = ("ok", fn(*args))
    except AccdbgError as exc:
        out = ("user", str(exc))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        out = ("bug", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    if os.getppid() != parent:  # killed meanwhile: nobody will read the result or clean up
        shutil.rmtree(job_path.parent, ignore_errors=True)
    else:
        Path(result).write_bytes(pickle.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:5]))
