"""Run folders: ``<working_dir>/<component>/<timestamp>/`` with an atomic ``latest`` link.

A run is written into a hidden staging folder and renamed into place only when it finished,
so a crashed or refused run never looks like a complete one, and an earlier run with the same
name is never touched.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from accdbg.errors import AccdbgError

TIMESTAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"
LOG_NAME = "log.txt"


def _check_dirname(name: str) -> str:
    if not name or name in {".", "..", "latest"} or "/" in name or "\\" in name or "\0" in name:
        raise AccdbgError(
            f"--output_dirname {name!r} must be a plain folder name (no '/', not '.', '..' or 'latest')"
        )
    return name


def make_component_root(working_dir: str | os.PathLike, component: str) -> Path:
    """Create ``<working_dir>/<component>`` or explain in one line why it cannot be."""
    root = Path(working_dir).expanduser().absolute() / component
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-probe-"):
            pass
    except OSError as exc:
        raise AccdbgError(
            f"working dir {str(Path(working_dir))!r} is not writable: {exc.strerror or exc}"
        ) from None
    return root


def update_latest(root: Path, target: Path) -> None:
    """Point ``root/latest`` at ``target`` by renaming a fresh link over it (atomic on POSIX)."""
    tmp = root / f".latest-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(target.name, tmp)
    os.replace(tmp, root / "latest")


class RunDir:
    """One run of one component.

    Use as a context manager: the run lives in a staging folder until the ``with`` block exits
    cleanly, then it is renamed to its final name and ``latest`` is pointed at it. On failure
    the staging folder is renamed ``<name>.failed`` so its ``log.txt`` stays readable.
    """

    def __init__(
        self,
        working_dir: str | os.PathLike,
        component: str,
        output_dirname: str | None = None,
        resume: bool = False,
    ):
        self.root = make_component_root(working_dir, component)
        self.component = component
        self.resume = resume
        self._explicit = output_dirname is not None
        self.name = _check_dirname(output_dirname) if output_dirname else self._free_timestamp()
        final = self.root / self.name
        # A timestamp name taken meanwhile by a concurrent run is replaced in __enter__.
        if self._explicit and final.exists() and not resume:
            raise AccdbgError(
                f"output folder {str(final)!r} already exists; pick another --output_dirname or remove it"
            )
        self.final_path = final
        self.path = final if (resume and final.exists()) else self.root / f".{self.name}.partial"
        self._log_handler: logging.Handler | None = None

    def _free_timestamp(self) -> str:
        base = time.strftime(TIMESTAMP_FORMAT)
        name, n = base, 0
        while (self.root / name).exists() or (self.root / f".{name}.partial").exists():
            n += 1
            name = f"{base}_{n}"
        return name

    def _take_free_name(self) -> None:
        self.name = self._free_timestamp()
        self.final_path = self.root / self.name
        self.path = self.root / f".{self.name}.partial"

    def __enter__(self) -> RunDir:
        if self.path != self.final_path:
            while True:
                try:
                    self.path.mkdir()
                except FileExistsError:  # another run took this name this very second
                    if self._explicit:
                        raise AccdbgError(
                            f"output folder {str(self.final_path)!r} is being written by another run (or a killed run left "
                            f"{str(self.path)!r}: remove it)"
                        ) from None
                    self._take_free_name()
                    continue
                if self._explicit or not self.final_path.exists():
                    break
                self.path.rmdir()  # another run finished under this name meanwhile
                self._take_free_name()
        self._log_handler = attach_log_file(self.path / LOG_NAME)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        detach_log_file(self._log_handler)
        if self.path == self.final_path:
            if exc_type is None:
                update_latest(self.root, self.final_path)
            return
        if exc_type is None:
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
        else:
            failed = self.root / f"{self.name}.failed"
            if failed.exists():
                shutil.rmtree(failed, ignore_errors=True)
            os.replace(self.path, failed)
            self.path = failed

    def write_options(self, options: dict[str, Any]) -> Path:
        """Write ``<component>_options.json`` with every option of this run."""
        path = self.path / f"{self.component}_options.json"
        write_json_atomic(path, options)
        return path


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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


@contextmanager
def extra_log_file(path: Path) -> Iterator[None]:
    """Also send the package's log to ``path`` for the duration (used by the wrapper)."""
    handler = attach_log_file(path)
    try:
        yield
    finally:
        detach_log_file(handler)
