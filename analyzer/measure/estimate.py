"""A layer's metrics estimated from two tensor summaries (analyzer/FORMATS.md §3), with their uncertainty.

Why: a sketch-first collection leaves most tensors on the phone and brings back their summaries. From
them this module gives every metric the judge reads, as numbers with a standard deviation, never a
status (judging stays threshold-side, analyzer/findings/exactneeds.py decides which layers must be
pulled whole because an estimate lies too close to a threshold):
- relative L2, cosine and SQNR from the count-sketches: the squared norm of the difference is the sum
  of the squared bucket differences, unbiased, with a relative standard deviation of at most
  sqrt(2 / BUCKETS) (4.4% for 1,024 buckets; half that on the relative L2, a square root), sharpened by the
  sample's own estimate when the two agree (`squared_difference`);
- the allclose share, the share beyond the tensor's scale, the zero collapse, saturation, quantiles of
  |diff| and a lower bound of the largest |diff| from the shared-position sample, measured by the very
  kernel full tensors go through, restricted to the sample's elements (binomial spread);
- NaN/Inf facts from the exact counts: a differing count proves at least that many mismatches.
A tensor of at most SAMPLE elements is sampled whole: its row is exact, not estimated.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from layerdiff.analyzer.formats.sketchformat import BUCKETS, TensorSummary, summarize
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances, cosine_from_sums
from layerdiff.errors import LayerdiffError

SKETCH_REL_SIGMA = math.sqrt(2.0 / BUCKETS)  # relative spread of a squared-norm estimate
SIGMA_COLUMNS = ("rel_l2_sigma", "cosine_sigma", "sqnr_db_sigma", "pass_fraction_sigma", "beyond_scale_sigma",
                 "zero_collapse_sigma")
# Scaled from the sample to the tensor: counts the judge reads as numbers of elements.
SCALED_COUNTS = ("n_fail", "n_zero_collapsed", "n_saturated", "n_zero_new", "n_out_of_range")
NONFINITE = (("nan", "n_nan"), ("posinf", "n_posinf"), ("neginf", "n_neginf"))


def kernel_stats(summary: TensorSummary) -> dict[str, Any]:
    """The statistics the metric kernel reads (mean/std of the finite values, counts, range) from a summary."""
    s = summary.stats
    finite = s["numel"] - s["n_nan"] - s["n_posinf"] - s["n_neginf"]
    mean = s["sum"] / finite if finite else math.nan
    var = max(s["sumsq"] / finite - mean * mean, 0.0) if finite else math.nan
    return {**s, "mean": mean, "std": math.sqrt(var) if finite else math.nan}


def estimate_layer(ref: TensorSummary, run: TensorSummary, tol: Tolerances,
                   kernel: PairKernel | None = None) -> dict[str, Any]:
    """Every metric of (reference, run) from their summaries, plus `estimated` and one `<metric>_sigma`
    per estimated figure (0 where the figure is exact). Raises ValueError when the two were not summarised
    over the same element count (different shapes: such a pair needs its tensors)."""
    if ref.numel != run.numel:
        raise ValueError(f"{run.name}: {run.numel} elements against the reference's {ref.numel}")
    kernel = kernel or PairKernel(tol)
    ref_stats, run_stats = kernel_stats(ref), kernel_stats(run)
    row = kernel.compare(ref.sample, run.sample, ref_stats, run_stats)
    if ref.exact_sample and run.exact_sample:
        return {**row, "estimated": False, **dict.fromkeys(SIGMA_COLUMNS, 0.0)}
    row.update(_from_sample(row, ref.numel, run.sample.size))
    row.update(_from_sketches(ref, run, row))
    row.update(_from_counts(ref, run, row))
    row["numel"] = ref.numel
    row["estimated"] = True
    return row


def estimate_against_tensor(reference: np.ndarray, run: TensorSummary, tol: Tolerances,
                            kernel: PairKernel | None = None) -> dict[str, Any]:
    """A run known only by its summary against a reference held whole (a local golden): the reference is
    summarised the way every harness summarises, then compared summary to summary."""
    return estimate_layer(summarize(reference, run.order, run.name), run, tol, kernel)


class SketchedValueErrors:
    """Structural alignment's value question (rel L2 of row j against row i) when a run is known partly by
    summaries: a pair with a summarised side is answered from the sketches (same element count and order),
    the others by the tensors as usual (`errors`, an align.values.ValueErrors)."""

    def __init__(self, errors, base_dump, other_dump, base_orders: list[int], other_orders: list[int]) -> None:
        self._errors, self._dumps, self._orders = errors, (base_dump, other_dump), (base_orders, other_orders)
        self._summaries: tuple[dict, dict] = ({}, {})
        self._known: dict[tuple[int, int], float] = {}

    def __call__(self, i: int, j: int) -> float:
        base_order, other_order = self._orders[0][i], self._orders[1][j]
        if (base_order not in self._dumps[0].estimated_orders
                and other_order not in self._dumps[1].estimated_orders):
            return self._errors(i, j)
        if (i, j) not in self._known:
            a, b = self._summary(0, base_order), self._summary(1, other_order)
            if a is None or b is None or a.numel != b.numel:
                self._known[i, j] = math.inf
            else:
                dd = float(np.sum((a.sketch - b.sketch) ** 2))
                aa = a.stats["sumsq"]
                self._known[i, j] = math.sqrt(dd / aa) if aa > 0 else (0.0 if dd == 0 else math.inf)
        return self._known[i, j]

    def _summary(self, side: int, order: int) -> TensorSummary | None:
        cache = self._summaries[side]
        if order not in cache:
            try:
                cache[order] = self._dumps[side].summary(order)
            except (LayerdiffError, ValueError, OSError, KeyError):  # an unreadable summary: no match
                cache[order] = None
        return cache[order]

    @property
    def pairs_asked(self) -> int:
        return self._errors.pairs_asked + len(self._known)

    @property
    def exact_calls(self) -> int:
        return self._errors.exact_calls


def _from_sample(row: dict[str, Any], numel: int, m: int) -> dict[str, Any]:
    """Shares from the sample with their binomial spread (never below one element's worth: a sample
    where every element passes does not prove the tensor has no failing element); counts scaled up."""
    scale = numel / m
    out = {k: int(round(row[k] * scale)) for k in SCALED_COUNTS if k in row}
    for key in ("pass_fraction", "beyond_scale", "zero_collapse"):
        p = float(row.get(key, 0.0))
        out[f"{key}_sigma"] = math.sqrt(max(p * (1.0 - p), 1.0 / m) / m)
    return out


def _from_sketches(ref: TensorSummary, run: TensorSummary, row: dict[str, Any]) -> dict[str, Any]:
    """rel L2, cosine and SQNR from the squared norms: the reference's and the run's exact (their sums of
    squares), the difference's from the sketches, sharpened by the sample when the two agree."""
    dd, dd_var = squared_difference(ref, run)
    aa, bb = ref.stats["sumsq"], run.stats["sumsq"]
    dd_sigma = math.sqrt(dd_var)
    rel = math.sqrt(dd / aa) if aa > 0 else (0.0 if dd == 0 else math.inf)
    return {
        "rel_l2": rel,
        "rel_l2_sigma": rel * dd_sigma / (2.0 * dd) if dd > 0 and math.isfinite(rel) else 0.0,  # d sqrt(x) = dx / 2 sqrt(x)
        "cosine": cosine_from_sums(aa, bb, dd),
        # d cos / d dd = -1 / (2 |a| |b|)
        "cosine_sigma": dd_sigma / (2.0 * math.sqrt(aa * bb)) if aa > 0 and bb > 0 else 0.0,
        "sqnr_db": 10.0 * math.log10(aa / dd) if dd > 0 and aa > 0 else (math.inf if dd == 0 else -math.inf),
        "sqnr_db_sigma": 10.0 / math.log(10.0) * dd_sigma / dd if dd > 0 else 0.0,
    }


def squared_difference(ref: TensorSummary, run: TensorSummary) -> tuple[float, float]:
    """(estimate, variance) of the squared L2 norm of run - ref.

    Two independent estimates: the sketches' (variance at most 2 dd^2 / BUCKETS, whatever the values) and
    the shared sample's (numel / m times the sum of the sampled squared differences, variance from the
    sample's own spread). When they agree within 3 combined sigmas they are weighted by inverse variance;
    when they do not, the sample has missed a few large differences (a heavy tail its spread cannot show)
    and the sketch alone is kept."""
    dd_sketch = float(np.sum((ref.sketch - run.sketch) ** 2))
    var_sketch = SKETCH_REL_SIGMA ** 2 * dd_sketch ** 2
    with np.errstate(all="ignore"):
        diff = run.sample.astype(np.float64) - ref.sample.astype(np.float64)
    m = diff.size
    if m < 2 or not np.isfinite(diff).all():
        return dd_sketch, var_sketch
    squares = diff * diff
    scale = ref.numel / m
    dd_sample = scale * float(squares.sum())
    var_sample = scale * scale * m * float(squares.var(ddof=1))
    if var_sample <= 0.0 or var_sketch <= 0.0 or not math.isfinite(dd_sample + var_sample):
        return dd_sketch, var_sketch
    if abs(dd_sketch - dd_sample) > 3.0 * math.sqrt(var_sketch + var_sample):
        return dd_sketch, var_sketch
    weight_sketch, weight_sample = 1.0 / var_sketch, 1.0 / var_sample
    total = weight_sketch + weight_sample
    return (dd_sketch * weight_sketch + dd_sample * weight_sample) / total, 1.0 / total


def _from_counts(ref: TensorSummary, run: TensorSummary, row: dict[str, Any]) -> dict[str, Any]:
    """NaN/Inf differences the exact counts prove: a run with more NaN than its reference has at least the
    difference as new NaN, whatever the sample saw. Any mismatch makes the L2 figures infinite, exactly."""
    out: dict[str, Any] = {}
    mismatch = 0
    for word, field in NONFINITE:
        new = max(run.stats[field] - ref.stats[field], int(row.get(f"n_{word}_new", 0)))
        lost = max(ref.stats[field] - run.stats[field], int(row.get(f"n_{word}_lost", 0)))
        out[f"n_{word}_new"], out[f"n_{word}_lost"] = new, lost
        mismatch += max(new, lost)
    mismatch = max(mismatch, int(row.get("n_nonfinite_mismatch", 0)))
    out["n_nonfinite_mismatch"] = mismatch
    if mismatch:
        out.update({"rel_l2": math.inf, "rel_l2_sigma": 0.0, "sqnr_db": -math.inf, "sqnr_db_sigma": 0.0,
                    "cosine": math.nan, "cosine_sigma": 0.0, "max_abs": math.inf})
    return out
