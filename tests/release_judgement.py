"""numpy's own judgement of two releases' dumps, read with h5py alone, outside layerdiff: what the tests of
engine releases check the report's "where the two releases part" against."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

REL_L2_WARN, ATOL, RTOL, MIN_PASS = 1e-2, 1e-3, 1e-2, 0.99  # the analyzer's default thresholds (README "Verdicts")


def text_of(value) -> str:
    """An HDF5 string cell or attribute as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def h5_tensors(path: Path) -> tuple[dict, list[tuple[str, str, np.ndarray]]]:
    """(root attributes, [(layer key, op type, tensor)] in execution order) read with h5py alone."""
    with h5py.File(path, "r") as f:
        attrs = {k: text_of(v) if isinstance(v, (bytes, str)) else v for k, v in f.attrs.items()}
        rows = sorted(f["layers"][()], key=lambda row: int(row["order"]))
        nodes = [(text_of(row["key"]), text_of(row["op_type"]), np.asarray(f["tensors"][str(int(row["order"]))][()],
                                                                         dtype=np.float64)) for row in rows]
    return attrs, nodes


def parts(ref: np.ndarray, other: np.ndarray) -> bool:
    """numpy's own judgement of one layer at the analyzer's default thresholds: relative L2 error above the warn
    line, fewer allclose elements than the pass share, or a NaN / Inf pattern that differs."""
    if ref.shape != other.shape:
        return True
    if not np.array_equal(np.isfinite(ref), np.isfinite(other)):
        return True
    fin = np.isfinite(ref)
    ref, other = ref[fin], other[fin]
    if ref.size == 0:
        return False
    diff = np.abs(other - ref)
    rel_l2 = np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30)
    close = (diff <= ATOL + RTOL * np.abs(ref)).mean()
    return bool(rel_l2 > REL_L2_WARN or close < MIN_PASS)
