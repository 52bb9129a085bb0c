"""Framework runners: run the float model in its own framework, every intermediate exposed."""

from accdbg.frameworks.base import FRAMEWORKS, FrameworkRunner, get_runner_class, register
from accdbg.frameworks import onnx_runner  # noqa: F401  (registers "onnx")

__all__ = ["FRAMEWORKS", "FrameworkRunner", "get_runner_class", "register"]
