"""Who owns a run folder: an ``flock`` on ``<folder>/.lock``, held for the whole run.

The kernel drops the lock when its holder dies, whatever killed it (SIGKILL included), so
"is the run that left this folder still alive?" has an exact answer instead of a guess from
timestamps. The file also records the holder's pid, only to name it in messages.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = ".lock"


class LockBusy(Exception):
    """Another live process holds the folder; ``owner`` describes it (``pid 1234``)."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


class FolderLock:
    """An exclusive hold on one folder; see :meth:`take`."""

    def __init__(self, fd: int, path: Path):
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def take(cls, folder: Path, create: bool = False) -> FolderLock:
        """Hold ``folder`` or raise :class:`LockBusy` when a live process holds it.

        Raises ``FileNotFoundError`` when the folder (or, without ``create``, its lock file)
        is not there - also when the folder was renamed while we locked it, so a caller that
        gets a lock always holds the folder still found at ``folder``.
        """
        path = folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = _read_owner(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockBusy(owner) from None
            raise
        try:
            here = os.stat(path)
            mine = os.fstat(fd)
            moved = (here.st_ino, here.st_dev) != (mine.st_ino, mine.st_dev)
        except FileNotFoundError:
            moved = True
        if moved:  # renamed or finished between our open and our lock
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "moved while locking", str(path))
        record = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        return cls(fd, path)

    def release(self, folder: Path | None = None) -> None:
        """Let go; with ``folder`` (where the locked folder is now), remove its lock file first."""
        if self._fd is None:
            return
        if folder is not None:
            (folder / LOCK_NAME).unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def holder(folder: Path) -> str | None:
    """The live process holding ``folder`` (``"pid 1234 on host"``), or None when nobody does.

    Without a lock file there is no holder to ask: None.
    """
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_owner(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "another process"
