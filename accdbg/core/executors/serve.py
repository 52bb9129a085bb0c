"""The child side of the local executor: ``python -m accdbg.core.executors.serve FD PARENT``.

A fresh Python (no inherited threads or sessions), started by
:class:`~accdbg.core.executors.local.LocalExecutor`: it builds its worker once from the
:class:`~accdbg.core.executors.base.WorkerSpec` it receives, then serves one item at a time
over the pipe, so a crash is always the crash of the item it was running. It dies with its
parent (``PR_SET_PDEATHSIG``) and leaves SIGINT and SIGTERM to it.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from accdbg.core.isolate import _die_with_parent
from accdbg.errors import AccdbgError


def reply(worker: Any, item: Any) -> tuple:
    """``("ok", value)``, or ``("error", one line, traceback)`` for the worker's own error."""
    from accdbg.core.executors.base import one_line

    try:
        return ("ok", worker(item))
    except AccdbgError as exc:
        return ("error", one_line(exc), "")
    except Exception as exc:  # the worker's own bug: its item fails, the worker serves on
        return ("error", f"{type(exc).__name__}: {one_line(exc)}", traceback.format_exc())


def serve(conn: Connection) -> int:
    spec = conn.recv()
    try:
        worker = spec.build()
    except Exception as exc:  # noqa: BLE001 - the parent says why no worker could be built
        conn.send(("unbuildable", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return 1
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe: no more work
            return 0
        if item is None:
            return 0
        out = reply(worker, item)
        try:
            conn.send(out)
        except Exception as exc:  # noqa: BLE001 - e.g. a value that does not pickle
            conn.send(("error", f"the worker's result could not be sent back: {exc}", ""))


def main(fd: str, parent: str) -> int:
    _die_with_parent(int(parent))
    return serve(Connection(int(fd)))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
