"""accdbg: find which layer of a model breaks on the QNN runtime, and why.

The command ``qnn-accuracy-debugger`` is a thin layer over these functions, which notebooks
can call directly; they return pandas DataFrames.

They are imported on first use: worker processes (``python -m accdbg.core.isolate``) import
this package too, and should not pay for onnx, onnxruntime and pandas they may not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accdbg.core.imports import lazy_exports
from accdbg.errors import AccdbgError

__version__ = "0.1.0"
_LAZY = {
    "compare_encodings": "accdbg.encodings.compare",
    "run_framework_diagnosis": "accdbg.frameworks.diagnosis",
    "run_quant_checker": "accdbg.algorithms.quant_checker",
    "run_tensor_inspection": "accdbg.inspection",
    "run_verification": "accdbg.verifiers.verification",
}
__all__ = [
    "AccdbgError",
    "compare_encodings",
    "run_framework_diagnosis",
    "run_quant_checker",
    "run_tensor_inspection",
    "run_verification",
    "__version__",
]

if TYPE_CHECKING:
    from accdbg.algorithms.quant_checker import run_quant_checker
    from accdbg.encodings.compare import compare_encodings
    from accdbg.frameworks.diagnosis import run_framework_diagnosis
    from accdbg.inspection import run_tensor_inspection
    from accdbg.verifiers.verification import run_verification

__getattr__ = lazy_exports(__name__, _LAZY)
