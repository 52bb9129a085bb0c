"""Layerwise snooping: every layer alone on the backend, fed with golden inputs.

A layer's error measured this way is its own: its inputs are the golden values, quantized
with the encodings the full model uses. The reference builds, converts and compiles one
model per layer; here many single-layer fragments share one model and one session (each fed
its own golden inputs), so the whole model is judged in a few sessions. Batches are bounded
by a memory budget, run on both cores, and a failing batch is bisected until the failing
layer is alone (see :mod:`accdbg.algorithms.snooping` for the statuses).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accdbg.algorithms.backend import PartRun, failure_status
from accdbg.algorithms.fragments import Layer, Part, SurgeryError, merge
from accdbg.algorithms.golden import GoldenError
from accdbg.algorithms.judging import error_row, judge_layer
from accdbg.algorithms.snooping import Context, SnoopArgs, SnoopingResult, has_golden, snoop
from accdbg.algorithms.statuses import ERR_PART
from accdbg.core.batching import plan_batches
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.engines.exposure import QDQ_OPS
from accdbg.engines.options import EngineConfig

log = logging.getLogger("accdbg.snooping")

DEFAULT_MEMORY_BUDGET_MB = 1024
# below this much tensor data a second process costs more than it saves
SPLIT_MIN_BYTES = 16 * 2**20


@dataclass
class Fragment:
    """One node of the model alone, its golden feeds and its size in memory."""

    layers: list[Layer]
    part: Part
    feeds: dict[str, tuple[str, tuple[int, ...], str]]
    nbytes: int


def _prefix(node_index: int) -> str:
    """Names inside a fragment: ``f<node index>/<name in the QDQ model>``."""
    return f"f{node_index}/"


def _golden_cut(ctx: Context, inputs: Sequence[str]) -> list[str]:
    """A layer's inputs, each one that QNN's pre-processing made (not a tensor of the model
    given, so no golden has it) replaced by the inputs of the node that makes it, back to
    tensors the golden has: a MatMul + Add becomes Reshape -> Gemm -> Reshape there, and the
    layer the user knows is the three together, run alone as one."""
    cut: list[str] = []
    todo, seen = list(inputs), set()
    while todo:
        t = todo.pop(0)
        if t in seen:
            continue
        seen.add(t)
        made = ctx.qdq.producer.get(t)
        if made is None or has_golden(t, ctx.source, ctx.golden, ctx.qdq):
            cut.append(t)
        else:
            todo += ctx.qdq.activation_inputs(ctx.qdq.nodes[made])
    return cut


def _ops_of(fragment: Fragment) -> list[str]:
    """The op types a fragment runs besides Q/DQ, in order (each once)."""
    ops = [n.op_type for n in fragment.part.model.graph.node if n.op_type not in QDQ_OPS]
    return list(dict.fromkeys(ops))


def _fragments(ctx: Context, layers: list[Layer]) -> tuple[list[Fragment], list[dict]]:
    """Fragments for the layers' nodes; layers that cannot be cut out get ``err_part`` rows."""
    by_node: dict[int, list[Layer]] = {}
    for layer in layers:
        by_node.setdefault(layer.node_index, []).append(layer)
    frags, errors = [], []
    for node_index, group in by_node.items():
        prefix = _prefix(node_index)
        try:
            part = ctx.qdq.between(_golden_cut(ctx, group[0].inputs), group, prefix)
            feeds, nbytes = {}, 0
            for name, tensor in part.inputs.items():
                shape = ctx.qdq.shape(tensor)
                feeds[name] = ctx.golden.feed(
                    tensor, shape, ctx.qdq.dtype(tensor), *ctx.qdq.aliases(tensor)
                )
                nbytes += int(np.prod(feeds[name][1])) * np.dtype(feeds[name][2]).itemsize
            for layer in group:
                shape = ctx.qdq.shape(layer.output)
                nbytes += int(np.prod(shape)) * 4 if shape else 0
        except (SurgeryError, GoldenError) as exc:
            errors += [
                error_row(layer, ERR_PART, str(exc), ctx.qdq.shape(layer.exposed.qdq_tensor))
                for layer in group
            ]
            continue
        frags.append(Fragment(group, part, feeds, nbytes))
    return frags, errors


def _split(frags: list[Fragment], n: int) -> list[list[Fragment]]:
    """``n`` consecutive groups of about equal size."""
    total = sum(f.nbytes for f in frags) or 1
    groups: list[list[Fragment]] = [[] for _ in range(n)]
    acc = 0
    for f in frags:
        groups[min(n - 1, int(acc * n / total))].append(f)
        acc += f.nbytes
    return [g for g in groups if g]


def _loop(ctx: Context) -> None:
    todo = [layer for layer in ctx.span if layer.position not in ctx.rows]
    frags, errors = _fragments(ctx, todo)
    if errors:
        ctx.record("rows", errors, 0)
    batches = plan_batches(frags, lambda f: f.nbytes, ctx.memory_budget_bytes)
    total = sum(f.nbytes for f in frags)
    if len(batches) < ctx.workers and len(frags) >= 2 * ctx.workers and total >= SPLIT_MIN_BYTES:
        batches = _split(frags, ctx.workers)  # one batch per core
    log.info(
        "layerwise: %d fragments in %d batch(es), %d at a time",
        len(frags),
        len(batches),
        ctx.workers,
    )
    queue = deque(batches)
    started = 0

    def runs():  # read lazily: a failed batch's halves join the queue while others run
        nonlocal started
        while queue:
            batch = queue.popleft()
            merged = merge([f.part for f in batch], ctx.qdq.model, f"layerwise_{len(batch)}")
            feeds = {k: v for f in batch for k, v in f.feeds.items()}
            label = f"batch_{started:04d}"
            started += 1
            json_dir = ctx.run_path / "qnn_json" / label if ctx.dump_qnn_json else None
            yield PartRun((batch, merged), merged, feeds, list(merged.outputs), label, json_dir)

    while queue:
        for (batch, merged), report, values in ctx.backend.run_many(runs()):
            sessions = report.sessions
            if report.ok:
                cpu = {name for _, name in report.cpu_nodes}
                rows, dumped = [], []
                for out, layer in merged.outputs.items():
                    on_cpu = _prefix(layer.node_index) + layer.exposed.node in cpu
                    rows.append(judge_layer(layer, values[out], ctx.golden, ctx.judge, cpu=on_cpu))
                    dumped.append((layer, values[out]))
                ctx.write_outputs(f"batch_{len(ctx.journal.records):04d}", dumped)
                ctx.record("rows", rows, sessions, batch=len(batch))
                log.info(
                    "layerwise: batch of %d fragment(s) judged (%d/%d layers)",
                    len(batch),
                    len([p for p in ctx.rows if p not in ctx.skipped]),
                    len(ctx.span),
                )
            elif len(batch) == 1:
                status = failure_status(report)
                rows = [
                    error_row(layer, status, report.error, ctx.qdq.shape(layer.exposed.qdq_tensor))
                    for layer in batch[0].layers
                ]
                ops = _ops_of(batch[0])  # the op the backend refused may be inside (an LSTM)
                for row in rows:
                    row["_ops"] = ops
                ctx.record("rows", rows, sessions, batch=1)
                log.warning("layerwise: %s: %s: %s", batch[0].layers[0].name, status, report.error)
            else:  # find the failing fragment(s): halves go first in the queue
                half = len(batch) // 2
                log.info(
                    "layerwise: a batch of %d failed (%s); bisecting",
                    len(batch),
                    failure_status(report),
                )
                ctx.journal.append(
                    {"kind": "note", "sessions": sessions, "failed_batch": len(batch)}
                )
                queue.appendleft(batch[half:])
                queue.appendleft(batch[:half])


def run_layerwise(
    model_path: str | os.PathLike,
    input_tensors: Sequence[InputTensor] = (),
    input_list: str | os.PathLike | None = None,
    golden_dir: str | os.PathLike | None = None,
    qdq_model: str | os.PathLike | None = None,
    verifiers: Sequence = ("CosineSimilarity",),
    start_layer: str | None = None,
    end_layer: str | None = None,
    engine_kwargs: EngineConfig | dict | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB,
    workers: int | None = None,
    dump_qnn_json: bool = False,
    allow_nonfinite_inputs: bool = False,
    model_explorer: bool = True,
    executor: ExecutorConfig | None = None,
) -> SnoopingResult:
    """Judge every layer alone; writes ``<working_dir>/layerwise_snooping/<run>/layerwise.csv``.

    ``golden_dir``: golden tensors (framework diagnosis run, or a folder of ``<tensor>.raw``
    such as an AIMET layer-output dump); None runs framework diagnosis first. ``qdq_model``:
    the QDQ model to debug; None quantizes ``model_path`` as the inference engine does
    (``engine_kwargs``: an :class:`~accdbg.engines.options.EngineConfig` or its plain keywords,
    e.g. ``{"act_bitwidth": 16}``), calibrated like it on every line of ``input_list``
    (a qnn-net-run input list; without it, on the ``input_tensors`` files). With ``output_dirname`` an interrupted run of that
    name is resumed. ``dump_qnn_json`` keeps each session's QNN graph JSON in ``qnn_json/``.
    ``model_explorer`` writes Model Explorer overlays of the table on ``model_path``'s graph.
    ``executor``: where the parts run (:class:`~accdbg.core.executors.ExecutorConfig`; default
    ``workers`` local worker processes, two on a multi-core host).
    """
    # locals() here are exactly the arguments above
    return snoop("layerwise", _loop, SnoopArgs(**locals()))
