"""Dataset mode's cost: time per input, peak RSS and disk, for N inputs, on a real model.

    python benchmarks/bench_dataset.py [--case det|tiny] [--n 20 200] [--executor serial] [--workers 1]

Each N runs in its own process (peak RSS is per process), on inputs generated from one
image by flips, crops (shifts) and noise. Prints, per N: wall time, seconds per input in the
worker, the process's peak RSS (with the serial executor the worker is this process) and
the run folder's bytes (kept tensors included, K = --keep_worst).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _case(name: str) -> tuple[Path, str, tuple[int, ...], np.ndarray]:
    if name == "tiny":
        x = np.fromfile(REPO / "examples/tiny_cnn/input.raw", np.float32).reshape(1, 3, 32, 32)
        return REPO / "examples/tiny_cnn/model.onnx", "image", (1, 3, 32, 32), x
    import importlib.util

    sys.path.insert(0, str(REPO))
    from tests.images import text_image

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    model = Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
    return model, "x", (1, 3, 320, 320), text_image(320, 320, seed=1)


def _inputs(base: np.ndarray, n: int, folder: Path) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        x = base.copy()
        if i % 2:
            x = x[..., ::-1]
        x = np.roll(x, shift=(int(rng.integers(-4, 5)), int(rng.integers(-4, 5))), axis=(2, 3))
        x = x + rng.normal(0, 0.02 * (i % 5), x.shape)
        path = folder / f"in{i}.raw"
        np.ascontiguousarray(x, dtype=np.float32).tofile(path)
        lines.append(str(path))
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    return folder / "list.txt"


def one(case: str, n: int, executor: str, workers: int, keep: int) -> dict:
    sys.path.insert(0, str(REPO))
    from accdbg.algorithms.dataset import run_dataset
    from accdbg.core.executors import ExecutorConfig
    from accdbg.core.inputs import InputTensor

    model, name, dims, base = _case(case)
    with tempfile.TemporaryDirectory(prefix="bench-dataset-") as tmp:
        lst = _inputs(base, n, Path(tmp))
        t = time.perf_counter()
        result = run_dataset(
            "onnx",
            model,
            [InputTensor(name, dims, Path(tmp) / "in0.raw", np.dtype("float32"))],
            input_list=lst,
            engine_kwargs={"runtime": "htp"},
            executor=ExecutorConfig(name=executor, workers=workers),
            keep_worst=keep,
            working_dir=Path(tmp) / "wd",
        )
        wall = time.perf_counter() - t
        return {
            "n": n,
            "wall s": round(wall, 1),
            "scoring s": round(result.seconds.get("scoring", float("nan")), 1),
            **{k: round(v, 3) for k, v in result.figures.items()},
            "layers": len(result.layers),
            "score table rows": len(result.scores),
        }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="det", choices=["det", "tiny"])
    p.add_argument("--n", type=int, nargs="+", default=[20, 200])
    p.add_argument("--executor", default="serial")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--keep_worst", type=int, default=2)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.case, a.one, a.executor, a.workers, a.keep_worst)))
        return
    for n in a.n:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--case",
                a.case,
                "--executor",
                a.executor,
                "--workers",
                str(a.workers),
                "--keep_worst",
                str(a.keep_worst),
                "--one",
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
