"""A run's inferences: every ``-l`` line (else the ``-i`` files), checked, as feeds.

The same feeds are what the engine runs and what the model is calibrated on
(:func:`~accdbg.engines.pipeline.prepare_model`), for the engine and snooping alike.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx

from accdbg.core import onnx_model as om
from accdbg.core.inputs import (
    InputList,
    InputTensor,
    check_finite,
    check_raw_size,
    line_files,
    read_input,
    resolve_input_types,
)
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.inference_engine")

# one dict per inference (input-list line): model input -> (raw file, dims, the model's dtype
# name, the file's dtype name)
Feed = dict[str, tuple[str, tuple[int, ...], str, str]]
Feeds = list[Feed]


def load_feed(feed: Feed) -> dict[str, np.ndarray]:
    """One inference's arrays, read from the files of one :data:`Feeds` entry (a float32 file
    converted to the model's type, :func:`~accdbg.core.inputs.read_input`)."""
    return {
        n: read_input(p, dims, np.dtype(dt), np.dtype(st), f"input {n!r}")
        for n, (p, dims, dt, st) in feed.items()
    }


def build_feeds(
    model: onnx.ModelProto,
    input_list: InputList | None,
    input_tensors: Sequence[InputTensor],
    allow_nonfinite: bool = False,
    native: bool = False,
) -> tuple[Feeds, dict[str, tuple[int, ...]], dict[str, np.dtype]]:
    """Per-inference feeds, with every file checked against its input's dims and dtype, and
    for NaN/Inf (unless ``allow_nonfinite``).

    Every ``-l`` line is one inference (and one calibration sample); without ``-l`` the
    ``-i`` files are the only one. Dims and types come from ``-i``, else from the model. The
    files are float32, converted to the model's input types, unless ``native``
    (``--use_native_input_files``): then they are in the model's types, as qnn-net-run reads
    them (:func:`~accdbg.core.inputs.resolve_input_types`).
    """
    inputs = om.real_inputs(model)
    names = [vi.name for vi in inputs]
    model_types = {vi.name: t for vi in inputs if (t := om.elem_dtype(vi)) is not None}
    input_tensors = resolve_input_types(input_tensors, model_types, native)
    given = {t.name: t for t in input_tensors}
    om.check_given_inputs(model, input_tensors)
    # the -i dims against the model's rank and fixed dims, here, before any run folder: the
    # pre-processing that fixes the dims would refuse them only once a run had started
    om.check_input_dims(model, {t.name: t.dims for t in input_tensors})
    if input_list is not None:
        om.check_tensor_names(model, input_list.output_names, input_list.outputs_where)
    dims: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    stored: dict[str, np.dtype] = {}  # what each input's files hold
    for vi in inputs:
        static = om.dims_of(vi)
        if vi.name in given:
            dims[vi.name] = given[vi.name].dims
            dtypes[vi.name] = given[vi.name].dtype
            stored[vi.name] = given[vi.name].stored
        else:
            if not static or not all(isinstance(d, int) and d > 0 for d in static):
                raise AccdbgError(
                    f"model input {vi.name!r} has dynamic dims [{','.join('?' if not isinstance(d, int) else str(d) for d in static)}]; "
                    f"give them with -i/--input_tensor {vi.name!r} <dims> <file>"
                )
            dims[vi.name] = tuple(int(d) for d in static)
            dtypes[vi.name] = om.elem_dtype(vi) or np.dtype("float32")
            stored[vi.name] = dtypes[vi.name] if native else np.dtype("float32")
    feeds: Feeds = []
    if input_list is not None:
        for entry in input_list.entries:
            where = f"{input_list.path}:{entry.line_no}"
            known = f"an input of the model; its inputs are: {om.describe_inputs(model)}"
            files = line_files(entry, names, where, known)
            for n, p in files.items():
                check_raw_size(p, dims[n], stored[n], f"{where}: input {n!r}")
                check_finite(p, stored[n], f"{where}: input {n!r}", allow_nonfinite, dims[n])
                if stored[n] != dtypes[n]:  # its values fit the model's type: now, not mid-run
                    read_input(p, dims[n], dtypes[n], stored[n], f"{where}: input {n!r}")
            feeds.append(
                {n: (str(p), dims[n], dtypes[n].name, stored[n].name) for n, p in files.items()}
            )
    elif given:
        missing = [n for n in names if n not in given]
        if missing:
            raise AccdbgError(
                f"model input {missing[0]!r} has no --input_tensor and there is no --input_list"
            )
        for t in given.values():
            t.check(allow_nonfinite)
            if t.stored != t.dtype:  # its values fit the model's type: now, not mid-run
                t.load()
        feeds.append(
            {n: (str(given[n].path), dims[n], dtypes[n].name, stored[n].name) for n in names}
        )
    else:
        raise AccdbgError("give the inputs with -l/--input_list or -i/--input_tensor")
    return feeds, dims, dtypes
