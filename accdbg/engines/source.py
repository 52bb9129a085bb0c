"""The source stage's model: a float ONNX model made ready for QNN and quantized.

The inference engine and the snooping algorithms both call :func:`source_model`, so the
model snooping debugs is the one the engine runs: same input-list lines (:func:`build_feeds`),
same pre-processing (:func:`~accdbg.engines.prepare.prepare_float_model`), same calibration
reader and quantizer options.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputList, InputTensor, check_finite, check_raw_size, line_files
from accdbg.engines.prepare import prepare_float_model
from accdbg.engines.quantize import FeedsReader, quantize_for_qnn
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")

# one dict per inference (input-list line): model input -> (raw file, dims, dtype name)
Feeds = list[dict[str, tuple[str, tuple[int, ...], str]]]


def build_feeds(
    model: onnx.ModelProto,
    input_list: InputList | None,
    input_tensors: Sequence[InputTensor],
    allow_nonfinite: bool = False,
) -> tuple[Feeds, dict[str, tuple[int, ...]], dict[str, np.dtype]]:
    """Per-inference feeds, with every file checked against its input's dims and dtype, and
    for NaN/Inf (unless ``allow_nonfinite``).

    Every ``-l`` line is one inference (and one calibration sample); without ``-l`` the
    ``-i`` files are the only one. Dims and dtypes come from ``-i``, else from the model.
    """
    inputs = om.real_inputs(model)
    names = [vi.name for vi in inputs]
    given = {t.name: t for t in input_tensors}
    for name in given:
        if name not in names:
            raise AccdbgError(
                f"--input_tensor {name!r} is not an input of the model; its inputs are: {om.describe_inputs(model)}"
            )
    dims: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for vi in inputs:
        static = om.dims_of(vi)
        if vi.name in given:
            dims[vi.name] = given[vi.name].dims
            dtypes[vi.name] = given[vi.name].dtype
        else:
            if not static or not all(isinstance(d, int) and d > 0 for d in static):
                raise AccdbgError(
                    f"model input {vi.name!r} has dynamic dims [{','.join('?' if not isinstance(d, int) else str(d) for d in static)}]; "
                    f"give them with -i/--input_tensor {vi.name!r} <dims> <file>"
                )
            dims[vi.name] = tuple(int(d) for d in static)
            dtypes[vi.name] = om.elem_dtype(vi) or np.dtype("float32")
    feeds: Feeds = []
    if input_list is not None:
        for entry in input_list.entries:
            where = f"{input_list.path}:{entry.line_no}"
            known = f"an input of the model; its inputs are: {om.describe_inputs(model)}"
            files = line_files(entry, names, where, known)
            for n, p in files.items():
                check_raw_size(p, dims[n], dtypes[n], f"{where}: input {n!r}")
                check_finite(p, dtypes[n], f"{where}: input {n!r}", allow_nonfinite, dims[n])
            feeds.append({n: (str(p), dims[n], dtypes[n].name) for n, p in files.items()})
    elif given:
        missing = [n for n in names if n not in given]
        if missing:
            raise AccdbgError(
                f"model input {missing[0]!r} has no --input_tensor and there is no --input_list"
            )
        for t in given.values():
            t.check(allow_nonfinite)
        feeds.append({n: (str(given[n].path), dims[n], dtypes[n].name) for n in names})
    else:
        raise AccdbgError("give the inputs with -l/--input_list or -i/--input_tensor")
    return feeds, dims, dtypes


def load_overrides(path: str | Path | None, ignore: bool, model_path: Path) -> dict | None:
    """``-qo`` AIMET encodings as onnxruntime tensor overrides for the prepared model."""
    if path is None or ignore:
        if path is not None:
            log.info("--ignore_encodings: not applying %s", path)
        return None
    p = Path(path)
    if not p.is_file():
        raise AccdbgError(f"-qo/--quantization_overrides {str(path)!r} does not exist")
    from accdbg.encodings.aimet import read_aimet
    from accdbg.encodings.overrides import aimet_to_tensor_quant_overrides

    return aimet_to_tensor_quant_overrides(
        read_aimet(p), onnx.load(str(model_path), load_external_data=False)
    )


def source_model(
    model: onnx.ModelProto,
    stem: str,
    feeds: Feeds,
    dims: dict[str, tuple[int, ...]],
    dtypes: dict[str, np.dtype],
    out_dir: Path,
    work_dir: Path,
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    act_quantizer: str = "tf",
    param_quantizer: str = "tf",
    per_channel: bool = False,
    quantization_overrides: str | Path | None = None,
    ignore_encodings: bool = False,
    precision: str = "int8",
) -> tuple[Path, list[str]]:
    """Pre-process ``model`` for QNN and quantize it, calibrated on every feed (``-l`` line);
    writes ``<stem>.qdq.onnx`` (``<stem>.fp16.onnx`` with ``precision='fp16'``) into
    ``out_dir`` and returns its path and the steps taken. ``work_dir`` holds the
    intermediates; the caller removes it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    prepared, steps = prepare_float_model(model, dims, work_dir)
    # kept: the float weights the QDQ model is quantized from (the culprit ranking's evidence)
    shutil.copyfile(prepared, out_dir / f"{stem}.prepared.onnx")
    if precision == "fp16":
        target = out_dir / f"{stem}.fp16.onnx"
        shutil.copyfile(prepared, target)
        steps.append("no quantization: float model on HTP in fp16")
        return target, steps
    target = out_dir / f"{stem}.qdq.onnx"
    t = time.perf_counter()
    kept: list[str] = []
    quantize_for_qnn(
        prepared,
        target,
        FeedsReader([{n: Path(p) for n, (p, _, _) in f.items()} for f in feeds], dims, dtypes),
        act_bitwidth,
        weights_bitwidth,
        bias_bitwidth,
        act_quantizer,
        param_quantizer,
        per_channel,
        load_overrides(quantization_overrides, ignore_encodings, prepared),
        notes=kept,
    )
    steps.extend(kept)
    steps.append(
        f"quantized for QNN (A{act_bitwidth}W{weights_bitwidth}, {act_quantizer}/{param_quantizer}"
        f"{', per-channel' if per_channel else ''}) with {len(feeds)} calibration input(s) "
        f"in {time.perf_counter() - t:.1f} s"
    )
    return target, steps
