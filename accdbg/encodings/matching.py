"""Pair AIMET tensor names (ONNX names) with QNN tensor names, and say how each pair was made.

QNN renames tensors. The rules below run in order; each pass only looks at names still
unpaired on both sides, and a rule pairs two names only when the pairing is unique (an
ambiguous candidate is left for a later rule, or listed as one-sided). ``matched_by`` names
the rule:

``exact``
    the same name.
``qnn_ep_param``
    ``<name>_quantized``: onnxruntime's quantizer names a quantized initializer so, and the
    QNN EP keeps that name for the static tensor.
``qnn_ep_activation``
    ``<name>_QuantizeLinear``: the QNN EP names an activation after the QuantizeLinear node
    onnxruntime inserted for it.
``sanitized``
    the QNN converter's rule for C++ identifiers: every run of non-word characters becomes
    ``_`` and a name not starting with a letter gets a ``_`` prefix
    (``/2/22/Conv_output_0`` -> ``__2_22_Conv_output_0``).
``sanitized_loose``
    the same, ignoring leading underscores (converter versions differ on the prefix).
``tensor_mapping``
    ``tensor_mapping.json`` beside the QNN JSON (an inference engine run) maps the two names.
``graph_producer``
    by the QNN graph: an ONNX-exporter name ``<node>_output_<k>`` is the k-th output of the QNN
    node named ``<node>`` (plain, sanitized, or with the EP's ``_token_<n>`` suffix).
``graph_layout_copy``
    by the QNN graph: a tensor QNN inserted to change layout (the output of a ``Transpose`` or
    ``Reshape`` whose input is already paired) is compared with its input's AIMET encoding;
    one AIMET entry can then appear in several rows.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from accdbg.encodings.qnn_json import QnnGraph
from accdbg.mapping.names import converter_loose as loose
from accdbg.mapping.names import converter_sanitize as sanitize

_TOKEN = re.compile(r"_token_\d+$")
_OUTPUT = re.compile(r"^(.*)_output_(\d+)$")
LAYOUT_OPS = {"Transpose", "Reshape"}
RULES = (
    "exact",
    "qnn_ep_param",
    "qnn_ep_activation",
    "sanitized",
    "sanitized_loose",
    "tensor_mapping",
    "graph_producer",
    "graph_layout_copy",
)


@dataclass(frozen=True)
class Pair:
    aimet_name: str
    qnn_name: str
    matched_by: str


def _unique_index(names: Iterable[str], key: Callable[[str], str]) -> dict[str, str]:
    """key -> name, for keys only one name has."""
    groups: dict[str, list[str]] = defaultdict(list)
    for n in names:
        groups[key(n)].append(n)
    return {k: v[0] for k, v in groups.items() if len(v) == 1}


def match_names(
    aimet_names: Iterable[str],
    qnn_names: Iterable[str],
    graph: QnnGraph | None = None,
    mapping: dict[str, str] | None = None,
) -> tuple[list[Pair], list[str], list[str]]:
    """Pair the names; returns ``(pairs, only_aimet, only_qnn)`` (input order kept)."""
    a_all = list(dict.fromkeys(aimet_names))
    q_all = list(dict.fromkeys(qnn_names))
    a_free = dict.fromkeys(a_all)
    q_free = dict.fromkeys(q_all)
    pairs: list[Pair] = []

    def take(a: str, q: str, rule: str) -> None:
        pairs.append(Pair(a, q, rule))
        a_free.pop(a, None)
        q_free.pop(q, None)

    def by_key(rule: str, a_key: Callable[[str], str], q_key: Callable[[str], str]) -> None:
        q_idx = _unique_index(q_free, q_key)
        a_idx = _unique_index(a_free, a_key)
        for k, a in a_idx.items():
            q = q_idx.get(k)
            if q is not None and q in q_free and a in a_free:
                take(a, q, rule)

    by_key("exact", lambda n: n, lambda n: n)
    by_key("qnn_ep_param", lambda n: n + "_quantized", lambda n: n)
    by_key("qnn_ep_activation", lambda n: n + "_QuantizeLinear", lambda n: n)
    by_key("sanitized", sanitize, lambda n: n)
    by_key("sanitized_loose", loose, loose)

    if mapping:
        for x, y in mapping.items():
            for a, q in ((y, x), (x, y)):
                if a in a_free and q in q_free:
                    take(a, q, "tensor_mapping")

    if graph is not None:
        _graph_producer(graph, a_free, q_free, take)
        _layout_copies(graph, pairs, q_free)

    only_a = [a for a in a_all if a in a_free]
    only_q = [q for q in q_all if q in q_free]
    return pairs, only_a, only_q


def _graph_producer(graph: QnnGraph, a_free: dict, q_free: dict, take) -> None:
    by_node: dict[str, list[str]] = defaultdict(list)
    for node_name in graph.nodes:
        base = _TOKEN.sub("", node_name)
        for key in {base, sanitize(base), loose(base)}:
            by_node[key].append(node_name)
    for a in list(a_free):
        m = _OUTPUT.match(a)
        if not m:
            continue
        node_part, k = m.group(1), int(m.group(2))
        cands = {
            n
            for key in (node_part, sanitize(node_part), loose(node_part))
            for n in by_node.get(key, [])
        }
        if len(cands) != 1:
            continue
        outs = graph.nodes[cands.pop()].get("output_names") or []
        if k < len(outs) and outs[k] in q_free:
            take(a, outs[k], "graph_producer")


def _layout_copies(graph: QnnGraph, pairs: list[Pair], q_free: dict) -> None:
    """QNN-inserted Transpose/Reshape outputs inherit their input's pairing (transitively)."""
    paired = {p.qnn_name: p.aimet_name for p in pairs}
    changed = True
    while changed:
        changed = False
        for node in graph.nodes.values():
            if node.get("type") not in LAYOUT_OPS:
                continue
            ins = node.get("input_names") or []
            for out in node.get("output_names") or []:
                if out in q_free and ins and ins[0] in paired:
                    pairs.append(Pair(paired[ins[0]], out, "graph_layout_copy"))
                    paired[out] = paired[ins[0]]
                    q_free.pop(out, None)
                    changed = True
