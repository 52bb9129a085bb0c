"""TFLite models on LiteRT (``ai-edge-litert``), every intermediate tensor kept.

``experimental_preserve_all_tensors`` keeps each op's output after ``invoke``, so one run gives
all intermediates; the default XNNPACK delegate is switched off because a delegated subgraph
hides its intermediates. Activations are NHWC. Quantized tensors (int8, uint8, int16) are
returned dequantized to float32, their scale and zero point recorded in the manifest.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from accdbg.errors import AccdbgError
from accdbg.frameworks.base import FrameworkRunner, register
from accdbg.frameworks.layouts import NHWC, LaidOutTensorInfo
from accdbg.frameworks.names import first_line, match_name, near
from accdbg.frameworks.versions import require

log = logging.getLogger("accdbg.framework_diagnosis")

_QUANTIZED = (np.int8, np.uint8, np.int16)


def load_interpreter(model_path, what: str = "--model_path"):
    """A LiteRT interpreter that keeps every tensor, or a one-line error."""
    litert = require("tflite")
    if not model_path.is_file():
        raise AccdbgError(f"{what} {str(model_path)!r} does not exist or is not a file")
    with open(model_path, "rb") as f:
        head = f.read(8)
    if head[4:8] != b"TFL3":
        raise AccdbgError(
            f"{what} {str(model_path)!r} is not a TFLite model (no 'TFL3' flatbuffer identifier)"
        )
    try:
        with warnings.catch_warnings():  # "preserve_all_tensors is for debugging": it is
            warnings.simplefilter("ignore")
            return litert.Interpreter(
                model_path=str(model_path),
                experimental_preserve_all_tensors=True,
                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            )
    except Exception as exc:
        raise AccdbgError(f"LiteRT could not load {str(model_path)!r}: {first_line(exc)}") from None


def densified(model_path: Path, out_path: Path) -> int:
    """Write ``model_path`` with its sparse weights made dense to ``out_path``; how many.

    A model with sparse weights (TFLite's sparsity format: MediaPipe's pose detector, the
    sparse face detector) unpacks them at run time with DENSIFY ops, whose inputs tf2onnx cannot
    read. LiteRT computes the dense weights itself (one run on zeros: they are constants);
    each DENSIFY output becomes a constant holding them, the op and its sparse input go, and the
    model computes exactly what it did. 0 (nothing written) when there is no DENSIFY op."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils as fb

    data = Path(model_path).read_bytes()
    lazy = schema.Model.GetRootAs(data, 0)  # the op codes only: most models have no DENSIFY
    densify = {
        i
        for i in range(lazy.OperatorCodesLength())
        if fb.get_builtin_code_from_operator_code(lazy.OperatorCodes(i))
        == schema.BuiltinOperator.DENSIFY
    }
    if not densify:
        return 0
    model = fb.read_model_from_bytearray(bytearray(data))  # the same codes, now editable
    graph = model.subgraphs[0]  # the one LiteRT runs (its tensor indices are this graph's)
    ops = [op for op in graph.operators or () if op.opcodeIndex in densify]
    if not ops:
        return 0
    it = load_interpreter(model_path)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    for op in ops:
        buf = schema.BufferT()
        buf.data = np.frombuffer(
            np.ascontiguousarray(it.get_tensor(op.outputs[0])).tobytes(), np.uint8
        )
        model.buffers.append(buf)
        graph.tensors[op.outputs[0]].buffer = len(model.buffers) - 1
        sparse = graph.tensors[op.inputs[0]]
        sparse.buffer, sparse.sparsity = 0, None  # no reader left: its data goes
    graph.operators = [op for op in graph.operators if op.opcodeIndex not in densify]
    fb.write_model(model, str(out_path))
    return len(ops)


def quantization(detail: dict) -> dict | None:
    """Manifest extras for a quantized tensor, None for a float one."""
    params = detail.get("quantization_parameters") or {}
    scales = np.asarray(params.get("scales", []), dtype=np.float64)
    if detail["dtype"] not in _QUANTIZED or scales.size == 0 or not np.any(scales):
        return None
    zps = np.asarray(params.get("zero_points", []), dtype=np.int64)
    dtype = np.dtype(detail["dtype"]).name
    if scales.size == 1:
        return {
            "scale": float(scales[0]),
            "zero_point": int(zps[0]) if zps.size else 0,
            "dtype": dtype,
        }
    return {
        "scale": [float(s) for s in scales],
        "zero_point": [int(z) for z in zps],
        "axis": int(params.get("quantized_dimension", 0)),
        "dtype": dtype,
    }


def dequantize(q: np.ndarray, quant: dict) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32, per tensor or per axis."""
    scale = np.asarray(quant["scale"], dtype=np.float32)
    zp = np.asarray(quant["zero_point"], dtype=np.float32)
    if scale.ndim:
        shape = [1] * q.ndim
        shape[quant["axis"]] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((q.astype(np.float32) - zp) * scale).astype(np.float32)


def quantize(x: np.ndarray, quant: dict) -> np.ndarray:
    """Float input to the model's quantized input type (per-tensor encodings only)."""
    dtype = np.dtype(quant["dtype"])
    info = np.iinfo(dtype)
    q = np.round(x.astype(np.float64) / quant["scale"]) + quant["zero_point"]
    return np.clip(q, info.min, info.max).astype(dtype)


@register
class TFLiteRunner(FrameworkRunner):
    """All op outputs of one ``invoke``, in execution order."""

    name = "tflite"
    layout = NHWC

    def activate(self) -> None:
        self.interpreter = it = load_interpreter(self.model_path)
        details = it.get_input_details()
        model_inputs = {d["name"]: d for d in details}
        described = ", ".join(
            f"{d['name']} [{','.join(map(str, d['shape_signature']))}] {np.dtype(d['dtype']).name}"
            for d in details
        )
        self._feeds: dict[str, tuple[dict, dict | None]] = {}  # -i name -> (detail, quantize)
        for t in self.inputs:
            name = match_name(t.name, list(model_inputs))
            if name is None:
                raise AccdbgError(
                    f"--input_tensor {t.name!r} is not an input of the model; its inputs are: {described}"
                )
            self._feeds[t.name] = (model_inputs[name], self._input_encoding(t, model_inputs[name]))
        self.feed_names = {g: d["name"] for g, (d, _q) in self._feeds.items()}  # -i name -> tensor
        position = {d["name"]: i for i, d in enumerate(details)}
        self._order = sorted(self.feed_names, key=lambda g: position[self.feed_names[g]])
        given = set(self.feed_names.values())
        missing = [n for n in model_inputs if n not in given]
        if missing:
            raise AccdbgError(
                f"model input {missing[0]!r} has no --input_tensor; the model's inputs are: {described}"
            )
        for t in self.inputs:
            detail = self._feeds[t.name][0]
            self._fix_shape(t, detail)
        try:
            it.allocate_tensors()
        except Exception as exc:
            why = first_line(exc).rstrip(".")
            if "custom op" in why.lower():  # e.g. MediaPipe's Convolution2DTransposeBias
                why += (
                    " (an op of the application that built the model, which LiteRT runs only "
                    "with that application's kernels: give accdbg the model as ONNX)"
                )
            raise AccdbgError(
                f"LiteRT could not allocate {str(self.model_path)!r}: {why}"
            ) from None
        self._tensors = self._list_tensors()
        self._by_name = {i.name: i for i in self._tensors}

    def model_input_order(self) -> list[str]:
        return list(self._order)

    def _input_encoding(self, t, detail: dict) -> dict | None:
        """None to feed the raw data as is; the encoding to quantize float data with."""
        want = np.dtype(detail["dtype"])
        if t.dtype == want:
            return None
        quant = quantization(detail)
        if quant is not None and t.dtype.kind == "f" and isinstance(quant["scale"], float):
            log.info(
                "input %s: float data quantized to %s with scale %g, zero point %d",
                t.name,
                want.name,
                quant["scale"],
                quant["zero_point"],
            )
            return quant
        raise AccdbgError(
            f"--input_tensor {t.name!r} is {t.dtype.name}, the model input {detail['name']!r} is {want.name}; "
            f"give the data as {want.name}"
        )

    def _fix_shape(self, t, detail: dict) -> None:
        model_dims = [int(d) for d in detail["shape_signature"]]
        if len(model_dims) != len(t.dims):
            raise AccdbgError(
                f"--input_tensor {t.name!r}: dims {','.join(map(str, t.dims))} have rank {len(t.dims)}, "
                f"the model expects rank {len(model_dims)} [{','.join(map(str, model_dims))}]"
            )
        for i, (m, g) in enumerate(zip(model_dims, t.dims, strict=True)):
            if m > 0 and m != g:
                raise AccdbgError(
                    f"--input_tensor {t.name!r}: dim {i} is {g}, the model fixes it to {m} "
                    f"(model input [{','.join(map(str, model_dims))}])"
                )
        if list(detail["shape"]) != list(t.dims):
            self.interpreter.resize_tensor_input(detail["index"], list(t.dims), strict=True)

    def _list_tensors(self) -> list[LaidOutTensorInfo]:
        it = self.interpreter
        try:
            ops = it._get_ops_details()  # the only LiteRT API naming each op's tensors
        except AttributeError:
            raise AccdbgError(
                "this ai-edge-litert has no op details; pip install -U accdbg[tflite]"
            ) from None
        details = {d["index"]: d for d in it.get_tensor_details()}
        produced = {i for op in ops for i in op["outputs"]}
        inputs = {d["index"] for d in it.get_input_details()}
        # parameters: tensors no op produces, and what ops compute from them alone
        # (e.g. DEQUANTIZE of float16 weights); not activations
        constant = {i for i in details if i not in produced and i not in inputs}
        infos: list[LaidOutTensorInfo] = []
        used: set[str] = set()
        self._index: dict[str, int] = {}
        for op in ops:
            srcs = [i for i in op["inputs"] if i >= 0]
            is_const = bool(srcs) and all(i in constant for i in srcs)
            if is_const:
                constant.update(op["outputs"])
                if not self.options.include_constants:
                    continue
            for idx in op["outputs"]:
                d = details[idx]
                if np.dtype(d["dtype"]).kind not in "biufc":  # a resource/variant handle
                    continue  # (VAR_HANDLE's): no values to dump, LiteRT cannot read it out
                name = d["name"] or f"tensor_{idx}"
                if name in used:  # names are not unique in every flatbuffer
                    name = f"{name}__t{idx}"
                used.add(name)
                quant = quantization(d)
                dtype = np.dtype(np.float32) if quant else np.dtype(d["dtype"])
                shape = tuple(int(s) for s in d["shape"])
                extra = dict(quant) if quant else {}
                infos.append(
                    LaidOutTensorInfo(
                        name=name,
                        node=f"{op['op_name']}_{op['index']}",
                        op_type=op["op_name"],
                        index=len(infos),
                        dtype=dtype,
                        shape=shape,
                        layout=NHWC if len(shape) == 4 else None,
                        extra=extra,
                    )
                )
                self._index[name] = idx
        return infos

    def tensors(self) -> list[LaidOutTensorInfo]:
        return self._tensors

    def check_outputs(self, names: Sequence[str], what: str = "-o/--output_tensor") -> None:
        known = [d["name"] for d in self.interpreter.get_tensor_details()]
        for name in names:
            if match_name(name, known) is None:
                raise AccdbgError(
                    f"{what} {name!r} is not a tensor of the model{near(name, known)}"
                )

    def infer(self, feeds, outputs):
        it = self.interpreter
        for given, (detail, quant) in self._feeds.items():
            data = np.asarray(feeds[given])
            it.set_tensor(detail["index"], quantize(data, quant) if quant else data)
        try:
            it.invoke()
        except Exception as exc:
            raise AccdbgError(
                f"LiteRT failed to run {str(self.model_path)!r}: {first_line(exc)}"
            ) from None
        values: dict[str, np.ndarray] = {}
        for name in outputs:
            info = self._by_name[name]
            value = np.array(it.get_tensor(self._index[name]))  # a copy: the next invoke reuses it
            values[name] = dequantize(value, info.extra) if info.extra else value
        return values

    def deactivate(self) -> None:
        self.interpreter = None
