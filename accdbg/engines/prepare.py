"""Make a real-world ONNX model acceptable to QNN, and say what was done.

QNN takes no dynamic shapes and refuses constant subgraphs it cannot fold itself, so a float
model is: shape-fixed from the given input dims, constant-folded and simplified by
onnxruntime's basic offline optimizations (which also fold BatchNormalization into Conv), and
passed through onnxruntime's QNN pre-processing (LayerNorm/GELU fusions...). QDQ models only get
their shapes fixed - optimizing them on CPU would fuse Q/DQ into CPU-only ops.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from accdbg.core import onnx_model as om
from accdbg.core.imports import qnn_quantization
from accdbg.engines.quantize import root_records_to_log
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")


def _counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def fix_shapes(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], steps: list[str]
) -> onnx.ModelProto:
    dynamic = {
        vi.name: om.dims_of(vi)
        for vi in om.real_inputs(model)
        if any(not isinstance(d, int) or d <= 0 for d in om.dims_of(vi))
    }
    missing = [n for n in dynamic if n not in shapes]
    if missing:
        dims = ",".join("?" if not isinstance(d, int) else str(d) for d in dynamic[missing[0]])
        raise AccdbgError(
            f"model input {missing[0]!r} has dynamic dims [{dims}]; give them with "
            f"-i/--input_tensor {missing[0]!r} <dims> <file>"
        )
    given = {k: v for k, v in shapes.items() if k in {vi.name for vi in om.real_inputs(model)}}
    om.fix_input_shapes(model, given)
    for name in dynamic:
        steps.append(f"fixed dynamic input {name} to [{','.join(map(str, shapes[name]))}]")
    return om.infer_shapes(model)


def initializers_not_inputs(model: onnx.ModelProto, steps: list[str]) -> onnx.ModelProto:
    """Initializers the graph also lists as inputs (the IR < 4 way) stay constants only.

    As inputs they may be fed: once constant folding has used them up (their consumers
    folded), they would be left as inputs nobody feeds, which calibration then asks for."""
    inits = {i.name for i in model.graph.initializer}
    listed = [i for i in model.graph.input if i.name in inits]
    if not listed:
        return model
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.ir_version = max(model.ir_version, 4)  # IR 4 lets initializers be no inputs
    steps.append(f"{len(listed)} initializers the graph also listed as inputs kept as constants")
    return model


MIN_OPSET = 13  # per-axis (per-channel) QuantizeLinear/DequantizeLinear need opset 13


def upgrade_opset(model: onnx.ModelProto, steps: list[str]) -> onnx.ModelProto:
    """Raise the default-domain opset to 13 so per-channel Q/DQ nodes are valid."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if current is None or current >= MIN_OPSET:
        return model
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        log.info("opset %d kept: onnx could not convert it to %d (%s)", current, MIN_OPSET, exc)
        return model
    steps.append(f"opset {current} converted to {MIN_OPSET} (per-channel quantization needs it)")
    return upgraded


def check_control_flow(model: onnx.ModelProto, steps: list[str], failed: bool = False) -> None:
    """Refuse a model that computes inside If/Loop/Scan subgraphs; note a few ops there.

    QNN HTP runs no control flow, onnxruntime's quantizer leaves a subgraph's ops in float and
    no tensor of a subgraph can be dumped: such ops run on the CPU in float, undebugged. When
    they are most of the model, a run would report "the outputs meet their thresholds" of a
    model nothing of which was quantized. ``failed``: loading it with fixed dims failed."""
    held = om.branch_nodes(model)
    if not held:
        return
    inner, top = sum(held.values()), len(model.graph.node)
    types = {om.node_name(n, i): n.op_type for i, n in enumerate(model.graph.node)}
    named = ", ".join(f"{k} ({types[k]})" for k in list(held)[:3])
    if failed or inner > top:
        raise AccdbgError(
            f"the model computes inside control flow: {inner} of its {inner + top} ops are in "
            f"the branches or bodies of {named}; QNN HTP runs no If/Loop/Scan and "
            "neither onnxruntime's quantizer nor its tensor dumps reach inside them - export "
            "the model without control flow (an If on an input your inputs fix, e.g. a sample "
            "rate, can be exported for that value)"
        )
    steps.append(
        f"{inner} ops inside {named} stay float on the CPU, not debugged (no If/Loop/Scan on "
        "QNN; onnxruntime dumps no tensor of a subgraph)"
    )


def identity_extremes(model: onnx.ModelProto, steps: list[str]) -> onnx.ModelProto:
    """A Max with a constant -inf (a Min with +inf) is its other input: a reduction's start
    value, as JAX exports it. Quantized, that constant gets an infinite scale (onnxruntime
    divides its range by the levels): the node becomes an Identity of the other input."""
    consts = om.constants(model)
    bound = {"Max": -np.inf, "Min": np.inf}
    done = []
    for n in model.graph.node:
        if n.op_type not in bound or len(n.input) != 2:
            continue
        ends = [
            i
            for i, x in enumerate(n.input)
            if x in consts
            and np.prod(consts[x].dims, dtype=np.int64) == 1  # no broadcast up: the other's shape
            and np.all(numpy_helper.to_array(consts[x]) == bound[n.op_type])
        ]
        if len(ends) != 1:
            continue
        other = n.input[1 - ends[0]]
        del n.input[:]
        n.input.append(other)
        n.op_type = "Identity"
        done.append(n.name or n.output[0])
    if done:
        steps.append(
            f"{len(done)} Max/Min with an infinite constant made an Identity (an infinite "
            f"constant has no encoding): {', '.join(done[:3])}"
        )
    return model


def prepare_float_model(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], work_dir: Path
) -> tuple[Path, list[str]]:
    """Shape-fix, fold and pre-process a float model for QNN; returns its path and the steps."""
    steps: list[str] = []
    model = initializers_not_inputs(model, steps)
    model = fix_shapes(model, shapes, steps)
    model = upgrade_opset(model, steps)
    model = identity_extremes(model, steps)
    fixed = work_dir / "model.fixed.onnx"
    onnx.save(model, str(fixed))
    before = _counts(model)
    folded = work_dir / "model.folded.onnx"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(folded)
    try:
        ort.InferenceSession(str(fixed), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        check_control_flow(model, [], failed=True)  # fixed dims break a branch never taken
        raise AccdbgError(
            f"onnxruntime could not load the model for pre-processing: {str(exc).splitlines()[0]}"
        ) from None
    folded_model = onnx.load(str(folded), load_external_data=False)
    check_control_flow(folded_model, steps)  # after folding: an If on a constant is gone
    after = _counts(folded_model)
    removed = {k: before[k] - after.get(k, 0) for k in before if before[k] > after.get(k, 0)}
    if removed:
        steps.append(
            "constant folding and basic fusions (onnxruntime): removed "
            + ", ".join(f"{n} {k}" for k, n in sorted(removed.items()))
        )
    pre = work_dir / "model.qnn_pre.onnx"
    if qnn_preprocess(folded, pre, steps):
        return pre, steps
    return folded, steps


def qnn_preprocess(src: Path, dst: Path, steps: list[str]) -> bool:
    """onnxruntime's QNN pre-processing of ``src`` into ``dst``; True when it changed the model.

    onnxruntime-qnn's ``save_and_reload_optimize_model`` does ``dict.update(model.metadata_props)``
    on the protobuf entries, a TypeError for any model with metadata (e.g. PP-OCR's
    ``character`` table). So the pre-processing gets the model without its metadata and the
    metadata is put back into its result. The fusions it makes are optional: if it still
    fails, the model goes on without them and the step says so.
    """
    qnn_preprocess_model = qnn_quantization().qnn_preprocess_model

    model = onnx.load(str(src))
    props = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    try:
        # it names unnamed nodes, with a root-logger warning for each: noise for the user
        with root_records_to_log():
            changed = qnn_preprocess_model(model, str(dst))
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("onnxruntime QNN pre-processing failed, its fusions are skipped (%s)", reason)
        steps.append(f"onnxruntime QNN pre-processing skipped: it failed ({reason})")
        return False
    if not changed:
        return False
    if props:
        out = onnx.load(str(dst))
        merged = {p.key: p.value for p in out.metadata_props} | props
        onnx.helper.set_model_props(out, merged)
        onnx.save(out, str(dst))
    steps.append("onnxruntime QNN pre-processing fused ops (e.g. LayerNorm, GELU)")
    return True
