"""The one exception type users see.

Every bad input is reported as an :class:`AccdbgError` whose message is a single line that
names the file, tensor or flag at fault and what was expected. The command layer prints it
without a traceback (``-v`` shows the traceback); anything else is a bug.
"""

from __future__ import annotations


class AccdbgError(Exception):
    """A user-facing error: the message is the whole story, on one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class NotImplementedComponent(AccdbgError):
    """A component or option that a later release fills in."""
