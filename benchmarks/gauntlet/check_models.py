"""Check that every gauntlet model runs in onnxruntime (CPU, float) on its rendered inputs and
gives finite outputs, before any accdbg run is spent on it.

    python -m benchmarks.gauntlet.check_models [NAME ...] [--n 3] [--out DIR]

Prints one line per model: name, input shapes, output shapes, seconds, ok or the error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.gauntlet.models import GauntletModel, iter_models


def check(model: GauntletModel, n: int, out_dir: Path) -> tuple[bool, str]:
    """Build or locate the model, render ``n`` input sets, run each; the line to print."""
    import onnxruntime as ort

    start = time.perf_counter()
    ins = " ".join(f"{s.name}[{s.cli_dims}]{s.dtype}" for s in model.inputs)
    try:
        path = model.onnx_path()
        sets = model.render_inputs(n, out_dir / model.name, seed=0)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        shapes: list[str] = []
        for paths in sets:
            feed = {
                s.name: np.fromfile(paths[s.name], dtype=s.dtype).reshape(s.dims)
                for s in model.inputs
            }
            outs = sess.run(None, feed)
            bad = [o.name for o, v in zip(sess.get_outputs(), outs, strict=True)
                   if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all()]  # fmt: skip
            if bad:
                raise ValueError(f"non-finite outputs: {', '.join(bad)}")
            shapes = [
                f"{o.name}{list(v.shape)}" for o, v in zip(sess.get_outputs(), outs, strict=True)
            ]
        size = path.stat().st_size / 1e6
        secs = time.perf_counter() - start
        return (
            True,
            f"{model.name:15s} in: {ins} | out: {' '.join(shapes)} | {size:.1f} MB | {secs:.1f}s"
            " | ok",
        )
    except Exception as err:  # one line per model, whatever broke
        secs = time.perf_counter() - start
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (
            False,
            f"{model.name:15s} in: {ins} | {secs:.1f}s | error: {type(err).__name__}: {first}",
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models to check (default: all)")
    ap.add_argument("--n", type=int, default=3, help="input sets per model (default 3)")
    ap.add_argument("--out", type=Path, help="where the inputs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for model in iter_models(args.names):
            passed, line = check(model, args.n, out)
            print(line, flush=True)
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
