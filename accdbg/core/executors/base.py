"""The executor interface, its registry, and the in-process ``serial`` executor.

Why a registry of small classes: the dataset run, the snooping algorithms and the fix search
hand their items to ``get_executor(config).map(spec, items)`` and never know whether the items
ran here, in local crash-isolated processes or on a Ray cluster.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from accdbg.errors import AccdbgError


@dataclass(frozen=True)
class WorkerSpec:
    """A worker class by import path (``"package.module:Class"``) and its constructor's
    keywords. Workers are built from it in other processes or machines, so both must pickle;
    the worker's ``__call__(item)`` returns a small picklable value per item."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        return resolve(self.target)(**self.kwargs)


def resolve(target: str) -> Any:
    """The object named ``"package.module:name"`` (a worker class, a function)."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise AccdbgError(f"worker {target!r}: expected 'package.module:name'")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class ItemOutcome:
    """What became of one item: its value, or a one-line error once its retries are spent."""

    key: str
    value: Any = None
    error: str | None = None
    attempts: int = 1
    worker: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ExecutorConfig:
    """``--executor``, ``--workers``, ``--ray_address``: parsed once, passed whole."""

    name: str = "local"
    workers: int = 1
    ray_address: str | None = None
    retries: int = 1  # a worker that crashes or is killed: its item is retried this often

    def check(self) -> None:
        if self.name not in EXECUTORS:
            raise AccdbgError(
                f"--executor {self.name!r}: expected one of {', '.join(sorted(EXECUTORS))}"
            )
        if self.workers < 1:
            raise AccdbgError(f"--workers {self.workers}: expected at least 1")


class Executor(ABC):
    """Runs work items on workers; a context manager that stops every worker on exit."""

    name: ClassVar[str]

    def __init__(self, config: ExecutorConfig):
        self.config = config

    @abstractmethod
    def map(self, spec: WorkerSpec, items: Iterable[tuple[str, Any]]) -> Iterator[ItemOutcome]:
        """Each ``(key, item)`` to ``worker(item)`` on one of ``config.workers`` workers built
        from ``spec``; outcomes are yielded as items complete (not in order). An exception
        raised by the worker fails its item at once (it would fail again); a worker that dies
        (native crash, killed) is replaced and its item retried ``config.retries`` times."""

    def close(self) -> None:
        """Stop every worker (also on errors and signals); nothing to stop by default."""
        return None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


EXECUTORS: dict[str, type[Executor]] = {}


def register_executor(cls: type[Executor]) -> type[Executor]:
    EXECUTORS[cls.name] = cls
    return cls


def get_executor(config: ExecutorConfig | None = None) -> Executor:
    config = config or ExecutorConfig()
    config.check()
    return EXECUTORS[config.name](config)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@register_executor
class SerialExecutor(Executor):
    """Every item in this process, one after another: for tests and debugging (no isolation:
    a native crash here takes the tool down, so it is never the default)."""

    name = "serial"

    def map(self, spec: WorkerSpec, items: Iterable[tuple[str, Any]]) -> Iterator[ItemOutcome]:
        try:
            worker = spec.build()
        except AccdbgError:
            raise
        except Exception as exc:  # as the local and ray executors say it
            raise AccdbgError(
                f"the worker {spec.target} could not be built: {one_line(exc)}"
            ) from exc
        for key, item in items:
            try:
                yield ItemOutcome(key, worker(item), worker="serial")
            except Exception as exc:  # the worker's own error: the item fails, the run goes on
                yield ItemOutcome(key, error=one_line(exc), worker="serial")
