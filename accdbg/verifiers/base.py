"""The verifier interface: one small class per metric, registered by name.

A verifier turns a golden/target pair into one number, a pass/fail against a documented
threshold, and a few details for its per-tensor report. The pair is prepared once (loaded,
laid out alike, cast to float64, non-finite values set aside) and shared by every verifier,
so each tensor is read once whatever the number of verifiers; quantities several verifiers
need (the difference, its absolute value, sums) are computed once and cached on the pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from accdbg.errors import AccdbgError

NOT_APPLICABLE = "not applicable"


@dataclass
class VerifierResult:
    """One verifier on one tensor pair.

    ``value`` is NaN when the verifier could not run (``status`` says why); ``passed`` is
    None when there is no verdict (no threshold, or no value).
    """

    value: float
    passed: bool | None
    status: str = "ok"
    details: dict[str, Any] = field(default_factory=dict)


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """Σ a·b of two flat float64 arrays, by numpy's own loop.

    Not BLAS: OpenBLAS spreads a dot over threads that spin against each other when the
    machine is busy (a 150k-element dot took 0.02 to 16 ms); einsum stays at ~0.3 ms.
    """
    return float(np.einsum("i,i->", a, b))


def finite_range(arr: np.ndarray) -> tuple[float, float]:
    """Min and max of the finite values (NaN, NaN when there are none)."""
    if arr.size == 0:
        return math.nan, math.nan
    lo, hi = float(arr.min()), float(arr.max())
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    finite = arr[np.isfinite(arr)]
    return (float(finite.min()), float(finite.max())) if finite.size else (math.nan, math.nan)


def _count(n: int) -> str:
    return f"{n} element{'s' if n != 1 else ''}"


class TensorPair:
    """Golden and target values of one tensor, flat float64, ready for any verifier.

    ``golden``/``target`` hold only the positions where both sides are finite. Non-finite
    values are never averaged in silently: positions where both sides hold the same NaN or
    the same infinity agree and are set aside with a note; any other non-finite value makes
    every verifier fail on this pair (``nonfinite_mismatch``), with the counts in ``notes``.

    ``scale`` is the target's quantization step (a float, or an array broadcastable to the
    target in golden layout for per-axis encodings); None when the target is not quantized.
    """

    def __init__(
        self,
        golden: np.ndarray | list[np.ndarray],
        target: np.ndarray | list[np.ndarray],
        scale: float | np.ndarray | None = None,
    ):
        self.problem: str | None = None
        self.notes: list[str] = []
        self.nonfinite_mismatch = 0
        self.scale: float | np.ndarray | None = scale
        if isinstance(golden, list | tuple) or isinstance(target, list | tuple):
            # multi-tensor verifiers (MeanIOU) read the raw lists themselves
            self.golden_list = [np.asarray(a, dtype=np.float64) for a in golden]
            self.target_list = [np.asarray(a, dtype=np.float64) for a in target]
            self.golden = self.target = np.empty(0)
            self.size = 0
            return
        g = np.asarray(golden, dtype=np.float64).ravel()
        t = np.asarray(target, dtype=np.float64).ravel()
        self.golden_list, self.target_list = [g], [t]
        self.size = g.size
        if g.size != t.size:
            self.problem = f"size mismatch: golden {_count(g.size)}, target {_count(t.size)}"
            self.golden, self.target = g, t
            return
        if isinstance(scale, np.ndarray):
            scale = (
                np.broadcast_to(scale, np.shape(target)).ravel()
                if scale.size > 1
                else float(scale.ravel()[0])
            )
            self.scale = scale
        # Σx² is finite exactly when every x is (NaN and Inf propagate), barring an overflow
        # of x² that the element-wise check below then sorts out; one BLAS pass instead of
        # two, and the sums are reused by CosineSimilarity and SQNR.
        with np.errstate(over="ignore", invalid="ignore"):
            gg, tt = dot(g, g), dot(t, t)
        if math.isfinite(gg) and math.isfinite(tt):
            self.golden, self.target = g, t
            self.__dict__["golden_sq_sum"], self.__dict__["target_sq_sum"] = gg, tt
            return
        fin_g, fin_t = np.isfinite(g), np.isfinite(t)
        if fin_g.all() and fin_t.all():
            self.golden, self.target = g, t
            return
        both = fin_g & fin_t
        with np.errstate(invalid="ignore"):
            same = ~fin_g & ~fin_t & ((g == t) | (np.isnan(g) & np.isnan(t)))
        self.nonfinite_mismatch = int((~both & ~same).sum())
        for side, arr, fin in (("golden", g, fin_g), ("target", t, fin_t)):
            if not fin.all():
                nan = int(np.isnan(arr).sum())
                inf = int((~fin).sum()) - nan
                if nan:
                    self.notes.append(f"NaN in {side} ({_count(nan)})")
                if inf:
                    self.notes.append(f"Inf in {side} ({_count(inf)})")
        if not self.nonfinite_mismatch:
            self.notes.append(f"identical non-finite values at {_count(int(same.sum()))} excluded")
        self.golden, self.target = g[both], t[both]
        if isinstance(scale, np.ndarray) and scale.size == g.size:
            self.scale = scale.ravel()[both]

    # shared intermediates, computed on first use by whichever verifier needs them
    @cached_property
    def diff(self) -> np.ndarray:
        return self.golden - self.target

    @cached_property
    def abs_diff(self) -> np.ndarray:
        return np.abs(self.diff)

    @cached_property
    def abs_diff_sum(self) -> float:
        return float(self.abs_diff.sum())

    @cached_property
    def sq_diff_sum(self) -> float:
        d = self.diff
        return dot(d, d)

    @cached_property
    def golden_sq_sum(self) -> float:
        return dot(self.golden, self.golden)

    @cached_property
    def target_sq_sum(self) -> float:
        return dot(self.target, self.target)

    @cached_property
    def golden_range(self) -> tuple[float, float]:
        return float(self.golden.min()), float(self.golden.max())


@dataclass(frozen=True)
class Param:
    """A verifier parameter: its default (which fixes its type) and what it means."""

    default: Any
    help: str
    choices: tuple[str, ...] = ()


def _coerce(verifier: str, name: str, spec: Param, raw: Any) -> Any:
    what = f"verifier {verifier} parameter {name!r}"
    kind = type(spec.default)
    if spec.choices:
        value = str(raw).strip().lower()
        if value not in spec.choices:
            raise AccdbgError(f"{what}: {raw!r} is not one of {', '.join(spec.choices)}")
        return value
    if kind is bool or isinstance(raw, bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise AccdbgError(f"{what}: {raw!r} is not true or false")
    try:
        if kind is int:
            value = float(raw)
            if not value.is_integer():
                raise ValueError
            return int(value)
        return float(raw)
    except (TypeError, ValueError):
        expected = "an integer" if kind is int else "a number"
        raise AccdbgError(f"{what}: {raw!r} is not {expected}") from None


class Verifier:
    """Base of every verifier.

    Subclasses set ``name`` (as the reference spells it), ``params``, ``threshold``,
    ``higher_is_better`` and ``unit``, and implement :meth:`compute` on a prepared
    :class:`TensorPair`. Every verifier also takes ``threshold`` to override its pass mark.
    """

    name: ClassVar[str]
    params: ClassVar[dict[str, Param]] = {}
    threshold: ClassVar[float | None] = None
    higher_is_better: ClassVar[bool] = False
    unit: ClassVar[str] = ""
    tensors_per_side: ClassVar[int] = 1
    needs_scale: ClassVar[bool] = False

    def __init__(self, **params: Any):
        known = {**self.params, "threshold": Param(self.threshold, "pass mark")}
        lower = {k.lower(): k for k in known}
        self.values: dict[str, Any] = {k: p.default for k, p in self.params.items()}
        self.given: dict[str, Any] = {}
        threshold = self.threshold
        for raw_key, raw in params.items():
            key = lower.get(str(raw_key).lower())
            if key is None:
                valid = ", ".join(sorted(known)) or "(none)"
                raise AccdbgError(
                    f"verifier {self.name} has no parameter {raw_key!r}; valid parameters: {valid}"
                )
            if key == "threshold":
                threshold = _coerce(self.name, key, Param(0.0, ""), raw)
            else:
                self.values[key] = _coerce(self.name, key, self.params[key], raw)
            self.given[key] = self.values.get(key, threshold)
        self.pass_mark: float | None = threshold

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.given.items())
        return f"{self.name}({args})"

    @property
    def label(self) -> str:
        """Column name: the verifier's name, with its non-default parameters if any."""
        if not self.given:
            return self.name
        return f"{self.name}({','.join(f'{k}={v}' for k, v in self.given.items())})"

    @property
    def spec(self) -> list[str]:
        """Command-line spec that rebuilds this verifier: ``get_verifier(v.spec)``."""

        def text(v: Any) -> str:
            return str(v).lower() if isinstance(v, bool) else str(v)

        return [self.name, *(x for k, v in self.given.items() for x in (k, text(v)))]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "spec": self.spec,
            "parameters": dict(self.values),
            "threshold": self.pass_mark,
            "higher_is_better": self.higher_is_better,
            "unit": self.unit,
            "formula": (self.__doc__ or "").strip().splitlines()[0],
        }

    def compute(self, pair: TensorPair) -> tuple[float, dict[str, Any]] | VerifierResult:
        """The metric value and details; or a VerifierResult saying why it does not apply."""
        raise NotImplementedError

    # ------------------------------------------------------------ what the metric means
    perfect: ClassVar[float | None] = None  # a finite perfect score of a higher-is-better metric

    @property
    def ideal(self) -> float | None:
        """The perfect score when it is finite (cosine 1, errors 0); None when unbounded (SQNR)."""
        return self.perfect if self.higher_is_better else 0.0

    def linear_error(self, value: float) -> float:
        """The score as an error on a linear scale (0 = perfect), so errors add and compare:
        noise-to-signal power for SQNR, 1 - cos for cosine, the value itself for errors."""
        if self.higher_is_better:
            return (self.ideal - value) if self.ideal is not None else -value
        return value

    def noise_to_signal(self, value: float) -> float | None:
        """The score as a noise-to-signal power ratio when the metric is one (SQNR) or
        approximates one (cosine); None otherwise. ``nsr_exact`` says which."""
        return None

    nsr_exact: ClassVar[bool] = False

    def threshold_text(self) -> str:
        """How the pass mark is judged, e.g. ``pass >= 20``."""
        if self.pass_mark is None:
            return "no threshold"
        return f"pass {'>=' if self.higher_is_better else '<='} {self.pass_mark:g}"

    def per_channel(self, pair: Any) -> np.ndarray | None:
        """The score of each channel of a :class:`~accdbg.verifiers.channels.ChannelPair`;
        None when the metric has no per-channel form."""
        return None

    def judge(self, value: float) -> bool | None:
        if self.pass_mark is None or math.isnan(value):
            return None
        return value >= self.pass_mark if self.higher_is_better else value <= self.pass_mark

    def verify(self, pair: TensorPair) -> VerifierResult:
        """Run on a prepared pair; never raises on data, always returns a status."""
        if pair.problem:
            return VerifierResult(math.nan, None, pair.problem)
        if self.tensors_per_side == 1 and pair.size == 0:
            return VerifierResult(math.nan, None, "empty tensor: nothing to compare")
        if self.tensors_per_side == 1 and pair.golden.size == 0:
            return VerifierResult(math.nan, False, "; ".join(pair.notes) + "; no finite values")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = self.compute(pair)  # overflow is handled (rescaled) by the verifiers that risk it
        if isinstance(out, VerifierResult):
            return out
        value, details = out
        value = float(value)
        passed = self.judge(value)
        status = "ok"
        if pair.notes:
            status = "; ".join(pair.notes)
            if pair.nonfinite_mismatch:
                passed = False
        details = {"value": value, "threshold": self.pass_mark, "passed": passed, **details}
        return VerifierResult(value, passed, status, details)

    def __call__(self, golden, target, scale=None) -> VerifierResult:
        """Convenience for notebooks and tests: verify two arrays (or two lists of arrays)."""
        return self.verify(TensorPair(golden, target, scale))


VERIFIERS: dict[str, type[Verifier]] = {}


def register(cls: type[Verifier]) -> type[Verifier]:
    VERIFIERS[cls.name.lower()] = cls
    return cls
