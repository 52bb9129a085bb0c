"""A culprit, as every algorithm names it and the fix search and the verification read it.

One record, structured: what kind of loss it is (:data:`KINDS`), the layer and the tensors that
carry its error (its *region*), and what the backend measured of its fix. Nothing downstream
reads the ``cause`` text back: it is for people. A :class:`Change` is one knob a fix turns
(the fix search's candidates, the verification's measurements).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# what a culprit loses - the key its fixes are chosen by
WEIGHT = "weight range"
CONCAT = "unbalanced concatenation"
ACTIVATION = "activation range"
CLIPPING = "clipping"
FEW = "outlier weights"  # a few of its weights far beyond the rest
BACKEND = "backend"  # QNN computes it otherwise than its encodings explain
MASK = "mask constant"  # a sentinel (-inf, float32 min) no encoding holds
UNHOLDABLE = "unholdable encoding"
DROPPED = "dropped activation"  # a Relu/Clip the quantizer removed, its encoding not clamping
CALIBRATION = "calibration coverage"  # the debugged input clipped beyond the calibration's
KINDS = (WEIGHT, CONCAT, ACTIVATION, CLIPPING, FEW, BACKEND, MASK, UNHOLDABLE, DROPPED, CALIBRATION)
# found in the quantized model before any run (accdbg.encodings.defects): named first
BEFORE_RUN = (MASK, UNHOLDABLE, DROPPED)


@dataclass(frozen=True)
class Change:
    """One knob. ``target``: the tensor, weight, calibration or Conv pair it acts on."""

    # per_channel_all | calibration | act16_all | per_channel | act16 | w16 | w8 | equalize |
    # encoding | float_region | clamp_mask | keep_activation | recalibrate
    kind: str
    target: str = ""
    layer: str = ""  # the culprit it was chosen for ('' for global knobs)
    why: str = ""

    @property
    def label(self) -> str:
        t = self.target
        return {
            "per_channel_all": "per-channel weights (all layers)",
            "calibration": f"activation calibration {t} ({CALIBRATIONS.get(t, '')})",
            "act16_all": "16-bit activations (all layers)",
            "w8_all": "8-bit weights (all layers; int4 in the run)",
            "per_channel": f"per-channel weights: {t}",
            "act16": f"16-bit activation: {t}",
            "w16": f"16-bit weights: {t}",
            "w8": f"8-bit weights: {t} (int4 in the run)",
            "equalize": f"equalize {t}",
            "encoding": f"{t.replace(',', ', ')}: the encoding of {self.layer}",
            "float_region": f"{self.layer} and its region in fp16 ({len(t.split(','))} tensors)",
            "region16": f"{self.layer} and its region in 16 bits ({len(t.split(','))} tensors)",
            "clamp_mask": f"mask constant {t} clamped",
            "keep_activation": f"keep {t} (not folded into its output's encoding)",
            "recalibrate": "recalibrated with the debugged inputs added",
        }[self.kind]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.target}"

    @property
    def is_global(self) -> bool:
        return self.kind in GLOBAL_KINDS

    def as_dict(self) -> dict:
        return {"kind": self.kind, "target": self.target, "layer": self.layer, "why": self.why}


GLOBAL_KINDS = ("per_channel_all", "calibration", "act16_all", "w8_all")
CALIBRATIONS = {"enhanced": "Entropy", "adjusted": "Percentile 99.999"}


@dataclass
class Verified:
    """What QNN HTP measured of a culprit's fixes: the outputs' SQNR gain of each change
    (graph outputs only, every debugged input), the counterfactual first."""

    baseline_db: float  # the outputs' SQNR on QNN as quantized (nan: QNN refused it)
    float_gain_db: float  # its region kept in fp16 on HTP: whether it is the culprit at all
    fix: str = ""  # the cheapest change within the policy's margin of that (its label)
    gain_db: float = math.nan  # that change's gain
    confirmed: bool = False  # the counterfactual gains what the policy asks of a culprit
    tried: list[dict[str, Any]] = field(default_factory=list)  # label, gain_db, status, cost
    command: str = ""  # the command applying the fix
    # QNN ran none of its counterfactuals (the region in fp16, in 16 bits, the layer alone):
    # not verifiable on the backend, named as the CPU measures ranked it (its cause says so)
    refused: bool = False


@dataclass
class Culprit:
    """A named culprit: its rank, the layer, why (words) and what (structured)."""

    rank: int
    name: str
    op_type: str
    cause: str
    local_db: float = math.nan
    kind: str = ""  # one of KINDS
    shows_at: tuple[str, ...] = ()  # where its error appears when not at it (an amplifying op)
    cost: float = math.nan  # the most it was measured to cost the outputs (share of the error)
    region: tuple[str, ...] = ()  # itself and the tensors that carry its error
    rules: tuple[str, ...] = ()  # the ranking rules that named and placed it
    verified: Verified | None = None
    # found before the run: the constant its values come from (a mask) or the node removed
    source: str = ""

    @property
    def backend(self) -> bool:
        return self.kind == BACKEND

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("shows_at", "region", "rules"):
            d[k] = list(d[k])
        for k in ("local_db", "cost"):
            d[k] = None if not math.isfinite(d[k]) else d[k]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Culprit:
        ver = d.get("verified")
        nan = math.nan
        return cls(
            rank=int(d["rank"]),
            name=str(d["name"]),
            op_type=str(d.get("op_type", "")),
            cause=str(d.get("cause", "")),
            local_db=nan if d.get("local_db") is None else float(d["local_db"]),
            kind=str(d.get("kind", "")),
            shows_at=tuple(d.get("shows_at", ())),
            cost=nan if d.get("cost") is None else float(d["cost"]),
            region=tuple(d.get("region", ())),
            rules=tuple(d.get("rules", ())),
            verified=Verified(**ver) if isinstance(ver, dict) else None,
            source=str(d.get("source", "")),
        )
