"""CPU simulation: the same QDQ model on onnxruntime's CPU provider (fake-quant).

Not QNN. Useful as a reference, to tell a quantization problem (both engines wrong) from a
backend problem (only QNN wrong), and where onnxruntime-qnn cannot be installed.
"""

from __future__ import annotations

import onnxruntime as ort

from accdbg.engines.base import Engine, EngineOptions, base_session_options, register


@register
class CpuSimulationEngine(Engine):
    name = "simulation"
    label = "CPU simulation (onnxruntime fake-quant, not QNN)"
    simulation = True

    def session_options(self, options: EngineOptions, verbose_log: bool) -> ort.SessionOptions:
        return base_session_options(verbose_log)

    def session_kwargs(self) -> dict:
        return {"providers": ["CPUExecutionProvider"]}
