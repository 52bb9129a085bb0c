"""The Python API, as a notebook would use it: every step returns pandas DataFrames.

    python examples/notebook_api.py [OUTPUT_DIR]

Debugs the bundled tiny CNN on the QNN HTP backend, prints the layers adding the most error,
then compares the QNN run with the CPU fake-quant simulation of the same quantized model, to
tell a quantization problem (both engines off) from a backend one (only QNN off).
"""

import sys
from pathlib import Path

from accdbg.algorithms.oneshot import run_oneshot
from accdbg.core.inputs import parse_input_tensor
from accdbg.engines import run_inference_engine
from accdbg.verifiers.verification import run_verification

HERE = Path(__file__).resolve().parent
work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("working_directory")
image = parse_input_tensor(["image", "1,3,32,32", str(HERE / "tiny_cnn" / "input.raw")])

result = run_oneshot("onnx", HERE / "tiny_cnn" / "model.onnx", [image], working_dir=work)
table = result.summary[
    ["Name", "LayerType", "CosineSimilarity", "SQNR", "SQNR drop", "SQNR error added"]
]
print(table.sort_values("SQNR error added", ascending=False).head(3).to_string(index=False))

# same QDQ model on onnxruntime's CPU fake-quant: how far is QNN from the simulation?
qdq = next(result.engine_run.glob("*.qdq.onnx"))
sim = run_inference_engine(
    qdq, input_tensors=[image], stage="converted", engine="simulation", working_dir=work
)
qnn_vs_sim = run_verification(
    sim.results[0],
    result.engine_run / "output" / "Result_0",
    default_verifiers=["CosineSimilarity"],
    working_dir=work,
)
worst = qnn_vs_sim.summary.sort_values("CosineSimilarity").iloc[0]
print(
    f"QNN vs CPU simulation, least similar layer: {worst['Name']} (cosine {worst['CosineSimilarity']:.6f})"
)
print(f"report: {result.report}")
