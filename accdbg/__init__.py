"""accdbg: find which layer of a model breaks on the QNN runtime, and why.

The command ``qnn-accuracy-debugger`` is a thin layer over these functions, which notebooks
can call directly; they return pandas DataFrames.
"""

from accdbg.encodings.compare import compare_encodings
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.inspection import run_tensor_inspection
from accdbg.verifiers.verification import run_verification

__version__ = "0.1.0"
__all__ = [
    "AccdbgError",
    "compare_encodings",
    "run_framework_diagnosis",
    "run_tensor_inspection",
    "run_verification",
    "__version__",
]
