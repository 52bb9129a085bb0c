"""The debugging algorithms behind one protocol: check the request, run it, one result type.

Each algorithm is a class registered under its ``--debugging_algorithm`` name
(:func:`register`); the end-to-end run (``accdbg.cli.wrapper``) and notebooks dispatch by name
(:func:`get_algorithm`). A request holds what every algorithm is asked with; what only one takes
(binary snooping's halving, layerwise's span) is in ``options``. Modules are imported when
their algorithm is first asked for: choosing one does not load the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from accdbg.algorithms.diagnosis.culprit import Culprit
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.engines.options import EngineConfig
from accdbg.errors import AccdbgError

# name -> the module that registers it
MODULES = {
    "oneshot-layerwise": "accdbg.algorithms.oneshot",
    "cumulative-layerwise": "accdbg.algorithms.cumulative",
    "layerwise": "accdbg.algorithms.layerwise",
    "binary": "accdbg.algorithms.binary",
}
NAMES = tuple(MODULES)


@dataclass(frozen=True)
class AlgorithmRequest:
    """One debugging run as asked: the model, its inputs, the engine, where it goes."""

    framework: str
    model_path: Path
    input_tensors: Sequence[InputTensor]
    config: EngineConfig
    input_list: str | Path | None = None
    output_tensors: Sequence[str] = ()
    golden_dir: str | Path | None = None
    verifiers: Sequence[Any] = ("CosineSimilarity", "SQNR")
    verifier_config: str | Path | None = None
    working_dir: str | Path = "working_directory"
    output_dirname: str | None = None
    allow_nonfinite_inputs: bool = False
    model_explorer: bool = True
    executor: ExecutorConfig | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # the algorithm's own


@dataclass
class AlgorithmResult:
    """What every algorithm returns: its run, its table and verdict, and its own result."""

    algorithm: str
    run_dir: Path
    report: Path
    table: pd.DataFrame
    findings: list[str]
    culprits: list[Culprit]
    own: Any = None  # OneshotResult, SnoopingResult, BinaryResult...


class Algorithm:
    """One debugging algorithm. ``check`` refuses a bad request before anything is written;
    ``run`` runs it. ``on_onnx``: it cuts the ONNX graph, so another framework's model runs
    as its ONNX conversion."""

    name: ClassVar[str]
    on_onnx: ClassVar[bool] = True

    def check(self, req: AlgorithmRequest) -> None:
        raise NotImplementedError

    def run(self, req: AlgorithmRequest) -> AlgorithmResult:
        raise NotImplementedError


REGISTRY: dict[str, type[Algorithm]] = {}


def register(name: str):
    """Register an :class:`Algorithm` class under ``name``."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return deco


def get_algorithm(name: str) -> Algorithm:
    """The algorithm of that name (its module imported now)."""
    if name not in MODULES:
        raise AccdbgError(
            f"--debugging_algorithm {name!r} is not known; expected one of: {', '.join(NAMES)}"
        )
    importlib.import_module(MODULES[name])
    return REGISTRY[name]()
