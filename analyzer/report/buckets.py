"""Fixed-size drawings of any model: a line keeps the worst value of each bucket of layers, so no
failing layer can disappear from a chart however many layers the model has (numpy only)."""
from __future__ import annotations

import numpy as np

MAX_POINTS = 1500  # per line; the heatmap's columns likewise


def worst_per_bucket(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) sorted by x, reduced to the largest y of each of `limit` equal x-ranges.

    A line through 10,000 layers is wider than the figure in pixels anyway; keeping each bucket's
    maximum (at its own x) means no spike, and so no failing layer, can disappear from the plot.
    """
    order = np.argsort(x, kind="stable")
    x, y = np.asarray(x)[order], np.asarray(y, dtype=float)[order]
    if x.size <= limit:
        return x, y
    span = float(x[-1] - x[0]) + 1.0
    bucket = ((x - x[0]) * (limit / span)).astype(np.int64)
    pick = np.lexsort((-np.nan_to_num(y, nan=-np.inf), bucket))
    first = pick[np.r_[True, bucket[pick][1:] != bucket[pick][:-1]]]
    first.sort()
    return x[first], y[first]


def worst_columns(values: np.ndarray, limit: int = MAX_POINTS) -> np.ndarray:
    """Columns merged in `limit` buckets keeping each row's worst value (NaN only if all are NaN)."""
    edges = np.linspace(0, values.shape[1], limit + 1).astype(np.int64)
    filled = np.where(np.isnan(values), -np.inf, values)
    worst = np.maximum.reduceat(filled, edges[:-1], axis=1)
    return np.where(np.isneginf(worst), np.nan, worst)


# Values past this magnitude are left out of a chart: an axis spanning -1e308..1e308 overflows its own
# width (Matplotlib cannot place ticks, a histogram cannot bin it); float32 tensors never come near,
# a float64 dump can.
PLOT_MAX = 1e300


def plottable(values: np.ndarray) -> np.ndarray:
    """Finite values small enough that an axis over them has a finite width."""
    return np.isfinite(values) & (np.abs(values) <= PLOT_MAX)
