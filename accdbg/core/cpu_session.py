"""onnxruntime CPU sessions that run a model exactly as written, on the threads allowed.

The culprit ranking's CPU simulations (sensitivity, outlier reach, backend comparison) need
every QuantizeLinear/DequantizeLinear executed as written - no fusion into onnxruntime's
QLinear kernels, whose integer arithmetic is not the fake-quant - so graph optimization is off.
Work done beside another process (the ranking's, while QNN finalizes its graph on one core)
asks for fewer threads with :func:`cpu_threads`, for the sessions the calling thread makes,
and runs at the lowest priority (:func:`idle_priority`); whoever waits for it waits only while
it runs (:func:`join_while_running`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import onnx
import onnxruntime as ort

_local = threading.local()


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Sessions made in this thread, inside the block, use ``n`` threads (0: onnxruntime's
    default, one per core)."""
    before = getattr(_local, "threads", 0)
    _local.threads = n
    try:
        yield
    finally:
        _local.threads = before


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


def join_while_running(thread: threading.Thread, every: float = 0.5, least: float = 0.1) -> bool:
    """Wait for ``thread`` while it gets CPU; False (it still runs) once it got under ``least``
    of a core in ``every`` seconds. A thread at :func:`idle_priority` starves while other
    processes take every core: no thread of normal priority may wait on it then (the wait
    would last as long as the machine is busy)."""
    try:
        clock = time.pthread_getcpuclockid(thread.ident or 0)
    except (AttributeError, OSError):  # no per-thread clock here: wait as any join does
        thread.join()
        return True
    while thread.is_alive():
        try:
            before = time.clock_gettime(clock)
            thread.join(every)
            if thread.is_alive() and time.clock_gettime(clock) - before < least * every:
                return False
        except OSError:  # it ended while its clock was read
            pass
    return True


def exact_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session running ``model`` as written."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    threads = getattr(_local, "threads", 0)
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
