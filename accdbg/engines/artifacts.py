"""Files an inference-engine run leaves beside ``output/`` for verification and users."""

from __future__ import annotations

import json
from pathlib import Path

from accdbg.core.run_dir import write_json_atomic
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines.exposure import Exposed
from accdbg.mapping.tensor_mapping import map_to_golden


def merge_qnn_json(json_dir: Path, out_path: Path, qdq_model: Path | None = None) -> Path | None:
    """One ``model_net.json`` from the QNN EP's per-partition graph dumps.

    With one QNN partition the file is the EP's own; with several, their ``graph.nodes`` and
    ``graph.tensors`` are merged and ``partitions`` lists the source graphs. The EP's dump
    garbles per-channel encodings, so those are filled in from the QDQ model QNN was given
    (marked ``accdbg_filled_from``).
    """
    files = sorted(p for p in json_dir.glob("*.json") if not p.name.endswith("_tensor_log.json"))
    if not files:
        return None
    merged: dict = {}
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not merged:
            merged = data
            merged.setdefault("graph", {}).setdefault("nodes", {})
            merged["graph"].setdefault("tensors", {})
            merged["partitions"] = [path.stem]
            continue
        merged["graph"]["nodes"].update(data.get("graph", {}).get("nodes", {}))
        merged["graph"]["tensors"].update(data.get("graph", {}).get("tensors", {}))
        merged["partitions"].append(path.stem)
    if qdq_model is not None:
        import onnx

        from accdbg.encodings import fill_per_channel_from_qdq

        fill_per_channel_from_qdq(merged, onnx.load(str(qdq_model), load_external_data=False))
    write_json_atomic(out_path, merged)
    return out_path


def qnn_tensor_names(model_net: Path | None) -> dict[str, dict]:
    if model_net is None or not model_net.exists():
        return {}
    return json.loads(model_net.read_text(encoding="utf-8")).get("graph", {}).get("tensors", {})


def qnn_name_for(e: Exposed, qnn_tensors: dict[str, dict]) -> str | None:
    """The QNN graph's name for an exposed tensor (the EP names node-unit outputs after the Q)."""
    q = e.q_output or e.graph_tensor
    for cand in (q, q.removesuffix("_Output"), e.graph_tensor, e.qdq_tensor, e.name):
        if cand in qnn_tensors:
            return cand
    return None


def tensor_mapping(exposed: list[Exposed], golden_names: set[str] | None) -> dict[str, str]:
    """Inference tensor name -> framework tensor name, from the float model's names when
    known, else best effort against a golden folder (the exposed name, then the QDQ name):
    :func:`accdbg.mapping.tensor_mapping.map_to_golden`."""
    return map_to_golden(
        ((e.name, e.framework_name, (e.name, e.qdq_tensor)) for e in exposed), golden_names
    )


def golden_names(folder: Path | None) -> set[str] | None:
    if folder is None:
        return None
    return set(TensorFolder(folder).names())


def graph_struct_layers(exposed: list[Exposed], shapes: dict[str, list[int]]) -> list[dict]:
    """Layers in execution order, as verification orders its rows (written by
    :func:`accdbg.mapping.graph_struct.write_graph_struct`)."""
    layers = []
    dumped = {e.qdq_tensor: e.name for e in exposed}  # inputs under the names rows use
    for i, e in enumerate(sorted(exposed, key=lambda e: e.index)):
        shape = shapes.get(e.name)
        layers.append(
            {
                "index": i,
                "name": e.node,
                "type": e.op_type,
                "inputs": [dumped.get(x, x) for x in e.inputs],
                "outputs": [e.name],
                "output_shapes": {e.name: shape},
                "layouts": {e.name: "NCHW" if shape is not None and len(shape) == 4 else None},
                "quantized": e.quantized,
            }
        )
    return layers
