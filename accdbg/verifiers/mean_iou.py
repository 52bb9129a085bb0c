"""MeanIOU: detection outputs (boxes and classes) compared box by box."""

from __future__ import annotations

import numpy as np

from accdbg.verifiers.base import Param, TensorPair, Verifier, VerifierResult, register


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` with every box in ``b``; boxes are [y_min, x_min, y_max, x_max].

    Two identical zero-area boxes have IoU 1; otherwise an empty union gives 0.
    """
    a, b = a[:, None, :], b[None, :, :]
    ih = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    iw = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = ih * iw
    area_a = np.clip(a[..., 2] - a[..., 0], 0, None) * np.clip(a[..., 3] - a[..., 1], 0, None)
    area_b = np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)
    union = area_a + area_b - inter
    same = np.all(a == b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), np.where(same, 1.0, 0.0))


def greedy_match(iou: np.ndarray) -> list[float]:
    """One-to-one matching, best IoU first; returns the matched IoUs (> 0 only)."""
    iou = iou.copy()
    matched = []
    while iou.size and iou.max() > 0:
        i, j = np.unravel_index(int(np.argmax(iou)), iou.shape)
        matched.append(float(iou[i, j]))
        iou[i, :] = -1
        iou[:, j] = -1
    return matched


@register
class MeanIOU(Verifier):
    """Σ matched IoU / Σ_class max(#golden, #target) over non-background detections, in [0, 1].

    Takes two tensors per side: boxes ``[..., 4]`` as [y_min, x_min, y_max, x_max] and their
    classes. Within each class, golden and target boxes are matched one to one, best IoU
    first; a detection left unmatched on either side counts as IoU 0. No detection on either
    side: 1. Detections whose class equals ``background_classification`` are ignored.
    Pass: >= 0.9.
    """

    name = "MeanIOU"
    params = {"background_classification": Param(1.0, "class value that means background")}
    threshold = 0.9
    higher_is_better = True
    perfect = 1.0
    unit = "IoU, 0..1"
    tensors_per_side = 2

    def _side(self, arrays: list[np.ndarray], side: str):
        if len(arrays) != 2:
            return f"MeanIOU needs 2 {side} tensors (boxes, classes), got {len(arrays)}"
        boxes, classes = arrays
        if boxes.size % 4:
            return f"{side} boxes have {boxes.size} values, not a multiple of 4"
        boxes = boxes.reshape(-1, 4)
        classes = classes.ravel()
        if classes.size != boxes.shape[0]:
            return f"{side} has {boxes.shape[0]} boxes but {classes.size} classes"
        if not (np.isfinite(boxes).all() and np.isfinite(classes).all()):
            return f"NaN or Inf in {side} boxes or classes"
        keep = ~np.isclose(classes, self.values["background_classification"])
        return boxes[keep], classes[keep]

    def compute(self, pair: TensorPair):
        g = self._side(pair.golden_list, "golden")
        t = self._side(pair.target_list, "target")
        for side in (g, t):
            if isinstance(side, str):
                return VerifierResult(np.nan, False if "NaN" in side else None, side)
        (gb, gc), (tb, tc) = g, t
        total, count = 0.0, 0
        for cls in np.union1d(gc, tc):
            gi, ti = gb[gc == cls], tb[tc == cls]
            count += max(len(gi), len(ti))
            if len(gi) and len(ti):
                total += sum(greedy_match(iou_matrix(gi, ti)))
        value = total / count if count else 1.0
        return value, {
            "golden_detections": int(len(gb)),
            "target_detections": int(len(tb)),
            "classes": int(np.union1d(gc, tc).size),
        }

    def verify(self, pair: TensorPair) -> VerifierResult:
        if pair.problem:
            return VerifierResult(np.nan, None, pair.problem)
        out = self.compute(pair)
        if isinstance(out, VerifierResult):
            return out
        value, details = out
        passed = self.judge(value)
        return VerifierResult(
            value,
            passed,
            "ok",
            {"value": value, "threshold": self.pass_mark, "passed": passed, **details},
        )
