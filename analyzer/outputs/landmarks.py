"""Keypoint outputs (face mesh, body pose, hand landmarks) compared as a user would: did a landmark move?

A landmark model returns K landmarks of D values each, x and y first (mediapipe's pose_landmark: 39 x 5,
x, y, z, visibility, presence; face_landmark: 468 x 3), in pixels of its input (or normalized to [0, 1]
of it). What an app draws is each landmark's position, so a run is judged by how far each landmark
moved in the image plane, in pixels: element errors in z or in a visibility logit are not positions.
"""
from __future__ import annotations

import math

import numpy as np

from layerdiff.analyzer.measure.classes import squeezed


def guess_dims(shape: tuple[int, ...]) -> int:
    """Values per landmark: the last axis of a [K, D] output (D of 2..5), else 5 when the size divides by
    5 (mediapipe's x, y, z, visibility, presence), else 3 (x, y, z), else 2; 0 when none fits."""
    dims = [d for d in shape if d != 1]
    if len(dims) == 2 and 2 <= dims[-1] <= 5:
        return dims[-1]
    size = int(np.prod(dims)) if dims else 1
    return next((d for d in (5, 3, 2) if size % d == 0 and size // d >= 2), 0)


def as_points(x: np.ndarray, dims: int) -> np.ndarray:
    """[K, dims] float64 landmarks of an output."""
    return np.asarray(squeezed(x), dtype=np.float64).reshape(-1, dims)


def compare_landmarks(ref: np.ndarray, run: np.ndarray, dims: int, points: int, scale: tuple[float, float]) -> dict:
    """Per-landmark movement in the image plane (pixels; `scale` multiplies x and y), over the first
    `points` landmarks (0: all). Returns distances (list), the count judged, the worst landmark and its
    movement, and the mean movement."""
    a, b = as_points(ref, dims), as_points(run, dims)
    if points:
        a, b = a[:points], b[:points]
    sx, sy = scale
    moved = np.hypot((b[:, 0] - a[:, 0]) * sx, (b[:, 1] - a[:, 1]) * sy)
    moved = np.where(np.isfinite(moved), moved, math.inf)
    worst = int(np.argmax(moved)) if len(moved) else -1
    return {"points": int(len(a)), "distances": [float(d) for d in moved], "worst": worst,
            "worst_px": float(moved[worst]) if worst >= 0 else 0.0, "mean_px": float(moved.mean()) if len(moved) else 0.0}
