"""Embedding outputs (a sentence encoder's vector, a face or speaker embedding) compared by what they are
used for: nearest-neighbour search by cosine similarity. Elements of an embedding mean nothing one by
one; the direction of the vector is the result, so a run is judged by its cosine similarity to the
reference's, per row of a batch."""
from __future__ import annotations

import numpy as np

from layerdiff.analyzer.measure.classes import squeezed


def as_rows(x: np.ndarray) -> np.ndarray:
    """[rows, D] float64: a 1-D output is one embedding, a 2-D one a row per embedding."""
    v = np.asarray(squeezed(x), dtype=np.float64)
    return v.reshape(1, -1) if v.ndim == 1 else v.reshape(-1, v.shape[-1])


def cosine_rows(ref: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Cosine similarity of each run row to its reference row (1 when both are zero, 0 when one is;
    NaN/Inf in the run give -1, the worst)."""
    a, b = as_rows(ref), as_rows(run).reshape(as_rows(ref).shape)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where((na > 0) & (nb > 0), dot / (na * nb), np.where((na == 0) & (nb == 0), 1.0, 0.0))
    return np.where(np.isfinite(cos), np.clip(cos, -1.0, 1.0), -1.0)
