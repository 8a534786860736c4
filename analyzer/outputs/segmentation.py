"""Segmentation outputs compared as masks: which pixels change class, and how each class's region overlaps.

Per-pixel class scores [C, H, W] decide by argmax (a pixel decides only where the reference's two best
scores are further apart than the output's tolerance, like class-score outputs); one map [H, W] is a
probability (or logit) map thresholded at 0.5 (0 for logits, which go negative).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MaskChanges:
    """How a run's mask differs from the reference's."""

    n_pixels: int
    n_decided: int
    n_changed: int  # deciding pixels whose class changed
    n_tie_changed: int  # pixels within tolerance of a tie whose class changed
    worst_class: int
    worst_iou: float  # the lowest per-class IoU over deciding pixels (1.0 when every region is kept)

    @property
    def changed_share(self) -> float:
        return self.n_changed / self.n_decided if self.n_decided else 0.0


def class_map(x: np.ndarray, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """(class per pixel, whether the pixel decides) of a squeezed [C, H, W] or [H, W] output."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim >= 3:
        flat = x.reshape(x.shape[0], -1)
        two = np.sort(flat, axis=0)[-2:]
        return np.argmax(flat, axis=0), (two[1] - two[0]) > tolerance
    flat = x.reshape(-1)
    cut = 0.5 if flat.min() >= 0 and flat.max() <= 1 else 0.0
    return (flat > cut).astype(np.int64), np.abs(flat - cut) > tolerance


def compare_masks(ref: np.ndarray, run: np.ndarray, tolerance: float) -> MaskChanges:
    """Compare the masks of a reference and a run output (same shape, size-1 axes dropped)."""
    ref_cls, decided = class_map(ref, tolerance)
    run_cls, _ = class_map(run.reshape(ref.shape), tolerance)
    changed = ref_cls != run_cls
    worst_class, worst_iou = -1, 1.0
    for cls in np.unique(ref_cls[decided]):  # over deciding pixels: a near tie's flip is no lost region
        a, b = (ref_cls == cls) & decided, (run_cls == cls) & decided
        iou = float((a & b).sum()) / float((a | b).sum())
        if iou < worst_iou:
            worst_class, worst_iou = int(cls), iou
    return MaskChanges(int(ref_cls.size), int(decided.sum()), int((changed & decided).sum()),
                       int((changed & ~decided).sum()), worst_class, worst_iou)
