"""Executors: items per second of the same work on each executor, in one run.

    python benchmarks/bench_executors.py [--items 80] [--qnn_items 200] [--repeats 3] [--no_ray]

Two workers: a CPU-bound numpy one (matrix products, one BLAS thread per process) and a QNN
HTP session held per worker on ``examples/tiny_cnn`` quantized (one session built per worker,
then one inference per item). Each executor first runs one item per worker (its start-up:
processes, imports, sessions; Ray's own start-up is reported apart), then the timed items.
Printed: steady items/s per executor, the scaling efficiency of 2 local workers
(2-worker throughput / (2 x 1-worker)), the start-up costs and this process's peak RSS.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# one BLAS thread per process: the workers, not BLAS, are what scales here
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")
os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from accdbg.core.executors import ExecutorConfig, WorkerSpec, get_executor  # noqa: E402

CONFIGS = [
    ("serial", ExecutorConfig("serial")),
    ("local x1", ExecutorConfig("local", 1)),
    ("local x2", ExecutorConfig("local", 2)),
    ("ray x2", ExecutorConfig("ray", 2)),
]


def tiny_qdq(out: Path) -> Path:
    import onnx

    from accdbg.core.inputs import parse_input_tensor
    from accdbg.engines.options import EngineConfig
    from accdbg.engines.pipeline import Calibration, prepare_model

    folder = REPO / "examples" / "tiny_cnn"
    model = onnx.load(str(folder / "model.onnx"))
    x = parse_input_tensor(["image", "1,3,32,32", str(folder / "input.raw")])
    calib = Calibration.from_inputs(model, None, [x])
    return prepare_model(model, "tiny", calib, EngineConfig(), out).path


def measure(config: ExecutorConfig, spec: WorkerSpec, n: int, repeats: int) -> dict:
    """Start-up (executor + one item per worker), then ``n`` timed items (the best of
    ``repeats`` runs); values checked."""
    t0 = time.perf_counter()
    ex = get_executor(config)
    made = time.perf_counter() - t0
    try:
        warm = list(ex.map(spec, [(f"w{i}", 10_000 + i) for i in range(config.workers)]))
        startup = time.perf_counter() - t0
        seconds = math.inf
        for _ in range(repeats):  # the best of a few: other work on the machine only slows
            t = time.perf_counter()
            outs = list(ex.map(spec, [(f"i{i}", i) for i in range(n)]))
            seconds = min(seconds, time.perf_counter() - t)
    finally:
        ex.close()
    bad = [o for o in warm + outs if not o.ok]
    if bad:
        raise SystemExit(f"{config.name}: {bad[0].key}: {bad[0].error}")
    return {
        "items/s": n / seconds,
        "startup": startup,
        "ray_init": getattr(ex, "startup_seconds", None),
        "made": made,
        "values": {o.key: o.value for o in outs},
    }


def digest(value) -> bytes:
    return value["value"].tobytes() if isinstance(value, dict) else value


def report(title: str, spec: WorkerSpec, n: int, configs, repeats: int) -> None:
    print(f"\n{title}: {n} items, best of {repeats}")
    print(f"  {'executor':<10} {'items/s':>9} {'start-up s':>11}")
    res = {}
    for name, config in configs:
        res[name] = r = measure(config, spec, n, repeats)
        extra = f"  (Ray itself: {r['ray_init']:.2f} s)" if r["ray_init"] is not None else ""
        print(f"  {name:<10} {r['items/s']:9.2f} {r['startup']:11.2f}{extra}")
    ref = {k: digest(v) for k, v in res["serial"]["values"].items()}
    same = all({k: digest(v) for k, v in r["values"].items()} == ref for r in res.values())
    print(f"  values byte-identical across executors: {same}")
    if "local x1" in res and "local x2" in res:
        eff = res["local x2"]["items/s"] / (2 * res["local x1"]["items/s"])
        print(f"  scaling efficiency, 2 local workers: {eff:.2f}")
    if "ray x2" in res and "local x2" in res:
        ratio = res["ray x2"]["items/s"] / res["local x2"]["items/s"]
        print(f"  ray x2 / local x2 throughput: {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=80, help="numpy items")
    ap.add_argument("--qnn_items", type=int, default=200, help="QNN items (one inference each)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per executor (best kept)")
    ap.add_argument("--no_ray", action="store_true", help="leave Ray out")
    args = ap.parse_args()
    configs = [c for c in CONFIGS if not (args.no_ray and c[1].name == "ray")]
    print(f"{os.cpu_count()} CPU(s); numpy with one BLAS thread per process")
    report(
        "numpy worker (tanh(x x^T), 256x256, 12 rounds)",
        WorkerSpec("tests.executor_workers:Numpy", {"size": 256, "rounds": 12}),
        args.items,
        configs,
        args.repeats,
    )
    with tempfile.TemporaryDirectory(prefix="bench-executors-") as tmp:
        qdq = tiny_qdq(Path(tmp))
        spec = WorkerSpec(
            "tests.executor_workers:QnnSession",
            {"model_path": str(qdq)},
        )
        report(
            "QNN HTP session worker (tiny_cnn, 1x3x32x32)",
            spec,
            args.qnn_items,
            configs,
            args.repeats,
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this (parent) process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
