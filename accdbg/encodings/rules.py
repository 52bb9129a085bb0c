"""Encoding rules: what a QDQ model's encodings should satisfy on HTP, checked before a run.

Each rule is an object with an id, a one-line statement and a check over the QDQ model's
encodings; a flag names the rule, the tensors and what to change. The rules are those of the
kind Qualcomm's newer debugger validates: the inputs of a Concat (and of an Add) on one range,
norm weights and their inputs at 16 bits, int4 weights only where HTP runs them, and every
encoding able to hold its tensor (masks and other unholdable values: :mod:`.defects`).
A JSON or YAML file turns rules off or sets their parameters::

    {"disable": ["add-one-range"], "params": {"concat-one-range": {"ratio": 4}}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from accdbg.encodings.htp_int4 import INT4_OPS, int4_axis
from accdbg.encodings.model import ACTIVATION, Encoding
from accdbg.encodings.qdq import qdq_encodings
from accdbg.errors import AccdbgError

INT4_TYPES = (TensorProto.INT4, TensorProto.UINT4)
NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization")


@dataclass(frozen=True)
class Flag:
    """One rule's finding: the tensors it flags and what to change."""

    rule: str
    tensors: tuple[str, ...]
    what: str
    change: str

    def line(self) -> str:
        shown = ", ".join(self.tensors[:4]) + (" ..." if len(self.tensors) > 4 else "")
        return f"encoding rule {self.rule}: {self.what} ({shown}) - {self.change}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "tensors": list(self.tensors),
            "what": self.what,
            "change": self.change,
        }


@dataclass(frozen=True)
class Rule:
    """A named rule: its statement, its default parameters and its check."""

    id: str
    statement: str
    # (the QDQ model, its encodings, the parameters, DequantizeLinear output -> encoding name)
    check: Callable[..., list[Flag]]
    params: Mapping[str, Any] = field(default_factory=dict)


def _scale(e: Encoding) -> float:
    return float(np.max(np.asarray(e.scale, np.float64)))


def _one_range(op: str, rule: str):
    def check(model, encs, params, sources) -> list[Flag]:
        out = []
        for node in model.graph.node:
            if node.op_type != op:
                continue
            # activations only: a bias added to its MatMul's output is folded into it on HTP
            ins = [
                encs[i]
                for i in _dq_sources(sources, node)
                if i in encs and encs[i].kind == ACTIVATION
            ]
            scales = [_scale(e) for e in ins if e.bitwidth and _scale(e) > 0]
            if len(scales) > 1 and max(scales) / min(scales) > params["ratio"]:
                out.append(
                    Flag(
                        rule,
                        tuple(e.name for e in ins),
                        f"{op} {node.name or node.output[0]}'s inputs on ranges "
                        f"{max(scales) / min(scales):.0f}x apart",
                        "one range for them (the widest input's encoding on all), or 16-bit "
                        "activations on the narrow ones",
                    )
                )
        return out

    return check


def _sources(model: onnx.ModelProto) -> dict[str, str]:
    """Each DequantizeLinear output -> the float tensor it was quantized from (its encoding's
    name): an activation's QuantizeLinear input, a parameter's quantized initializer."""
    q = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return {
        n.output[0]: q.get(n.input[0], n.input[0]).removesuffix("_quantized")
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
    }


def _dq_sources(sources: Mapping[str, str], node: onnx.NodeProto) -> list[str]:
    """The encodings' names of a node's inputs (an input no DequantizeLinear gives: itself)."""
    return [sources.get(i, i) for i in node.input]


def _norm16(model, encs, params, sources) -> list[Flag]:
    out = []
    for node in model.graph.node:
        if node.op_type not in NORM_OPS:
            continue
        named = _dq_sources(sources, node)[:2]  # its input and its weight (scale)
        low = [
            n for n in named if n in encs and encs[n].bitwidth and encs[n].bitwidth < params["bits"]
        ]
        if low:
            out.append(
                Flag(
                    "norm-16bit",
                    tuple(low),
                    f"{node.op_type} {node.name or node.output[0]} at "
                    f"{min(encs[n].bitwidth for n in low)} bits",
                    "16-bit weights and activations on its input and weight (-qo, or the fix "
                    "search's 16-bit candidates)",
                )
            )
    return out


def _int4(model, encs, params, sources) -> list[Flag]:
    inits = {i.name: i for i in model.graph.initializer}
    dq4 = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
        and n.input[0] in inits
        and inits[n.input[0]].data_type in INT4_TYPES
    }
    out = []
    for node in model.graph.node:
        for i in node.input:
            if i not in dq4:
                continue
            if int4_axis(node, inits[dq4[i]]) is None:
                out.append(
                    Flag(
                        "int4-supported",
                        (dq4[i].removesuffix("_quantized"),),
                        f"int4 weight on {node.op_type} {node.name or node.output[0]}",
                        f"8-bit weights there: Qualcomm documents HTP's int4 weights for "
                        f"{INT4_OPS} only",
                    )
                )
    return out


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "concat-one-range",
            "a Concat's inputs share one range (HTP requantizes each to the output's encoding)",
            _one_range("Concat", "concat-one-range"),
            {"ratio": 4.0},
        ),
        Rule(
            "add-one-range",
            "an Add's inputs on ranges far apart lose the narrow one in the sum's encoding",
            _one_range("Add", "add-one-range"),
            {"ratio": 64.0},
        ),
        Rule(
            "norm-16bit",
            "norm weights and their inputs at 16 bits (Qualcomm's encoding rules)",
            _norm16,
            {"bits": 16},
        ),
        Rule(
            "int4-supported",
            "int4 weights only on the ops HTP runs them on",
            _int4,
        ),
    )
}


@dataclass(frozen=True)
class RuleConfig:
    """Which rules run, and their parameters."""

    disabled: frozenset[str] = frozenset()
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path | None) -> RuleConfig:
        """Read a JSON or YAML rule file; a bad one is refused naming it."""
        if path is None:
            return cls()
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
            if p.suffix in (".yaml", ".yml"):
                import yaml

                doc = yaml.safe_load(text) or {}
            else:
                doc = json.loads(text)
        except (OSError, ValueError) as exc:
            raise AccdbgError(
                f"--encoding_rules {str(p)!r}: not a readable JSON/YAML file: {exc}"
            ) from None
        unknown = (set(doc.get("disable", [])) | set(doc.get("params", {}))) - set(RULES)
        if unknown:
            raise AccdbgError(
                f"--encoding_rules {str(p)!r}: unknown rule(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(RULES)}"
            )
        return cls(frozenset(doc.get("disable", [])), dict(doc.get("params", {})))


def check_rules(model: onnx.ModelProto, config: RuleConfig | None = None) -> list[Flag]:
    """Every enabled rule's flags on a QDQ model (none on a float one)."""
    try:
        encs = qdq_encodings(model)
    except Exception:  # not a QDQ model: no encodings to check
        return []
    config = config or RuleConfig()
    sources = _sources(model)  # once for every rule
    out = []
    for rule in RULES.values():
        if rule.id not in config.disabled:
            params = {**rule.params, **config.params.get(rule.id, {})}
            out += rule.check(model, encs, params, sources)
    return out


def summary_lines(flags: list[Flag]) -> list[str]:
    """One line per rule that flagged something: how many, the first one, what to change."""
    by: dict[str, list[Flag]] = {}
    for f in flags:
        by.setdefault(f.rule, []).append(f)
    return [
        f"encoding rule {rule}: {len(fs)} flag(s), e.g. {fs[0].what} ({', '.join(fs[0].tensors[:3])}) "
        f"- {fs[0].change}"
        for rule, fs in by.items()
    ]
