"""The framework runner interface and its registry.

A runner is activated once (model loaded, inputs checked), then asked for any subset of its
tensors; the diagnosis loop decides which subsets so memory stays bounded. Modelled on
Polygraphy's backend runners: ``activate`` / ``infer`` / ``deactivate``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from accdbg.core.inputs import InputTensor
from accdbg.core.onnx_model import TensorInfo
from accdbg.errors import AccdbgError


@dataclass
class RunnerOptions:
    """Options every runner understands; runners ignore what does not apply to them."""

    disable_graph_optimization: bool = False
    custom_op_lib: Path | None = None
    include_constants: bool = False
    scratch_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_flags(
        cls,
        disable_graph_optimization: bool = False,
        onnx_custom_op_lib: str | Path | None = None,
        include_constants: bool = False,
    ) -> RunnerOptions:
        """The options of the framework-diagnosis flags (paths made absolute)."""
        return cls(
            disable_graph_optimization=bool(disable_graph_optimization),
            custom_op_lib=Path(onnx_custom_op_lib).expanduser().absolute()
            if onnx_custom_op_lib
            else None,
            include_constants=bool(include_constants),
        )


class FrameworkRunner(ABC):
    """Runs one float model; yields named intermediate tensors on request."""

    name: ClassVar[str]
    layout: ClassVar[str | None] = None  # e.g. "NHWC" for TFLite; None when model-defined

    def __init__(self, model_path: Path, inputs: Sequence[InputTensor], options: RunnerOptions):
        self.model_path = Path(model_path)
        self.inputs = list(inputs)
        self.options = options

    @abstractmethod
    def activate(self) -> None:
        """Load and check the model against the inputs; raise AccdbgError on a bad input."""

    @abstractmethod
    def tensors(self) -> list[TensorInfo]:
        """Every intermediate tensor this model can dump, in topological order."""

    @abstractmethod
    def infer(self, feeds: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run once and return exactly the named tensors."""

    @classmethod
    def isolated(cls, options: RunnerOptions) -> bool:
        """Whether framework diagnosis runs this model in a child Python: True where the
        framework's native code runs the model in-process, so a crash in it is an error
        instead of the end of the tool."""
        return True

    @classmethod  # noqa: B027 - optional hook
    def check_path(cls, path: Path) -> None:
        """Raise when ``path`` cannot be this framework's model, checked without importing the
        framework: the parent says so at once, before a child Python loads it."""

    def model_input_order(self) -> list[str]:
        """The ``--input_tensor`` names in the model's input order (plain input-list paths
        follow it); by default the order they were given in."""
        return [t.name for t in self.inputs]

    def check_outputs(self, names: Sequence[str], what: str = "-o/--output_tensor") -> None:  # noqa: B027 - optional hook
        """Raise when a requested output tensor does not exist."""

    def deactivate(self) -> None:  # noqa: B027 - optional hook
        """Release sessions and memory."""

    def __enter__(self) -> FrameworkRunner:
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()


FRAMEWORKS: dict[str, type[FrameworkRunner]] = {}


def register(cls: type[FrameworkRunner]) -> type[FrameworkRunner]:
    FRAMEWORKS[cls.name] = cls
    return cls


def get_runner_class(framework: str) -> type[FrameworkRunner]:
    key = framework.strip().lower()
    if key not in FRAMEWORKS:
        raise AccdbgError(
            f"-f/--framework {framework!r} is not supported; expected one of: {', '.join(sorted(FRAMEWORKS))}"
        )
    return FRAMEWORKS[key]
