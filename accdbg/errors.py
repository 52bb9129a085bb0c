"""The one exception type users see.

Every bad input is reported as an :class:`AccdbgError` whose message is a single line that
names the file, tensor or flag at fault and what was expected. The command layer prints it
without a traceback (``-v`` shows the traceback); anything else is a bug.
"""

from __future__ import annotations

import errno


class AccdbgError(Exception):
    """A user-facing error: the message is the whole story, on one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: stop cleanly (close the run as failed, stop child processes).

    A :class:`KeyboardInterrupt`, so every clean-up written for Ctrl-C runs for SIGTERM too.
    """

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name


# a stop signal received while the run goes on: its Interrupted may have been raised where
# Python swallows exceptions (a finalizer running when the signal came), so checkpoints ask
_PENDING: list[str] = []


def signal_received(signal_name: str) -> None:
    _PENDING[:] = [signal_name]


def stop_if_signalled() -> None:
    """Raise :class:`Interrupted` again for a stop signal whose first raise was lost."""
    if _PENDING:
        raise Interrupted(_PENDING[0])


def forget_signal() -> None:
    _PENDING.clear()


def describe(exc: BaseException) -> str:
    """The one line that ends the console and a failed run's ``log.txt``."""
    if isinstance(exc, AccdbgError):
        return f"error: {exc}"
    if isinstance(exc, Interrupted):
        return f"interrupted by {exc.signal_name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if is_disk_full(exc):
        where = f" (writing {exc.filename})" if getattr(exc, "filename", None) else ""
        return f"error: the disk is full{where}: free some space and rerun"
    return f"internal error: {type(exc).__name__}: {exc}"


def is_disk_full(exc: BaseException) -> bool:
    """A full disk or quota is the machine's state, not a bug: one line, no traceback."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
