"""Row statuses of the snooping reports: the reference's names, mapped onto our stages.

The reference builds one model per layer with its converter, model-library generator and
context-binary generator, then runs it. Here a part of the QDQ model is cut out with onnx,
loaded by onnxruntime, composed and finalized by the QNN execution provider at session
creation, and run. Each reference status names the stage that failed:

================  ===========================================================================
status            meaning here
================  ===========================================================================
(empty)           judged normally
``skip``          not debugged as asked: outside ``--start_layer``/``--end_layer``, or removed
                  by ``skip_layer_types``/``skip_layer_outputs`` (or not in ``add_layer_*``)
``part``          (cumulative) the first layer failing a verifier since the last partition
                  point; the next run starts after it, fed with golden values
``err_part``      cutting the model failed: onnx extraction, or no usable golden value for a
                  tensor entering the part (the reference's partitioning step)
``err_con``       onnxruntime refused the part as a model (invalid graph, type or shape
                  inference, no kernel) - the stage the reference's converter fills
``err_lib``       QNN refused the graph while composing it at session creation (op
                  validation, adding nodes; also a backend crash then) - the model-library step
``err_cntx``      QNN failed to finalize the graph or create its context at session creation
                  - the context-binary step
``err_exec``      the session was created but running it failed (or the backend crashed then)
``err_COMPARE``   the output could not be compared: no golden value, sizes differ, or no
                  verifier could produce a value
================  ===========================================================================

A failing batch or step is bisected until the failing layer is alone, so one failing layer
never stops the run and never takes other layers' results with it.
"""

from __future__ import annotations

OK, SKIP, PART = "", "skip", "part"
ERR_PART, ERR_CON, ERR_LIB, ERR_CNTX, ERR_EXEC, ERR_COMPARE = (
    "err_part",
    "err_con",
    "err_lib",
    "err_cntx",
    "err_exec",
    "err_COMPARE",
)
ERRORS = (ERR_PART, ERR_CON, ERR_LIB, ERR_CNTX, ERR_EXEC, ERR_COMPARE)

# what each error status means in one line: a finding says why layers were not measured
MEANING = {
    ERR_PART: "the model could not be cut there",
    ERR_CON: "onnxruntime refused the part",
    ERR_LIB: "QNN refused the graph",
    ERR_CNTX: "QNN could not finalize the graph",
    ERR_EXEC: "running it failed",
    ERR_COMPARE: "no comparison possible",
}
