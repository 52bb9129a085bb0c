"""From culprit to cure, in a notebook: diagnose, then search a fix measured on QNN HTP.

    python examples/fix_search.py [OUTPUT_DIR]

Debugs the bundled tiny CNN (oneshot), hands its culprit ranking to the fix search, and prints
the candidates it measured on the QNN HTP backend - every one quantized with the inference
engine's own pipeline and run over every input - and the command that reproduces the best.
"""

import sys
from pathlib import Path

from accdbg.algorithms.fixes import run_fix_search
from accdbg.algorithms.oneshot import run_oneshot
from accdbg.core.inputs import parse_input_tensor

HERE = Path(__file__).resolve().parent
work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("working_directory")
model = HERE / "tiny_cnn" / "model.onnx"
image = parse_input_tensor(["image", "1,3,32,32", str(HERE / "tiny_cnn" / "input.raw")])

diagnosis = run_oneshot("onnx", model, [image], working_dir=work)
fixes = run_fix_search(
    model, [image], diagnosis=diagnosis.summary, target_gap=0.9, working_dir=work
)

table = fixes.candidates  # a DataFrame: one row per candidate measured on QNN HTP
columns = ["round", "change", "status", "accepted", "SQNR mean", "gap closed", "16-bit tensors"]
print(table[columns].to_string(index=False))
print("\n".join(fixes.findings))
print(f"reproduce: {fixes.reproduce}")
