"""One model-preparation pipeline: the model a run gives QNN, made from the user's model.

Every caller that needs the model QNN runs goes through :func:`prepare_model` - the inference
engine, layerwise and cumulative-layerwise snooping - or through its two halves when it
quantizes many variants of one model: :func:`prepare_float` once, :func:`quantize_prepared`
per variant, with its quantizer options and per-tensor overrides (the fix search, the
quantization checker). So the model snooping debugs is the one the engine runs: same
input-list lines (the calibration feeds of :func:`~accdbg.engines.source.build_feeds`), same
pre-processing (:func:`~accdbg.engines.prepare.prepare_float_model`), same ``-qo`` overrides
and quantizer. Which layer outputs are dumped or debugged is :func:`select_layers`, with the
same :class:`~accdbg.engines.options.LayerFilter`.

Stages (``--stage``): ``source`` float ONNX, pre-processed then quantized (or fp16);
``converted`` the user's QDQ model, shapes fixed; ``compiled`` an EPContext model, as is.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accdbg.core.inputs import InputTensor, parse_input_list
from accdbg.core.progress import Progress, stage
from accdbg.encodings.defects import MASK, Defect, defects_path, find_defects, write_defects
from accdbg.engines import exposure
from accdbg.engines.integrity import check_runs_on_cpu
from accdbg.engines.legalize import clamp_constants, keep_float, legalize
from accdbg.engines.options import EngineConfig, LayerFilter, QuantOptions
from accdbg.engines.prepare import fix_shapes, prepare_float_model
from accdbg.engines.quantize import FeedsReader, overrides_for_ort, quantize_for_qnn
from accdbg.engines.source import Feeds, build_feeds, load_feed
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")


@dataclass
class Calibration:
    """The inferences a model is calibrated on (every ``-l`` line, else the ``-i`` files),
    with each input's dims and dtype, as :func:`~accdbg.engines.source.build_feeds` makes them."""

    feeds: Feeds
    dims: dict[str, tuple[int, ...]]
    dtypes: dict

    @classmethod
    def from_inputs(
        cls,
        model: onnx.ModelProto,
        input_list: str | Path | None = None,
        input_tensors: Sequence[InputTensor] = (),
        allow_nonfinite: bool = False,
        native: bool = False,
    ) -> Calibration:
        """Every ``-l`` line (else the ``-i`` files), each file checked, as the engine reads them
        (``native``: the files in the model's input types, ``--use_native_input_files``)."""
        parsed = parse_input_list(input_list) if input_list else None
        return cls(*build_feeds(model, parsed, input_tensors, allow_nonfinite, native))

    @classmethod
    def from_feeds(cls, feeds: Feeds) -> Calibration:
        """Feeds already built (name -> (path, dims, dtype name, file dtype name) per
        inference), e.g. sent to a child process: the dims and dtypes are theirs."""
        dims = {n: tuple(d) for f in feeds for n, (_, d, *_) in f.items()}
        dtypes = {n: np.dtype(t) for f in feeds for n, (_, _, t, _) in f.items()}
        return cls(list(feeds), dims, dtypes)


@dataclass
class PreparedModel:
    """The model to run, what was done to make it, and the float model it was quantized from."""

    path: Path  # <stem>.qdq.onnx, <stem>.fp16.onnx, <stem>.onnx (converted) or the EPContext model
    stage: str
    steps: list[str] = field(default_factory=list)
    float_model: Path | None = None  # <stem>.prepared.onnx (source stage): the ranking's evidence
    # encodings of the quantized model that cannot hold their tensors (found before any run)
    defects: list[Defect] = field(default_factory=list)

    @property
    def quantized_here(self) -> bool:
        return self.stage == "source" and self.path.name.endswith(".qdq.onnx")

    def load(self) -> onnx.ModelProto:
        return onnx.load(str(self.path), load_external_data=False)


def prepare_model(
    model: onnx.ModelProto,
    stem: str,
    calibration: Calibration,
    config: EngineConfig,
    out_dir: Path,
    work_dir: Path | None = None,
    source_path: Path | None = None,
    tensor_overrides: Mapping[str, list[dict[str, Any]]] | None = None,
) -> PreparedModel:
    """The model ``config`` says QNN runs, written into ``out_dir`` (``work_dir`` holds the
    intermediates and is removed; default ``out_dir/.prepare``). ``source_path`` is the model's
    file, used as is in the compiled stage. ``tensor_overrides``: per-tensor quantizer settings
    on top of ``config.quant`` (see :func:`quantize_prepared`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.stage == "compiled":
        assert source_path is not None, "the compiled stage runs the given EPContext file"
        return PreparedModel(Path(source_path), "compiled")
    if config.stage == "converted":
        steps: list[str] = []
        target = out_dir / f"{stem}.onnx"
        onnx.save(fix_shapes(model, calibration.dims, steps), str(target))
        return PreparedModel(target, "converted", steps)
    work = work_dir or out_dir / ".prepare"
    prepared = prepare_float(model, stem, calibration, out_dir, work)
    quantized = quantize_prepared(
        prepared.path, stem, calibration, config.quant, out_dir, tensor_overrides, work
    )
    return replace(quantized, steps=prepared.steps + quantized.steps)


def prepare_float(
    model: onnx.ModelProto,
    stem: str,
    calibration: Calibration,
    out_dir: Path,
    work_dir: Path | None = None,
) -> PreparedModel:
    """The source stage's first half: the float model pre-processed for QNN (shapes, opset,
    folding, QNN pre-processing) as ``out_dir/<stem>.prepared.onnx`` - what every variant is
    quantized from (:func:`quantize_prepared`) and the culprit ranking's float evidence.
    ``work_dir`` (default ``out_dir/.prepare``) holds the intermediates and is removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = work_dir or out_dir / ".prepare"
    work.mkdir(parents=True, exist_ok=True)
    try:
        with stage("pre-processing", line=False):  # its steps are logged by the caller
            prepared, steps = prepare_float_model(model, calibration.dims, work)
        target = out_dir / f"{stem}.prepared.onnx"
        shutil.copyfile(prepared, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return PreparedModel(target, "source", steps, target)


def quantize_prepared(
    prepared: Path,
    stem: str,
    calibration: Calibration,
    quant: QuantOptions,
    out_dir: Path,
    tensor_overrides: Mapping[str, list[dict[str, Any]]] | None = None,
    work_dir: Path | None = None,
) -> PreparedModel:
    """The source stage's second half: a prepared float model (:func:`prepare_float`)
    quantized as ``quant`` says into ``out_dir/<stem>.qdq.onnx``, calibrated on every feed
    (fp16 precision: copied as ``<stem>.fp16.onnx``). One call per variant of one model (a
    fix search, the quantization checker); calls share nothing, so they can run in other
    processes at once.

    ``tensor_overrides`` are onnxruntime's ``TensorQuantOverrides`` in JSON form (a
    ``quant_type`` by name, e.g. ``"QUInt16"``), merged over the ``-qo`` overrides tensor by
    tensor. The quantizer writes scratch models beside its input, so it quantizes a private
    copy in ``work_dir`` (default ``out_dir/.quantize-<stem>``, removed).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    prepared = Path(prepared)
    if not quant.quantizes:
        target = out_dir / f"{stem}.fp16.onnx"
        shutil.copyfile(prepared, target)
        steps = ["no quantization: float model on HTP in fp16"]
        if quant.float_bias_bitwidth == 16:
            steps.append(round_biases_to_fp16(target))
        return PreparedModel(target, "source", steps, prepared)
    target = out_dir / f"{stem}.qdq.onnx"
    work = work_dir or out_dir / f".quantize-{stem}"
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    kept: list[str] = []
    float_proto = onnx.load(str(prepared), load_external_data=False)
    try:
        scratch = work / prepared.name
        shutil.copyfile(prepared, scratch)
        overrides = dict(load_overrides(quant, scratch) or {})
        overrides.update(overrides_for_ort(tensor_overrides or {}))
        qdq = _quantize(scratch, target, calibration, quant, overrides, kept)
        defects = find_defects(float_proto, qdq)
        clamps = _fatal_masks(defects)
        if clamps:  # no backend takes an infinite scale: the mask clamped for the run
            clamped = onnx.load(str(scratch), load_external_data=False)
            clamp_constants(clamped, clamps)
            scratch = work / f"clamped.{prepared.name}"
            onnx.save(clamped, str(scratch))
            kept.append(_clamped_step(defects, clamps))
            qdq = _quantize(scratch, target, calibration, quant, overrides, [])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kept.append(
        f"quantized for QNN ({quant.describe()}) with {len(calibration.feeds)} calibration "
        f"input(s) in {time.perf_counter() - t:.1f} s"
    )
    # what still no backend takes (a sentinel with no score beside it): run in float
    fatal = [t for d in find_defects(float_proto, qdq) if d.fatal for t in d.tensors]
    if fatal and keep_float(qdq, fatal):
        onnx.save(qdq, str(target))
        kept.append(
            f"{len(fatal)} tensor(s) whose encodings have an infinite or zero scale kept in "
            f"float (fp16 on HTP; no backend takes such a scale): {', '.join(fatal[:3])}"
            + (" and more" if len(fatal) > 3 else "")
        )
    with stage("QDQ model: a CPU run", line=False):  # a big model's session takes seconds
        check_runs_on_cpu(target, _first_feed(calibration))
    write_defects(defects_path(target), defects)  # beside the model: who reads it
    return PreparedModel(target, "source", kept, prepared, defects)


def _quantize(
    float_path: Path,
    target: Path,
    calibration: Calibration,
    quant: QuantOptions,
    overrides: dict,
    notes: list[str],
) -> onnx.ModelProto:
    """One quantization of ``float_path`` into ``target``, legalized for QNN HTP (its edits
    added to ``notes``); returns the QDQ model written."""

    def run_quantizer(fixed: dict, said: list[str]) -> None:
        reader = FeedsReader(calibration.feeds)
        # counted as the calibrator reads the inputs; its line is the step "quantized ... in"
        with Progress(
            f"quantization ({target.name.split('.')[0]})",
            len(calibration.feeds),
            "calibration inputs",
            line=False,
            count=lambda: reader.served,
        ):
            quantize_for_qnn(
                float_path,
                target,
                reader,
                quant.act_bitwidth,
                quant.weights_bitwidth,
                quant.bias_bitwidth,
                quant.act_quantizer,
                quant.param_quantizer,
                quant.per_channel,
                fixed or None,
                notes=said,
                keep_activations=quant.keep_activations,
                weight_block_size=quant.weight_block_size,
            )

    if quant.restricts_steps:  # onnxruntime's ranges first, then the restricted steps
        run_quantizer(overrides, [])
        restricted = restricted_steps(target, quant, float_path, set(overrides))
        notes.append(
            f"-rqs: {len(restricted)} {quant.restricted_bits}-bit tensors quantized again "
            f"with {quant.quantization_steps} steps over onnxruntime's ranges"
        )
        overrides = {**restricted, **overrides}  # given encodings stay as given
    run_quantizer(overrides, notes)
    qdq = onnx.load(str(target), load_external_data=False)
    steps = legalize(qdq)
    if steps:
        onnx.save(qdq, str(target))
        notes.extend(steps)
    return qdq


def _fatal_masks(defects: Sequence[Defect]) -> dict[str, float]:
    """The sentinel constants whose tensors no backend takes, and the value each is clamped
    to for the run (all of them, or none: a partly clamped model would still be refused)."""
    fatal = [d for d in defects if d.kind == MASK and d.fatal]
    clamps = {d.constant: d.extra.get("clamp") for d in fatal}
    if not clamps or any(v is None for v in clamps.values()):
        return {}
    return clamps


def _clamped_step(defects: Sequence[Defect], clamps: Mapping[str, float]) -> str:
    """The pre-processing step saying which mask was clamped, to what, and why."""
    d = next(d for d in defects if d.constant in clamps)
    return (
        f"{d.source}: clamped to {clamps[d.constant]:g} for this run - its tensors' encodings "
        f"would have an infinite scale, which no backend takes (culprit #1; the model as "
        "given does not run on QNN)"
    )


def _first_feed(calibration: Calibration) -> dict[str, np.ndarray] | None:
    """The first calibration input, loaded (what the quantized model's CPU check runs)."""
    if not calibration.feeds:
        return None
    return load_feed(calibration.feeds[0])


def restricted_steps(
    qdq_path: Path, quant: QuantOptions, float_path: Path, keep: set[str]
) -> dict[str, list[dict[str, Any]]]:
    """``-rqs``: fixed encodings (onnxruntime tensor overrides) for every tensor of the
    restricted bitwidth that onnxruntime quantized (``keep``: tensors whose encodings were
    given, left alone), each spreading its range over the restricted steps: QNN's
    ``scale = (max - min) / steps``. The range is the one onnxruntime's encoding covers; the
    grid keeps its lowest value at the lowest integer (an unsigned zero point scales with the
    steps) and a signed symmetric grid its zero point 0."""
    from onnxruntime.quantization import QuantType

    from accdbg.encodings.model import PER_BLOCK, zero_point_from_offset
    from accdbg.encodings.overrides import storage
    from accdbg.encodings.qdq import qdq_encodings

    steps, bits = quant.quantization_steps, quant.restricted_bits
    assert steps is not None and bits is not None
    known = {i.name for i in onnx.load(str(float_path), load_external_data=False).graph.initializer}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, enc in qdq_encodings(qdq_path).items():
        if enc.bitwidth != bits or enc.is_float or enc.enc_type == PER_BLOCK or name in keep:
            continue
        _, signed = storage(enc)
        own = 2**bits - (2 if signed else 1)
        qtype = {(8, False): QuantType.QUInt8, (8, True): QuantType.QInt8,
                 (16, False): QuantType.QUInt16, (16, True): QuantType.QInt16}[(bits, signed)]  # fmt: skip
        np_type = onnx.helper.tensor_dtype_to_np_dtype(qtype.tensor_type)
        entries = []
        for scale, offset in zip(enc.scale, enc.offset, strict=True):
            zp = zero_point_from_offset(offset, bits, signed)
            entries.append(
                {
                    "quant_type": qtype,
                    "scale": np.array(scale * own / steps, np.float32),
                    "zero_point": np.array(zp if signed else round(zp * steps / own), np_type),
                }
            )
        if len(entries) > 1:
            if name not in known:
                continue
            for e in entries:
                e["axis"] = enc.axis
        out[name] = entries
    return out


def round_biases_to_fp16(model_path: Path) -> str:
    """``-fbw 16``: every Conv/ConvTranspose/Gemm bias rounded to the nearest fp16 value,
    kept as float32 (the type the QNN execution provider takes); returns the step's note."""
    model = onnx.load(str(model_path))
    inits = {i.name: i for i in model.graph.initializer}
    rounded = 0
    for node in model.graph.node:
        bias = node.input[2] if node.op_type in ("Conv", "ConvTranspose", "Gemm") and len(
            node.input
        ) > 2 else ""  # fmt: skip
        if bias in inits and inits[bias].data_type == onnx.TensorProto.FLOAT:
            values = onnx.numpy_helper.to_array(inits[bias])
            inits[bias].CopyFrom(
                onnx.numpy_helper.from_array(values.astype(np.float16).astype(np.float32), bias)
            )
            rounded += 1
    onnx.save(model, str(model_path))
    return f"-fbw 16: {rounded} Conv/ConvTranspose/Gemm biases rounded to fp16 values"


def load_overrides(quant: QuantOptions, model_path: Path) -> dict | None:
    """``-qo`` AIMET encodings as onnxruntime tensor overrides for the prepared model."""
    if quant.overrides is None:
        if quant.quantization_overrides is not None:
            log.info("--ignore_encodings: not applying %s", quant.quantization_overrides)
        return None
    from accdbg.encodings.aimet import read_aimet
    from accdbg.encodings.overrides import aimet_to_tensor_quant_overrides

    if not quant.overrides.is_file():
        raise AccdbgError(
            f"-qo/--quantization_overrides {str(quant.quantization_overrides)!r} does not exist"
        )
    from accdbg.engines.int4 import check_int4_overrides

    model = onnx.load(str(model_path), load_external_data=False)
    overrides = aimet_to_tensor_quant_overrides(
        read_aimet(quant.overrides),
        model,
        f"the model as prepared for QNN ({model_path.name}: its pre-processing folds constants "
        "and fuses ops, and their tensors go with them)",
    )
    check_int4_overrides(overrides, model, str(quant.quantization_overrides))
    return overrides


def select_layers(
    model: onnx.ModelProto,
    layers: LayerFilter,
    framework_names: set[str] | None = None,
) -> list[exposure.Exposed]:
    """The layer outputs of the prepared model, in execution order, that ``layers`` keeps."""
    return exposure.select(model, framework_names, layers)
