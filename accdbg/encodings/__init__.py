"""Quantization encodings: QNN graph JSON, AIMET files and QDQ models in one convention.

:class:`~accdbg.encodings.model.Encoding` holds scale/offset/min/max/bitwidth in AIMET's
convention (documented in :mod:`accdbg.encodings.model`); readers convert to it and writers
from it. :func:`compare_encodings` is the ``--compare_encodings`` component.
"""

from accdbg.encodings.aimet import AimetEncodings, aimet_dict, load_aimet, parse_aimet
from accdbg.encodings.compare import CompareResult, compare_encodings
from accdbg.encodings.model import Encoding
from accdbg.encodings.overrides import aimet_to_tensor_quant_overrides
from accdbg.encodings.qdq import export_qdq_encodings, qdq_encodings
from accdbg.encodings.qnn_json import fill_per_channel_from_qdq, load_qnn_graph, qnn_encodings

__all__ = [
    "AimetEncodings",
    "CompareResult",
    "Encoding",
    "aimet_dict",
    "aimet_to_tensor_quant_overrides",
    "compare_encodings",
    "export_qdq_encodings",
    "fill_per_channel_from_qdq",
    "load_aimet",
    "load_qnn_graph",
    "parse_aimet",
    "qdq_encodings",
    "qnn_encodings",
]
