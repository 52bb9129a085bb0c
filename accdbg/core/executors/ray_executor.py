"""The ``ray`` executor: Ray actors, on a local Ray instance or a cluster (``ray_address``).

Each actor (``num_cpus=1``) builds its worker once from the
:class:`~accdbg.core.executors.base.WorkerSpec` - e.g. holds one QNN session - and runs one
item at a time, so an actor that dies (native crash, killed, its node lost) is pinned on its
item; it is replaced and the item retried like the local executor's. Ray is imported only
here and only when this executor is built: it is an optional extra (``accdbg[ray]``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from accdbg.core.executors.base import (
    Executor,
    ExecutorConfig,
    ItemOutcome,
    WorkerSpec,
    one_line,
    register_executor,
)
from accdbg.core.isolate import child_env, source_tree
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.executors")
INSTALL_HINT = "--executor ray needs Ray: pip install 'accdbg[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise AccdbgError(INSTALL_HINT) from None
    return ray


class RayWorker:
    """The actor's body: the worker built once; each item's value or the worker's own error
    (returned, not raised: a raised error would look like the actor's death)."""

    def __init__(self, spec: WorkerSpec):
        self.error = ""
        try:
            self.worker = spec.build()
        except Exception as exc:  # noqa: BLE001 - reported by run(), not as an actor death
            self.error = f"{type(exc).__name__}: {exc}"

    def run(self, item: Any) -> tuple:
        if self.error:
            return ("unbuildable", self.error, "")
        from accdbg.core.executors.serve import reply

        return reply(self.worker, item)


def _runtime_env(local: bool) -> dict[str, Any]:
    """Ray's workers import the driver's ``accdbg``: a source tree is put on their
    PYTHONPATH on this machine, or shipped to a cluster's machines (``py_modules``)."""
    tree = source_tree()
    if tree is None:
        return {}
    if local:
        return {"env_vars": {"PYTHONPATH": child_env()["PYTHONPATH"]}}
    return {"py_modules": [str(Path(tree) / "accdbg")]}


@register_executor
class RayExecutor(Executor):
    """``config.workers`` Ray actors, one item in flight each."""

    name = "ray"

    def __init__(self, config: ExecutorConfig):
        super().__init__(config)
        self.ray = import_ray()
        self.started_ray = False
        self.startup_seconds = 0.0
        t = time.perf_counter()
        if not self.ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,  # native output stays in Ray's logs, off the console
                "logging_level": logging.WARNING,
            }
            if config.ray_address:
                kwargs["address"] = config.ray_address
            else:
                kwargs["num_cpus"] = config.workers
            try:
                self.ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - e.g. no cluster at that address
                where = config.ray_address or "a local instance"
                raise AccdbgError(
                    f"--executor ray: Ray could not start on {where}: {one_line(exc)}"
                ) from None
            self.started_ray = True
        self.startup_seconds = time.perf_counter() - t
        log.debug("ray executor: Ray ready in %.2f s", self.startup_seconds)
        self._actor_cls = self.ray.remote(num_cpus=1, max_restarts=0)(RayWorker)
        self._env = _runtime_env(local=not config.ray_address)
        self._spec: WorkerSpec | None = None
        self._actors: list[Any] = []
        self._started = 0

    def _start(self, spec: WorkerSpec) -> tuple[str, Any]:
        name = f"actor-{self._started}"
        self._started += 1
        actor = self._actor_cls.options(runtime_env=self._env or None).remote(spec)
        self._actors.append(actor)
        return name, actor

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if actor in self._actors:
            self._actors.remove(actor)

    def map(self, spec: WorkerSpec, items: Iterable[tuple[str, Any]]) -> Iterator[ItemOutcome]:
        from ray.exceptions import RayActorError, RayError

        if spec != self._spec:
            self._stop()
            self._spec = spec
        idle: list[tuple[str, Any]] = [(f"actor-{i}", a) for i, a in enumerate(self._actors)]
        running: dict[
            Any, tuple[str, Any, str, Any, int]
        ] = {}  # ref -> name, actor, key, item, attempts
        retry: deque[tuple[str, Any, int]] = deque()
        source = iter(items)
        exhausted = False
        try:
            while True:
                while (not exhausted or retry) and (
                    idle or len(self._actors) < self.config.workers
                ):
                    if retry:
                        key, item, attempts = retry.popleft()
                    else:
                        nxt = next(source, None)
                        if nxt is None:
                            exhausted = True
                            continue
                        (key, item), attempts = nxt, 0
                    name, actor = idle.pop() if idle else self._start(spec)
                    running[actor.run.remote(item)] = (name, actor, key, item, attempts + 1)
                if not running:
                    return
                (ref,), _ = self.ray.wait(list(running), num_returns=1)
                name, actor, key, item, attempts = running.pop(ref)
                try:
                    kind, *payload = self.ray.get(ref)
                except (RayActorError, RayError) as exc:  # the actor died on its item
                    self._kill(actor)
                    why = one_line(exc)
                    log.warning("ray executor: %s died on item %s: %s", name, key, why)
                    if attempts <= self.config.retries:
                        retry.append((key, item, attempts))
                        continue
                    yield ItemOutcome(
                        key,
                        error=f"the Ray actor died on item {key} ({attempts} attempts): {why}",
                        attempts=attempts,
                        worker=name,
                    )
                    continue
                idle.append((name, actor))
                if kind == "unbuildable":
                    raise AccdbgError(f"the worker {spec.target} could not be built: {payload[0]}")
                if payload[1:] and payload[1]:
                    log.debug("worker error on item %s:\n%s", key, payload[1])
                if kind == "ok":
                    yield ItemOutcome(key, payload[0], attempts=attempts, worker=name)
                else:
                    yield ItemOutcome(key, error=payload[0], attempts=attempts, worker=name)
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> None:
        for actor in list(self._actors):
            self._kill(actor)
        self._spec = None

    def close(self) -> None:
        self._stop()
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self.started_ray = False
