"""Where the backend parts from the quantization: QNN against onnxruntime's CPU fake-quant.

The same QDQ model runs on onnxruntime's CPU provider (every QuantizeLinear/DequantizeLinear
executed as written, in float) with every layer output exposed exactly as the QNN dump exposes it.
Both sides carry the same quantization; they differ by the kernels' rounding, which adds up
slowly along the graph. A layer where the QNN result suddenly parts from the CPU one, far
more than at its inputs, is a backend matter: fine in fake-quant, wrong on HTP.

Along a whole run those differences are inherited, and a saturating or mostly-zero layer turns
a small difference at its inputs into a large relative one. :func:`local_divergence` removes
that: each layer's CPU fake-quant is fed the backend's *own* values of its inputs (the integers
QNN wrote), so what is left is that layer's kernel alone - bit-exact on many layers of the
models measured, a rounding step on the others.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from accdbg.algorithms.diagnosis.policy import POLICY
from accdbg.core import onnx_model as om
from accdbg.core.cpu_session import exact_session
from accdbg.core.tensor_store import TensorFolder
from accdbg.engines.exposure import Exposed
from accdbg.verifiers.base import dot

log = logging.getLogger("accdbg.divergence")

# ops whose output the quantizer gives their input's encoding
KEEP_ENCODING = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")
HELD = 256 << 20  # bytes of the backend's dumps one CPU run of the local divergence is fed


class Divergences(dict):
    """Per layer, ``Σ(qnn - cpu)² / Σcpu²``; ``how`` says, for the layers that differ, how the
    backend's integers part from the fake-quant's (:func:`how_they_part`)."""

    def __init__(self) -> None:
        super().__init__()
        self.how: dict[str, str] = {}
        # for the layers that differ, the median difference in integer steps of the values
        # that differ: one is a rounding of the backend's requantization (a few values may
        # part by more), more a different computation
        self.steps: dict[str, float] = {}
        # with a golden: per layer, (QNN's error, the CPU fake-quant's error) against float,
        # each ``Σ(x - golden)² / Σgolden²``
        self.errors: dict[str, tuple[float, float]] = {}


def how_they_part(steps: np.ndarray) -> str:
    """How the backend's integers part from the fake-quant's (``steps``: backend minus CPU, in
    quantization steps): on what share of the values, by how much, and whether one way. One
    step, nearly always the same way, is a rounding bias of the backend's requantization - on a
    tensor crushed to a few levels it is much of the signal; more steps are a different
    computation."""
    steps = np.asarray(steps).ravel()
    nz = int(np.count_nonzero(steps))
    if nz == 0 or steps.size == 0:
        return ""
    below = int(np.count_nonzero(steps < 0))
    big = int(np.abs(steps).max())
    side, count = ("below", below) if below >= nz - below else ("above", nz - below)
    share = 100 * nz / steps.size
    text = f"QNN's integers differ on {share:{'.2g' if share < 10 else '.0f'}}% of the values"
    text += " by one step" if big == 1 else f" by up to {big} steps"
    if count >= POLICY.one_way * nz:
        text += f", {100 * count / nz:.0f}% of them {side} the fake-quant's"
        if big == 1:
            text += " (a rounding bias)"
    return text


def kept_integers(
    backend: np.ndarray, cpu: np.ndarray, inputs: Sequence[tuple[str, np.ndarray]]
) -> tuple[str, int] | None:
    """Where a Concat's backend integers part from the fake-quant's by more than a step, are
    they its inputs' own integers, copied in their encodings instead of requantized to the
    Concat's? ``inputs``: (name, the backend's integers) in the Concat's order. Returns the
    input holding most of those values and how many, when at least ``POLICY.copied`` of them are
    copies; None otherwise (or when the shapes do not make one concatenation)."""
    axis = _concat_axis(backend.shape, [v.shape for _, v in inputs])
    if axis is None:
        return None
    far = np.abs(backend.astype(np.int64) - cpu.astype(np.int64)) > 1
    if not far.any():
        return None
    copied = np.concatenate([v.astype(np.int64) for _, v in inputs], axis) == backend
    if np.count_nonzero(copied & far) < POLICY.copied * np.count_nonzero(far):
        return None
    sizes = np.cumsum([0] + [v.shape[axis] for _, v in inputs])
    counts = [
        int(np.count_nonzero(np.take(copied & far, range(a, b), axis=axis)))
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    best = int(np.argmax(counts))
    return inputs[best][0], counts[best]


def _concat_axis(out: tuple[int, ...], ins: Sequence[tuple[int, ...]]) -> int | None:
    """The one axis along which ``ins`` concatenate to ``out``."""
    for a in range(len(out)):
        rest = [s[:a] + s[a + 1 :] for s in ins]
        if all(len(s) == len(out) for s in ins) and all(r == out[:a] + out[a + 1 :] for r in rest):
            if sum(s[a] for s in ins) == out[a]:
                return a
    return None


def divergence(
    qdq_model: onnx.ModelProto,
    layers: Sequence[Exposed],
    feeds: Mapping[str, np.ndarray],
    target: TensorFolder,
    golden: Callable[[Exposed], np.ndarray | None] | None = None,
) -> Divergences:
    """Per layer: ``Σ(qnn - cpu)² / Σcpu²`` for every layer dumped in ``target``. With
    ``golden`` (a layer's float tensor, None when unknown), also each run's error against float
    (``errors``): two runs that round differently part by as much as either is from float
    without either being worse, so only the two errors say what the backend adds."""
    wanted = [e for e in layers if e.name in target]
    return _compare(qdq_model, wanted, dict(feeds), target, golden=golden)


def local_divergence(
    qdq_model: onnx.ModelProto,
    layers: Sequence[Exposed],
    feeds: Mapping[str, np.ndarray],
    target: TensorFolder,
    held: int = HELD,
) -> Divergences:
    """Per layer, as :func:`divergence`, but each layer's CPU fake-quant reads the backend's
    values of its inputs: a CPU run in which every dumped tensor's consumers are cut from
    their producer and fed the integers QNN computed for it. The layers are taken in parts of
    at most ``held`` bytes of dumps, each part's run fed only the dumps it reads: a big
    model's tensors are never all in memory at once."""
    wanted = [e for e in layers if e.name in target]
    model, cuts = _cut_plan(qdq_model, wanted, target)
    read = _reader(target)
    out = Divergences()
    for part in held_parts(wanted, target, held):
        sub, given, fed = _slice(model, cuts, [e.graph_tensor for e in part], feeds, read)
        got = _compare(sub, part, {**given, **fed}, target, fed, cuts)
        out.update(got)
        out.how.update(got.how)
        out.steps.update(got.steps)
    return out


def golden_alone(
    qdq_model: onnx.ModelProto,
    layers: Sequence[Exposed],
    names: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    golden: TensorFolder,
    golden_name: Callable[[str], str | None],
) -> dict[str, np.ndarray]:
    """Each named layer's output in onnxruntime's CPU fake-quant of it alone, fed the golden
    values of the nearest tensors the golden has, quantized with their encodings (what
    layerwise feeds the backend): what the layer's quantization alone makes of it, its
    inputs' rounding and how the layer carries it included, as the QDQ graph holds it (a
    quantized layer's integers). The golden is read only for the tensors the named layers
    read."""
    specs: dict[str, tuple[Exposed, str]] = {}

    def shape_only(e: Exposed) -> np.ndarray:
        g = golden_name(e.name)
        if g is None or g not in golden:
            raise KeyError(e.name)  # no golden: its readers keep its producer
        specs[_cut_name(e)] = (e, g)
        dtype = _backend_dtype(e, "float32")
        return np.broadcast_to(np.zeros((), dtype), golden.records[g].shape)

    model, _ = _cut(qdq_model, layers, shape_only)
    by = {e.name: e for e in layers}
    asked = [by[n] for n in names if n in by]
    if not asked:
        return {}
    sub = om.sliced(model, [e.graph_tensor for e in asked])
    fed = {}
    for i in sub.graph.input:
        if i.name in specs:
            e, g = specs[i.name]
            fed[i.name] = held_as_graph(e, np.asarray(golden.load(g)))
        elif i.name in feeds:
            fed[i.name] = feeds[i.name]
    values = _run(sub, [e.graph_tensor for e in asked], fed)
    return {e.name: values[e.graph_tensor] for e in asked}


def held_as_graph(e: Exposed, values: np.ndarray) -> np.ndarray:
    """A backend's dequantized values of a layer as the QDQ graph holds them (a quantized
    activation's integers, exactly: they lie on its grid)."""
    return _backend_value(e, values, "float32")


def _slice(
    cut_model: onnx.ModelProto,
    cuts: Mapping[str, Exposed],
    tensors: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    read: Callable[[Exposed], np.ndarray],
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The part of the cut model that computes ``tensors``, the model inputs it reads (onnxruntime
    refuses a feed the model does not have) and the backend's dumps it reads, by cut name."""
    sub = om.sliced(cut_model, tensors)
    needed = [i.name for i in sub.graph.input]
    given = {k: feeds[k] for k in needed if k in feeds}
    return sub, given, {n: read(cuts[n]) for n in needed if n in cuts}


def held_parts(wanted: Sequence[Exposed], target: TensorFolder, held: int) -> list[list[Exposed]]:
    """Consecutive layers whose dumps (as the backend's integers) add up to at most about
    ``held`` bytes - a part's inputs are mostly the outputs of the part before, so a run holds
    about twice that."""
    parts: list[list[Exposed]] = [[]]
    size = 0
    for e in wanted:
        rec = target.records[e.name]
        n = rec.size * _backend_dtype(e, rec.native_dtype).itemsize
        if parts[-1] and size + n > held:
            parts.append([])
            size = 0
        parts[-1].append(e)
        size += n
    return [p for p in parts if p]


class KernelRuns:
    """The CPU fake-quant of the whole model with some layers' kernel difference (QNN's result
    minus the CPU fake-quant of the layer fed QNN's inputs) added where they compute, one run
    per question. The difference is added to what flows there, so a moved layer's effect
    reaches the outputs through the other layers as computed; every named layer's difference
    is held, so ask about a bounded set."""

    def __init__(
        self,
        qdq_model: onnx.ModelProto,
        layers: Sequence[Exposed],
        feeds: Mapping[str, np.ndarray],
        target: TensorFolder,
        names: Sequence[str],
        judged: Sequence[str],
    ):
        by = {e.name: e for e in layers}
        subjects = [by[n] for n in names if n in by and n in target]
        self.ends = [by[n] for n in judged if n in by]
        self.names = [e.name for e in subjects] if self.ends else []
        if not self.names:
            return
        read = _reader(target)
        cut_all, cuts = _cut_plan(qdq_model, [e for e in layers if e.name in target], target)
        tensors = [e.graph_tensor for e in subjects]
        sub, given, fed = _slice(cut_all, cuts, tensors, feeds, read)
        local = _run(sub, tensors, {**given, **fed})
        delta = {}  # each subject's kernel difference, in its integers when it has them
        for e in subjects:
            backend = fed[_cut_name(e)] if _cut_name(e) in fed else read(e)
            delta[e.name] = _difference(backend, local[e.graph_tensor])
        self._start(qdq_model, subjects, delta, feeds)

    @classmethod
    def of_differences(
        cls,
        qdq_model: onnx.ModelProto,
        layers: Sequence[Exposed],
        feeds: Mapping[str, np.ndarray],
        differences: Mapping[str, tuple[np.ndarray, np.ndarray]],
        judged: Sequence[str],
    ) -> KernelRuns:
        """The same runs for kernel differences measured elsewhere: layer -> (the backend's
        result, the CPU fake-quant's) as the QDQ graph holds them (layerwise: each layer fed
        the golden inputs on both sides, :func:`golden_alone`)."""
        runs = cls.__new__(cls)
        by = {e.name: e for e in layers}
        runs.ends = [by[n] for n in judged if n in by]
        subjects = [by[n] for n in differences if n in by]
        runs.names = [e.name for e in subjects] if runs.ends else []
        if runs.names:
            delta = {e.name: _difference(*differences[e.name]) for e in subjects}
            runs._start(qdq_model, subjects, delta, feeds)
        return runs

    def _start(
        self,
        qdq_model: onnx.ModelProto,
        subjects: Sequence[Exposed],
        delta: dict[str, np.ndarray],
        feeds: Mapping[str, np.ndarray],
    ) -> None:
        """The model with the subjects' differences added, its session, and its run with
        none added."""
        self.delta = delta
        model, self.moved = _added(qdq_model, subjects)
        self.outputs = [self.moved.get(e.name, e.graph_tensor) for e in self.ends]
        self.sess = exact_session(om.with_outputs(model, self.outputs))
        self.fed_as = {e.name: _delta_name(e) for e in subjects}
        self.known: dict[tuple[str, ...], dict[str, float]] = {}
        self.feed = {**feeds, **{self.fed_as[n]: np.zeros_like(d) for n, d in self.delta.items()}}
        base = self.sess.run(self.outputs, self.feed)  # no difference added: the CPU's own run
        self.base = [_deq(e, v) for e, v in zip(self.ends, base, strict=True)]

    def each(self) -> dict[str, dict[str, float]]:
        """Per named layer, what its kernel difference alone does to the outputs:
        ``Σ(out - out_cpu)² / Σout_cpu²`` at each judged tensor (layer -> judged tensor ->
        value), the scale of the outputs' error, so a share of it can be taken."""
        return {n: self.effect([n]) for n in self.names}

    def effect(self, group: Sequence[str]) -> dict[str, float]:
        """``Σ(out - out_cpu)² / Σout_cpu²`` at each judged tensor with the ``group``'s kernel
        differences added at once."""
        key = tuple(group)
        if key in self.known:  # the whole group, asked by the caller and again by the halving
            return self.known[key]
        moved = {self.fed_as[n]: self.delta[n] for n in group}
        runs = self.sess.run(self.outputs, {**self.feed, **moved})
        out = {}
        for end, b, v in zip(self.ends, self.base, runs, strict=True):
            ss = dot(b, b)
            if ss > 0:
                got = _deq(end, v)
                out[end.name] = dot(got - b, got - b) / ss
        self.known[key] = out
        return out


def _difference(backend: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """A kernel difference, in integers (widened) when the tensor holds them."""
    wide = np.int32 if np.issubdtype(cpu.dtype, np.integer) else np.float32
    return backend.astype(wide) - cpu.astype(wide)


def _delta_name(e: Exposed) -> str:
    return f"{e.graph_tensor}::kernel_difference"


def _added(
    qdq_model: onnx.ModelProto, subjects: Sequence[Exposed]
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy where each subject's tensor is followed by the addition of a fed difference
    (integers: widened, added, clipped to their type, narrowed back) that its readers read
    instead; and, by layer, the name of the tensor holding the sum."""
    from onnx import helper

    m, readers = _copy_with_readers(qdq_model)
    moved: dict[str, str] = {}
    added: list[onnx.NodeProto] = []
    for e in subjects:
        t, d, out = e.graph_tensor, _delta_name(e), f"{e.graph_tensor}::moved"
        users = readers.get(t, [])
        integer = _holds_integers(e)
        elem = onnx.TensorProto.INT32 if integer else onnx.TensorProto.FLOAT
        m.graph.input.append(helper.make_tensor_value_info(d, elem, None))
        if integer:
            info = np.iinfo(e.native_dtype)
            lo, hi = (f"{t}::{k}" for k in ("lo", "hi"))
            m.graph.initializer.extend(
                [
                    onnx.numpy_helper.from_array(np.array(info.min, np.int32), lo),
                    onnx.numpy_helper.from_array(np.array(info.max, np.int32), hi),
                ]
            )
            native = helper.np_dtype_to_tensor_dtype(np.dtype(e.native_dtype))
            added += [
                helper.make_node("Cast", [t], [f"{t}::wide"], to=onnx.TensorProto.INT32),
                helper.make_node("Add", [f"{t}::wide", d], [f"{t}::sum"]),
                helper.make_node("Clip", [f"{t}::sum", lo, hi], [f"{t}::kept"]),
                helper.make_node("Cast", [f"{t}::kept"], [out], to=native),
            ]
        else:
            added.append(helper.make_node("Add", [t, d], [out]))
        for node, i in users:
            node.input[i] = out
        moved[e.name] = out
    m.graph.node.extend(added)
    nodes = om.topological_nodes(m.graph)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m, moved


def kernel_bisect(
    runs: KernelRuns, share_of: Callable[[dict[str, float]], float], bar: float
) -> dict[str, float]:
    """The layers whose kernel difference alone costs ``bar`` of the outputs' error or more,
    found by halving: a group is split only while it reaches ``bar`` (``share_of`` turns an
    :meth:`KernelRuns.effect` into that share), so at most two runs per halving; a group that
    reaches it while neither half does is a difference spread over its layers, not one's."""
    found: dict[str, float] = {}

    def visit(group: list[str]) -> None:
        share = share_of(runs.effect(group))
        if not share >= bar:
            return
        if len(group) == 1:
            found[group[0]] = share
            return
        half = len(group) // 2
        visit(group[:half])
        visit(group[half:])

    if runs.names:
        visit(list(runs.names))
    return found


def _deq(e: Exposed, values: np.ndarray) -> np.ndarray:
    return np.asarray(e.dequantize(values), np.float64).ravel()


def _against_float(
    out: Divergences, e: Exposed, gold: np.ndarray | None, qnn: np.ndarray, cpu: np.ndarray
) -> None:
    """Both runs' error against the layer's float tensor, when it is known and matches."""
    if gold is None:
        return
    q = error_against(qnn, gold)
    if not math.isnan(q):
        out.errors[e.name] = (q, error_against(cpu, gold))


def error_against(values: np.ndarray, gold: np.ndarray) -> float:
    """``Σ(x - golden)² / Σgolden²`` over the flattened tensors; NaN when their sizes differ
    or the golden is silent."""
    g = np.asarray(gold, np.float64).ravel()
    x = np.asarray(values, np.float64).ravel()
    gg = dot(g, g)
    if g.size != x.size or not gg > 0:
        return math.nan
    return dot(x - g, x - g) / gg


def _shifted(cpu: np.ndarray, backend: np.ndarray, local: np.ndarray) -> np.ndarray:
    """``cpu`` moved by the kernel's difference ``backend - local`` (in integer steps for a
    quantized tensor, kept within its type)."""
    if not np.issubdtype(cpu.dtype, np.integer):
        return (cpu + (backend.astype(np.float32) - local)).astype(cpu.dtype)
    info = np.iinfo(cpu.dtype)
    moved = cpu.astype(np.int64) + backend.astype(np.int64) - local.astype(np.int64)
    return np.clip(moved, info.min, info.max).astype(cpu.dtype)


def _cut_name(e: Exposed) -> str:
    return f"{e.graph_tensor}::backend"


def _copy_with_readers(
    model: onnx.ModelProto,
) -> tuple[onnx.ModelProto, dict[str, list[tuple[onnx.NodeProto, int]]]]:
    """A copy of the model to rewire, and, by tensor, the (node, input slot) pairs reading it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in m.graph.node:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, i))
    return m, readers


def _cut(
    qdq_model: onnx.ModelProto,
    exposed: Sequence[Exposed],
    value_of: Callable[[Exposed], np.ndarray],
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy whose readers of each exposed tensor read a new graph input instead, and the
    feeds for them (``value_of(e)``; a tensor that cannot be read keeps its producer)."""
    m, readers = _copy_with_readers(qdq_model)
    fed: dict[str, np.ndarray] = {}
    for e in exposed:
        users = readers.get(e.graph_tensor, [])
        if e.graph_is_dequantized or not users:
            continue
        try:
            value = np.asarray(value_of(e))
        except Exception:  # unreadable dump: its consumers keep the CPU's own input
            continue
        for node, i in users:
            node.input[i] = _cut_name(e)
        m.graph.input.append(
            onnx.helper.make_tensor_value_info(
                _cut_name(e), onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
            )
        )
        fed[_cut_name(e)] = value
    return m, fed


def _cut_plan(
    qdq_model: onnx.ModelProto, exposed: Sequence[Exposed], target: TensorFolder
) -> tuple[onnx.ModelProto, dict[str, Exposed]]:
    """As :func:`_cut` with the backend's dumps, without reading them: the cut model and, by
    cut name, the layer whose dump feeds it (typed from the dump's record; a dump whose file
    does not match its record keeps its producer)."""
    specs: dict[str, Exposed] = {}

    def shape_only(e: Exposed) -> np.ndarray:
        rec = target.check(e.name)
        specs[_cut_name(e)] = e
        return np.broadcast_to(np.zeros((), _backend_dtype(e, rec.native_dtype)), rec.shape)

    model, _ = _cut(qdq_model, exposed, shape_only)
    return model, specs


def _reader(target: TensorFolder) -> Callable[[Exposed], np.ndarray]:
    return lambda e: _backend_value(e, target.load(e.name), target.records[e.name].native_dtype)


def _holds_integers(e: Exposed) -> bool:
    """The QDQ graph holds a dumped tensor as the backend's integers when it is a quantized
    activation; else as float (as a graph output is, read after its DequantizeLinear)."""
    return e.quantized and not e.graph_is_dequantized


def _backend_dtype(e: Exposed, dumped: str) -> np.dtype:
    """How the QDQ graph holds a dump: a quantized activation's integers; an unquantized
    tensor as the type it has there - the indices/flags it is, or float16 in a model computing
    part of its graph in it, as float32 otherwise (``dumped``: its dtype on the backend)."""
    if _holds_integers(e):
        return np.dtype(e.native_dtype)
    kind = np.dtype(dumped)
    return kind if kind.kind in "biuf" else np.dtype("float32")


def _backend_value(e: Exposed, values: np.ndarray, dumped: str) -> np.ndarray:
    """The dumped tensor as the QDQ graph holds it (integers re-quantized exactly from the
    dequantized dump; an int or bool tensor, stored as float, as the graph's type)."""
    if not _holds_integers(e):
        return np.asarray(values).astype(_backend_dtype(e, dumped), copy=False)
    return e.quantize(values)


def _run(
    model: onnx.ModelProto, outputs: Sequence[str], feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    outputs = list(dict.fromkeys(outputs))
    if [o.name for o in model.graph.output] != outputs:  # a slice has them already
        model = om.with_outputs(model, outputs)
    sess = exact_session(model)
    return dict(zip(outputs, sess.run(outputs, dict(feeds)), strict=True))


def _compare(
    model: onnx.ModelProto,
    wanted: Sequence[Exposed],
    feeds: Mapping[str, np.ndarray],
    target: TensorFolder,
    loaded: Mapping[str, np.ndarray] | None = None,
    cuts: Mapping[str, Exposed] | None = None,
    golden: Callable[[Exposed], np.ndarray | None] | None = None,
) -> Divergences:
    """``loaded``: the backend's values already read, by cut name (not read twice); ``cuts``:
    the layers whose dumps are read as the backend's integers (those the cut model feeds);
    ``golden``: see :func:`divergence`."""
    values = _run(model, [e.graph_tensor for e in wanted], feeds)
    loaded, cuts = loaded or {}, cuts or {}
    read = _reader(target)
    out = Divergences()
    for e in wanted:
        have = loaded.get(_cut_name(e))
        if have is None and _cut_name(e) in cuts:  # fed to a later part: read it here
            have = read(e)
        same = have is not None and np.array_equal(have, values[e.graph_tensor])
        if same and golden is None:
            out[e.name] = 0.0  # the same integers (most layers): nothing to dequantize
            continue
        cpu = np.asarray(e.dequantize(values[e.graph_tensor]), np.float64).ravel()
        try:
            qnn = cpu if same else target.load(e.name) if have is None else e.dequantize(have)
            qnn = np.asarray(qnn, np.float64).ravel()
        except Exception:  # unreadable dump: no verdict for this layer
            continue
        if qnn.size != cpu.size or not (np.isfinite(qnn).all() and np.isfinite(cpu).all()):
            continue
        if golden is not None:
            _against_float(out, e, golden(e), qnn, cpu)
        d = qnn - cpu
        ss, dd = dot(cpu, cpu), dot(d, d)
        out[e.name] = dd / ss if ss > 0 else (0.0 if dd == 0 else math.inf)
        if e.quantized and dd > 0:
            cpu_int = values[e.graph_tensor]
            steps = (  # in integers when both sides are (no float pass)
                have.astype(np.int32) - cpu_int.astype(np.int32)
                if have is not None and np.issubdtype(cpu_int.dtype, np.integer)
                else np.rint(d / e.scale)
            )
            out.how[e.name] = how_they_part(steps)
            parted = np.abs(steps[steps != 0])
            out.steps[e.name] = float(np.median(parted)) if parted.size else 0.0
            if e.op_type == "Concat":  # both sides as integers (a graph output's are floats)
                ints = have if have is not None else e.quantize(qnn.reshape(cpu_int.shape))
                cpu_ints = e.quantize(cpu.reshape(cpu_int.shape))
                out.how[e.name] += _copied_note(e, ints, cpu_ints, loaded, cuts, read)
    return out


def _copied_note(
    e: Exposed,
    have: np.ndarray,
    cpu: np.ndarray,
    loaded: Mapping[str, np.ndarray],
    cuts: Mapping[str, Exposed],
    read: Callable[[Exposed], np.ndarray],
) -> str:
    """The cause's words when the backend kept some of a Concat's inputs in their own encoding
    (:func:`kept_integers`), with the fix that avoids it."""
    by_name = {x.name: x for x in cuts.values()}
    inputs = [by_name.get(n) for n in e.inputs]
    if not inputs or any(x is None or not _holds_integers(x) for x in inputs):
        return ""
    try:
        values = [(x.name, loaded.get(_cut_name(x), None)) for x in inputs]
        values = [(n, v if v is not None else read(by_name[n])) for n, v in values]
    except Exception:  # an unreadable dump: no more to say
        return ""
    kept = kept_integers(have, cpu, values)
    if kept is None:
        return ""
    x = by_name[kept[0]]
    chain = [x]  # the encoding is made where the ops that keep it (a Reshape) take it from
    while chain[-1].op_type in KEEP_ENCODING and len(chain[-1].inputs) == 1:
        up = by_name.get(chain[-1].inputs[0])
        if up is None or (up.scale, up.zero_point) != (x.scale, x.zero_point):
            break
        chain.append(up)
    return (
        f"; {kept[1]} of its values are {x.name}'s own integers (scale {x.scale:.4g}, offset "
        f"{-x.zero_point}) kept in this Concat's encoding (scale {e.scale:.4g}, offset "
        f"{-e.zero_point}), not requantized: {_GIVING} "
        f"{' and '.join(c.name for c in reversed(chain))} {_AVOIDS}"
    )


_GIVING, _AVOIDS = "giving", "this Concat's encoding avoids it"


def encoding_fix(cause: str) -> list[str]:
    """The tensors a backend ``cause`` says should take its Concat's encoding (the fix
    :func:`_copied_note` writes; the fix search measures it on QNN)."""
    m = re.search(f"not requantized: {_GIVING} (.+?) {re.escape(_AVOIDS)}", cause)
    return m.group(1).split(" and ") if m else []
