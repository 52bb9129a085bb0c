"""accdbg's fault zoo: real models with planted faults; does the culprit ranking name them?

    python benchmarks/fault_zoo.py [--quick] [--algorithms oneshot,layerwise,cumulative]
        [--models det,rec,cls,face] [--kinds weight_outlier,...] [--out DIR] [--jobs N]
        [--keep-tensors]

Prints, per algorithm and fault kind, hit@1 and hit@3 of ``culprit_rank`` (overall and by what
the fault costs the outputs on QNN) and the false alarms on the clean models; writes ``cases.csv``
(one row per case and algorithm) and ``summary.md`` to ``--out``. See benchmarks/zoo/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")

from benchmarks.zoo import models as zoo_models  # noqa: E402
from benchmarks.zoo import plant as zoo_plant  # noqa: E402
from benchmarks.zoo import runner, scoring  # noqa: E402


def _list(text: str, known, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in known]
    if bad:
        raise SystemExit(f"--{what} {bad[0]!r} is not known; expected some of: {', '.join(known)}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default="oneshot,layerwise,cumulative")
    p.add_argument(
        "--models",
        default=",".join(zoo_models.MODELS),
        help=f"held out from the design, not run by default: {','.join(zoo_models.HELD_OUT)}",
    )
    p.add_argument("--kinds", default=",".join(zoo_plant.KINDS))
    p.add_argument(
        "--cases", default="", help="explicit case names model/kind/depth, comma-separated"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"only {len(runner.QUICK)} cases, oneshot and layerwise",
    )
    p.add_argument("--out", default="fault_zoo_out")
    p.add_argument("--jobs", type=int, default=1, help="cases run in parallel")
    p.add_argument(
        "--cumulative-depths",
        default="mid",
        help="depths cumulative-layerwise (the slowest) runs on, besides clean cases; 'all' for every case",
    )
    p.add_argument(
        "--cumulative-models",
        default="det,cls,face",
        help="models cumulative-layerwise runs on (rec's runs take minutes each)",
    )
    p.add_argument(
        "--every-case",
        action="store_true",
        help="also rec's early and late cases (by default only its mid ones and weight outliers)",
    )
    p.add_argument("--rerun", action="store_true", help="ignore results cached in --out")
    p.add_argument(
        "--keep-tensors",
        action="store_true",
        help="keep every case's tensor dumps (GBs over the zoo; by default a planted case's go "
        "once it ran, keeping the SQNRs the summary needs)",
    )
    p.add_argument(
        "--keep-harmless",
        action="store_true",
        help="keep every planting at its drawn strength, whether the quantized outputs feel "
        "it or not (by default a planting must cost them >= 3 dB on QNN: made stronger or "
        "moved until it does, else left out)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def _run_one(args: tuple) -> list[dict]:
    case, algorithms, out, rerun, workers, keep_tensors = args
    logging.getLogger("accdbg").setLevel(logging.WARNING)
    return runner.run_case(case, algorithms, out, rerun, workers, keep_tensors)


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if a.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    logging.getLogger("fault_zoo").setLevel(logging.INFO)
    algorithms = _list(a.algorithms, runner.ALGORITHMS, "algorithms")
    if a.quick:
        wanted = list(runner.QUICK)
        if a.algorithms == parse_args([]).algorithms:
            algorithms = ["oneshot", "layerwise"]
    elif a.cases:
        wanted = [c.strip() for c in a.cases.split(",") if c.strip()]
    else:
        wanted = runner.case_names(
            _list(a.models, zoo_models.EVERY_MODEL, "models"),
            _list(a.kinds, zoo_plant.KINDS, "kinds"),
            a.every_case,
        )
    out = Path(a.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cases, dropped = runner.build_cases(wanted, out, a.seed, gate=not a.keep_harmless)
    print(
        f"{len(cases)} cases planted in {time.perf_counter() - t0:.0f} s; {len(dropped)} left out"
    )
    for name, why in dropped:
        print(f"  left out {name}: {why}")
    if not cases:
        print("no case left to run")
        return 1
    workers = runner.default_workers(a.jobs)
    cum_depths = (
        set(zoo_plant.DEPTHS)
        if a.cumulative_depths == "all"
        else set(a.cumulative_depths.split(","))
    )

    cum_models = set(a.cumulative_models.split(","))

    def algos(case) -> list[str]:
        if case.fault.model in cum_models and (
            case.fault.kind == "clean" or case.fault.depth in cum_depths
        ):
            return algorithms
        return [x for x in algorithms if x != "cumulative"]

    jobs = [(c, algos(c), out, a.rerun, workers, a.keep_tensors) for c in cases]
    results: list[dict] = []
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            for case, rows in zip(cases, pool.map(_run_one, jobs), strict=True):
                results += rows
                _progress(case, rows)
    else:
        for job in jobs:
            rows = _run_one(job)
            results += rows
            _progress(job[0], rows)
    df = runner.to_frame(results)
    df = runner.with_harm(df)
    df.to_csv(out / "cases.csv", index=False)
    table = scoring.summary_table(df, zoo_plant.KINDS)
    total = time.perf_counter() - t0
    md = report_markdown(table, df, dropped, algorithms, total)
    (out / "summary.md").write_text(md)
    print()
    print(md)
    print(f"per-case results: {out / 'cases.csv'}")
    return 0


def _progress(case, rows) -> None:
    parts = []
    for r in rows:
        rank = r.get("best_rank")
        rank = "-" if rank is None or rank != rank else int(rank)
        parts.append(
            f"{r['algorithm']} {r.get('status', '?')[:40]} rank {rank} {r.get('seconds', 0)}s"
        )
    print(f"{case.name:40s} " + "; ".join(parts), flush=True)


def markdown(df) -> str:
    """A DataFrame as a Markdown table (pandas' to_markdown needs tabulate)."""
    cols = [str(c) for c in df.columns]
    rows = [["" if v != v else str(v) for v in r] for r in df.itertuples(index=False)]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def report_markdown(table, df, dropped, algorithms, seconds: float) -> str:
    ranking = sorted(set(df.get("ranking", []).dropna())) if "ranking" in df else []
    lines = [
        "# accdbg fault zoo",
        "",
        f"Ranking: {', '.join(ranking) or '-'}; algorithms: {', '.join(algorithms)}; "
        f"{df['case'].nunique()} cases; runs took {df['seconds'].sum() / 60:.1f} min in all "
        f"(this invocation {seconds / 60:.1f} min; results cached in --out are reused).",
        "",
        markdown(table),
        "",
        "hit@k: a layer of the culprit set has culprit_rank <= k. False alarms: clean models "
        "where some layer has a culprit_rank, except layers named as the backend's on a model "
        "whose plain QNN run's outputs are 3 dB or more under the CPU fake-quant's on one of "
        "the input list's lines (listed below). Outputs lose: the SQNR the fault costs the "
        "model's outputs (logits for a softmax/sigmoid output) against the model without it, "
        "on QNN HTP (oneshot runs). Every fault kept cost them >= 3 dB in a plain QNN run when "
        "it was planted (benchmarks/zoo/harm.py; unless --keep-harmless); a planting they do "
        "not feel is left out below, with each strength and site tried.",
    ]
    clean = df[(df["kind"] == "clean") & (df["status"] == "ok")]
    real = scoring.real_backend(clean)
    if not real.empty:
        lines += ["", "Named on a clean model, and not a false alarm:", ""] + [
            f"* {r['model']}, {r['algorithm']}: only the backend's ({r['named']}); its plain QNN "
            f"run's outputs are {r['backend_gap_db']:.1f} dB under onnxruntime's CPU fake-quant "
            "of the same QDQ model: the shipped model diverges on the backend"
            for _, r in real.iterrows()
        ]
    if dropped:
        lines += ["", "Left out:", ""] + [f"* {n}: {why}" for n, why in dropped]
    secs = df.groupby(["model", "algorithm"])["seconds"].median().unstack()
    lines += ["", "Median seconds per run:", "", markdown(secs.round(1).reset_index())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
