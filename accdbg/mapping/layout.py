"""Bring a target tensor into the golden tensor's layout before comparing them.

QNN runs convolutions channel-last (NHWC) while ONNX is channel-first (NCHW); a dump may be
in either. Comparing a NCHW tensor with a NHWC one element by element compares unrelated
values: the best-known false alarm of Qualcomm's tool, which flattens both. We never
flatten: the target is transposed according to the recorded axis formats (tensor manifest
``layout``, or the QNN graph JSON's ``axis_format``/``src_axis_format``), else according to
the shapes when exactly one channel-first/channel-last permutation explains them. A target
recorded channel-last against a golden with no record is taken as the channel-first golden
(ONNX's layout) when the shapes agree. A pair that nothing explains is reported with both
shapes and not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# QNN axis formats whose letters name the axes (N batch, C channels, D/H/W spatial,
# F feature, T time). Other values (ANY, NONTRIVIAL, NOT_YET_DEFINED) say nothing.
KNOWN_LAYOUTS = frozenset(
    {"NCDHW", "NDHWC", "NCHW", "NHWC", "NCF", "NFC", "NTF", "TNF", "NF", "NC", "F"}
)
UNKNOWN_LAYOUTS = frozenset({"", "ANY", "NONTRIVIAL", "NOT_YET_DEFINED", "UNDEFINED", "NONE"})
_CHANNEL_LAST = {"NHWC": "NCHW", "NFC": "NCF", "NDHWC": "NCDHW"}


def normalize_layout(value: object, rank: int | None = None) -> str | None:
    """``"nhwc"`` -> ``"NHWC"``; None for unknown values or a layout of the wrong rank."""
    if value is None:
        return None
    text = str(value).strip().upper()
    if text.startswith("QNN_TENSOR_AXIS_FORMAT_"):
        text = text[len("QNN_TENSOR_AXIS_FORMAT_") :]
    if text in UNKNOWN_LAYOUTS or text not in KNOWN_LAYOUTS:
        return None
    if rank is not None and len(text) != rank:
        return None
    return text


def layout_permutation(src: str, dst: str) -> tuple[int, ...] | None:
    """Axes of a ``src``-laid-out array that give ``dst``: NHWC->NCHW is (0, 3, 1, 2).

    None when the two layouts do not name the same axes (e.g. NF and NC).
    """
    if sorted(src) != sorted(dst) or len(set(src)) != len(src):
        return None
    return tuple(src.index(axis) for axis in dst)


def channel_moves(rank: int) -> dict[str, tuple[int, ...]]:
    """The two layout changes QNN makes on rank 3-5 tensors, as permutations of the target."""
    if rank < 3:
        return {}
    last_to_first = (0, rank - 1, *range(1, rank - 1))
    first_to_last = (0, *range(2, rank), 1)
    names = {3: ("NFC", "NCF"), 4: ("NHWC", "NCHW"), 5: ("NDHWC", "NCDHW")}
    cl, cf = names.get(rank, ("channel-last", "channel-first"))
    return {f"{cl}->{cf}": last_to_first, f"{cf}->{cl}": first_to_last}


def _fmt(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


@dataclass(frozen=True)
class Alignment:
    """How to turn a target array into the golden layout, or why it cannot be done.

    ``kind`` is ``same`` (shapes equal), ``reshape`` (equal once size-1 axes are dropped,
    which never reorders data), ``transpose`` (``perm``) or ``mismatch`` (not compared).
    ``note`` says which, and from what evidence, for the report's Layout/Status columns.
    """

    kind: str
    golden_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    perm: tuple[int, ...] | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.kind != "mismatch"

    def apply(self, target: np.ndarray) -> np.ndarray:
        """The target in golden layout (a view when possible)."""
        arr = np.asarray(target).reshape(self.target_shape)
        if self.kind == "transpose":
            arr = arr.transpose(self.perm)
        return arr.reshape(self.golden_shape)


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def reconcile(
    golden_shape,
    target_shape,
    golden_layout: str | None = None,
    target_layout: str | None = None,
) -> Alignment:
    """Decide how the target maps onto the golden (see the module docstring for the order)."""
    gs = tuple(int(d) for d in golden_shape)
    ts = tuple(int(d) for d in target_shape)
    gl = normalize_layout(golden_layout, len(gs))
    tl = normalize_layout(target_layout, len(ts))

    # 1. recorded layouts that differ and name the same axes
    if gl and tl and gl != tl:
        perm = layout_permutation(tl, gl)
        if perm is not None:
            moved = tuple(ts[p] for p in perm)
            if moved == gs:
                return Alignment("transpose", gs, ts, perm, f"{tl}->{gl} (recorded)")
            return Alignment(
                "mismatch",
                gs,
                ts,
                None,
                f"layout mismatch: target recorded {tl} {_fmt(ts)} does not become golden "
                f"{gl} {_fmt(gs)} by transposing",
            )
    # 1b. a target recorded channel-last against a golden with no record: the golden is in
    #     the framework's (ONNX) layout, channel-first, when the shapes agree with that
    if tl and not gl and tl in _CHANNEL_LAST:
        first = _CHANNEL_LAST[tl]
        perm = layout_permutation(tl, first)
        if tuple(ts[p] for p in perm) == gs:
            return Alignment("transpose", gs, ts, perm, f"{tl}->{first} (recorded)")
    # 2. same shape: same layout (nothing recorded says otherwise)
    if gs == ts:
        return Alignment("same", gs, ts, None, gl or tl or "")
    # 3. only size-1 axes differ: a reshape, data order unchanged
    if _squeezed(gs) == _squeezed(ts):
        return Alignment("reshape", gs, ts, None, f"reshape {_fmt(ts)}->{_fmt(gs)}")
    if gl and tl and gl == tl:
        return Alignment(
            "mismatch",
            gs,
            ts,
            None,
            f"shape mismatch: both recorded {gl}, golden {_fmt(gs)} target {_fmt(ts)}",
        )
    # 4. shapes explained by a channel move that agrees with any recorded layout
    #    (for rank 3 both moves are the same swap, hence the dict keyed by permutation)
    if len(gs) == len(ts):
        perms: dict[tuple[int, ...], str] = {}
        for name, p in channel_moves(len(ts)).items():
            src, dst = name.split("->")
            if (tl and src != tl) or (gl and dst != gl):
                continue
            if tuple(ts[i] for i in p) == gs:
                perms.setdefault(p, name)
        if len(perms) == 1:
            ((perm, name),) = perms.items()
            return Alignment("transpose", gs, ts, perm, f"{name} (from shapes)")
    size_g, size_t = int(np.prod(gs)) if gs else 1, int(np.prod(ts)) if ts else 1
    what = "shape mismatch" if size_g == size_t else "size mismatch"
    return Alignment("mismatch", gs, ts, None, f"{what}: golden {_fmt(gs)} target {_fmt(ts)}")
