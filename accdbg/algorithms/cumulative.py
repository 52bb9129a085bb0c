"""Cumulative-layerwise snooping: judge layers in execution order without earlier layers' error.

The model runs on the backend from the last *partition point* onward, every tensor crossing
that cut fed with its golden value (through its Q/DQ, with the full model's encodings). One
session and one run give every later layer's output; the layers are judged in order and the
first one failing a verifier becomes the next partition point (``part``): its error, and
everything before it, is replaced by golden values for the layers after it. So a session is
created per partition point (plus one), not per layer as the reference does, which quantizes
and compiles one model per layer.

``Orig Outputs`` is the model outputs' scores in the run that judged the layer (with
``--end_layer``, the model is cut there and the end layer's output stands for them).
A run that fails is bisected on its last layer to find the first layer the backend cannot
run; that layer gets its ``err_*`` status and becomes a partition point, so the run goes on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np

from accdbg.algorithms.backend import PartReport, failure_status
from accdbg.algorithms.fragments import Layer, Part, SurgeryError
from accdbg.algorithms.golden import GoldenError
from accdbg.algorithms.judging import error_row, failing, judge_layer, orig_outputs_text
from accdbg.algorithms.protocol import AlgorithmRequest, AlgorithmResult, register
from accdbg.algorithms.snooping import Context, SnoopArgs, Snooping, SnoopingResult, snoop
from accdbg.algorithms.statuses import ERR_PART, PART
from accdbg.core.batching import plan_batches
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.engines.options import EngineConfig
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.snooping")


class _Step:
    """Parts of the model from one partition point on (one boundary in node order)."""

    def __init__(self, ctx: Context, boundary: int):
        self.ctx, self.boundary = ctx, boundary
        self.judged = [
            layer
            for layer in ctx.span
            if layer.node_index >= boundary and layer.position not in ctx.rows
        ]
        end = ctx.end_layer
        self.extra = (
            [end]
            if end is not None and end not in self.judged and end.node_index >= boundary
            else []
        )

    def part(self, layers: list[Layer], finals: bool) -> tuple[Part, dict]:
        """The suffix exposing ``layers`` (and the end layer), with its golden feeds."""
        ctx = self.ctx
        part = ctx.qdq.suffix(
            self.boundary, [*layers, *self.extra], finals=finals and ctx.end_layer is None
        )
        feeds = {
            name: ctx.golden.feed(t, ctx.qdq.shape(t), ctx.qdq.dtype(t), *ctx.qdq.aliases(t))
            for name, t in part.inputs.items()
        }
        return part, feeds

    def run(self, layers: list[Layer], finals: bool, label: str) -> tuple[PartReport, dict]:
        part, feeds = self.part(layers, finals)
        json_dir = self.ctx.run_path / "qnn_json" / label if self.ctx.dump_qnn_json else None
        outputs = [*part.outputs, *part.finals]
        return self.ctx.backend.run(part, feeds, outputs, label, json_dir)

    def window(self) -> None:
        """Judge at most a memory budget's worth of outputs in one run; the next run continues
        from the same partition point when none of them fails."""
        qdq = self.ctx.qdq

        def nbytes(layer: Layer) -> int | None:
            shape = qdq.shape(layer.suffix_output)
            dtype = qdq.dtype(layer.suffix_output)
            return (
                int(np.prod(shape)) * dtype.itemsize
                if shape is not None and dtype is not None
                else None
            )

        if self.judged:
            self.judged = plan_batches(self.judged, nbytes, self.ctx.memory_budget_bytes)[0]


def _orig_scores(ctx: Context, values: dict) -> str:
    """The model outputs' (or the end layer's) scores in this run."""
    scores: dict[str, dict | str] = {}
    if ctx.end_layer is not None:
        layer = ctx.end_layer
        out = layer.suffix_output
        if out in values:
            row = judge_layer(layer, values[out], ctx.golden, ctx.judge)
            scores[layer.name] = row.get("_values") or row["Info"]
        return orig_outputs_text(scores)
    for out in ctx.qdq.graph_outputs:
        if out not in values:
            continue
        target = np.asarray(values[out], dtype=np.float32)
        try:
            golden = ctx.golden.load(out, target.shape)
        except GoldenError as exc:
            scores[out] = str(exc)
            continue
        vals, _, _ = ctx.judge.scores(np.asarray(golden, np.float64), target, None)
        scores[out] = vals
    return orig_outputs_text(scores)


def _can_cut_after(ctx: Context, layer: Layer) -> str | None:
    """Why the model cannot be partitioned after ``layer`` (None: it can)."""
    step = _Step(ctx, layer.node_index + 1)
    step.judged = [x for x in step.judged if x.position > layer.position]
    if not step.judged and not step.extra:
        return None
    try:
        step.part(step.judged or step.extra, finals=False)
    except (SurgeryError, GoldenError) as exc:
        return f"cannot partition after this layer: {exc}"
    return None


def _bisect(
    step: _Step, failed: PartReport, n: int
) -> tuple[int, dict, tuple[Layer, PartReport] | None]:
    """After a failed run: the longest prefix of the judged layers whose suffix runs (without
    the model outputs), its values, and the first layer beyond it with its failure."""
    layers = step.judged
    if step.ctx.end_layer is None:  # the model outputs may be what fails
        report, values = step.run(layers, False, f"step_{n:04d}_no_outputs")
        if report.ok:
            return len(layers), values, None
    good, good_values = 0, {}
    bad, bad_report = len(layers), failed
    while bad - good > 1:
        mid = (good + bad) // 2
        report, values = step.run(layers[:mid], False, f"step_{n:04d}_first_{mid}")
        if report.ok:
            good, good_values = mid, values
        else:
            bad, bad_report = mid, report
    return good, good_values, (layers[bad - 1], bad_report)


def _loop(ctx: Context) -> None:
    steps = ctx.journal.of_kind("step")
    if steps:
        boundary = steps[-1]["next_boundary"]
    else:
        boundary = ctx.start_layer.node_index if ctx.start_layer is not None else 0
    n = len(steps)
    while boundary is not None:
        step = _Step(ctx, boundary)
        if not step.judged:
            break
        step.window()
        more = len(_Step(ctx, boundary).judged) > len(step.judged)
        label = f"step_{n:04d}"
        before = ctx.backend.sessions
        try:
            report, values = step.run(step.judged, True, label)
        except (SurgeryError, GoldenError) as exc:
            if n == 0 and ctx.start_layer is not None:
                raise AccdbgError(
                    f"--start_layer {ctx.start_layer.name!r}: cannot cut the model there: {exc}"
                ) from None
            rows = [
                error_row(layer, ERR_PART, str(exc), ctx.qdq.shape(layer.exposed.qdq_tensor))
                for layer in step.judged
            ]
            ctx.record(
                "step", rows, ctx.backend.sessions - before, boundary=boundary, next_boundary=None
            )
            return
        judged, broken, orig = step.judged, None, None
        if not report.ok:
            log.warning(
                "cumulative: the run from node %d failed (%s); bisecting",
                boundary,
                failure_status(report),
            )
            good, values, broken = _bisect(step, report, n)
            judged = step.judged[:good]
            orig = f"not computed: {failure_status(report)}"
        if orig is None:
            orig = _orig_scores(ctx, values)
        cpu = {name for _, name in report.cpu_nodes} if report.ok else set()
        rows, dumped, next_layer = [], [], None
        for layer in judged:
            on_cpu = layer.exposed.node in cpu
            row = judge_layer(layer, values[layer.suffix_output], ctx.golden, ctx.judge, cpu=on_cpu)
            dumped.append((layer, values[layer.suffix_output]))
            rows.append(row)
            if failing(row):
                why = _can_cut_after(ctx, layer)
                if why is None:
                    row["Status"], next_layer = PART, layer
                    break
                row["Status"] = ERR_PART
                row["Info"] = "; ".join(x for x in (row["Info"], why) if x)
        if next_layer is None and broken is not None:
            layer, bad_report = broken
            rows.append(
                error_row(
                    layer,
                    failure_status(bad_report),
                    bad_report.error,
                    ctx.qdq.shape(layer.exposed.qdq_tensor),
                )
            )
            next_layer = layer
        for row in rows:
            row["Orig Outputs"] = orig
        if next_layer is not None:
            next_boundary = next_layer.node_index + 1
        else:
            next_boundary = boundary if more else None  # the next window, same partition point
        ctx.write_outputs(f"{label}_{len(ctx.journal.records):04d}", dumped)
        ctx.record(
            "step",
            rows,
            ctx.backend.sessions - before,
            boundary=boundary,
            next_boundary=next_boundary,
        )
        log.info(
            "cumulative: step %d from node %d judged %d layer(s)%s",
            n,
            boundary,
            len(rows),
            f"; partition after {next_layer.name}" if next_layer is not None else "",
        )
        boundary, n = next_boundary, n + 1


def run_cumulative_layerwise(
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
    memory_budget_mb: float = 1024,
    workers: int | None = None,
    dump_qnn_json: bool = False,
    allow_nonfinite_inputs: bool = False,
    model_explorer: bool = True,
    executor: ExecutorConfig | None = None,
) -> SnoopingResult:
    """Judge layers from partition point to partition point; writes
    ``<working_dir>/cumulative_layerwise_snooping/<run>/cumulative_layerwise.csv``.

    Arguments as :func:`accdbg.algorithms.layerwise.run_layerwise`.
    """
    # locals() here are exactly the arguments above
    return snoop("cumulative_layerwise", _loop, SnoopArgs(**locals()))


@register("cumulative-layerwise")
class Cumulative(Snooping):
    """Layers from partition point to partition point (:func:`run_cumulative_layerwise`)."""

    snoop_name = "cumulative_layerwise"
    default_memory_budget_mb = 1024

    def run(self, req: AlgorithmRequest) -> AlgorithmResult:
        return self._call(run_cumulative_layerwise, req)
