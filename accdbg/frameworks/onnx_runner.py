"""Float ONNX models on onnxruntime's CPU provider, any node output on demand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from accdbg.core import onnx_model as om
from accdbg.errors import AccdbgError
from accdbg.frameworks.base import FrameworkRunner, RunnerOptions, register


def session_options(disable_optimization: bool, custom_op_lib=None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if disable_optimization
        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    )
    if custom_op_lib is not None:
        if not custom_op_lib.is_file():
            raise AccdbgError(f"--onnx_custom_op_lib {str(custom_op_lib)!r} does not exist")
        try:
            so.register_custom_ops_library(str(custom_op_lib))
        except Exception as exc:
            raise AccdbgError(
                f"--onnx_custom_op_lib {str(custom_op_lib)!r} could not be loaded: {exc}"
            ) from None
    return so


@register
class OnnxRunner(FrameworkRunner):
    """Exposes the requested node outputs as graph outputs and runs one session per request."""

    name = "onnx"

    @classmethod
    def isolated(cls, options: RunnerOptions) -> bool:
        """onnxruntime's CPU kernels run in this process (a child costs a second or two); a
        custom-op library is the user's native code, and runs in a child."""
        return options.custom_op_lib is not None

    def activate(self) -> None:
        model = om.load_model(self.model_path)
        given = {t.name: t for t in self.inputs}
        model_inputs = {vi.name: vi for vi in om.real_inputs(model)}
        om.check_given_inputs(model, self.inputs)
        missing = [n for n in model_inputs if n not in given]
        if missing:
            raise AccdbgError(
                f"model input {missing[0]!r} has no --input_tensor; the model's inputs are: "
                f"{om.describe_inputs(model)}"
            )
        self._order = list(model_inputs)
        dims = {n: t.dims for n, t in given.items()}
        if om.branch_nodes(model):
            # fixed dims reach every If branch, also one this input never takes, whose shape
            # inference may then fail (silero-vad's 8 kHz branch on a 16 kHz frame): checked only
            om.check_input_dims(model, dims)
        else:
            om.fix_input_shapes(model, dims)
        self.model = om.infer_shapes(model)
        skip = () if self.options.include_constants else ("Constant",)
        self._tensors = om.tensor_infos(self.model, skip)
        self._so = session_options(
            self.options.disable_graph_optimization, self.options.custom_op_lib
        )

    def tensors(self):
        return self._tensors

    def model_input_order(self) -> list[str]:
        return list(self._order)

    def check_outputs(self, names: Sequence[str], what: str = "-o/--output_tensor") -> None:
        om.check_tensor_names(self.model, names, what)

    def infer(self, feeds, outputs):
        key = tuple(outputs)
        cached = getattr(self, "_session", None)
        if cached is None or cached[0] != key:
            self._session = None  # the previous batch's session goes before the next is built
            exposed = om.with_outputs(self.model, outputs)
            data = om.serialize(exposed, self.options.scratch_dir or self.model_path.parent)
            try:
                sess = ort.InferenceSession(
                    data, sess_options=self._so, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise AccdbgError(
                    f"onnxruntime could not load {str(self.model_path)!r}: {str(exc).splitlines()[0]}"
                ) from None
            # kept for the next input of the same batch (an input list runs each batch N times)
            self._session = cached = (key, sess, [o.name for o in sess.get_outputs()])
        _, sess, names = cached
        values = sess.run(names, feeds)
        return dict(zip(names, (np.asarray(v) for v in values), strict=True))

    def deactivate(self) -> None:
        self._session = None
