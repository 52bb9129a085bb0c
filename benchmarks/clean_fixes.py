"""Do the layers oneshot names on models as shipped deserve it? Their fix, measured on QNN.

    python benchmarks/clean_fixes.py --models det3,face,face_back [--out clean_fixes_out]
    python benchmarks/clean_fixes.py --zoo fault_zoo_out   # the planted cases a zoo run kept

On a clean model the fault zoo can only count a named layer as a false alarm. This asks the
backend instead: for each model (the zoo's models, as shipped, with the zoo's inputs) oneshot
runs, then the fix search (``--fix_search``, every candidate a QNN HTP session) starts from its
diagnosis. A named layer whose own candidates (per-channel or 16-bit weights, a 16-bit
activation, equalization) lift the outputs by about the share of their error oneshot says it
costs is a finding; one whose candidates move nothing is a name the backend does not back.
Prints per named layer the share oneshot gives it, its best own candidate in round 1 (dB over
the baseline, and the share of the outputs' error power that removes) and the best global knob.
Each model's runs are kept in ``--out/<model>/`` and reused. With ``--zoo`` (a
``fault_zoo.py --out`` folder whose cases kept their tensors) the same is asked of planted
cases, from their oneshot run: would the backend back the planted layer's name too
(``planted``)? A case planted through ``-qo`` encodings (clipping) is listed, not searched.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.fault_zoo import markdown  # noqa: E402
from benchmarks.zoo import models as zoo_models  # noqa: E402
from benchmarks.zoo.runner import TABLES  # noqa: E402

ROUND_BUDGET = 240.0  # seconds: the fix search starts no round after this (round 1 always runs)


def removed(gain_db: float) -> float:
    """The share of the outputs' error power an SQNR gain of ``gain_db`` removes."""
    return 1.0 - 10.0 ** (-gain_db / 10.0)


def _summary(work: Path) -> Path:
    """Oneshot's table in a working folder, as the zoo's runs write it."""
    return work / TABLES["oneshot"]


def _fixes(model: Path, inputs: list, input_list, work: Path, search: bool) -> pd.DataFrame:
    """The fix search's candidates from the oneshot diagnosis in ``work``: searched once
    (``search``, and only when the diagnosis names a layer), read from its ``fixes.csv`` after."""
    from accdbg.algorithms.fixes import run_fix_search

    summary, fixes = _summary(work), work / "fix_search" / "fix" / "fixes.csv"
    named = pd.read_csv(summary)["culprit_rank"].notna().any()
    if search and named and not fixes.is_file():
        run_fix_search(
            model,
            inputs,
            input_list=input_list,
            diagnosis=summary,
            time_budget=ROUND_BUDGET,
            working_dir=work,
            output_dirname="fix",
            model_explorer=False,
        )
    return pd.read_csv(fixes) if fixes.is_file() else pd.DataFrame()


def run_model(name: str, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Oneshot's summary and the fix search's candidates for one clean model (cached)."""
    from accdbg.algorithms.oneshot import run_oneshot

    spec = zoo_models.EVERY_MODEL[name]
    prep = zoo_models.prepare(spec, out)
    work = out / name / "w"
    inputs = [zoo_models.debugged_input(spec, prep.input_paths[0])]
    if not _summary(work).is_file():
        run_oneshot(
            "onnx",
            prep.onnx_path,
            inputs,
            input_list=prep.input_list,
            working_dir=work,
            output_dirname="oneshot",
            model_explorer=False,
        )
    fixes = _fixes(prep.onnx_path, inputs, prep.input_list, work, search=True)
    return pd.read_csv(_summary(work)), fixes


def run_case(folder: Path) -> tuple[str, pd.DataFrame, pd.DataFrame, list[str]]:
    """A zoo case's oneshot summary, its fix search's candidates (cached) and culprit set."""
    fault = json.loads((folder / "fault.json").read_text())
    spec = zoo_models.EVERY_MODEL[fault["model"]]
    first = Path(Path(fault["input_list"]).read_text().split()[0])
    work = folder / "w"
    # a case planted through -qo encodings (clipping) is not searched: the fix search starts
    # from quantizer flags, not from overrides
    fixes = _fixes(
        folder / "model.onnx",
        [zoo_models.debugged_input(spec, first)],
        fault["input_list"],
        work,
        search=not fault["overrides"],
    )
    case = f"{fault['model']}/{fault['kind']}/{fault['depth']}"
    return case, pd.read_csv(_summary(work)), fixes, list(fault["culprits"])


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{float(x):.0%}"


def rows(
    name: str, table: pd.DataFrame, fixes: pd.DataFrame, planted: Sequence[str] = ()
) -> list[dict]:
    """One row per named layer: what oneshot claims, what its own fix does on QNN
    (``planted``: a zoo case's culprit set, marked)."""
    named = table[table["culprit_rank"].notna()].sort_values("culprit_rank")
    if named.empty:
        return [{"model": name, "named": "-"}]

    def label(r: pd.Series) -> str:
        mark = " (planted)" if r["Name"] in planted else ""
        return f"#{int(r['culprit_rank'])} {r['Name']}{mark}"

    if fixes.empty:
        return [
            {"model": name, "named": label(r), "own best fix": "not searched"}
            for _, r in named.iterrows()
        ]
    ok = fixes[fixes["status"] == "ok"]
    base = float(ok[ok["change"] == "baseline"]["SQNR mean"].iloc[0])
    first = ok[ok["round"] == 1]
    best_global = first[first["scope"] == "global"]["SQNR mean"].max()
    out = []
    for _, r in named.iterrows():
        own = first[(first["scope"] == "local") & (first["layer"] == r["Name"])]
        best = own.loc[own["SQNR mean"].idxmax()] if not own.empty else None
        gain = float(best["SQNR mean"]) - base if best is not None else float("nan")
        out.append(
            {
                "model": name,
                "named": label(r),
                "alone": _pct(r.get("output error share")),
                "taken out": _pct(r.get("output error removed")),
                "baseline dB": round(base, 2),
                "own best fix": best["change"] if best is not None else "-",
                "own gain dB": round(gain, 2),
                "own removes": f"{removed(gain):.0%}" if best is not None else "-",
                "best global gain dB": round(float(best_global) - base, 2),
            }
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="det3,face,face_back,hand,iris")
    p.add_argument("--out", default="clean_fixes_out")
    p.add_argument("--zoo", help="a fault_zoo.py --out folder: its planted cases instead")
    a = p.parse_args(argv)
    out = Path(a.zoo or a.out)
    found = []
    cases = sorted(out.glob("cases/*/*/fault.json")) if a.zoo else []
    for fault in cases:
        if _summary(fault.parent / "w").is_file():
            t = time.perf_counter()
            case, table, fixes, planted = run_case(fault.parent)
            found.extend(rows(case, table, fixes, planted))
            print(f"{case}: {time.perf_counter() - t:.0f} s", flush=True)
    for name in [] if a.zoo else a.models.split(","):
        t = time.perf_counter()
        table, fixes = run_model(name, out)
        found.extend(rows(name, table, fixes))
        print(f"{name}: {time.perf_counter() - t:.0f} s", flush=True)
    frame = pd.DataFrame(found)
    frame.to_csv(out / "clean_fixes.csv", index=False)
    print(markdown(frame))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
