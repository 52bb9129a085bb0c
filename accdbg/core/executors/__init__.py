"""Executors: where independent work items run (this process, local worker processes, Ray).

A *work item* is one picklable value (one input through golden and QNN; one sub-model; one
fix-search candidate). A *worker* is an object built once per worker process or actor from a
:class:`WorkerSpec` (so it can keep a QNN session open across items) and called once per item.
Whichever executor runs them, the same items give the same values.
"""

from accdbg.core.executors import local, ray_executor  # noqa: F401 - they register themselves
from accdbg.core.executors.base import (
    EXECUTORS,
    Executor,
    ExecutorConfig,
    ItemOutcome,
    WorkerSpec,
    get_executor,
    register_executor,
)

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorConfig",
    "ItemOutcome",
    "WorkerSpec",
    "get_executor",
    "register_executor",
]
