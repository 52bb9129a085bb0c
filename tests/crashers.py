"""Functions that die natively, to prove backend crashes do not take the tool down."""

import ctypes
import os
import signal


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def abort() -> None:
    os.kill(os.getpid(), signal.SIGABRT)


def answer(x: int) -> int:
    return x * 2


def sleep(seconds: float) -> float:
    """Busy for a while, as a long native call would be (the child cannot look around)."""
    import time

    time.sleep(seconds)
    return seconds


def measure_or_crash(specs):
    """The fix search's candidate measurement, except that a 16-bit-weight candidate kills the
    backend process natively (SIGSEGV), as a QNN crash would."""
    from accdbg.algorithms.fixes.measure import measure_many

    if any("w16:" in s.key for s in specs):
        segfault()
    return measure_many(specs)


def log_then_print(text: str) -> str:
    """Logs a two-line record through accdbg's logger and prints a native-looking line."""
    import logging

    logging.getLogger("accdbg.test_child").warning("first line\nsecond line")
    print(text, flush=True)
    return text


def raise_two_lines() -> None:
    raise ValueError("Could not read the state tensor\nsecond line of the message")
