"""The peer on the fault zoo: AIMET's QuantAnalyzer per-layer sensitivity, scored like accdbg.

    python benchmarks/aimet_peer.py [--zoo fault_zoo_out] [--analyses enabled,disabled]

Runs on the cases a ``benchmarks/fault_zoo.py`` run planted and ran (``--zoo``, its ``--out``):
for each, AIMET's simulation of the same pre-processed float model (8-bit per-tensor, min/max
over the same inputs, the case's ``-qo`` overrides) ranks every layer by the outputs' SQNR with
only its quantizers enabled (``enabled``, QuantAnalyzer's first per-layer analysis) or only
them disabled (``disabled``, its second; ten times slower). Prints hit@1/hit@3 per fault kind
beside accdbg's rows of the same cases (the zoo's ``cases.csv``, with what each fault costs
the outputs on QNN) and writes ``aimet_cases.csv``. Each case's ranking is cached in its
folder. Needs ``aimet_onnx`` (see benchmarks/zoo/aimet_peer.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.fault_zoo import markdown  # noqa: E402
from benchmarks.zoo import aimet_peer, scoring  # noqa: E402
from benchmarks.zoo import models as zoo_models  # noqa: E402
from benchmarks.zoo import plant as zoo_plant  # noqa: E402
from benchmarks.zoo.probe import load_feeds  # noqa: E402


def run_case(folder: Path, analyses: list[str]) -> dict[str, pd.DataFrame]:
    """The case's AIMET tables, from its cache when they are there."""
    cached = {a: folder / f"aimet_{a}.csv" for a in analyses}
    if all(p.is_file() for p in cached.values()):
        return {f"aimet_{a}": pd.read_csv(p) for a, p in cached.items()}
    fault = json.loads((folder / "fault.json").read_text())
    spec = zoo_models.EVERY_MODEL[fault["model"]]
    paths = [Path(p) for p in Path(fault["input_list"]).read_text().split()]
    feeds = load_feeds(paths, spec.input_name, spec.dims)
    prepared = next((folder / "w" / "inference_engine" / "oneshot").glob("*.prepared.onnx"))
    overrides = folder / "overrides.encodings"
    tables = aimet_peer.rank_case(
        prepared,
        feeds,
        overrides if overrides.is_file() else None,
        [f"aimet_{a}" for a in analyses],
    )
    for a, p in cached.items():
        tables[f"aimet_{a}"].to_csv(p, index=False)
    return tables


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", default="fault_zoo_out", help="a fault_zoo.py --out folder")
    p.add_argument("--analyses", default="enabled", help="enabled, disabled or both")
    args = p.parse_args(argv)
    zoo = Path(args.zoo)
    analyses = [a.strip() for a in args.analyses.split(",") if a.strip()]
    bad = [a for a in analyses if f"aimet_{a}" not in aimet_peer.ANALYSES]
    if bad:
        raise SystemExit(f"--analyses {bad[0]!r} is not known; expected enabled and/or disabled")
    cases_csv = zoo / "cases.csv"
    if not cases_csv.is_file():
        raise SystemExit(f"{cases_csv} not found: run benchmarks/fault_zoo.py --out {zoo} first")
    ours = pd.read_csv(cases_csv)
    rows = []
    for _, case in ours[ours["algorithm"] == "oneshot"].iterrows():
        folder = Path(case["folder"])
        culprits = [] if case["kind"] == "clean" else str(case["culprits"]).split(" | ")
        t = time.perf_counter()
        try:
            tables = run_case(folder, analyses)
        except Exception as exc:  # the peer failing on a case is a row, not the end
            for algo in (f"aimet_{a}" for a in analyses):
                rows.append(case.to_dict() | {"algorithm": algo, "status": f"failed: {exc}"})
            print(f"{case['case']:<40} aimet failed: {str(exc).splitlines()[0]}", flush=True)
            continue
        secs = time.perf_counter() - t
        for algo, table in tables.items():
            scored = scoring.score(algo, table, culprits)
            rows.append(case.to_dict() | scored | {"algorithm": algo, "seconds": round(secs, 1)})
        print(
            f"{case['case']:<40} "
            + "; ".join(f"{r['algorithm']} rank {r['best_rank']}" for r in rows[-len(tables) :])
            + f" {secs:.0f}s",
            flush=True,
        )
    df = scoring.with_defaults(pd.DataFrame(rows))
    df.to_csv(zoo / "aimet_cases.csv", index=False)
    both = pd.concat([ours[ours["algorithm"] == "oneshot"], df], ignore_index=True)
    table = scoring.summary_table(both, zoo_plant.KINDS)
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
