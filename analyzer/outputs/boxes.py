"""Detected boxes and how a run's boxes differ from the reference's, as a user would compare them.

A reference box is matched to the run box of the same class that overlaps it most (greedy, best IoU
first, each box used once). What a user sees, in that order of gravity:
  moved    matched, but IoU below `moved` (default 0.9): the box is somewhere else;
  lost     no run box of its class overlaps it by IoU >= 0.5, not even one just under the score threshold;
  gained   the same, the other way round;
  relabelled  a box overlapping it by IoU >= 0.5 exists, but with another class;
  scores   matched boxes whose score changed by more than `score_tol`;
  threshold   a box present in one run only because its score sits on the threshold (the other run has
           it just below): reported, but no decision changed beyond the score tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MATCH_IOU = 0.5  # a box overlapping another by less is a different box


@dataclass
class Boxes:
    """Boxes as x0, y0, x1, y1 in input pixels, with their score and class."""

    xyxy: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return int(len(self.scores))

    def take(self, keep) -> "Boxes":
        return Boxes(self.xyxy[keep], self.scores[keep], self.classes[keep])

    @staticmethod
    def empty() -> "Boxes":
        return Boxes(np.zeros((0, 4)), np.zeros(0), np.zeros(0, dtype=np.int64))


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in `a` with every box in `b` (xyxy)."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: Boxes, iou: float, top_k: int = 1000) -> Boxes:
    """Per-class hard non-maximum suppression, best score first (what the families' own post-processing does)."""
    order = np.argsort(-boxes.scores, kind="stable")[:max(top_k, 0) or None]
    kept: list[int] = []
    for cls in np.unique(boxes.classes[order]):
        idx = [i for i in order if boxes.classes[i] == cls]
        while idx:
            best, idx = idx[0], idx[1:]
            kept.append(best)
            if idx:
                over = iou_matrix(boxes.xyxy[[best]], boxes.xyxy[idx])[0]
                idx = [i for i, o in zip(idx, over) if o <= iou]
    kept.sort(key=lambda i: -boxes.scores[i])
    return boxes.take(np.array(kept, dtype=np.int64))


@dataclass
class BoxChanges:
    """The comparison of a run's boxes with the reference's (indices into the reference/run boxes)."""

    n_reference: int
    n_run: int
    ious: list[float] = field(default_factory=list)  # per matched pair
    moved: list[tuple[int, int, float]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    gained: list[int] = field(default_factory=list)
    relabelled: list[tuple[int, int, float]] = field(default_factory=list)
    scores: list[tuple[int, int, float]] = field(default_factory=list)  # (ref, run, score change)
    threshold: list[tuple[str, int, float]] = field(default_factory=list)  # ("lost"/"gained", box, its other score)

    @property
    def decisions_changed(self) -> bool:
        return bool(self.moved or self.lost or self.gained or self.relabelled)


def compare_boxes(ref: Boxes, run: Boxes, ref_all: Boxes, run_all: Boxes, moved: float,
                  score_tol: float) -> BoxChanges:
    """Match run boxes to reference boxes; `*_all` are the same outputs decoded at a lower threshold
    (conf - score_tol), so a box that merely crossed the threshold is told apart from a lost one."""
    changes = BoxChanges(len(ref), len(run))
    pairs = _greedy(ref, run, same_class=True)
    for i, j, iou in pairs:
        changes.ious.append(iou)
        if iou < moved:
            changes.moved.append((i, j, iou))
        delta = float(run.scores[j] - ref.scores[i])
        if abs(delta) > score_tol:
            changes.scores.append((i, j, delta))
    changes.moved.sort(key=lambda m: m[2])  # the box that moved most first
    matched_ref, matched_run = {i for i, _, _ in pairs}, {j for _, j, _ in pairs}
    _unmatched(changes, "lost", [i for i in range(len(ref)) if i not in matched_ref], ref, run, run_all, score_tol)
    _unmatched(changes, "gained", [j for j in range(len(run)) if j not in matched_run], run, ref, ref_all, score_tol)
    return changes


def _unmatched(changes: BoxChanges, kind: str, indices: list[int], mine: Boxes, theirs: Boxes,
               theirs_all: Boxes, score_tol: float) -> None:
    """Sort boxes one side lacks into threshold crossings, relabelled boxes and real losses (gains)."""
    for i in indices:
        box = mine.take([i])
        near = _greedy(box, theirs_all, same_class=True)
        if near and abs(float(theirs_all.scores[near[0][1]] - mine.scores[i])) <= score_tol:
            changes.threshold.append((kind, i, float(theirs_all.scores[near[0][1]])))
            continue
        other = _greedy(box, theirs, same_class=False)
        if other and theirs.classes[other[0][1]] != mine.classes[i]:
            if kind == "lost":
                changes.relabelled.append((i, other[0][1], other[0][2]))
            continue  # a relabelled box is said once, from the reference's side
        getattr(changes, kind).append(i)


def _greedy(a: Boxes, b: Boxes, same_class: bool) -> list[tuple[int, int, float]]:
    """Pairs (i, j, IoU) with IoU >= MATCH_IOU, best first, each box once."""
    iou = iou_matrix(a.xyxy, b.xyxy)
    if same_class and iou.size:
        iou = np.where(a.classes[:, None] == b.classes[None, :], iou, 0.0)
    pairs, used_a, used_b = [], set(), set()
    for flat in np.argsort(-iou, axis=None, kind="stable"):
        i, j = divmod(int(flat), iou.shape[1])
        if iou[i, j] < MATCH_IOU:
            break
        if i not in used_a and j not in used_b:
            used_a.add(i), used_b.add(j)
            pairs.append((i, j, float(iou[i, j])))
    return pairs
