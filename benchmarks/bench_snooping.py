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
    """Peak resident set size so far: this process, and the largest child process (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, child


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", default=None, help="working directory (default: a temporary one, removed)"
    )
    parser.add_argument("--act_bitwidth", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("accdbg").setLevel(logging.WARNING)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="accdbg-bench-"))
    model = ppocr_det()
    inputs = [parse_input_tensor(["x", "1,3,320,320", str(image(work / "x.raw"))])]
    engine_kwargs = {"act_bitwidth": args.act_bitwidth, "weights_bitwidth": 8}
    rows = []
    try:
        t = time.perf_counter()
        golden = run_framework_diagnosis("onnx", model, inputs, working_dir=work / "oneshot")
        engine = run_inference_engine(
            model, input_tensors=inputs, working_dir=work / "oneshot", **engine_kwargs
        )
        run_verification(golden.run_dir, engine.run_dir, working_dir=work / "oneshot")
        oneshot = time.perf_counter() - t
        rows.append(
            ("oneshot", oneshot, engine.report.sessions, len(engine.tensors), *peak_rss_mb())
        )

        t = time.perf_counter()
        lw = run_layerwise(
            model, inputs, engine_kwargs=engine_kwargs, working_dir=work / "layerwise"
        )
        rows.append(
            ("layerwise", time.perf_counter() - t, lw.sessions, len(lw.report), *peak_rss_mb())
        )

        t = time.perf_counter()
        cu = run_cumulative_layerwise(
            model, inputs, engine_kwargs=engine_kwargs, working_dir=work / "cumulative"
        )
        parts = int((cu.report["Status"] == "part").sum())
        rows.append(
            (
                "cumulative-layerwise",
                time.perf_counter() - t,
                cu.sessions,
                len(cu.report),
                *peak_rss_mb(),
            )
        )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    print(
        f"PP-OCRv4 det, 1x3x320x320, A{args.act_bitwidth}W8, QNN HTP (x86_64 emulation), CosineSimilarity"
    )
    print(
        f"{'algorithm':<22}{'wall s':>9}{'x oneshot':>11}{'sessions':>10}{'layers':>8}"
        f"{'peak RSS MB':>13}{'child peak MB':>15}"
    )
    for name, sec, sessions, layers, own, child in rows:
        print(
            f"{name:<22}{sec:>9.1f}{sec / oneshot:>11.2f}{sessions:>10d}{layers:>8d}{own:>13.0f}{child:>15.0f}"
        )
    lw_ratio, cu_ratio = rows[1][1] / oneshot, rows[2][1] / oneshot
    print(
        f"cumulative-layerwise: {parts} partition point(s), {rows[2][2]} session(s) for {rows[2][3]} layers "
        f"(the reference tool compiles one model per layer)"
    )
    print(
        f"targets: layerwise {lw_ratio:.2f}x <= {LAYERWISE_TARGET:g}x: {'met' if lw_ratio <= LAYERWISE_TARGET else 'MISSED'}; "
        f"cumulative-layerwise {cu_ratio:.2f}x <= {CUMULATIVE_TARGET:g}x: "
        f"{'met' if cu_ratio <= CUMULATIVE_TARGET else 'MISSED'}"
    )
    return 0 if lw_ratio <= LAYERWISE_TARGET and cu_ratio <= CUMULATIVE_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
