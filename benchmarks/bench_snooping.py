"""Layerwise and cumulative-layerwise snooping against oneshot, on the real PP-OCRv4 det model.

    python benchmarks/bench_snooping.py [--work DIR] [--act_bitwidth 8]

All three run in this process from the float model (1,3,320,320), each with its own framework
diagnosis and quantization, so the ratios compare whole runs measured alike:

* oneshot    = framework diagnosis + ``run_inference_engine`` (QNN HTP, every layer dumped)
               + verification;
* layerwise  = ``run_layerwise`` (framework diagnosis, quantization, single-layer fragments
               batched into few sessions);
* cumulative = ``run_cumulative_layerwise`` (one session per partition point).

Targets (issue 7): layerwise <= 5x oneshot, cumulative-layerwise <= 10x. Also printed: QNN
sessions each created, and peak RSS (this process, and the largest child process).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accdbg.algorithms import run_cumulative_layerwise, run_layerwise
from accdbg.core.inputs import parse_input_tensor
from accdbg.engines import run_inference_engine
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.verifiers.verification import run_verification

LAYERWISE_TARGET, CUMULATIVE_TARGET = 5.0, 10.0


def ppocr_det() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the model first: pip install --no-deps rapidocr-onnxruntime==1.4.4")
    return Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"


def image(path: Path) -> Path:
    """The test suite's deterministic image-like input (tests/conftest.py ppocr_input)."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:320, 0:320] / 320.0
    img = np.stack([np.sin(6 * xx) * np.cos(4 * yy), xx - yy, (xx * yy) ** 0.5]).astype(np.float32)
    img += 0.05 * rng.standard_normal(img.shape).astype(np.float32)
    img[None].astype(np.float32).tofile(path)
    return path


def peak_rss_mb() -> tuple[float, float]:
    """``getrusage`` peak RSS so far (Linux: KiB): this process, and the largest child. A
    child's ``ru_maxrss`` includes this process's RSS at the time it was started (Linux keeps
    the pre-exec high-water mark), so it is never below the first number."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, child


@dataclass
class Row:
    name: str
    seconds: float
    sessions: int
    layers: int
    self_peak_mb: float  # getrusage, so far in this process
    children_peak_mb: float  # getrusage, largest child so far (includes our RSS at its start)
    backend_peak_mb: float | None = None  # the largest backend child's own VmHWM


def measure(name: str, fn) -> tuple[Row, object]:
    t = time.perf_counter()
    result, sessions, layers, backend = fn()
    return Row(name, time.perf_counter() - t, sessions, layers, *peak_rss_mb(), backend), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", default=None, help="working directory (default: a temporary one, removed)"
    )
    parser.add_argument("--act_bitwidth", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("accdbg").setLevel(logging.WARNING)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="accdbg-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model = ppocr_det()
    inputs = [parse_input_tensor(["x", "1,3,320,320", str(image(work / "x.raw"))])]
    kwargs = {"act_bitwidth": args.act_bitwidth, "weights_bitwidth": 8}

    def oneshot():
        golden = run_framework_diagnosis("onnx", model, inputs, working_dir=work / "oneshot")
        engine = run_inference_engine(
            model, input_tensors=inputs, working_dir=work / "oneshot", **kwargs
        )
        run_verification(golden.run_dir, engine.run_dir, working_dir=work / "oneshot")
        return engine, engine.report.sessions, len(engine.tensors), None

    def snooping(fn, folder):
        res = fn(model, inputs, engine_kwargs=kwargs, working_dir=work / folder)
        return res, res.sessions, len(res.report), res.backend_peak_rss_mb

    try:
        one, _ = measure("oneshot", oneshot)
        lw, _ = measure("layerwise", lambda: snooping(run_layerwise, "layerwise"))
        cu, cu_res = measure(
            "cumulative-layerwise", lambda: snooping(run_cumulative_layerwise, "cumulative")
        )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    print(
        f"PP-OCRv4 det, 1x3x320x320, A{args.act_bitwidth}W8, QNN HTP (x86_64 emulation), CosineSimilarity"
    )
    print(
        f"{'algorithm':<22}{'wall s':>8}{'x oneshot':>11}{'sessions':>10}{'layers':>8}"
        f"{'self MB':>9}{'children MB':>13}{'backend MB':>12}"
    )
    for r in (one, lw, cu):
        backend = f"{r.backend_peak_mb:>12.0f}" if r.backend_peak_mb is not None else f"{'-':>12}"
        print(
            f"{r.name:<22}{r.seconds:>8.1f}{r.seconds / one.seconds:>11.2f}{r.sessions:>10d}{r.layers:>8d}"
            f"{r.self_peak_mb:>9.0f}{r.children_peak_mb:>13.0f}{backend}"
        )
    print(
        "peak RSS (MB): self and children are getrusage maxima so far in this process (a child's includes "
        "this process's RSS when it started); backend is the largest backend child's own VmHWM"
    )
    parts = int((cu_res.report["Status"] == "part").sum())
    print(
        f"cumulative-layerwise: {parts} partition point(s), {cu.sessions} session(s) for {cu.layers} layers "
        "(the reference tool compiles one model per layer)"
    )
    lw_ratio, cu_ratio = lw.seconds / one.seconds, cu.seconds / one.seconds
    ok_lw, ok_cu = lw_ratio <= LAYERWISE_TARGET, cu_ratio <= CUMULATIVE_TARGET
    print(
        f"targets: layerwise {lw_ratio:.2f}x <= {LAYERWISE_TARGET:g}x: {'met' if ok_lw else 'MISSED'}; "
        f"cumulative-layerwise {cu_ratio:.2f}x <= {CUMULATIVE_TARGET:g}x: {'met' if ok_cu else 'MISSED'}"
    )
    return 0 if ok_lw and ok_cu else 1


if __name__ == "__main__":
    sys.exit(main())
