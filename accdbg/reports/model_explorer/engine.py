"""What an inference-engine run tells the overlays: the model it started from, its QDQ
model, and which layers it left on the CPU (``partitioning.json``)."""

from __future__ import annotations

from pathlib import Path

from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def cpu_marks(partitioning: str | Path, qdq_model: str | Path) -> dict[tuple[str, ...], str]:
    """{candidate names: why the layer ran on the CPU} from an engine run's
    ``partitioning.json``.

    Its node names are the QDQ model's. A Q/DQ node on the CPU belongs to the layer whose
    output it (de)quantizes: the names met walking back to that layer's node (the DQ's
    output, which is the original name of a graph output, the Q's input, the node's own
    output and name) are the candidates, tried in order on the source model.
    """
    import onnx

    info = read_json(partitioning, "partitioning.json")
    try:
        model = onnx.load(str(qdq_model), load_external_data=False)
    except Exception as exc:
        raise AccdbgError(f"cannot read the QDQ model {str(qdq_model)!r}: {exc}") from None
    nodes = {n.name: n for n in model.graph.node if n.name}
    producer = {o: n for n in model.graph.node for o in n.output}
    out: dict[tuple[str, ...], list[str]] = {}
    for rec in info.get("cpu_nodes", []):
        node = nodes.get(rec.get("name", ""))
        if node is None or not node.output:
            continue
        what = rec.get("type") or node.op_type
        names = [node.output[0]]
        for _ in range(4):
            if node is None or node.op_type not in QDQ_OPS or not node.input:
                break
            what = f"its {rec.get('type') or node.op_type}"
            names.append(node.input[0])
            node = producer.get(node.input[0])
        if node is not None:
            names += [*node.output[:1], node.name]
        key = tuple(dict.fromkeys(n for n in names if n))
        out.setdefault(key, []).append(f"{what}: {rec.get('reason', '')}".rstrip(": "))
    return {k: "; ".join(v) for k, v in out.items()}


def engine_model(engine_run: str | Path | None) -> tuple[Path | None, Path | None]:
    """The model an engine run started from (its ``-m``: the float or converted ONNX
    model) and its QDQ model, from the files it wrote; None for what it does not say."""
    if engine_run is None:
        return None, None
    engine_run = Path(engine_run)
    model = None
    options = engine_run / "inference_engine_options.json"
    if options.is_file():
        data = read_json(options, "inference_engine_options.json")
        path = data.get("model_path") if data.get("stage", "source") != "compiled" else None
        model = Path(path) if path and Path(path).is_file() else None
    qdq = sorted(engine_run.glob("*.qdq.onnx"))
    return model, (qdq[0] if len(qdq) == 1 else None)
