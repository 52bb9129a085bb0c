"""A run's results on the model's graph: Google Model Explorer node-data overlays.

Model Explorer (``ai-edge-model-explorer``, with the ``model-explorer-onnx`` adapter) draws an
ONNX graph and colours its nodes from node-data JSON files. Verification, oneshot, snooping
(layerwise, cumulative, binary), dissection, fix search and quantization checker runs write
them into ``<run>/model_explorer/`` with ``overlays.json`` (model, graph, files), on the
*source* model (the float ONNX model, or the converted one for other frameworks);
``qnn-accuracy-debugger --model_explorer_view RUN_DIR`` opens them.

- :mod:`.overlays`: :func:`write_overlays`, the files of any table;
- :mod:`.engine`: the engine run's model, QDQ model and layers on the CPU;
- :mod:`.page`: :func:`overlay_run`, written for a finished run and linked from its pages;
- :mod:`.viewer`: :func:`serve`, the local viewer.
"""

from accdbg.reports.model_explorer.engine import cpu_marks, engine_model
from accdbg.reports.model_explorer.overlays import (
    DIRNAME,
    MANIFEST,
    MARK_COLORS,
    RANK_COLORS,
    WORST,
    Overlays,
    Score,
    score_results,
    source_nodes,
    view_command,
    write_overlays,
)
from accdbg.reports.model_explorer.page import add_links, links_html, overlay_run
from accdbg.reports.model_explorer.viewer import read_overlays, serve

__all__ = [
    "DIRNAME",
    "MANIFEST",
    "MARK_COLORS",
    "RANK_COLORS",
    "WORST",
    "Overlays",
    "Score",
    "add_links",
    "cpu_marks",
    "engine_model",
    "links_html",
    "overlay_run",
    "read_overlays",
    "score_results",
    "serve",
    "source_nodes",
    "view_command",
    "write_overlays",
]
