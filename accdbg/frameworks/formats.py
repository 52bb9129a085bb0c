"""What a model file is, told from its first bytes (and its name where the bytes cannot
tell): ``-f`` is checked against it before anything loads the model, so ``-f onnx`` with a
``.tflite`` file is one line naming both, not a parser's error from deep inside a run."""

from __future__ import annotations

from pathlib import Path

from accdbg.errors import AccdbgError

# what the file is, as the message says it
KINDS = {
    "onnx": "an ONNX model",
    "tflite": "a TFLite model (flatbuffer)",
    "tensorflow": "a TensorFlow GraphDef (.pb)",
    "pytorch": "a PyTorch model (an archive, .pt2 or TorchScript, or a .py factory)",
}


def model_format(path: str | Path) -> str | None:
    """The framework whose model file ``path`` is, or None when its bytes and name do not
    tell (then nothing is refused here: the framework's own loader judges it).

    A TFLite flatbuffer carries ``TFL3`` at bytes 4-8; ``.pt2`` and TorchScript files are
    zip archives; an ONNX ModelProto starts with its ``ir_version`` (protobuf field 1, a
    varint: byte 0x08) where a TensorFlow GraphDef starts with its nodes (field 1, a message:
    0x0a). A ``.py`` file is a PyTorch factory's source."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return None
    suffix = p.suffix.lower()
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:4] == b"PK\x03\x04":
        return "pytorch"
    if suffix == ".py":
        return "pytorch"
    if head[:1] == b"\x08" and suffix in (".onnx", ".pb", ""):
        return "onnx"
    if suffix == ".onnx":
        return "onnx"
    if suffix in (".pb", ".pbtxt"):
        return "tensorflow"
    return None


def check_model_format(framework: str, model_path: str | Path | None) -> None:
    """Refuse ``-f framework`` with a model file of another framework, in one line naming the
    file, what ``-f`` says and what the file is."""
    if model_path is None:
        return
    text = str(model_path)
    path = Path(text).expanduser()
    if not path.exists() and ":" in text:  # file.py:factory
        path = Path(text.rpartition(":")[0]).expanduser()
    found = model_format(path)
    wanted = framework.strip().lower()
    if found is None or found == wanted or wanted not in KINDS:
        return
    raise AccdbgError(
        f"-m/--model_path {str(model_path)!r} is {KINDS[found]}, but -f/--framework says "
        f"{wanted}: give -f {found}, or the {wanted} model"
    )
