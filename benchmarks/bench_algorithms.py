"""Every debugging algorithm on PP-OCRv4 det with one planted fault: time, QNN sessions, rank.

    python benchmarks/bench_algorithms.py [--case det/weight_channel/mid] [--work DIR]
        [--algorithms oneshot,layerwise,cumulative,binary,dissection] [--min_graph_size 16]

The fault is planted with the fault zoo (``benchmarks/zoo/plant.py``); its culprit layers are
what a ranking must name. Oneshot runs first (framework diagnosis, quantization, the QNN
engine, verification, ranking); the others reuse its golden tensors and QDQ model, as the
zoo does, so their wall time is the algorithm's own. The deep analyzer dissects back from
the first tensor failing oneshot's verification. Printed per algorithm: wall time, QNN
sessions created (oneshot: the engine's QNN processes, one session each) and the best
``culprit_rank`` of a planted-fault layer (``-`` = not named).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")

from benchmarks.zoo import models as zoo_models  # noqa: E402
from benchmarks.zoo import runner, scoring  # noqa: E402

ALGORITHMS = ("oneshot", "layerwise", "cumulative", "binary", "dissection")


def engine_sessions(engine_run: Path) -> int:
    """QNN sessions of an engine run: one per QNN child process its log records."""
    text = (engine_run / "log.txt").read_text(encoding="utf-8", errors="replace")
    return len(re.findall(r"\[running [^\]]* on QNN", text))


def below(qdq_path: Path, fault: str, steps: int = 3) -> tuple[str | None, int]:
    """The first layer after ``fault`` (execution order) whose dissection reaches the fault's
    layer at iteration ``steps`` or later."""
    from accdbg.algorithms.dissection import Cuts
    from accdbg.algorithms.fragments import QdqModel

    qdq = QdqModel.load(qdq_path)
    at = next((layer for layer in qdq.layers if layer.name == fault), None)
    if at is None:
        return None, 0
    for layer in qdq.layers[at.position + 1 :]:
        cuts = Cuts(qdq, layer)
        plan = cuts.automatic(steps)
        if len(plan) == steps and at.node_index in cuts.cone(plan[-1]):
            if at.node_index not in cuts.cone(plan[-2]):
                return layer.name, steps
    return None, 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", default="det/weight_channel/mid", help="model/kind/depth of the zoo")
    p.add_argument(
        "--work", default=None, help="working folder (default: a temporary one, removed)"
    )
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--min_graph_size", type=int, default=16, help="binary snooping (default 16)")
    args = p.parse_args(argv)
    wanted = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    bad = [a for a in wanted if a not in ALGORITHMS]
    if bad:
        raise SystemExit(
            f"--algorithms {bad[0]!r} is not known; expected some of: {', '.join(ALGORITHMS)}"
        )
    logging.getLogger("accdbg").setLevel(logging.WARNING)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="accdbg-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, wanted, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, wanted: list[str], work: Path) -> int:
    from accdbg.algorithms.binary import run_binary
    from accdbg.algorithms.cumulative import run_cumulative_layerwise
    from accdbg.algorithms.dissection import run_dissection
    from accdbg.algorithms.layerwise import run_layerwise
    from accdbg.algorithms.oneshot import run_oneshot

    cases, dropped = runner.build_cases([args.case], work)
    if not cases:
        raise SystemExit(f"{args.case}: not planted ({dropped[0][1] if dropped else 'unknown'})")
    case = cases[0]
    spec = zoo_models.MODELS[case.fault.model]
    inputs = runner._inputs(spec, work / "models")
    kwargs = {"quantization_overrides": str(case.overrides)} if case.overrides else {}
    w = case.folder / "w"
    shutil.rmtree(w, ignore_errors=True)
    print(f"case {case.name}: {case.fault.detail}")
    print(f"planted-fault layers: {', '.join(case.fault.culprits)}")
    rows = []

    def record(
        name: str, seconds: float, sessions: int, table, column: str, note: str = ""
    ) -> None:
        s = scoring.score(column, table, case.fault.culprits)
        rows.append((name, seconds, sessions, s["best_rank"], s["named"], note))
        best = "-" if math.isnan(s["best_rank"]) else int(s["best_rank"])
        print(f"  {name}: {seconds:.1f} s, {sessions} session(s), rank {best}", flush=True)

    t = time.perf_counter()
    one = run_oneshot(
        "onnx",
        case.model_path,
        inputs,
        engine_kwargs=kwargs,
        working_dir=w,
        output_dirname="oneshot",
    )
    if "oneshot" in wanted:
        record(
            "oneshot",
            time.perf_counter() - t,
            engine_sessions(one.engine_run),
            one.summary,
            "oneshot",
        )
    qdq = next(one.engine_run.glob("*.qdq.onnx"))
    golden = one.golden_dir
    snoop = dict(golden_dir=golden, qdq_model=qdq, engine_kwargs=kwargs, working_dir=w)
    if "layerwise" in wanted:
        t = time.perf_counter()
        r = run_layerwise(case.model_path, inputs, output_dirname="layerwise", **snoop)
        record("layerwise", time.perf_counter() - t, r.sessions, r.report, "layerwise")
    if "cumulative" in wanted:
        t = time.perf_counter()
        r = run_cumulative_layerwise(case.model_path, inputs, output_dirname="cumulative", **snoop)
        record("cumulative-layerwise", time.perf_counter() - t, r.sessions, r.report, "layerwise")
    if "binary" in wanted:
        t = time.perf_counter()
        r = run_binary(
            case.model_path,
            inputs,
            output_dirname="binary",
            min_graph_size=args.min_graph_size,
            **snoop,
        )
        leaf = r.subgraphs[r.subgraphs["culprit_rank"] == 1]
        note = f"top subgraph {int(leaf['Ops'].iloc[0])} ops" if len(leaf) else ""
        record("binary", time.perf_counter() - t, r.sessions, r.report, "layerwise", note)
    if "dissection" in wanted:
        t = time.perf_counter()
        r = run_dissection(
            qdq,
            golden,
            inputs,
            verification_dir=one.verification_run,
            working_dir=w,
            output_dirname="dissection",
        )
        record(
            "deep analyzer",
            time.perf_counter() - t,
            r.sessions,
            r.report,
            "layerwise",
            f"problem tensor {r.problem_tensor}",
        )
    if "dissection" in wanted:
        # the first failing tensor may be a natural standout upstream of the fault; what the
        # analyzer does when told where to look: a tensor a few producer steps below the fault
        problem, steps = below(qdq, case.fault.culprits[0])
        if problem is not None:
            t = time.perf_counter()
            r = run_dissection(
                qdq,
                golden,
                inputs,
                problem_inference_tensor=problem,
                working_dir=w,
                output_dirname="dissection_named",
            )
            record(
                "deep analyzer (named)",
                time.perf_counter() - t,
                r.sessions,
                r.report,
                "layerwise",
                f"problem tensor {problem}, {steps} steps below the fault",
            )
    print()
    print(f"{'algorithm':<22}{'wall s':>9}{'sessions':>10}{'rank':>6}  named (top 5) / note")
    for name, secs, sessions, best, named, note in rows:
        rank = "-" if math.isnan(best) else str(int(best))
        print(
            f"{name:<22}{secs:>9.1f}{sessions:>10}{rank:>6}  {named}{'  [' + note + ']' if note else ''}"
        )
    print(
        "(snooping algorithms and the deep analyzer reuse oneshot's golden tensors and QDQ model)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
