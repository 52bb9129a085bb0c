"""Which changes are worth trying, chosen from the diagnosis.

A :class:`Change` is one knob: a global one (per-channel weights, activation calibration,
16-bit activations) or a local one on a diagnosed layer (per-channel for its weights, 16-bit
for its output activation, 16-bit for its weights, equalization with a neighbouring Conv).
The ``cause`` the culprit ranking wrote (``weight range``, ``activation range``, ``clipping``,
``unbalanced concatenation``, ``backend``) orders them: the change aimed at the cause first.
A layer whose cause is the backend gets no precision candidate - precision is not its problem;
when its cause says which inputs the backend left in their own encoding (a Concat that does not
requantize them, :func:`accdbg.algorithms.diagnosis.divergence.encoding_fix`), those inputs given the
Concat's encoding are its candidate.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import pandas as pd

from accdbg.algorithms.diagnosis.culprit import (
    ACTIVATION,
    BACKEND,
    CALIBRATION,
    CALIBRATIONS,
    CLIPPING,
    CONCAT,
    DROPPED,
    FEW,
    MASK,
    WEIGHT,
    Change,
    Culprit,
)
from accdbg.algorithms.diagnosis.divergence import encoding_fix
from accdbg.algorithms.diagnosis.ranking.measures import KIND_COL
from accdbg.algorithms.fixes.equalize import Pair, conv_pairs
from accdbg.errors import AccdbgError

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ops the quantizer folds into the layer before them: walk back through them to the weights
FOLDED = ("Relu", "Clip", "LeakyRelu", "BatchNormalization", "Add", "Identity")
PER_CHANNEL_AXIS = {"Conv": 0, "ConvTranspose": 1}
# what a culprit's changes aim at first: its weights, or its activations
AIMS_AT_ACTIVATIONS = (ACTIVATION, CLIPPING, CONCAT)
# the changes of one weight's storage: one of them per weight
WEIGHT_KINDS = ("per_channel", "w16", "w8")
SUMMARY_JSON = "summary.json"  # a verification run's, holding oneshot's culprits
CULPRITS_JSON = "culprits.json"  # a snooping run's (accdbg.algorithms.report writes it)


def config_key(changes: Sequence[Change]) -> str:
    """The identity of a set of changes (order does not matter), for the resume journal."""
    return " + ".join(sorted(c.key for c in changes)) or "baseline"


def read_diagnosis(source: pd.DataFrame | str | Path | None) -> list[Culprit]:
    """Culprits (rank order) of a diagnosis: the structured records a run folder holds
    (``summary.json``'s ``culprits``), else a table with ``culprit_rank`` and ``cause`` (and
    ``culprit_kind`` when the run wrote one): a DataFrame, a CSV (``summary.csv``,
    ``layerwise.csv``...) or a run folder holding one."""
    if source is None:
        return []
    if isinstance(source, pd.DataFrame):
        return _from_table(source, "the diagnosis table")
    p = Path(source)
    if p.is_dir():
        recorded = _recorded(p / CULPRITS_JSON)
        if recorded is None:
            recorded = _recorded(p / SUMMARY_JSON)
        if recorded is not None:
            return recorded
        found = [p / n for n in ("summary.csv", "layerwise.csv", "cumulative_layerwise.csv")]
        found = [f for f in found if f.is_file()]
        if not found:
            raise AccdbgError(
                f"--diagnosis {str(p)!r} holds no summary.csv, layerwise.csv or "
                "cumulative_layerwise.csv (a verification or snooping run folder was expected)"
            )
        p = found[0]
    if not p.is_file():
        raise AccdbgError(f"--diagnosis {str(source)!r} does not exist")
    try:
        df = pd.read_csv(p)
    except Exception as exc:
        raise AccdbgError(f"--diagnosis {str(p)!r} is not a CSV table: {exc}") from None
    return _from_table(df, str(p))


def _recorded(path: Path) -> list[Culprit] | None:
    """The culprits a run recorded in its JSON summary; None when it holds none (an older run)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    rows = doc.get("culprits") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        return None
    return sorted((Culprit.from_dict(r) for r in rows), key=lambda c: c.rank)


def _from_table(df: pd.DataFrame, where: str) -> list[Culprit]:
    name_col = next((c for c in ("Name", "O/P Name") if c in df.columns), None)
    if name_col is None or "culprit_rank" not in df.columns:
        raise AccdbgError(
            f"{where} has no Name (or O/P Name) and culprit_rank columns; give a table written "
            "by oneshot verification or a snooping algorithm"
        )
    ranks = pd.to_numeric(df["culprit_rank"], errors="coerce")
    cause = df["cause"] if "cause" in df.columns else pd.Series([""] * len(df))
    kinds = df[KIND_COL] if KIND_COL in df.columns else None
    out = []
    for i in range(len(df)):
        if pd.isna(ranks.iloc[i]):
            continue
        text = str(cause.iloc[i] or "")
        kind = str(kinds.iloc[i]) if kinds is not None and pd.notna(kinds.iloc[i]) else ""
        name = _unquote(str(df[name_col].iloc[i]))
        out.append(Culprit(int(ranks.iloc[i]), name, "", text, kind=kind or kind_of(text)))
    return sorted(out, key=lambda c: c.rank)


def _unquote(name: str) -> str:
    """A name as it was before the CSV writer quoted it (``'=x`` -> ``=x``, see reports.cells)."""
    from accdbg.reports.cells import FORMULA_START

    return name[1:] if name.startswith("'") and name[1:].startswith(FORMULA_START) else name


@dataclass
class Layer:
    """A diagnosed layer resolved in the float model: its weight-bearing node."""

    name: str  # the culprit row (an output tensor)
    node: onnx.NodeProto | None
    weight: str | None
    axis: int | None  # per-channel axis of its weight


def resolve_layer(model: onnx.ModelProto, tensor: str) -> Layer:
    """The node whose weights shape ``tensor``: its producer, walking back through the ops
    the quantizer folds into a layer (Relu, BatchNormalization, bias Add...)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    cur = tensor
    for _ in range(8):
        node = producer.get(cur)
        if node is None:
            break
        if node.op_type in WEIGHTED:
            w = next((i for i in node.input[1:2] if i in inits), None)
            if w is None and node.op_type == "MatMul" and node.input[0] in inits:
                w = node.input[0]
            axis = PER_CHANNEL_AXIS.get(node.op_type)
            return Layer(tensor, node, w, axis)
        if node.op_type not in FOLDED:
            break
        live = [i for i in node.input if i and i not in inits]
        if len(live) != 1:
            break
        cur = live[0]
    return Layer(tensor, None, None, None)


def act16_region(model: onnx.ModelProto, tensor: str) -> list[str]:
    """``tensor`` and the layer outputs of its consumers: the tensors a 16-bit candidate sets.

    onnxruntime's mixed-precision fixer gives a consumer the input type of its own output: a
    16-bit tensor read by an 8-bit layer is converted back to 8 bits, with the same range, in
    front of it - the precision would be lost again. So the consumers' outputs are 16-bit too,
    and the Converts move to where their outputs leave the region. A Relu/Clip folded into a
    layer takes its input's type: both sides of it are set, or the fixer keeps it apart with
    an 8-bit input.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producer: dict[str, onnx.NodeProto] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n
    outputs = {o.name for o in model.graph.output}
    region = [tensor]
    p = producer.get(tensor)
    if p is not None and p.op_type in ("Relu", "Clip") and len(consumers.get(p.input[0], [])) == 1:
        region.insert(0, p.input[0])
    for node in consumers.get(tensor, []):
        if not node.output or not node.output[0]:
            continue
        out = node.output[0]
        if out not in region:
            region.append(out)
        nxt = consumers.get(out, [])
        # a sole-consumer activation is folded into the layer: its output is the layer's
        if len(nxt) == 1 and nxt[0].op_type in ("Relu", "Clip") and out not in outputs:
            if nxt[0].output[0] not in region:
                region.append(nxt[0].output[0])
    return region


def kind_of(cause: str) -> str:
    """A culprit's kind from its cause's words: tables written before runs recorded the kind."""
    c = cause.lower()
    for key in (BACKEND, WEIGHT, CONCAT, CLIPPING, ACTIVATION, FEW):
        if c.startswith(key) or f"; {key}" in c:
            return key
    return ""


def changes_for(
    model: onnx.ModelProto,
    c: Culprit,
    per_channel: bool,
    act_bitwidth: int,
    pairs: Sequence[Pair] | None = None,
    int4: Collection[str] = (),
) -> tuple[list[Change], str]:
    """The changes a culprit's kind calls for, aimed at it first, and a note when it gets
    none (a backend layer: precision is not its problem). ``pairs``: the model's Conv pairs
    (:func:`~accdbg.algorithms.fixes.equalize.conv_pairs`), computed once by a caller asking
    for several culprits. ``int4``: the weights a ``-wbw 4`` run stores in int4 - their
    layer's cheapest weight change is 8-bit weights (they are per-channel already)."""
    tensors = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    why = f"culprit #{c.rank}: {c.cause}"
    if c.kind == MASK and c.source:  # the sentinel clamped, or its tensors in 16 bits
        act = [] if act_bitwidth == 16 else [Change("act16", t, c.name, why) for t in c.region]
        return [Change("clamp_mask", c.source, c.name, why), *act[:1]], ""
    if c.kind == CALIBRATION:  # calibrated on the debugged inputs, the given encodings dropped
        return [Change("recalibrate", "", c.name, why)], ""
    if c.kind == DROPPED:
        return [Change("keep_activation", c.source or c.name, c.name, why)], ""
    if c.backend:
        shared = [t for t in encoding_fix(c.cause) if t in tensors]
        if shared and c.name in tensors:
            change = Change("encoding", ",".join(shared), c.name, why)
            return [change], f"{c.name}: backend; its candidate: {change.label}"
        return [], (
            f"{c.name}: {c.cause} - a backend issue, not a precision one: no precision "
            "candidate; see the engine run's partitioning.json and model_net.json (QNN graph)"
        )
    if c.name not in tensors:
        return [], f"{c.name}: not a tensor of the float model; no local candidate"
    layer = resolve_layer(model, c.name)
    weight = []
    if layer.weight and layer.weight in int4:
        weight.append(Change("w8", layer.weight, c.name, why))
    elif layer.weight and not per_channel and layer.axis is not None:
        weight.append(Change("per_channel", layer.weight, c.name, why))
    node_name = layer.node.name if layer.node is not None else None
    for p in conv_pairs(model) if pairs is None else pairs:
        if node_name in (p.producer, p.consumer) or c.name in p.between:
            weight.append(Change("equalize", p.label, c.name, why))
    act = [] if act_bitwidth == 16 else [Change("act16", c.name, c.name, why)]
    w16 = [Change("w16", layer.weight, c.name, why)] if layer.weight else []
    order = act + weight + w16 if c.kind in AIMS_AT_ACTIVATIONS else weight + act + w16
    return list(dict.fromkeys(order)), ""


def int4_weights(model: onnx.ModelProto, weights_bitwidth: int) -> frozenset[str]:
    """The weights a run stores in int4 (``-wbw 4``: :mod:`accdbg.engines.int4`)."""
    if int(weights_bitwidth) != 4:
        return frozenset()
    from accdbg.engines.int4 import int4_plan

    return frozenset(int4_plan(model).overrides)


def global_changes(
    per_channel: bool, act_bitwidth: int, act_quantizer: str, int4: bool = False
) -> list[Change]:
    """The model-wide knobs not already turned (``int4``: the run has int4 weights, whose
    8-bit weights come first: the cheapest, the run's own other layers have them)."""
    glob: list[Change] = [Change("w8_all", why="global knob")] if int4 else []
    if not per_channel:
        glob.append(Change("per_channel_all", why="global knob"))
    for q in CALIBRATIONS:
        if q != act_quantizer:
            glob.append(Change("calibration", q, why="global knob"))
    if act_bitwidth != 16:
        glob.append(Change("act16_all", why="global knob"))
    return glob


def propose(
    model: onnx.ModelProto,
    culprits: Sequence[Culprit],
    per_channel: bool,
    act_bitwidth: int,
    act_quantizer: str,
    int4: Collection[str] = (),
) -> tuple[list[Change], list[str]]:
    """The candidates, aimed at the causes first, then the global knobs; and notes (e.g. the
    backend culprits that get no precision candidate). ``int4``: as :func:`changes_for`."""
    notes: list[str] = []
    local: list[Change] = []
    pairs = conv_pairs(model)
    for c in culprits:
        changes, note = changes_for(model, c, per_channel, act_bitwidth, pairs, int4)
        local.extend(x for x in changes if x not in local)
        if note:
            notes.append(note)
    if not culprits:
        notes.append("no culprit in the diagnosis: only global knobs are tried")
    return local + global_changes(per_channel, act_bitwidth, act_quantizer, bool(int4)), notes


def pairs_of(model: onnx.ModelProto, changes: Sequence[Change]) -> list[Pair]:
    by_label = {p.label: p for p in conv_pairs(model)}
    return [by_label[c.target] for c in changes if c.kind == "equalize" and c.target in by_label]


def compatible(changes: Sequence[Change], new: Change) -> bool:
    """Whether ``new`` adds something to ``changes`` (one calibration at a time; a local
    knob a global one already covers adds nothing)."""
    kinds = {c.kind for c in changes}
    if new in changes:
        return False
    if new.kind == "per_channel" and "per_channel_all" in kinds:
        return False
    if new.kind == "act16" and "act16_all" in kinds:
        return False
    if new.kind in WEIGHT_KINDS and any(
        c.kind in WEIGHT_KINDS and c.target == new.target for c in changes
    ):
        return False
    if new.kind == "equalize":
        mine = new.target.split("->")
        for c in changes:
            if c.kind == "equalize" and set(c.target.split("->")) & set(mine):
                return False
    return True


def with_change(changes: Sequence[Change], new: Change) -> list[Change]:
    """``changes`` plus ``new``; a calibration replaces the previous one."""
    kept = [c for c in changes if not (new.kind == "calibration" and c.kind == "calibration")]
    return [*kept, new]


def settings(
    changes: Sequence[Change],
    per_channel: bool,
    act_bitwidth: int,
    act_quantizer: str,
    weight_type: str,
    axes: dict[str, int],
    regions: dict[str, list[str]] | None = None,
    encodings: Mapping[str, tuple[float, int, str]] | None = None,
) -> dict:
    """Quantizer options and TensorQuantOverrides (JSON form) of a set of changes, and the
    (what, tensor) pairs whose landing in the QNN graph is checked. ``regions``: the tensors
    a 16-bit activation candidate sets, by target (:func:`act16_region`); ``encodings``: the
    baseline's (scale, zero point, quant type) of the layers whose encoding a candidate gives
    others."""
    regions = regions or {}
    encodings = encodings or {}
    out = {
        "per_channel": per_channel,
        "act_bitwidth": act_bitwidth,
        "act_quantizer": act_quantizer,
        "keep_activations": False,
        "overrides": {},
        "landed": [],
    }
    for c in changes:
        if c.kind == "per_channel_all":
            out["per_channel"] = True
        elif c.kind == "calibration":
            out["act_quantizer"] = c.target
        elif c.kind == "act16_all":
            out["act_bitwidth"] = 16
        elif c.kind == "w8_all":
            out["weights_bitwidth"] = 8
        elif c.kind == "per_channel":
            out["overrides"][c.target] = [
                {"axis": axes.get(c.target, 0), "quant_type": weight_type}
            ]
            out["landed"].append(("per_channel", c.target))
        elif c.kind == "act16":
            for t in regions.get(c.target, [c.target]):
                out["overrides"][t] = [{"quant_type": "QUInt16"}]
            out["landed"].append(("act16", c.target))
        elif c.kind == "region16":  # a culprit's region in 16-bit integers
            for t in c.target.split(","):
                out["overrides"][t] = [{"quant_type": "QUInt16"}]
        elif c.kind == "recalibrate":
            out["recalibrate"] = True
            out["act_quantizer"] = "tf"
        elif c.kind == "keep_activation":
            out["keep_activations"] = True
        elif c.kind == "w16":
            out["overrides"][c.target] = [{"quant_type": "QUInt16"}]
            out["landed"].append(("w16", c.target))
        elif c.kind == "w8":  # the 8-bit weights the run's other layers have (per channel too)
            axis = {"axis": axes[c.target]} if out["per_channel"] and c.target in axes else {}
            out["overrides"][c.target] = [{"quant_type": weight_type, **axis}]
            out["landed"].append(("w8", c.target))
        elif c.kind == "encoding" and c.layer in encodings:
            scale, zero, qtype = encodings[c.layer]
            for t in c.target.split(","):
                out["overrides"][t] = [{"scale": scale, "zero_point": zero, "quant_type": qtype}]
                out["landed"].append((f"{ENCODING_OF}{c.layer}", t))
    return out


ENCODING_OF = "encoding of "  # a landing check's 'what': the tensor holds this layer's encoding
