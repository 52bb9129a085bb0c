"""onnxruntime CPU sessions that run a model exactly as written, on the threads allowed.

The culprit ranking's CPU simulations (sensitivity, outlier reach, backend comparison) need
every QuantizeLinear/DequantizeLinear executed as written - no fusion into onnxruntime's
QLinear kernels, whose integer arithmetic is not the fake-quant - so graph optimization is off.
Work done beside another process (the ranking's, while QNN finalizes its graph on one core)
asks for fewer threads with :func:`cpu_threads`, for the sessions the calling thread makes,
and runs at the lowest priority (:func:`idle_priority`); whoever waits for it waits only while
it runs (:class:`IdleThread`), and a thread asked to stop stops at its next session or run
(:func:`stop_if_asked`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import onnx
import onnxruntime as ort

_local = threading.local()
_made = 0  # sessions made in this process, every thread: what a progress bar counts


@contextmanager
def _scoped(name: str, value: object) -> Iterator[None]:
    """This thread's setting ``name`` is ``value`` inside the block."""
    before = getattr(_local, name, None)
    setattr(_local, name, value)
    try:
        yield
    finally:
        setattr(_local, name, before)


def cpu_threads(n: int) -> contextlib.AbstractContextManager[None]:
    """Sessions made in this thread, inside the block, use ``n`` threads (0: onnxruntime's
    default, one per core)."""
    return _scoped("threads", n)


class Stopped(BaseException):
    """Raised at :func:`stop_if_asked` in a thread asked to stop (:func:`stops_on`). Not an
    ``Exception``: the handlers that turn a failed measure into "not measured" let it through."""


def stops_on(event: threading.Event) -> contextlib.AbstractContextManager[None]:
    """Inside the block, this thread's :func:`stop_if_asked` raises :class:`Stopped` once
    ``event`` is set."""
    return _scoped("stop", event)


def stop_if_asked() -> None:
    """Where the calling thread's work may stop: before each CPU session and run, between two
    layers' evidence. A thread starved at :func:`idle_priority` is then waited for a short
    step at most, not a whole stage."""
    event = getattr(_local, "stop", None)
    if event is not None and event.is_set():
        raise Stopped


def idle_priority() -> None:
    """The calling thread runs only on a core the other processes leave idle: work done beside
    the backend run (a QNN worker process using both cores while it runs the graph) must not
    slow that run down. Linux only, where a thread is a task with its own nice value (raising
    it needs no privilege); a thread cannot take it back, so give it to a thread made for that
    work."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # a sandbox refusing it: the work only competes as before
            pass


class IdleThread(threading.Thread):
    """A daemon thread running ``target`` at :func:`idle_priority`, which whoever waits for it
    waits for only while it runs (:meth:`wait`), and which stops at its next step once asked
    (:meth:`ask_to_stop`)."""

    def __init__(self, target: Callable[[], None], name: str):
        super().__init__(target=target, name=name, daemon=True)
        # its CPU clock, read by the thread itself: asked of another thread, the clock of a
        # thread already ended reads freed memory (a segfault in pthread_getcpuclockid)
        self._clock: int | None = None
        self._asked = threading.Event()  # not ``_stop``: a method of threading.Thread

    def run(self) -> None:
        try:
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):  # no per-thread clock here: waited for as any thread
            pass
        idle_priority()
        with stops_on(self._asked), contextlib.suppress(Stopped):
            super().run()

    def ask_to_stop(self) -> None:
        """Its work raises :class:`Stopped` at its next :func:`stop_if_asked`, and ends."""
        self._asked.set()

    def wait(self, every: float = 0.5, least: float = 0.1) -> bool:
        """Join it while it gets CPU; False (it still runs) once it got under ``least`` of a
        core in ``every`` seconds. At the lowest priority it starves while other processes
        take every core: no thread of normal priority may wait on it then (the wait would
        last as long as the machine is busy)."""
        while self.is_alive():
            clock = self._clock
            try:
                before = time.clock_gettime(clock) if clock is not None else None
                self.join(every)
                if before is not None and self.is_alive():
                    if time.clock_gettime(clock) - before < least * every:
                        return False
            except OSError:  # it ended while its clock was read (the kernel knows it no more)
                pass
        return True


def sessions_made() -> int:
    """CPU sessions made so far in this process (the culprit ranking's progress)."""
    return _made


def exact_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session running ``model`` as written."""
    global _made
    stop_if_asked()
    _made += 1
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    threads = getattr(_local, "threads", 0)
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
