"""accdbg: find which layer of a model breaks on the QNN runtime, and why.

The command ``qnn-accuracy-debugger`` is a thin layer over these functions, which notebooks
can call directly; they return pandas DataFrames.
"""

from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis

__version__ = "0.1.0"
__all__ = ["AccdbgError", "run_framework_diagnosis", "__version__"]
