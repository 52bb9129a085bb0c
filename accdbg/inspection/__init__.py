"""Tensor inspection: plots, samples and range statistics of golden against target tensors."""

from accdbg.inspection.encodings import CalibratedRange, load_target_encodings
from accdbg.inspection.inspect import InspectionResult, Workers, run_tensor_inspection

__all__ = [
    "CalibratedRange",
    "InspectionResult",
    "Workers",
    "load_target_encodings",
    "run_tensor_inspection",
]
