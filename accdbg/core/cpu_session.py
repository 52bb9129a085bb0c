"""onnxruntime CPU sessions that run a model exactly as written, on the threads allowed.

The culprit ranking's CPU simulations (sensitivity, outlier reach, backend comparison) need
every QuantizeLinear/DequantizeLinear executed as written - no fusion into onnxruntime's
QLinear kernels, whose integer arithmetic is not the fake-quant - so graph optimization is off.
Work done beside another process (the ranking's, while QNN finalizes its graph on one core)
asks for fewer threads with :func:`cpu_threads`, for the sessions the calling thread makes.
"""

from __future__ import annotations

import threading
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
