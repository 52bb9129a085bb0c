"""Framework runners: run the float model in its own framework, every intermediate exposed."""

# these import their framework only in activate(), so a lean install still lists them
from accdbg.frameworks import (  # noqa: F401, E402
    onnx_runner,  # noqa: F401  (registers "onnx")
    tensorflow_runner,
    tflite_runner,
    torch_runner,
)
from accdbg.frameworks.base import FRAMEWORKS, FrameworkRunner, get_runner_class, register

__all__ = ["FRAMEWORKS", "FrameworkRunner", "get_runner_class", "register"]
