"""The inference engine interface and its registry.

An engine turns an ONNX model (QDQ or float) into an onnxruntime session placed on some
backend. Everything else - which tensors to expose, how to write them - is shared, so an
engine is only: check the host, build the session options, name itself honestly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import onnxruntime as ort

from accdbg.errors import AccdbgError


@dataclass
class EngineOptions:
    """Backend choices of one run; picklable, so it crosses into the worker process."""

    runtime: str = "htp"
    architecture: str = "x86_64-linux-clang"
    precision: str = "int8"
    soc_model: str | None = None
    profiling_level: str | None = None
    profiling_path: str | None = None
    json_graph_dir: str | None = None
    disable_cpu_fallback: bool = False
    perf_profile: str | None = None
    extra_provider_options: dict[str, str] = field(default_factory=dict)


class Engine(ABC):
    """One way of running a model; ``simulation`` engines say so wherever they appear."""

    name: ClassVar[str]
    label: ClassVar[str]
    simulation: ClassVar[bool] = False
    isolated: ClassVar[bool] = False  # run in a child process (native backends)

    def check_host(self, options: EngineOptions) -> None:  # noqa: B027 - optional hook
        """Raise a one-line error when this engine cannot run here with these options."""

    @abstractmethod
    def session_options(self, options: EngineOptions, verbose_log: bool) -> ort.SessionOptions:
        """Session options placing the model on this engine's backend."""

    def create_session(self, model: bytes | str, options: EngineOptions, verbose_log: bool = False):
        so = self.session_options(options, verbose_log)
        sess = ort.InferenceSession(model, sess_options=so, **self.session_kwargs())
        # onnxruntime's Python wrapper otherwise re-runs a failed run on the CPU provider,
        # silently: the tensors would no longer come from the engine they are labelled with.
        sess.disable_fallback()
        return sess

    def session_kwargs(self) -> dict:
        return {}


ENGINES: dict[str, type[Engine]] = {}


def register(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def get_engine(name: str) -> Engine:
    key = name.strip().lower()
    if key not in ENGINES:
        raise AccdbgError(
            f"--engine {name!r} is not known; expected one of: {', '.join(sorted(ENGINES))}"
        )
    return ENGINES[key]()


def base_session_options(verbose_log: bool) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 0 if verbose_log else 3
    so.log_verbosity_level = 0
    return so
