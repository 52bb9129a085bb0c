"""One dataset worker: an input through the float golden and QNN, scored, then dropped.

Built once per worker process (or Ray actor) from a
:class:`~accdbg.core.executors.WorkerSpec` ``("accdbg.algorithms.dataset.worker:DatasetWorker",
kwargs)``: it keeps one float onnxruntime session (the framework runner framework diagnosis
uses, with its batches, so the golden values are the ones a diagnosis would dump) and ONE QNN
session of the debug graph (the engine's exposure of the selected tensors, built and checked
as the engine builds it). Each call runs one input through both, scores every layer with the
verifiers (the verification's own scoring step), computes the layer's partial statistics,
the final outputs' scores, and writes the tensors only when the parent says this input may be
kept. It returns small arrays; no tensor outlives the call.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accdbg.algorithms.dataset.stats import HIST_WIDTH, PARTIAL_WIDTH, encoding_edges, partial
from accdbg.core import onnx_model as om
from accdbg.core.batching import plan_batches
from accdbg.core.inputs import InputTensor
from accdbg.core.memory import own_peak_rss_mb
from accdbg.core.provenance import inputs_record
from accdbg.core.tensor_store import TensorWriter
from accdbg.engines.base import EngineOptions
from accdbg.engines.exposure import Exposed
from accdbg.engines.source import load_feed
from accdbg.engines.worker import Job, JobReport, checked_run, checked_session
from accdbg.frameworks.base import RunnerOptions, get_runner_class
from accdbg.mapping.layout import reconcile
from accdbg.verifiers import get_verifier
from accdbg.verifiers import status as row_status
from accdbg.verifiers.base import TensorPair, finite_range
from accdbg.verifiers.configured import configured_verifiers
from accdbg.verifiers.scoring import RANGE_COLUMNS, channel_columns, score_pair

GOLDEN_DIR, TARGET_DIR = "golden", "target"


def score_columns(verifier_specs: list) -> list[str]:
    """The numeric columns of a score row, in the order the worker fills them."""
    cvs = configured_verifiers(verifier_specs)
    return [cv.label for cv in cvs] + channel_columns(cvs) + RANGE_COLUMNS


def classifier_like(arr: np.ndarray) -> bool:
    """A [batch, classes] output (trailing size-1 axes allowed): top-1 means something."""
    shape = [d for d in arr.shape[1:] if d != 1] if arr.ndim >= 2 else []
    return len(shape) == 1 and shape[0] >= 2


def top1_agreement(golden: np.ndarray, target: np.ndarray) -> float:
    g = golden.reshape(golden.shape[0], -1)
    t = target.reshape(target.shape[0], -1)
    return float(np.mean(np.argmax(g, axis=1) == np.argmax(t, axis=1)))


def _as_stored(arr: np.ndarray) -> np.ndarray:
    """float64 of the float32 a tensor folder stores: a dump read back gives these values."""
    return np.asarray(arr).astype(np.float32, copy=False).astype(np.float64)


class DatasetWorker:
    """Golden and QNN sessions held for the worker's life; ``__call__`` scores one input."""

    def __init__(
        self,
        framework: str,
        model_path: str,
        input_tensors: list[InputTensor],
        runner_options: dict[str, Any],
        memory_budget_mb: float,
        target_model: str,
        engine: str,
        engine_options: EngineOptions,
        exposed: list[Exposed],
        golden_name: dict[str, str],
        verifiers: list,
        outputs: list[str],
        output_root: str,
    ):
        self.exposed = exposed
        self.golden_name = golden_name
        self.outputs = outputs
        self.root = Path(output_root)
        self.cvs = configured_verifiers(verifiers)
        self.columns = score_columns(verifiers)
        self.edges = [encoding_edges(e.scale, e.zero_point, e.native_dtype) for e in exposed]
        self.final_verifiers = {v: get_verifier(v) for v in ("SQNR", "CosineSimilarity")}
        self.rank_verifier = self.cvs[0].verifier
        # the float golden, as framework diagnosis computes it (same runner, same batches)
        opts = RunnerOptions(**runner_options)
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        opts.scratch_dir = logs / f".scratch-{os.getpid()}"
        self.runner = get_runner_class(framework)(Path(model_path), input_tensors, opts)
        self.runner.activate()
        infos = self.runner.tensors()
        self.infos = {i.name: i for i in infos}
        self.golden_batches = [
            [i.name for i in b]
            for b in plan_batches(infos, lambda i: i.nbytes, int(memory_budget_mb * 2**20))
        ]
        self.input_names = self.runner.model_input_order()
        # one QNN session of the debug graph: every selected tensor and the graph outputs
        model = onnx.load(target_model)
        names = list(dict.fromkeys([*outputs, *(e.graph_tensor for e in exposed)]))
        self.target_names = names
        self.job = Job(
            engine=engine,
            options=engine_options,
            model_path=target_model,
            exposed=exposed,
            feeds=[],
            output_root=str(self.root),
            native_log=str(logs / f"backend_log_{os.getpid()}.txt"),
        )
        self.report = JobReport()
        options = replace(engine_options, json_graph_dir=None, profiling_level=None)
        exposed_model = om.serialize(
            om.with_outputs(model, names), logs / f".scratch-{os.getpid()}"
        )
        self.session = checked_session(
            self.job, exposed_model, options, "debug session creation", self.report
        )
        # the session logs verbosely (placement is read from it), so every run would add
        # its lines: each run's native output goes to a file holding only the latest input's
        self.job = replace(self.job, native_log=str(logs / f"backend_run_{os.getpid()}.txt"))

    # ------------------------------------------------------------------ one input

    def _golden(self, feed: dict[str, tuple[str, tuple[int, ...], str]]) -> dict[str, np.ndarray]:
        arrays = load_feed(feed)
        values: dict[str, np.ndarray] = {}
        for batch in self.golden_batches:
            values.update(self.runner.infer(arrays, batch))
        return values

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        feed = item["feed"]
        golden = self._golden(feed)
        Path(self.job.native_log).write_bytes(b"")
        target = checked_run(self.session, self.target_names, feed, self.job, self.report)
        values = np.full((len(self.exposed), len(self.columns)), np.nan)
        statuses, faileds = [], []
        partials = np.full((len(self.exposed), PARTIAL_WIDTH), np.nan)
        hists = np.full((len(self.exposed), HIST_WIDTH), -1, dtype=np.int64)
        col = {c: j for j, c in enumerate(self.columns)}
        dumped: dict[str, np.ndarray] = {}
        for i, e in enumerate(self.exposed):
            row: dict[str, Any] = {"LayerType": e.op_type, "Status": ""}
            g_name = self.golden_name.get(e.name)
            t_arr32 = e.dequantize(target[e.graph_tensor]).astype(np.float32, copy=False)
            dumped[e.name] = t_arr32
            results = {}
            if g_name is None or g_name not in golden:
                row["Status"] = "missing in golden"
            else:
                g_arr = _as_stored(golden[g_name])
                row["golden_min"], row["golden_max"] = finite_range(g_arr)
                alignment = reconcile(g_arr.shape, t_arr32.shape)
                if not alignment.ok:
                    row["target_min"], row["target_max"] = finite_range(t_arr32.astype(np.float64))
                    row["Status"] = alignment.note
                else:
                    t_arr = alignment.apply(t_arr32).astype(np.float64)
                    scale = float(e.scale) if e.quantized else None
                    results = score_pair(row, g_arr, t_arr, scale, None, self.cvs)
                    partials[i], hists[i] = partial(g_arr, t_arr, self.edges[i])
            failed = [lab for lab, r in results.items() if r.passed is False]
            for lab, r in results.items():
                row[lab] = r.value
            for c, j in col.items():
                v = row.get(c)
                if v is not None:
                    values[i, j] = float(v)
            faileds.append(", ".join(failed))
            statuses.append(row_status.compose(failed, [row["Status"]]))
        final, top1, rank_value = self._finals(golden, target)
        badness = self._badness(rank_value)
        kept = self._may_keep(item, badness)
        if kept:
            self._write(item, golden, dumped)
        del golden, target, dumped
        return {
            "index": item["index"],
            "key": item["key"],
            "values": values,
            "status": statuses,
            "failed": faileds,
            "partials": partials,
            "hists": hists,
            "final": final,
            "top1": top1,
            "rank_value": rank_value,
            "badness": badness,
            "kept": kept,
            "seconds": time.perf_counter() - start,
            "peak_rss_mb": own_peak_rss_mb(),
            "worker_pid": os.getpid(),
        }

    def _finals(self, golden, target) -> tuple[dict[str, dict[str, float]], float | None, float]:
        """Each graph output's SQNR and cosine, top-1 agreement (classifier outputs), and the
        first verifier's worst value over the outputs (what --keep_worst ranks by)."""
        final: dict[str, dict[str, float]] = {}
        agreements, ranks = [], []
        for out in self.outputs:
            g_name = self.golden_name.get(out, out)
            if g_name not in golden or out not in target:
                continue
            g, t = _as_stored(golden[g_name]), _as_stored(target[out])
            if g.shape != t.shape:
                continue
            pair = TensorPair(g, t)
            final[out] = {k: v.verify(pair).value for k, v in self.final_verifiers.items()}
            r = self.rank_verifier.verify(pair).value
            ranks.append(r)
            if classifier_like(g):
                agreements.append(top1_agreement(g, t))
        top1 = float(np.mean(agreements)) if agreements else None
        hib = self.rank_verifier.higher_is_better
        finite = [r for r in ranks if not math.isnan(r)]
        if not finite:
            rank_value = math.nan
        else:
            rank_value = min(finite) if hib else max(finite)
        return final, top1, rank_value

    def _badness(self, value: float) -> float:
        """Higher is worse, whatever the verifier's direction; no score counts as worst."""
        if math.isnan(value):
            return math.inf
        return -value if self.rank_verifier.higher_is_better else value

    @staticmethod
    def _may_keep(item: dict[str, Any], badness: float) -> bool:
        """Named inputs always; otherwise while fewer than K are known, or when this input
        ranks before the K-th worst known when it was sent (ties: the lower line first)."""
        if item.get("named"):
            return True
        keep = item.get("keep", "no")
        if keep == "yes":
            return True
        if keep != "if_before":
            return False
        before = item["before"]
        return (-badness, item["index"]) < (float(before[0]), int(before[1]))

    def _write(self, item, golden: dict[str, np.ndarray], dumped: dict[str, np.ndarray]) -> None:
        """The input's golden and QNN tensors, in framework diagnosis' and the engine's
        ``Result_N`` format, so verification and tensor inspection run on them as they are."""
        key = item["key"]
        files = {n: p for n, (p, *_) in item["feed"].items()}
        meta = {"component": "dataset", "result": item["index"], "inputs": inputs_record(files)}
        gw = TensorWriter(self.root / GOLDEN_DIR / key, meta=meta)
        layout = getattr(self.runner, "layout", None)
        for name, info in self.infos.items():
            if name in golden:
                gw.write(
                    name,
                    golden[name],
                    node=info.node,
                    op_type=info.op_type,
                    index=info.index,
                    layout=getattr(info, "layout", layout),
                    **getattr(info, "extra", {}),
                )
        gw.save_manifest()
        tw = TensorWriter(self.root / TARGET_DIR / key, meta=meta)
        for e in self.exposed:
            tw.write(
                e.name,
                dumped[e.name],
                node=e.node,
                op_type=e.op_type,
                index=e.index,
                **e.encoding(),
            )
        tw.save_manifest()

    def close(self) -> None:
        self.session = None
        self.runner.deactivate()
