"""Layerwise snooping: every layer alone on the backend, fed with golden inputs.

A layer's error measured this way is its own: its inputs are the golden values, quantized
with the encodings the full model uses. The reference builds, converts and compiles one
model per layer; here many single-layer fragments share one model and one session (each fed
its own golden inputs), so the whole model is judged in a few sessions. Batches are bounded
by a memory budget, run on both cores, and a failing batch is bisected until the failing
layer is alone (see :mod:`accdbg.algorithms.snooping` for the statuses).

Alone on a graph input, a layer is not always the kernel it is in the graph: HTP fuses the
elementwise and layout ops after a convolution or a matmul into it, or runs them in place on
its output buffer. So a layer that is no such kernel also runs *in context* - after its
producers back to the nearest ones, fed golden values there - beside its alone fragment, and
its error there and its inputs' go in the table (``in-context SQNR``); the ranking names one
whose error there jumps far beyond what its inputs bring (a backend divergence that only its
neighbours trigger, as HTP's channel Pad after a convolution).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from accdbg.algorithms.backend import PartRun, failure_status
from accdbg.algorithms.diagnosis.ranking.measures import CONTEXT, CONTEXT_IN
from accdbg.algorithms.fragments import KERNELS, Layer, Part, SurgeryError, context_walk, merge
from accdbg.algorithms.golden import GoldenError
from accdbg.algorithms.judging import error_row, judge_layer
from accdbg.algorithms.protocol import AlgorithmRequest, AlgorithmResult, register
from accdbg.algorithms.snooping import (
    Context,
    SnoopArgs,
    Snooping,
    SnoopingResult,
    has_golden,
    snoop,
)
from accdbg.algorithms.statuses import ERR_PART
from accdbg.core.batching import plan_batches
from accdbg.core.cpu_session import exact_session
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.engines.exposure import QDQ_OPS
from accdbg.engines.options import EngineConfig
from accdbg.engines.source import load_feed
from accdbg.verifiers import get_verifier

log = logging.getLogger("accdbg.snooping")

DEFAULT_MEMORY_BUDGET_MB = 1024
# below this much tensor data a second process costs more than it saves
SPLIT_MIN_BYTES = 16 * 2**20
# nodes (Q/DQ included) of one session: QNN HTP's graph finalize grows with their square
# (PP-OCRv4 rec's fragments: 610 nodes 0.7 s, 1246 2.9 s, 4036 31 s), so many small sessions
# finalize faster than a few big ones
BATCH_NODES = 600
SQNR = get_verifier("SQNR")  # a layer's error in its context run


@dataclass
class Fragment:
    """One node of the model alone, its golden feeds and its size in memory."""

    layers: list[Layer]
    part: Part
    feeds: dict[str, tuple[str, tuple[int, ...], str]]
    nbytes: int
    # with a context merged in: the node's fragment without it, run instead if the two fail
    alone: list[Fragment] | None = None
    context_failed: str = ""  # why its context did not run (said in its row's Info)

    @property
    def nodes(self) -> int:
        return len(self.part.model.graph.node)

    @property
    def judged(self) -> dict[str, Layer]:
        """Its alone fragments' outputs (the rest of its outputs are its context's)."""
        if self.alone is None:
            return self.part.outputs
        return {o: x for f in self.alone for o, x in f.part.outputs.items()}


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


def _context_prefix(node_index: int) -> str:
    return f"c{node_index}/"


def _context_cut(ctx: Context, layer: Layer) -> list[str] | None:
    """Where a layer's context starts: the inputs of its producers back through ops that are
    no kernel (``KERNELS``) to the nearest kernels, those included, at most the nearest
    ``CONTEXT_OPS`` (golden values enter where the walk stops). None when that is the layer
    alone (a kernel itself, or reading graph inputs)."""
    if layer.op_type in KERNELS:
        return None
    qdq = ctx.qdq

    def producers(i: int) -> list[int]:
        made = (qdq.producer.get(t) for t in qdq.activation_inputs(qdq.nodes[i]))
        return [m for m in made if m is not None]

    start = [qdq.producer[t] for t in layer.inputs if t in qdq.producer]
    inside = context_walk(start, producers, lambda i: qdq.nodes[i].op_type in KERNELS)
    if not inside:
        return None
    reads = [*layer.inputs, *(x for i in inside for x in qdq.activation_inputs(qdq.nodes[i]))]
    return list(dict.fromkeys(x for x in reads if qdq.producer.get(x) not in inside))


def _context_part(ctx: Context, cut: list[str], members: list[Layer]) -> Part | None:
    """The layers sharing the context that starts at ``cut`` (:func:`_context_cut`), run
    together after their producers, each exposed with its inputs; None when it cannot be cut
    out (they then run alone only)."""
    try:
        prefix = _context_prefix(members[0].node_index)
        return ctx.qdq.between(_golden_cut(ctx, cut), _with_inputs(ctx, members), prefix)
    except SurgeryError:
        return None


def _with_inputs(ctx: Context, layers: Sequence[Layer]) -> list[Layer]:
    """The layers, each after the layers whose outputs it reads (each once): a run exposing
    them all says what each was fed there."""
    shown: dict[str, Layer] = {}
    for layer in layers:
        for t in layer.inputs:
            if t in ctx.qdq.layer_at and t in ctx.qdq.producer:
                shown.setdefault(ctx.qdq.layer_at[t].name, ctx.qdq.layer_at[t])
        shown[layer.name] = layer
    return list(shown.values())


def _context_db(values: dict[str, tuple[Layer, np.ndarray]], golden) -> dict[str, float]:
    """Each layer of a context run (its members and their inputs) -> its SQNR there (dB), each
    golden loaded once for all the members sharing the run; a silent tensor has none."""
    db: dict[str, float] = {}
    for name, (x, v) in values.items():
        try:
            g = golden.load(x.exposed.qdq_tensor, None, x.name)
        except GoldenError:
            continue
        r = SQNR(g, x.dequantize(v))
        if r.details.get("signal_power_sum", 0.0) > 0:
            db[name] = r.value
    return db


def _in_context(
    layer: Layer, values: dict[str, tuple[Layer, np.ndarray]], db: dict[str, float]
) -> dict[str, float]:
    """The layer's SQNR in its context run and its worst input's there (dB), for its row."""
    if layer.name not in db:
        return {}
    ins = [
        db[n] for n, (x, _) in values.items() if x.exposed.qdq_tensor in layer.inputs and n in db
    ]
    return {CONTEXT: db[layer.name], **({CONTEXT_IN: min(ins)} if ins else {})}


class ContextRuns:
    """Layers run again for the ranking, where layerwise saw their error jump in context.

    :meth:`cut`: the same cut, on the backend and in onnxruntime's CPU fake-quant, fed the same
    golden values - a jump the CPU makes too is the quantization's, and what their difference
    costs the outputs is measured from it. :meth:`whole`: the model from its inputs to those
    layers on the backend, as deployed - a cut's producers are fed golden values as graph
    inputs, which HTP may take differently from its own tensors, so a jump there that the
    whole model does not show is the cut's. One session each for all the layers asked."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.by = {layer.name: layer for layer in ctx.span}

    def cut(self, names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Layer -> (the backend's result in its context, the CPU's), dequantized; a layer
        without a context, or whose run fails, is left out."""
        ctx, frags, asked = self.ctx, [], {}
        for n in names:
            layer = self.by.get(n)
            cut = _context_cut(ctx, layer) if layer is not None else None
            part = _context_part(ctx, cut, [layer]) if cut is not None else None
            out = next((o for o, x in part.outputs.items() if x.name == n), None) if part else None
            if out is None:
                continue
            try:
                frags.append(_fragment(ctx, [layer], part))
            except GoldenError:
                continue
            asked[n] = (layer, out)
        if not asked:
            return {}
        merged, feeds = _merged(ctx, frags, "in_context")
        outs = [o for _, o in asked.values()]
        values = self._run(merged, feeds, outs, "in_context")
        if values is None:
            return {}
        cpu = exact_session(merged.model).run(outs, load_feed(feeds))
        return {
            n: (layer.dequantize(values[o]), layer.dequantize(c))
            for (n, (layer, o)), c in zip(asked.items(), cpu, strict=True)
        }

    def whole(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The layers' and their inputs' results in the model run from its inputs on the
        backend (dequantized, by layer); empty when it cannot be cut or run."""
        ctx = self.ctx
        shown = _with_inputs(ctx, [self.by[n] for n in names if n in self.by])
        if not shown:
            return {}
        try:
            part = ctx.qdq.between(list(ctx.qdq.graph_inputs), shown, "whole/")
            frag = _fragment(ctx, shown, part)
        except (SurgeryError, GoldenError):
            return {}
        values = self._run(part, frag.feeds, list(part.outputs), "whole")
        if values is None:
            return {}
        return {x.name: x.dequantize(values[o]) for o, x in part.outputs.items()}

    def _run(self, part: Part, feeds: dict, outputs: list[str], label: str) -> dict | None:
        report, values = self.ctx.backend.run(part, feeds, outputs, label)
        if not report.ok:
            log.info("layers not run again (%s): %s", label, report.error.partition("\n")[0])
            return None
        return values


def _ops_of(fragment: Fragment) -> list[str]:
    """The op types a fragment runs besides Q/DQ, in order (each once)."""
    ops = [n.op_type for n in fragment.part.model.graph.node if n.op_type not in QDQ_OPS]
    return list(dict.fromkeys(ops))


def _fragments(ctx: Context, layers: list[Layer]) -> tuple[list[Fragment], list[dict]]:
    """Fragments for the layers' nodes; layers that cannot be cut out get ``err_part`` rows.
    The layers whose contexts start at the same cut share one fragment: their alone parts
    and one context part running them all (a convolution's hardswish once, not per op)."""
    by_node: dict[int, list[Layer]] = {}
    for layer in layers:
        by_node.setdefault(layer.node_index, []).append(layer)
    units: list[tuple[list[Layer], Part]] = []
    errors: list[dict] = []
    for node_index, group in by_node.items():
        try:
            units.append(
                (
                    group,
                    ctx.qdq.between(_golden_cut(ctx, group[0].inputs), group, _prefix(node_index)),
                )
            )
        except (SurgeryError, GoldenError) as exc:
            errors += [_part_error(ctx, layer, exc) for layer in group]
    # a context's cut (a unit without one: its index) -> the units run with it, in the order
    # of their first unit
    runs: dict[tuple[str, ...] | int, list[int]] = {}
    for i, (group, _) in enumerate(units):
        cut = _context_cut(ctx, group[0]) if len(group) == 1 else None
        runs.setdefault(i if cut is None else tuple(cut), []).append(i)
    frags: list[Fragment] = []
    for key, ids in runs.items():
        alone = []
        for j in ids:
            try:
                alone.append(_fragment(ctx, *units[j]))
            except GoldenError as exc:
                errors += [_part_error(ctx, layer, exc) for layer in units[j][0]]
        members = [x for f in alone for x in f.layers]
        context = (
            _context_part(ctx, list(key), members) if isinstance(key, tuple) and members else None
        )
        if context is not None:
            try:
                full = merge([*(f.part for f in alone), context], ctx.qdq.model)
                frags.append(_fragment(ctx, members, full, alone))
                continue
            except GoldenError:  # the context's golden is missing: they run alone only
                pass
        frags += alone
    return frags, errors


def _part_error(ctx: Context, layer: Layer, exc: Exception) -> dict:
    """The row of a layer that could not be cut out (``err_part``)."""
    return error_row(layer, ERR_PART, str(exc), ctx.qdq.shape(layer.exposed.qdq_tensor))


def _fragment(
    ctx: Context, layers: list[Layer], part: Part, alone: list[Fragment] | None = None
) -> Fragment:
    """A fragment with its golden feeds and its size in memory; ``alone``: the fragments of
    its layers without their context."""
    known = {k: v for f in alone or () for k, v in f.feeds.items()}  # fed already, alone
    feeds, nbytes = {}, 0
    for name, tensor in part.inputs.items():
        feeds[name] = known.get(name) or ctx.golden.feed(
            tensor, ctx.qdq.shape(tensor), ctx.qdq.dtype(tensor), *ctx.qdq.aliases(tensor)
        )
        nbytes += int(np.prod(feeds[name][1])) * np.dtype(feeds[name][2]).itemsize
    for layer in part.outputs.values():
        shape = ctx.qdq.shape(layer.output)
        nbytes += int(np.prod(shape)) * 4 if shape else 0
    return Fragment(layers, part, feeds, nbytes, alone)


def _split(frags: list[Fragment], n: int) -> list[list[Fragment]]:
    """``n`` consecutive groups of about equal size."""
    total = sum(f.nbytes for f in frags) or 1
    groups: list[list[Fragment]] = [[] for _ in range(n)]
    acc = 0
    for f in frags:
        groups[min(n - 1, int(acc * n / total))].append(f)
        acc += f.nbytes
    return [g for g in groups if g]


def _merged(ctx: Context, frags: Sequence[Fragment], name: str) -> tuple[Part, dict]:
    """The fragments as one model for one backend session, and their feeds together."""
    return merge([f.part for f in frags], ctx.qdq.model, name), {
        k: v for f in frags for k, v in f.feeds.items()
    }


def _loop(ctx: Context) -> None:
    todo = [layer for layer in ctx.span if layer.position not in ctx.rows]
    frags, errors = _fragments(ctx, todo)
    if errors:
        ctx.record("rows", errors, 0)
    batches = plan_batches(frags, lambda f: f.nbytes, ctx.memory_budget_bytes)
    total = sum(f.nbytes for f in frags)
    if len(batches) < ctx.workers and len(frags) >= 2 * ctx.workers and total >= SPLIT_MIN_BYTES:
        batches = _split(frags, ctx.workers)  # one batch per core
    batches = [b for batch in batches for b in plan_batches(batch, lambda f: f.nodes, BATCH_NODES)]
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
            merged, feeds = _merged(ctx, batch, f"layerwise_{len(batch)}")
            label = f"batch_{started:04d}"
            started += 1
            json_dir = ctx.run_path / "qnn_json" / label if ctx.dump_qnn_json else None
            yield PartRun(batch, merged, feeds, list(merged.outputs), label, json_dir)

    while queue:
        for batch, report, values in ctx.backend.run_many(runs()):
            sessions = report.sessions
            if report.ok:
                cpu = {name for _, name in report.cpu_nodes}
                rows, dumped = [], []
                for frag in batch:
                    judged = frag.judged
                    there = {  # its context run's layers
                        x.name: (x, values[o])
                        for o, x in frag.part.outputs.items()
                        if o not in judged
                    }
                    there_db = _context_db(there, ctx.golden) if there else {}
                    for out, layer in judged.items():
                        on_cpu = _prefix(layer.node_index) + layer.exposed.node in cpu
                        row = judge_layer(layer, values[out], ctx.golden, ctx.judge, cpu=on_cpu)
                        if there:
                            row.update(_in_context(layer, there, there_db))
                        if frag.context_failed:
                            why = f"not run in context: {frag.context_failed}"
                            row["Info"] = "; ".join(x for x in (row["Info"], why) if x)
                        rows.append(row)
                        dumped.append((layer, values[out]))
                ctx.write_outputs(f"batch_{len(ctx.journal.records):04d}", dumped)
                ctx.record("rows", rows, sessions, batch=len(batch))
                log.info(
                    "layerwise: batch of %d fragment(s) judged (%d/%d layers)",
                    len(batch),
                    len([p for p in ctx.rows if p not in ctx.skipped]),
                    len(ctx.span),
                )
            elif len(batch) == 1 and batch[0].alone is not None:
                # its context may be what fails (a fusion HTP cannot compile): run them alone
                frag = batch[0]
                why = f"{failure_status(report)}, {report.error.splitlines()[0] if report.error else ''}"
                log.info(
                    "layerwise: %s failed in context (%s); running alone",
                    frag.layers[0].name,
                    why,
                )
                ctx.journal.append({"kind": "note", "sessions": sessions, "failed_context": 1})
                queue.appendleft([replace(f, context_failed=why) for f in frag.alone])
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
    return snoop("layerwise", _loop, SnoopArgs(**locals()), ContextRuns)


@register("layerwise")
class Layerwise(Snooping):
    """Every layer alone on golden inputs (:func:`run_layerwise`)."""

    snoop_name = "layerwise"
    default_memory_budget_mb = DEFAULT_MEMORY_BUDGET_MB

    def run(self, req: AlgorithmRequest) -> AlgorithmResult:
        return self._call(run_layerwise, req)
