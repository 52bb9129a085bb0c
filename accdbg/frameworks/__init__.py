"""Framework runners: run the float model in its own framework, every intermediate exposed."""

from accdbg.frameworks.base import FRAMEWORKS, FrameworkRunner, get_runner_class, register
from accdbg.frameworks import onnx_runner  # noqa: F401  (registers "onnx")
# these import their framework only in activate(), so a lean install still lists them
from accdbg.frameworks import tflite_runner, tensorflow_runner, torch_runner  # noqa: F401, E402

__all__ = ["FRAMEWORKS", "FrameworkRunner", "get_runner_class", "register"]
