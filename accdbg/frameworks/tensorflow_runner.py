"""TensorFlow 1.x frozen graphs (``.pb``) in a ``tf.compat.v1`` session, any tensor on demand.

Tensors are named as TensorFlow names them, ``scope/op:0``; ``-i input`` and ``-i input:0``
both work, as in the reference's samples. The given input dims are written into the
placeholders before import, so every tensor's shape is known before running (the memory
budget needs it). Parameters (``Const`` and what is computed from constants alone, such as
``weights/read``) are skipped unless ``--include_constants``. Activations are NHWC unless an op
says ``data_format: NCHW``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from accdbg.errors import AccdbgError
from accdbg.frameworks.base import FrameworkRunner, register
from accdbg.frameworks.layouts import NCHW, NHWC, LaidOutTensorInfo
from accdbg.frameworks.names import first_line, match_name, near
from accdbg.frameworks.versions import require

log = logging.getLogger("accdbg.framework_diagnosis")

_NO_DATA = {"NoOp", "Assert", "SaveV2", "RestoreV2"}


def check_graph_def_path(path: Path, what: str = "--model_path") -> None:
    """A frozen graph is one file: a folder (a SavedModel) or nothing is a one-line error."""
    if path.is_dir():
        raise AccdbgError(
            f"{what} {str(path)!r} is a folder (a SavedModel?); framework diagnosis takes a frozen "
            f"TF 1.x graph (.pb): freeze it with tf.compat.v1.graph_util.convert_variables_to_constants"
        )
    if not path.is_file():
        raise AccdbgError(f"{what} {str(path)!r} does not exist")


def load_graph_def(tf, path: Path, what: str = "--model_path"):
    """A GraphDef from a binary (or text) ``.pb``, or a one-line error."""
    check_graph_def_path(path, what)
    data = path.read_bytes()
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception:
        try:
            from google.protobuf import text_format

            text_format.Merge(data.decode("utf-8"), graph_def)
        except Exception:
            raise AccdbgError(f"{what} {str(path)!r} is not a TensorFlow GraphDef (.pb)") from None
    if not graph_def.node:
        raise AccdbgError(f"{what} {str(path)!r} is not a TensorFlow GraphDef (it has no nodes)")
    return graph_def


def tensor_name(given: str) -> str:
    """``'input'`` -> ``'input:0'``; names with an output index are kept."""
    head, _, tail = given.rpartition(":")
    return given if head and tail.isdigit() else f"{given}:0"


@register
class TensorFlowRunner(FrameworkRunner):
    """One session over the imported graph; each request fetches the asked tensors."""

    name = "tensorflow"
    layout = NHWC

    @classmethod
    def check_path(cls, path: Path) -> None:
        check_graph_def_path(path)

    def activate(self) -> None:
        tf = self.tf = require("tensorflow")
        graph_def = load_graph_def(tf, self.model_path)
        placeholders = {f"{n.name}:0": n for n in graph_def.node if n.op == "Placeholder"}
        described = ", ".join(_describe(n) for n in placeholders.values()) or "(none)"
        self.feed_names: dict[str, str] = {}
        for t in self.inputs:
            name = match_name(tensor_name(t.name), list(placeholders))
            if name is None:
                raise AccdbgError(
                    f"--input_tensor {t.name!r} is not an input (Placeholder) of the model; its inputs are: {described}"
                )
            self.feed_names[t.name] = name
            _fix_placeholder(tf, placeholders[name], t)
        missing = [n for n in placeholders if n not in self.feed_names.values()]
        if missing:
            raise AccdbgError(
                f"model input {missing[0]!r} has no --input_tensor; the model's inputs are: {described}"
            )
        self.graph = tf.Graph()
        try:
            with self.graph.as_default():
                tf.compat.v1.import_graph_def(graph_def, name="")
        except Exception as exc:
            raise AccdbgError(
                f"TensorFlow could not import {str(self.model_path)!r}: {first_line(exc)}"
            ) from None
        self._tensors = self._list_tensors()
        config = tf.compat.v1.ConfigProto()
        if self.options.disable_graph_optimization:
            config.graph_options.rewrite_options.disable_meta_optimizer = True
            config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)

    def _list_tensors(self) -> list[LaidOutTensorInfo]:
        ops = _topological(self.graph.get_operations())
        consumed = {t.name for op in ops for t in op.inputs}
        constant: set[str] = set()  # op names computed from constants alone
        layouts: dict[str, str] = {}
        infos: list[LaidOutTensorInfo] = []
        self.graph_outputs: list[str] = []
        for op in ops:
            if op.type == "Placeholder":
                for t in op.outputs:
                    layouts[t.name] = NHWC
                continue
            srcs = [t.op.name for t in op.inputs]
            if op.type == "Const" or (srcs and all(s in constant for s in srcs)):
                constant.add(op.name)
                if not self.options.include_constants:
                    continue
            if op.type in _NO_DATA:
                continue
            fmt = _data_format(op)
            for i, t in enumerate(op.outputs):
                if i > 0 and t.name not in consumed:  # e.g. FusedBatchNorm's batch statistics
                    continue
                if (
                    not t.dtype.is_numpy_compatible
                    or t.dtype.is_quantized
                    or t.dtype.name in ("string", "resource", "variant")
                ):
                    continue
                shape = tuple(t.shape.as_list()) if t.shape.is_fully_defined() else None
                rank = t.shape.rank
                layout = None
                if rank == 4:
                    layout = fmt or next(
                        (layouts[s.name] for s in op.inputs if s.name in layouts), NHWC
                    )
                    layouts[t.name] = layout
                infos.append(
                    LaidOutTensorInfo(
                        name=t.name,
                        node=op.name,
                        op_type=op.type,
                        index=len(infos),
                        dtype=np.dtype(t.dtype.as_numpy_dtype),
                        shape=shape,
                        layout=layout,
                    )
                )
                if i == 0 and t.name not in consumed and op.name not in constant:
                    self.graph_outputs.append(t.name)
        return infos

    def tensors(self) -> list[LaidOutTensorInfo]:
        return self._tensors

    def check_outputs(self, names: Sequence[str], what: str = "-o/--output_tensor") -> None:
        known = [t.name for op in self.graph.get_operations() for t in op.outputs]
        for name in names:
            if match_name(tensor_name(name), known) is None:
                raise AccdbgError(
                    f"{what} {name!r} is not a tensor of the model{near(name, known)}"
                )

    def infer(self, feeds, outputs):
        feed_dict = {self.feed_names[n]: np.asarray(v) for n, v in feeds.items()}
        try:
            values = self.session.run(list(outputs), feed_dict)
        except Exception as exc:
            raise AccdbgError(
                f"TensorFlow failed to run {str(self.model_path)!r}: {first_line(exc)}"
            ) from None
        return {n: np.asarray(v) for n, v in zip(outputs, values, strict=True)}

    def deactivate(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()
        self.session = None


def _describe(node) -> str:
    shape = node.attr["shape"].shape
    dims = (
        "?"
        if shape.unknown_rank
        else ",".join("?" if d.size < 0 else str(d.size) for d in shape.dim)
    )
    return f"{node.name}:0 [{dims}]"


def _fix_placeholder(tf, node, t) -> None:
    """Write the given dims into the placeholder, checking rank and static dims."""
    shape = node.attr["shape"].shape
    if not shape.unknown_rank and shape.dim:
        model = [d.size for d in shape.dim]
        shown = ",".join("?" if d < 0 else str(d) for d in model)
        if len(model) != len(t.dims):
            raise AccdbgError(
                f"--input_tensor {t.name!r}: dims {','.join(map(str, t.dims))} have rank {len(t.dims)}, "
                f"the model expects rank {len(model)} [{shown}]"
            )
        for i, (m, g) in enumerate(zip(model, t.dims, strict=True)):
            if m > 0 and m != g:
                raise AccdbgError(
                    f"--input_tensor {t.name!r}: dim {i} is {g}, the model fixes it to {m} (model input [{shown}])"
                )
    want = np.dtype(t.dtype)
    model_dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
    if model_dtype.as_numpy_dtype != want.type:
        raise AccdbgError(
            f"--input_tensor {t.name!r} is {want.name}, the model input {node.name!r} is {model_dtype.name}; "
            f"give the data as {model_dtype.name}"
        )
    shape.unknown_rank = False
    del shape.dim[:]
    for d in t.dims:
        shape.dim.add().size = int(d)


def _data_format(op) -> str | None:
    try:
        fmt = op.get_attr("data_format")
    except (ValueError, AttributeError):
        return None
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    return NCHW if fmt == "NCHW" else (NHWC if fmt == "NHWC" else None)


def _topological(ops):
    """Operations in dependency order (GraphDefs need not be sorted)."""
    done: set[str] = set()
    ordered = []
    pending = list(ops)
    while pending:
        rest = []
        for op in pending:
            deps = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
            if all(d in done for d in deps):
                ordered.append(op)
                done.add(op.name)
            else:
                rest.append(op)
        if len(rest) == len(pending):  # a cycle (while loops): keep graph order
            ordered.extend(rest)
            break
        pending = rest
    return ordered
