"""Run folders: ``<working_dir>/<component>/<timestamp>/`` with an atomic ``latest`` link.

A run is written into a hidden staging folder and renamed into place only when it finished,
so a crashed or refused run never looks like a complete one, and an earlier run with the same
name is never touched.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from accdbg.core.folder_lock import LOCK_NAME, FolderLock, LockBusy, holder
from accdbg.errors import AccdbgError, Interrupted, describe, is_disk_full, stop_if_signalled

TIMESTAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"
LOG_NAME = "log.txt"
log = logging.getLogger("accdbg.run")


def _check_dirname(name: str) -> str:
    if not name or name in {".", "..", "latest"} or "/" in name or "\\" in name or "\0" in name:
        raise AccdbgError(
            f"--output_dirname {name!r} must be a plain folder name (no '/', not '.', '..' or 'latest')"
        )
    return name


def component_root(working_dir: str | os.PathLike, component: str) -> Path:
    """``<working_dir>/<component>``, absolute; nothing is created."""
    return Path(working_dir).expanduser().absolute() / component


def check_writable(folder: Path) -> None:
    """Raise, naming the folder at fault, unless ``folder`` can be written (or created).

    The nearest existing folder on the way is probed with a temporary file that is removed at
    once, so a check that fails leaves nothing behind and one that passes leaves no trace.
    """
    folder = Path(folder)
    existing = folder
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    needed = "" if existing == folder else f" (to create {str(folder)!r})"
    if not existing.is_dir():
        raise AccdbgError(f"{str(existing)!r} is not a folder, so it is not writable{needed}")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-probe-"):
            pass
    except OSError as exc:
        raise AccdbgError(
            f"folder {str(existing)!r} is not writable: {exc.strerror or exc}{needed}"
        ) from None


def make_component_root(working_dir: str | os.PathLike, component: str) -> Path:
    """Create ``<working_dir>/<component>`` or explain in one line which folder prevents it."""
    root = component_root(working_dir, component)
    check_writable(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AccdbgError(f"cannot create {str(root)!r}: {exc.strerror or exc}") from None
    check_writable(root)
    return root


# (working dir, run name) pairs whose finished component runs are parts of a dead
# end-to-end run being taken over (see taking_over)
_TAKEN_OVER: ContextVar[frozenset[tuple[str, str]]] = ContextVar(
    "accdbg_taken_over", default=frozenset()
)


def _over_key(working_dir: str | os.PathLike, name: str) -> tuple[str, str]:
    return str(Path(working_dir).expanduser().absolute()), name


@contextmanager
def taking_over(working_dir: str | os.PathLike, name: str | None) -> Iterator[None]:
    """Within this block, the component runs named ``name`` under ``working_dir`` are the
    parts of an end-to-end run of that name that died (or failed) before it finished, which
    the same command, run again, takes over: a component run of that name starts again, and
    when it finishes it replaces the dead run's finished folder of that name (instead of
    being refused because the name is taken). Nothing changes for ``name`` None."""
    if name is None:
        yield
        return
    token = _TAKEN_OVER.set(_TAKEN_OVER.get() | {_over_key(working_dir, name)})
    try:
        yield
    finally:
        _TAKEN_OVER.reset(token)


def replaces_finished(working_dir: str | os.PathLike, name: str | None) -> bool:
    """Whether a finished component run named ``name`` may be replaced (:func:`taking_over`)."""
    return name is not None and _over_key(working_dir, name) in _TAKEN_OVER.get()


def unfinished_run(working_dir: str | os.PathLike, component: str, name: str | None) -> bool:
    """Whether ``<working_dir>/<component>/<name>`` is a run that did not finish: its staging
    folder, left by a run that died (no live holder), or its ``NAME.failed``, and no finished
    folder of that name."""
    if name is None:
        return False
    root = component_root(working_dir, component)
    if (root / name).exists():
        return False
    staging = root / f".{name}.partial"
    dead = staging.is_dir() and (staging / LOCK_NAME).exists() and holder(staging) is None
    return dead or (root / f"{name}.failed").is_dir()


def check_run_folder(
    working_dir: str | os.PathLike,
    component: str,
    output_dirname: str | None = None,
    resume: bool = False,
) -> Path:
    """Everything :class:`RunDir` will need, checked without writing anything: the name, the
    folder's writability, and (for an explicit name) that no finished or live run holds it -
    a finished one may, when it is a part of a dead run being taken over (:func:`taking_over`)."""
    name = _check_dirname(output_dirname) if output_dirname is not None else None
    root = component_root(working_dir, component)
    check_writable(root)
    if name is not None:
        final = root / name
        if final.exists() and not resume and not replaces_finished(working_dir, name):
            raise AccdbgError(
                f"output folder {str(final)!r} already exists; pick another --output_dirname or remove it"
            )
        for folder in (root / f".{name}.partial", final):
            owner = holder(folder)
            if owner is not None:
                raise AccdbgError(
                    f"output folder {str(final)!r} is being written by another run ({owner}); "
                    "wait for it to end or pick another --output_dirname"
                )
    return root


def update_latest(root: Path, target: Path) -> None:
    """Point ``root/latest`` at ``target`` by renaming a fresh link over it (atomic on POSIX)."""
    tmp = root / f".latest-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(target.name, tmp)
    os.replace(tmp, root / "latest")


# how a run continues what an earlier run of the same name left (RunDir.resumed)
KILLED, FAILED, FINISHED = "killed", "failed", "finished"
KILLED_NOTE = (
    "this run stopped without closing (killed by SIGKILL, or the machine stopped); "
    "a later run of the same name took its folder"
)


class RunDir:
    """One run of one component.

    Use as a context manager: the run lives in a staging folder ``.<name>.partial`` until the
    ``with`` block exits cleanly, then it is renamed to its final name and ``latest`` is
    pointed at it. On failure the staging folder is renamed ``<name>.failed`` with the error
    (or the signal) as the last line of its ``log.txt``.

    The staging folder is locked (:mod:`accdbg.core.folder_lock`) for the run's lifetime, so
    a folder whose run died without closing (SIGKILL) is told apart from a live one: with an
    explicit ``output_dirname`` the dead run's folder is taken over (``resume``: continued,
    see :attr:`resumed`; otherwise kept as ``<name>.failed``), a live one is refused.
    """

    def __init__(
        self,
        working_dir: str | os.PathLike,
        component: str,
        output_dirname: str | None = None,
        resume: bool = False,
        discard_refused: bool = False,
    ):
        self.root = check_run_folder(working_dir, component, output_dirname, resume)
        # a finished run of this name is a dead end-to-end run's part: start again, replace it
        self.replace = not resume and replaces_finished(working_dir, output_dirname)
        # a run of other components (the end-to-end run): refused in one of them, it leaves
        # nothing (see _refused)
        self.discard_refused = discard_refused
        self.component = component
        self.resume = resume
        self._explicit = output_dirname is not None
        self.name = output_dirname if output_dirname else self._free_timestamp()
        self.final_path = self.root / self.name
        self.path = self.root / f".{self.name}.partial"
        # what an earlier run of this name left and this one continues: KILLED (a staging
        # folder whose run died), FAILED (a NAME.failed), FINISHED (the final folder), or None
        self.resumed: str | None = None
        self._lock: FolderLock | None = None
        self._log_handler: logging.Handler | None = None

    def _free_timestamp(self) -> str:
        base = time.strftime(TIMESTAMP_FORMAT)
        name, n = base, 0
        while (self.root / name).exists() or (self.root / f".{name}.partial").exists():
            n += 1
            name = f"{base}_{n}"
        return name

    @property
    def failed_path(self) -> Path:
        """Where a run of this name that fails is kept."""
        return self.root / f"{self.name}.failed"

    def _staging(self, name: str) -> Path:
        return self.root / f".{name}.partial"

    def __enter__(self) -> RunDir:
        # the folders this run creates on the way (working dir, component folder): a refused
        # run removes them again (see _refused)
        self._created = [f for f in (self.root, *self.root.parents) if not f.exists()]
        make_component_root(self.root.parent, self.component)
        if self._explicit:
            self._claim_name()
        else:
            self._claim_timestamp()
        self._claimed_at = self.root.stat().st_mtime_ns
        if self._explicit:  # what a run killed while replacing a folder of this name left
            for left in self.root.glob(f".{self.name}.replaced-*"):
                shutil.rmtree(left, ignore_errors=True)
        self._log_handler = attach_log_file(self.path / LOG_NAME)
        return self

    def _refused(self, exc: BaseException | None) -> bool:
        """Whether a run of other components (``discard_refused``) ended refusing its input
        rather than failing: a bad input (an :class:`AccdbgError`) raised before it wrote
        anything but its log and options file, in a folder of its own (not one taken over),
        and before any of its components started (no other component folder of the working
        folder changed since it claimed its own). A refused command leaves nothing, also
        when the check that refused it could only run in a component (another framework's
        model is loaded, in a child process, by framework diagnosis)."""
        if not self.discard_refused or not isinstance(exc, AccdbgError):
            return False
        if self.resumed is not None:
            return False
        if self.path == self.final_path or not self.path.is_dir():
            return False
        own = {LOG_NAME, LOCK_NAME, f"{self.component}_options.json"}
        if any(p.name not in own for p in self.path.iterdir()):
            return False
        for other in self.root.parent.iterdir():
            try:
                if (
                    other != self.root
                    and other.is_dir()
                    and (other.stat().st_mtime_ns >= self._claimed_at)
                ):
                    return False
            except OSError:
                return False
        return True

    def _discard(self, lock: FolderLock | None) -> None:
        """Remove a refused run's folder, and the folders it created on the way if empty."""
        if lock is not None:
            lock.release()
        shutil.rmtree(self.path, ignore_errors=True)
        for folder in self._created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break

    def _claim_timestamp(self) -> None:
        while True:
            staging = self._staging(self.name)
            self._lock = _create_staging(self.root, staging)
            if self._lock is not None and not self.final_path.exists():
                self.path = staging
                return
            if self._lock is not None:  # another run finished under this name meanwhile
                self._lock.release()
                shutil.rmtree(staging, ignore_errors=True)
            self.name = self._free_timestamp()
            self.final_path = self.root / self.name

    def _claim_name(self) -> None:
        final, staging, failed = self.final_path, self._staging(self.name), self.failed_path
        for _ in range(100):  # each pass either claims a folder or sees another run move one
            if staging.exists():
                lock = self._take(staging, create=False)
                if lock is None:
                    continue
                if self.resume:
                    self._lock, self.path, self.resumed = lock, staging, KILLED
                    return
                _note(staging, KILLED_NOTE)
                _retire(staging, failed, lock)
                log.warning(
                    "a killed run left %s; kept as %s, its log explains", staging, failed.name
                )
                continue
            if self.resume and failed.is_dir():
                lock = self._take(failed, create=True)
                if lock is None:
                    continue
                try:
                    os.rename(failed, staging)
                except OSError:  # another run created the staging folder meanwhile
                    lock.release(failed)
                    continue
                self._lock, self.path, self.resumed = lock, staging, FAILED
                return
            if final.exists() and not self.replace:
                if not self.resume:
                    raise AccdbgError(
                        f"output folder {str(final)!r} already exists; pick another --output_dirname or remove it"
                    )
                lock = self._take(final, create=True)
                if lock is None:
                    continue
                self._lock, self.path, self.resumed = lock, final, FINISHED
                return
            lock = _create_staging(self.root, staging)
            if lock is None:
                continue
            self._lock, self.path = lock, staging
            return
        raise AccdbgError(
            f"could not claim output folder {str(final)!r}: other runs keep moving it"
        )

    def _take(self, folder: Path, create: bool) -> FolderLock | None:
        """Hold ``folder``; None when it moved meanwhile (look again); refuse a live owner."""
        try:
            return FolderLock.take(folder, create=create)
        except LockBusy as busy:
            raise AccdbgError(
                f"output folder {str(self.final_path)!r} is being written by another run "
                f"({busy.owner}); wait for it to end or pick another --output_dirname"
            ) from None
        except FileNotFoundError:
            if folder.exists() and not create and not (folder / LOCK_NAME).exists():
                raise AccdbgError(
                    f"{str(folder)!r} was left by an older accdbg, which recorded no owner to ask "
                    "whether it still runs; remove it if no run is writing it"
                ) from None
            return None

    def __exit__(self, exc_type, exc, tb) -> None:
        lost = None
        try:
            if exc is None:
                stop_if_signalled()  # a stop signal whose raise was swallowed: not a success
        except Interrupted as signalled:
            lost = signalled
            exc_type, exc = type(signalled), signalled
        try:
            if exc is not None:
                self._follow_the_rename(exc)
                self._log_failure(exc)
        finally:
            detach_log_file(self._log_handler)
        lock, self._lock = self._lock, None
        try:
            if exc_type is not None:
                if self._refused(exc):
                    self._discard(lock)
                    lock = None
                elif self.path != self.final_path:
                    failed = self.failed_path
                    _retire(self.path, failed, None)
                    self.path = failed
                if lost is not None:  # the body ended as if nothing came: end it here
                    raise lost
                return
            if self.path != self.final_path:
                if self.replace and self.final_path.exists():
                    self._set_aside_the_replaced()
                while True:
                    try:
                        # rename(2) never replaces a non-empty folder: a name another run
                        # finished under since __enter__ fails here instead of being clobbered
                        os.rename(self.path, self.final_path)
                        break
                    except OSError:
                        if self._explicit or not self.final_path.exists():
                            raise
                        self.name = self._free_timestamp()
                        self.final_path = self.root / self.name
                self.path = self.final_path
            update_latest(self.root, self.final_path)
            replaced = getattr(self, "_replaced", None)
            if replaced is not None:
                shutil.rmtree(replaced, ignore_errors=True)
        finally:
            if lock is not None:
                lock.release(self.path)

    def _set_aside_the_replaced(self) -> None:
        """The dead run's finished folder of this name, which this run replaces: renamed
        aside (then removed) just before this one takes the name."""
        aside = self.root / f".{self.name}.replaced-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(self.final_path, aside)
        self._replaced = aside

    def _follow_the_rename(self, exc: BaseException) -> None:
        """An error naming a file of the staging folder (a backend log) names it where the
        user will find it: in ``NAME.failed``."""
        if self.path == self.final_path:
            return
        staging, failed = str(self.path), str(self.failed_path)
        if isinstance(exc, AccdbgError):
            exc.args = tuple(
                a.replace(staging, failed) if isinstance(a, str) else a for a in exc.args
            )
        elif is_disk_full(exc) and isinstance(exc.filename, str):
            exc.filename = exc.filename.replace(staging, failed)

    def _log_failure(self, exc: BaseException) -> None:
        """End this run's ``log.txt`` with the error or the signal; the traceback before it
        with -v (:data:`LOG_TRACEBACKS`) or when the failure is a bug."""
        handler = self._log_handler
        if handler is None:
            return
        expected = isinstance(exc, AccdbgError | KeyboardInterrupt) or is_disk_full(exc)
        trace = None
        if LOG_TRACEBACKS or not expected:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        for level, text in ((logging.DEBUG, trace), (logging.ERROR, describe(exc))):
            if text:
                handler.handle(
                    logging.LogRecord(
                        "accdbg.run", level, __file__, 0, "%s", (text.rstrip(),), None
                    )
                )

    def write_options(self, options: dict[str, Any]) -> Path:
        """Write ``<component>_options.json`` with every option of this run."""
        path = self.path / f"{self.component}_options.json"
        write_json_atomic(path, options)
        return path


# set by the command line with -v: failed runs' logs then carry the traceback of any error
LOG_TRACEBACKS = False


def _create_staging(root: Path, staging: Path) -> FolderLock | None:
    """A new staging folder, created already locked (built under a temporary name, then
    renamed), so no other run ever sees it unowned; None when ``staging`` is taken."""
    tmp = root / f"{staging.name}.new-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()  # not mkdtemp: the run folder gets the user's usual permissions (umask)
    lock = FolderLock.take(tmp, create=True)
    try:
        os.rename(tmp, staging)  # fails on an existing (non-empty) folder
    except OSError as exc:
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return None
        raise
    return lock


def _retire(folder: Path, failed: Path, lock: FolderLock | None) -> None:
    """Keep ``folder`` as ``NAME.failed`` (replacing an older one), its log readable."""
    if failed.exists():
        shutil.rmtree(failed, ignore_errors=True)
    os.replace(folder, failed)
    if lock is not None:
        lock.release(failed)


def _note(folder: Path, text: str) -> None:
    """Append one line to a run folder's log (a run that could not write it itself)."""
    try:
        with open(folder / LOG_NAME, "a", encoding="utf-8") as fh:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            fh.write(f"{stamp},000 ERROR   accdbg.run: {text}\n")
    except OSError:
        pass


@contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block
    ends cleanly (removed when it fails), so readers never see half a file. ``durable``:
    fsync'd before the rename (a journal's report that must survive SIGKILL). Every atomic
    write of the package goes through here."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def options_dict(*groups: Any, **values: Any) -> dict[str, Any]:
    """A run's options, JSON-ready, for ``<component>_options.json`` - the one way every
    component writes that record. ``groups`` are typed option objects (dataclasses: their
    fields, nested groups flattened) or parsed argument namespaces; ``values`` are added as
    given. Paths become strings and tuples lists; names starting with ``_`` are left out."""
    out: dict[str, Any] = {}

    def add(obj: Any) -> None:
        items = (
            {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            if dataclasses.is_dataclass(obj)
            else vars(obj)
        )
        for key, value in items.items():
            if dataclasses.is_dataclass(value) and not hasattr(value, "record"):
                add(value)
            elif not key.startswith("_"):
                out[key] = _plain(value)

    for group in groups:
        add(group)
    out.update({k: _plain(v) for k, v in values.items()})
    return out


def _plain(value: Any) -> Any:
    if hasattr(value, "record") and callable(value.record):
        return value.record()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON atomically (:func:`write_bytes_atomic`)."""
    text = json.dumps(data, indent=2, default=_json_default, allow_nan=True) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, set | tuple):
        return list(obj)
    return str(obj)


LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def attach_log_file(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.DEBUG)
    logger = logging.getLogger("accdbg")
    handler._accdbg_saved_level = logger.level  # type: ignore[attr-defined]
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        # API callers (notebooks) never set it: log.txt must still get the run's INFO lines.
        # Not DEBUG: records also propagate to whatever root handler the caller (or a library)
        # installed, and DEBUG there would be noise. The CLI sets DEBUG itself with -v.
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return handler


def detach_log_file(handler: logging.Handler | None) -> None:
    if handler is not None:
        logger = logging.getLogger("accdbg")
        logger.removeHandler(handler)
        handler.close()
        if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
            logger.setLevel(getattr(handler, "_accdbg_saved_level", logger.level))


def final_of(staging: Path) -> Path:
    """A run folder's name once finished: it is written as ``.NAME.partial`` beside it."""
    name = staging.name
    if name.startswith(".") and name.endswith(".partial"):
        name = name[1 : -len(".partial")]
    return staging.with_name(name)
