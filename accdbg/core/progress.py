"""One progress API for every long stage: a bar on a terminal, one plain line elsewhere.

Why: a run's stages (dumps, QNN sessions and runs, verification, snooping batches, fix
candidates, dataset items) take seconds to minutes. On a terminal the user sees a tqdm bar
with counts and an ETA, and a ticker thread redraws every open bar each second, so even a
stage with no count (one QNN graph finalize) shows its elapsed time instead of silence.
Where there is no terminal (a log, CI) a stage leaves exactly one plain line when it ends -
through logging, so the run's ``log.txt`` gets it too, and never a bar's redraw. A stage
whose own code already logs a line at its end passes ``line=False``.

Bars go to stderr, where the console log lines go (``cli/main.py``): the terminal test is
``sys.stderr.isatty()``, the stream actually written. A log record written while bars are
shown goes through :func:`paused`, which clears the bars and draws them again below it.
``ACCDBG_PROGRESS=bars`` or ``=lines`` forces the choice (tests: a fake terminal);
``ACCDBG_NO_PROGRESS`` or ``CI`` mean lines.

A child process (``core/isolate.py``) has no terminal: its stages travel to the parent as
events in a file named by ``ACCDBG_PROGRESS_EVENTS``, and the parent's :class:`Relay`
shows them as its own bars (and logs their lines), while the child still runs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")
log = logging.getLogger("accdbg.progress")

MODE_ENV = "ACCDBG_PROGRESS"  # "bars" or "lines": forced, whatever the stream is
EVENTS_ENV = "ACCDBG_PROGRESS_EVENTS"  # a child's channel: the file its events go to
TICK = 0.25  # seconds between two rounds of the ticker (redraws, counts, relayed events)
REDRAW = 1.0  # a bar is redrawn at least this often: its elapsed time moves
EVENT_EVERY = 0.25  # a child writes a bar's count at most this often (and when it ends)
KNOWN_TOTAL = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}{postfix}]"
)
COUNTED = "{desc}: {n_fmt} {unit} [{elapsed}{postfix}]"
SPINNER = "{desc} [{elapsed}{postfix}]"


def mode(stream: TextIO | None = None) -> str:
    """``"bars"``, ``"lines"`` or ``"events"`` (a child process relaying to its parent)."""
    if os.environ.get(EVENTS_ENV):
        return "events"
    forced = os.environ.get(MODE_ENV, "").strip().lower()
    if forced in ("bars", "lines"):
        return forced
    if os.environ.get("ACCDBG_NO_PROGRESS") or os.environ.get("CI"):
        return "lines"
    stream = sys.stderr if stream is None else stream
    try:
        return "bars" if stream is not None and stream.isatty() else "lines"
    except (AttributeError, ValueError):  # a closed or odd stream (a notebook's)
        return "lines"


class Progress:
    """One stage: ``with Progress("verification", total=8, unit="inputs") as bar:
    ... bar.update()``. ``total=None`` counts without an ETA; with no count at all it shows
    the elapsed time (a spinner). ``count``: a function whose growth since the start is the
    stage's count, read by the ticker - for loops that are not ours to touch. ``line``: the
    plain line at the end (``False`` where the stage logs its own)."""

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        unit: str = "items",
        *,
        line: bool = True,
        count: Callable[[], int] | None = None,
    ):
        self.desc, self.total, self.unit, self.line = desc, total, unit, line
        self.n = 0
        self._count = count
        self._base = count() if count is not None else 0
        self._start = time.perf_counter()
        self._mode = mode()
        self._bar: tqdm | None = None
        self._closed = False
        self._sent = 0.0  # when the last count event went out (events mode)
        self._dirty = False
        if self._mode == "bars":
            fmt = KNOWN_TOTAL if total is not None else COUNTED if unit else SPINNER
            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                bar_format=fmt,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )
            self._drawn = time.perf_counter()
        elif self._mode == "events":
            self._id = _channel().open(self)
        if self._mode != "lines" or count is not None:
            _ticker.add(self)

    def update(self, n: int = 1) -> None:
        """``n`` more items done."""
        self._advance(n)

    def note(self, text: str) -> None:
        """What the stage is doing now (``graph finalize``), shown after the counts."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
        elif self._mode == "events":
            _channel().send({"id": self._id, "note": text})

    def close(self, ok: bool = True) -> None:
        """End the stage: the bar goes, the plain line stays (only when it ``ok``-ended)."""
        if self._closed:
            return
        self._closed = True
        _ticker.remove(self)
        self._poll()
        seconds = time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.refresh()  # its last state (N/N) drawn, then cleared for the line
            self._bar.close()
        if self._mode == "events":
            _channel().send({"id": self._id, "n": self.n, "end": ok})
            return
        text = self.summary(seconds)
        if ok and self.line and self.total != 0:  # a stage with nothing to do says nothing
            log.info("%s", text)
        elif not ok:
            log.debug("%s (stopped)", text)

    def summary(self, seconds: float) -> str:
        """The stage's plain line: ``verification: 8 inputs in 3.2 s``."""
        if self.total is None and not self.unit:
            return f"{self.desc} in {seconds:.1f} s"
        done = f"{self.n}" if self.total in (None, self.n) else f"{self.n}/{self.total}"
        return f"{self.desc}: {done} {self.unit} in {seconds:.1f} s"

    def _advance(self, n: int) -> None:
        if n <= 0:
            return
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._mode == "events":
            self._dirty = True
            if time.perf_counter() - self._sent >= EVENT_EVERY:
                self._send_count()

    def _send_count(self) -> None:
        self._sent, self._dirty = time.perf_counter(), False
        _channel().send({"id": self._id, "n": self.n})

    def _poll(self) -> None:
        if self._count is not None:
            self._advance(self._count() - self._base - self.n)

    def tick(self) -> None:
        """From the ticker: the count read, the bar redrawn, a child's count sent."""
        if self._closed:
            return
        self._poll()
        if self._bar is not None and time.perf_counter() - self._drawn >= REDRAW:
            self._drawn = time.perf_counter()
            self._bar.refresh()
        elif self._mode == "events" and self._dirty:
            self._send_count()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(ok=exc_type is None)


def progress(
    items: Iterable[T],
    desc: str,
    total: int | None = None,
    unit: str = "items",
    line: bool = True,
) -> Iterator[T]:
    """``items`` one by one, each counted as done when the next is asked for (or the loop
    ends); the stage ends with the loop."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = Progress(desc, total, unit, line=line)
    ok = False
    try:
        for item in items:
            yield item
            bar.update()
        ok = True
    except GeneratorExit:  # the loop stopped early (a break, a budget spent): no failure
        ok = True
        raise
    finally:
        bar.close(ok)


@contextmanager
def stage(
    desc: str, *, line: bool = True, unit: str = "", count: Callable[[], int] | None = None
) -> Iterator[Progress]:
    """A stage with no known total, as a ``with`` block or a decorator: its elapsed time on a
    terminal (or its ``count``), one plain line at its end elsewhere."""
    with Progress(desc, None, unit, line=line, count=count) as bar:
        yield bar


@contextmanager
def paused(stream: TextIO | None = None) -> Iterator[None]:
    """Bars on the terminal cleared while something else is written, then drawn again."""
    with tqdm.external_write_mode(file=sys.stderr if stream is None else stream):
        yield


# ---------------------------------------------------------------- the ticker thread


class _Ticker:
    """One daemon thread calling ``tick()`` on every open bar and relay, while there are any."""

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="accdbg-progress", daemon=True
                )
                self._thread.start()

    def remove(self, item: Any) -> None:
        with self._lock:
            if item in self._items:
                self._items.remove(item)

    def _run(self) -> None:
        while True:
            time.sleep(TICK)
            with self._lock:
                items = list(self._items)
                if not items:
                    self._thread = None
                    return
            for item in items:
                try:
                    item.tick()
                except Exception as exc:  # noqa: BLE001 - a bar must never stop a run
                    log.debug("progress: %s", exc)


_ticker = _Ticker()


# ---------------------------------------------------------------- child -> parent


class _Channel:
    """A child's events file: one JSON object per line, appended and flushed."""

    def __init__(self, path: str):
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - for the process
        self._lock = threading.Lock()
        self._next = 0

    def open(self, bar: Progress) -> int:
        with self._lock:
            self._next += 1
            ident = self._next
        self.send(
            {"id": ident, "desc": bar.desc, "total": bar.total, "unit": bar.unit, "line": bar.line}
        )
        return ident

    def send(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()


_channels: dict[str, _Channel] = {}


def _channel() -> _Channel:
    path = os.environ[EVENTS_ENV]
    if path not in _channels:
        _channels[path] = _Channel(path)
    return _channels[path]


class Relay:
    """The parent's side of a child's channel: the child's stages as this process's bars,
    read from ``path`` while the child runs; :meth:`stop` reads the rest and ends them.
    Once the child has work (:meth:`working`), ``idle`` is shown as a spinner whenever it
    shows no stage of its own (its start-up: imports take seconds; its work between two
    stages), so a child is never silent."""

    def __init__(self, path: Path, idle: str | None = None):
        self.path, self.idle = Path(path), idle
        self._offset = 0
        self._bars: dict[int, Progress] = {}
        self._spinner: Progress | None = None
        self._working = False
        self._lock = threading.Lock()
        _ticker.add(self)

    def working(self) -> None:
        """The child was given its work: from now on it is never silent."""
        self._working = True

    def tick(self) -> None:
        with self._lock:
            self._read()
            self._idle()

    def stop(self) -> None:
        """The child is done (or dead): what it sent is shown, its open stages are ended."""
        _ticker.remove(self)
        with self._lock:
            self._read()
            self._working = False
            self._idle()
            for bar in self._bars.values():
                bar.close(ok=False)
            self._bars.clear()

    def _idle(self) -> None:
        want = self._working and self.idle is not None and not self._bars
        if want and self._spinner is None:
            self._spinner = Progress(str(self.idle), None, "", line=False)
        elif not want and self._spinner is not None:
            self._spinner.close()
            self._spinner = None

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:  # not written yet
            return
        data = data[: data.rfind(b"\n") + 1]  # whole lines only
        self._offset += len(data)
        for raw in data.splitlines():
            try:
                self._apply(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                continue

    def _apply(self, event: dict[str, Any]) -> None:
        ident = event["id"]
        if "desc" in event:
            if self._spinner is not None:  # the child's own stage replaces it
                self._spinner.close()
                self._spinner = None
            self._bars[ident] = Progress(
                event["desc"], event["total"], event["unit"], line=event["line"]
            )
            return
        bar = self._bars.get(ident)
        if bar is None:
            return
        if "note" in event:
            bar.note(event["note"])
        if "n" in event:
            bar.update(event["n"] - bar.n)
        if "end" in event:
            self._bars.pop(ident).close(ok=bool(event["end"]))
