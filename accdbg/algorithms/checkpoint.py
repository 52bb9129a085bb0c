"""Resumable runs: a progress journal and the run folder of a killed run.

After each finished unit of work (a batch of fragments, a cumulative step) one JSON line is
appended to ``progress.jsonl`` and fsynced; a line cut short by a kill is dropped on reading.
Starting again with the same ``--output_dirname`` finds the run folder whatever state the
kill left it in (``.NAME.partial`` after SIGKILL, ``NAME.failed`` after SIGINT/SIGTERM, or
``NAME``), takes it over (:class:`~accdbg.core.run_dir.RunDir` tells a dead run's folder from
a live one by its lock) and replays the journal, so only unfinished layers run again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from accdbg.core.run_dir import RunDir, write_bytes_atomic
from accdbg.errors import AccdbgError, stop_if_signalled

log = logging.getLogger("accdbg.snooping")

JOURNAL = "progress.jsonl"


class Journal:
    """An append-only list of JSON records that survives being killed at any instant."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            raw = path.read_bytes()
            lines = raw.split(b"\n")
            good: list[bytes] = []
            for line in lines:
                if not line.strip():
                    continue
                try:
                    self.records.append(json.loads(line))
                    good.append(line)
                except json.JSONDecodeError:
                    log.warning(
                        "%s: dropping an unfinished record (the run was killed while writing it)",
                        path,
                    )
                    break
            if len(good) != len([x for x in lines if x.strip()]):
                write_bytes_atomic(path, b"".join(g + b"\n" for g in good))

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        with open(self.path, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self.records.append(record)
        stop_if_signalled()  # each row is a checkpoint: a lost stop signal stops here

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]


def open_run(working_dir: str | os.PathLike, component: str, output_dirname: str | None) -> RunDir:
    """The run folder: a new one, or - with an ``output_dirname`` - the earlier run of that
    name, in whatever state it was left (killed, failed or finished), to be resumed. A run
    still alive under that name is refused (:class:`~accdbg.core.run_dir.RunDir`)."""
    return RunDir(working_dir, component, output_dirname, resume=output_dirname is not None)


def check_options(path: Path, options: dict[str, Any], keys: list[str]) -> None:
    """A resumed run must be the same run: refuse when an option that shapes results changed."""
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return
    for key in keys:
        if json.dumps(old.get(key), sort_keys=True) != json.dumps(
            options.get(key), sort_keys=True, default=str
        ):
            raise AccdbgError(
                f"output folder {str(path.parent)!r} holds a run with another {key} ({old.get(key)!r}, now "
                f"{options.get(key)!r}); pick another --output_dirname to start a new run"
            )
