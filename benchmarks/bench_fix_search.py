"""The fix search's cost, in units of one oneshot, on real models.

For each case: one oneshot-layerwise run (the diagnosis), then the fix search chained after it
on the same inputs; prints the oneshot's and the search's wall time, their ratio (target: a
search closing >= 80 % of the gap spends <= 10x one oneshot), the QNN sessions the search
used, and what it found (gap closed, best fix).

Cases: ``cls`` - PP-OCR's direction classifier with a planted fault (one output channel's
weights blown up, ``benchmarks/zoo/plant.py``); ``det`` - PP-OCRv4 det as shipped (its own
8-bit error is what the search works on; minutes per session in HTP emulation).

Usage: python benchmarks/bench_fix_search.py [--cases cls det] [--workers N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accdbg.algorithms.fixes import run_fix_search  # noqa: E402
from accdbg.algorithms.oneshot import run_oneshot  # noqa: E402
from accdbg.core.inputs import parse_input_tensor  # noqa: E402
from benchmarks.zoo import models as zoo_models  # noqa: E402
from benchmarks.zoo.runner import build_cases  # noqa: E402


def case_inputs(name: str, out: Path) -> tuple[Path, Path, list]:
    """(model, input list, -i) of a case."""
    if name == "cls":
        cases, dropped = build_cases(["cls/weight_channel/mid"], out / "zoo")
        if not cases:
            raise SystemExit(f"no cls case: {dropped}")
        fault = json.loads((cases[0].folder / "fault.json").read_text())
        print(f"cls: planted {fault['detail']}")
        model, listing = cases[0].model_path, Path(fault["input_list"])
        spec = zoo_models.MODELS["cls"]
    else:
        spec = zoo_models.MODELS[name]
        prep = zoo_models.prepare(spec, out / "models")
        model = out / f"{name}.onnx"
        import onnx

        onnx.save(prep.model, str(model))
        listing = prep.input_list
    first = listing.read_text().split()[0]
    dims = ",".join(map(str, spec.dims))
    return model, listing, [parse_input_tensor([spec.input_name, dims, first])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["cls"], choices=["cls", "det"])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_fix_search_"))
    for name in args.cases:
        model, listing, inputs = case_inputs(name, out)
        work = out / "work" / name
        t = time.perf_counter()
        one = run_oneshot("onnx", model, inputs, input_list=listing, working_dir=work)
        oneshot_s = time.perf_counter() - t
        t = time.perf_counter()
        res = run_fix_search(
            model,
            inputs,
            input_list=listing,
            diagnosis=one.summary,
            target_gap=0.8,
            workers=args.workers,
            working_dir=work,
        )
        search_s = time.perf_counter() - t
        gap = res.best.get("gap closed")
        print(
            f"{name}: oneshot {oneshot_s:.1f} s; fix search {search_s:.1f} s = "
            f"{search_s / oneshot_s:.1f}x one oneshot; {res.sessions} QNN session(s), "
            f"{len(res.candidates)} measurement(s); gap closed {100 * (gap or 0):.0f}% "
            f"({res.baseline.get('SQNR mean'):.2f} -> {res.best.get('SQNR mean'):.2f} dB); "
            f"best fix: {' + '.join(res.accepted) or 'none'}"
        )


if __name__ == "__main__":
    main()
