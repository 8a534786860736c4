"""Class-score outputs: where a top-1 decision exists, and whether a run keeps it.

Top-1 agreement is a decision metric only where the output *is* a distribution over classes. Taken
over "axis 1" of any tensor it judged detector heads by their anchors or box coordinates (one flipped
argmax among 2,100 anchors failed a run whose boxes were unchanged), and gave two answers for the same
run when one engine dropped the batch axis. So:

- the class axis is found on the reference with every size-1 axis dropped first, so [1, 7600, 10]
  (ONNX Runtime, MNN) and [7600, 10] (ncnn) are the same tensor to this module;
- without a declared task an output is a class-score tensor only when it is recognised robustly: a
  probability distribution (non-negative, summing to 1 along one axis at every position). Logits and
  sigmoid scores look like any other numbers (an embedding, box offsets), so they are judged as
  elements unless the user declares `--task classification` (then the last non-trivial axis);
- a position decides only when the reference's two best classes are further apart than the output's
  tolerance (atol + rtol x max|ref|): a flip between near-equal classes is reported on its own
  (`n_tie_flips`), never counted as a changed decision.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from layerdiff.analyzer.measure.tolerances import Tolerances

MAX_CLASSES = 1 << 16
SUM_TOLERANCE = 1e-3  # |sum - 1| allowed for a probability vector (fp32 softmax over 10^4 classes: ~1e-6)
MIN_POSITIONS_CHECKED = 1


def squeezed(t: np.ndarray) -> np.ndarray:
    """The tensor without its size-1 axes (batch included): every engine's layout of it looks alike."""
    shape = [d for d in t.shape if d != 1]
    return t.reshape(shape or [t.size])


def probability_axis(ref: np.ndarray) -> int | None:
    """The axis of `ref` (squeezed) along which it is a probability distribution at every position, else None."""
    x = squeezed(ref)
    if x.dtype.kind != "f" or x.size < 2 or not np.isfinite(x).all() or float(x.min()) < 0.0:
        return None
    for axis in reversed(range(x.ndim)):  # the last axis first: softmax over classes is usually last
        if not 2 <= x.shape[axis] <= MAX_CLASSES:
            continue
        sums = x.sum(axis=axis, dtype=np.float64)
        if float(np.abs(sums - 1.0).max()) <= SUM_TOLERANCE:
            return axis
    return None


def class_axis(ref: np.ndarray, declared: bool = False) -> int | None:
    """The class axis of an output (squeezed), or None when it holds no class decision.

    `declared`: the user said the output is class scores (logits allowed): its last axis, when that
    axis has 2..MAX_CLASSES entries."""
    axis = probability_axis(ref)
    if axis is not None or not declared:
        return axis
    x = squeezed(ref)
    return x.ndim - 1 if 2 <= x.shape[-1] <= MAX_CLASSES else None


def topk_agreement(ref: np.ndarray, run: np.ndarray, tolerance: float, declared: bool = False) -> dict:
    """Top-1 / top-5 agreement of a class-score output, over the positions where the reference decides.

    Returns top1 (share of deciding positions whose argmax the run keeps), top5 (share where the
    reference's top-1 is among the run's five best; NaN under 6 classes), n_positions, n_decided, n_flips
    (deciding positions that changed) and n_tie_flips (positions within `tolerance` of a tie whose
    argmax changed). Every value is NaN when the output is not class scores."""
    nothing = {"top1": math.nan, "top5": math.nan, "n_positions": 0, "n_decided": 0, "n_flips": 0, "n_tie_flips": 0}
    if ref.size != run.size:
        return nothing
    axis = class_axis(ref, declared)
    if axis is None:
        return nothing
    a = np.moveaxis(squeezed(ref), axis, -1)
    b = np.moveaxis(squeezed(run.reshape(ref.shape)), axis, -1)
    a = np.nan_to_num(a.reshape(-1, a.shape[-1]).astype(np.float64), nan=-np.inf)
    b = np.nan_to_num(b.reshape(-1, b.shape[-1]).astype(np.float64), nan=-np.inf)
    best = np.argmax(a, axis=1)
    two = np.sort(a, axis=1)[:, -2:]
    decided = (two[:, 1] - two[:, 0]) > tolerance
    kept = best == np.argmax(b, axis=1)
    n_decided = int(decided.sum())
    out = {"n_positions": int(len(a)), "n_decided": n_decided, "n_flips": int((decided & ~kept).sum()),
           "n_tie_flips": int((~decided & ~kept).sum())}
    out["top1"] = float(kept[decided].mean()) if n_decided else math.nan
    if a.shape[1] <= 5 or not n_decided:
        out["top5"] = math.nan
    else:
        five = np.argpartition(-b, 4, axis=1)[:, :5]
        out["top5"] = float(np.any(five == best[:, None], axis=1)[decided].mean())
    return out


def decision_tolerance(ref: np.ndarray, tolerances: Tolerances, stats: dict | None = None) -> float:
    """How far apart a reference's two best scores must be for its argmax to be a decision: the
    output's own tolerance, atol + rtol x max|ref| (the same scale the element error uses)."""
    lo, hi = (stats or {}).get("min"), (stats or {}).get("max")
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        peak = max(abs(float(lo)), abs(float(hi)))
    else:
        finite = ref[np.isfinite(ref)] if ref.dtype.kind == "f" else ref
        peak = float(np.abs(finite).max()) if finite.size else 0.0
    return tolerances.atol + tolerances.rtol * peak
