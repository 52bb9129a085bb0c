"""Dataset mode at scale: inputs per second per executor, start-up, peak memory and disk vs N.

    python benchmarks/bench_dataset.py [--case cls|det|tiny] [--n 20 200] [--configs local:1 local:2 ray:2]

On a real model (default: PP-OCR's text-direction classifier from rapidocr-onnxruntime; ``det``
is PP-OCRv4 det at 320x320), with inputs generated from one image by flips, shifts and noise,
it prints, measured in this one invocation:

* for N = the first ``--n``: inputs per second of each executor configuration (the scoring
  phase, worker start-up included) and the scaling efficiency of 2 local workers over 1
  (throughput(2) / (2 x throughput(1)));
* Ray's start-up cost (a bare local ``ray.init`` + shutdown, and the ray run's scoring time
  over the local run with as many workers);
* for every N (with the first configuration): peak RSS of the parent and of the largest worker,
  and the bytes on disk of the run (tables, journal, the K kept inputs' tensors): what grows
  with N is only the score table and journal.

Each run is its own process (peak RSS is per process).
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
    if spec is None:
        sys.exit("install the model first: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    models = Path(spec.submodule_search_locations[0]) / "models"
    if name == "cls":
        return (
            models / "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "x",
            (1, 3, 48, 192),
            text_image(48, 192, seed=1),
        )
    return (
        models / "ch_PP-OCRv4_det_infer.onnx",
        "x",
        (1, 3, 320, 320),
        text_image(320, 320, seed=1),
    )


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
        scoring = result.seconds.get("scoring", float("nan"))
        return {
            "n": n,
            "executor": f"{executor}:{workers}",
            "wall s": round(wall, 1),
            "scoring s": round(scoring, 1),
            "inputs/s": round(n / scoring, 2),
            **{k: round(v, 3) for k, v in result.figures.items()},
            "layers": len(result.layers),
            "score table rows": len(result.scores),
        }


def _run(case: str, n: int, config: str, keep: int) -> dict:
    executor, _, workers = config.partition(":")
    cmd = [sys.executable, __file__, "--case", case, "--keep_worst", str(keep)]
    cmd += ["--executor", executor, "--workers", workers or "1", "--one", str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{config} N={n} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ray_startup() -> float:
    code = (
        "import time, ray; t = time.perf_counter(); "
        "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False); "
        "ray.shutdown(); print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="cls", choices=["cls", "det", "tiny"])
    p.add_argument("--n", type=int, nargs="+", default=[20, 200])
    p.add_argument("--configs", nargs="+", default=["local:1", "local:2", "ray:2"])
    p.add_argument("--keep_worst", type=int, default=2)
    p.add_argument("--executor", default="serial", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.case, a.one, a.executor, a.workers, a.keep_worst)))
        return
    first = a.n[0]
    print(f"== {a.case}: N = {first}, throughput per executor (K = {a.keep_worst})", flush=True)
    runs = {}
    for config in a.configs:
        runs[config] = _run(a.case, first, config, a.keep_worst)
        print(json.dumps(runs[config]), flush=True)
    rate = {c: r["inputs/s"] for c, r in runs.items()}
    if "local:1" in rate and "local:2" in rate:
        print(f"scaling efficiency, 2 local workers: {rate['local:2'] / (2 * rate['local:1']):.2f}")
    if any(c.startswith("ray") for c in a.configs):
        print(f"Ray start-up (bare local ray.init + shutdown): {_ray_startup():.1f} s")
        for c in [c for c in a.configs if c.startswith("ray")]:
            local = "local:" + c.partition(":")[2]
            if local in runs:
                extra = runs[c]["scoring s"] - runs[local]["scoring s"]
                print(f"{c} scoring over {local}: {extra:+.1f} s")
    base = a.configs[0]
    print(f"== {a.case}: memory and disk vs N ({base}, K = {a.keep_worst})", flush=True)
    by_n = {first: runs[base]}
    for n in a.n[1:]:
        by_n[n] = _run(a.case, n, base, a.keep_worst)
    keys = ["parent peak RSS MB", "worker peak RSS MB", "run folder MB", "kept tensors MB"]
    print("N      " + "  ".join(f"{k:>20}" for k in keys))
    for n, r in by_n.items():
        print(f"{n:<6} " + "  ".join(f"{r.get(k, float('nan')):>20.1f}" for k in keys))
    if len(by_n) > 1:
        lo, hi = min(by_n), max(by_n)
        for k in ("worker peak RSS MB", "run folder MB"):
            if k in by_n[lo] and k in by_n[hi]:
                print(f"{k}: N={hi} over N={lo}: {by_n[hi][k] / by_n[lo][k]:.2f}x")


if __name__ == "__main__":
    main()
