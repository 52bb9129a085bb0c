"""The real-model gauntlet: every model through oneshot, layerwise, the fix search and dataset
mode, at A8W8 and A16W8, as a user runs them - one command each, in a scratch folder.

    python -m benchmarks.gauntlet.run [NAME ...] [--modes oneshot,layerwise,fix,dataset]
        [--precisions A8W8,A16W8] [--root /tmp/gauntlet] [--timeout 1800] [--inputs 2]

Per model, precision and mode it prints (and appends to ``ROOT/results.jsonl``): the exit
code, wall time, peak RSS of the process tree, the outputs' SQNR, what is named first and what
its fix gains on QNN (as the run's own files say), or the first line of its error. Runs go one
at a time (two cores: QNN emulation is single-threaded, two runs would slow each other). The
dumps are deleted after each run unless ``--keep``. The README's table (docs/benchmarks.md) is
this script's ``--table`` output.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil

from benchmarks.gauntlet.models import GauntletModel, iter_models

MODES = ("oneshot", "layerwise", "fix", "dataset")
PRECISIONS = {"A8W8": [], "A16W8": ["-abw", "16"]}


def _peak_rss(proc: subprocess.Popen, poll: float = 0.5) -> tuple[int, float]:
    """Wait for ``proc``; returns its exit code and the peak RSS (MB) of it and its children."""
    peak = 0.0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(
                c.memory_info().rss for c in ps.children(recursive=True)
            )
            peak = max(peak, rss / 2**20)
        except psutil.Error:
            pass
        time.sleep(poll)
    return proc.returncode, peak


def _latest(work: Path, component: str) -> Path | None:
    p = work / component / "latest"
    return p.resolve() if p.exists() else None


def _oneshot_facts(work: Path) -> dict:
    run = _latest(work, "verification")
    if run is None or not (run / "summary.json").is_file():
        return {}
    doc = json.loads((run / "summary.json").read_text())
    findings = doc.get("findings", [])
    out = {"verdict": findings[0] if findings else "", "fix": ""}
    culprits = doc.get("culprits") or []
    if culprits:
        c = culprits[0]
        v = c.get("verified") or {}
        out["named"] = f"{c['name']} ({c.get('kind', '')})"
        out["fix"] = f"{v.get('fix', '')} {_db(v.get('gain_db'))}".strip()
    last = findings[-1] if findings else ""
    if last.startswith("fix:") and not out["fix"]:
        out["fix"] = last.split(" -> ")[0].removeprefix("fix: ")
    out["sqnr"] = _sqnr_of(run)
    return out


def _sqnr_of(run: Path) -> float:
    """The worst graph output's SQNR of a verification run (its summary's output rows)."""
    try:
        df = pd.read_csv(run / "summary.csv")
        outs = json.loads((run / "summary.json").read_text()).get("outputs") or []
        rows = df[df["Name"].isin(outs)] if outs else df.tail(1)
        return float(pd.to_numeric(rows["SQNR"], errors="coerce").min())
    except Exception:
        return math.nan


def _layerwise_facts(work: Path) -> dict:
    run = _latest(work, "layerwise_snooping")
    if run is None:
        return {}
    culprits = (
        json.loads((run / "culprits.json").read_text()) if (run / "culprits.json").is_file() else []
    )
    out: dict = {"named": "", "fix": ""}
    if culprits:
        c, v = culprits[0], culprits[0].get("verified") or {}
        out["named"] = f"{c['name']} ({c.get('kind', '')})"
        out["fix"] = f"{v.get('fix', '')} {_db(v.get('gain_db'))}".strip()
    return out


def _fix_facts(work: Path) -> dict:
    run = _latest(work, "fix_search")
    if run is None or not (run / "findings.json").is_file():
        return {}
    findings = json.loads((run / "findings.json").read_text())
    return {"fix": next((f for f in findings if "->" in f), findings[-1] if findings else "")}


def _dataset_facts(work: Path) -> dict:
    run = _latest(work, "dataset")
    if run is None:
        return {}
    try:
        scores = pd.read_csv(run / "scores.csv")
        col = next(c for c in scores.columns if "SQNR" in c)
        return {"sqnr": float(pd.to_numeric(scores[col], errors="coerce").median())}
    except Exception:
        return {}


FACTS = {
    "oneshot": _oneshot_facts,
    "layerwise": _layerwise_facts,
    "fix": _fix_facts,
    "dataset": _dataset_facts,
}


def _db(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.1f} dB"


def command(model: GauntletModel, mode: str, precision: str, inputs: list[dict], folder: Path):
    """The command line a user would type for this mode."""
    lines = [" ".join(f"{n}:={p}" for n, p in line.items()) for line in inputs]
    listing = folder / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    cmd = ["qnn-accuracy-debugger", "-f", "onnx"]
    cmd += ["-m", str(model.onnx_path()), *model.cli_inputs(inputs[0]), "-l", str(listing)]
    cmd += ["-r", "htp", *PRECISIONS[precision]]
    if mode == "layerwise":
        cmd += ["--debugging_algorithm", "layerwise"]
    elif mode == "dataset":
        cmd += ["--dataset_mode"]
    elif mode == "fix":  # oneshot, then the fix search from its culprits
        cmd += ["--suggest_fixes", "--time_budget", "900"]
    return cmd


def run_one(model: GauntletModel, mode: str, precision: str, args) -> dict:
    folder = args.root / f"{model.name}-{precision}-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rec: dict = {"model": model.name, "family": model.family, "precision": precision, "mode": mode}
    try:
        inputs = model.render_inputs(args.inputs, folder / "inputs", seed=0)
        cmd = command(model, mode, precision, inputs, folder)
    except Exception as err:
        return {**rec, "rc": None, "error": f"setup: {type(err).__name__}: {err}"}
    rec["cmd"] = " ".join(cmd)
    start = time.perf_counter()
    with open(folder / "console.log", "w") as log:
        proc = subprocess.Popen(
            ["timeout", str(args.timeout), *cmd], cwd=folder, stdout=log, stderr=subprocess.STDOUT
        )
        rc, peak = _peak_rss(proc)
    rec.update(rc=rc, seconds=round(time.perf_counter() - start, 1), peak_rss_mb=round(peak))
    lines = (folder / "console.log").read_text(errors="replace").splitlines()
    if rc != 0:
        rec["error"] = next(
            (x for x in reversed(lines) if "error" in x.lower()), lines[-1] if lines else ""
        )
    work = folder / "working_directory"
    rec.update(FACTS[mode](work) if work.exists() else {})
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rec


def table(rows: list[dict]) -> str:
    """The markdown table of results (one row per model, precision and mode)."""
    head = "| model | family | precision | mode | exit | time s | peak RSS MB | outputs SQNR dB | named first | its fix on QNN |"
    out = [head, "|" + "---|" * 10]
    for r in rows:
        sq = r.get("sqnr")
        out.append(
            f"| {r['model']} | {r.get('family', '')} | {r['precision']} | {r['mode']} | {r.get('rc')} "
            f"| {r.get('seconds', '')} | {r.get('peak_rss_mb', '')} "
            f"| {'' if sq is None or not math.isfinite(sq) else f'{sq:.1f}'} "
            f"| {r.get('named', '') or ('-' if r.get('rc') == 0 else r.get('error', '')[:80])} "
            f"| {r.get('fix', '')[:90]} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--root", type=Path, default=Path("/tmp/gauntlet"))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--inputs", type=int, default=2, help="input-list lines rendered per model")
    ap.add_argument("--keep", action="store_true", help="keep each run's working_directory")
    ap.add_argument("--table", action="store_true", help="print the table of ROOT/results.jsonl")
    args = ap.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    results = args.root / "results.jsonl"
    if args.table:
        rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
        print(table(rows))
        return 0
    for model in iter_models(args.names):
        for precision in args.precisions.split(","):
            for mode in args.modes.split(","):
                rec = run_one(model, mode, precision, args)
                with open(results, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(table([rec]).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
