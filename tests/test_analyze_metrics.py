"""The metric kernel against metrics computed independently with plain float64 numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from layerdiff.analyzer.measure import metrics
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances
from layerdiff.analyzer.formats.tensorstats import tensor_stats

EPS = 2.220446049250313e-16


def stats(a: np.ndarray) -> dict:
    return tensor_stats(a).as_dict()


def numpy_metrics(ref: np.ndarray, run: np.ndarray, atol: float, rtol: float) -> dict:
    """Independent float64 reference implementation for finite tensors."""
    with np.errstate(all="ignore"):
        return _numpy_metrics(ref, run, atol, rtol)


def _numpy_metrics(ref: np.ndarray, run: np.ndarray, atol: float, rtol: float) -> dict:
    a, b = ref.astype(np.float64).ravel(), run.astype(np.float64).ravel()
    ad = np.abs(b - a)
    den = np.abs(a)
    floor = metrics.NEGLIGIBLE * np.sqrt(np.mean(a * a))  # scale-aware: near-zero references divide by the floor
    den = np.maximum(den, floor) if floor > 0 else np.where(den == 0, EPS, den)
    rel = ad / den
    return {
        "max_abs": ad.max(), "mean_abs": ad.mean(), "median_abs": np.median(ad), "p99_abs": np.percentile(ad, 99),
        "max_rel": rel.max(), "mean_rel": rel.mean(), "rel_l2": np.linalg.norm(b - a) / np.linalg.norm(a),
        "cosine": np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)),
        "sqnr_db": 10 * np.log10(np.sum(a * a) / np.sum((b - a) ** 2)),
        "pass_fraction": 1 - np.mean((ad > atol) & (rel > rtol)),
    }


def compare(ref, run, tol=Tolerances()):
    return PairKernel(tol).compare(ref, run, stats(ref), stats(run))


@pytest.mark.parametrize("n", [1, 7, metrics.SAMPLE_MAX, 3 * metrics.CHUNK + 5])
def test_finite_metrics_match_numpy(n):
    rng = np.random.default_rng(n)
    ref = rng.normal(size=n).astype(np.float32)
    run = (ref + rng.normal(scale=0.01, size=n)).astype(np.float32)
    if n > 1:
        ref[0] = 0.0  # exercises the epsilon denominator
    got, want = compare(ref, run), numpy_metrics(ref, run, 1e-3, 1e-2)
    sampled = {"median_abs", "p99_abs"} if n > metrics.SAMPLE_MAX else set()  # quantiles of a sample above it
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=0.01 if name in sampled else 2e-5, abs=1e-9), name


def test_cosine_is_exact_enough_near_one():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=100_000).astype(np.float32)
    run = (ref * np.float32(1.0001)).astype(np.float32)
    assert compare(ref, run)["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert compare(ref, run)["sqnr_db"] == pytest.approx(80.0, abs=0.05)


def test_nan_and_inf_never_hide():
    ref = np.arange(1, 11, dtype=np.float32)
    run = ref.copy()
    run[2] = np.nan
    run[5] = np.inf
    ref2 = ref.copy()
    ref2[7] = -np.inf
    run[7] = -np.inf  # same non-finite value on both sides: equal, not an error
    got = compare(ref2, run)
    assert got["n_nonfinite_mismatch"] == 2
    assert got["n_nan_new"] == 1 and got["n_posinf_new"] == 1 and got["n_neginf_new"] == 0
    assert math.isinf(got["max_abs"]) and math.isinf(got["mean_abs"]) and math.isinf(got["rel_l2"])
    assert got["sqnr_db"] == -math.inf
    assert math.isnan(got["cosine"])  # the 8 finite pairs agree exactly: their cosine (1.0) would hide the Inf
    assert compare(ref2, ref2)["cosine"] == pytest.approx(1.0)  # the same Inf on both sides: equal, cosine defined
    assert got["n_fail"] == 2 and got["pass_fraction"] == pytest.approx(0.8)
    assert got["median_abs"] == 0.0  # 7 of 10 pairs are exact
    lost = compare(run, ref2)  # the reverse: the reference has NaN the run does not
    assert lost["n_nan_lost"] == 1 and lost["n_posinf_lost"] == 1


def test_allclose_needs_both_abs_and_rel_to_fail():
    ref = np.array([1000.0, 1e-6, 1.0, 1.0], dtype=np.float32)
    run = np.array([1000.5, 1e-3, 1.5, 1.0005], dtype=np.float32)
    got = compare(ref, run, Tolerances(atol=1e-2, rtol=1e-2))
    # 1000.5: abs 0.5 > atol but rel 5e-4 < rtol -> passes; 1e-3 vs 1e-6: abs 1e-3 < atol -> passes;
    # 1.5: both exceed -> fails; 1.0005: neither -> passes.
    assert got["n_fail"] == 1 and got["pass_fraction"] == pytest.approx(0.75)


def test_zero_collapse_and_saturation_counts():
    # zeros count against the reference values that matter: 1e-9 is negligible against this tensor
    ref = np.array([1.0, 2.0, 0.0, 3.0, 1e-9, 4.0], dtype=np.float32)
    run = np.array([0.0, 0.0, 0.0, 3.0, 0.0, 4.0], dtype=np.float32)
    got = compare(ref, run)
    assert got["n_zero_collapsed"] == 2
    assert got["zero_collapse"] == pytest.approx(2 / 4)
    ref = np.array([3.0, 1e5, -2e5], dtype=np.float32)
    got = compare(ref, np.array([3.0, 65504.0, -65504.0], dtype=np.float32))
    assert got["n_saturated"] == 2


def test_large_tensor_quantiles_are_sampled_closely():
    n = metrics.SAMPLE_MAX * 2 + 17
    rng = np.random.default_rng(7)
    ref = rng.normal(size=n).astype(np.float32)
    run = (ref + rng.exponential(0.01, size=n)).astype(np.float32)
    got = compare(ref, run)
    ad = np.abs(run.astype(np.float64) - ref)
    assert got["median_abs"] == pytest.approx(np.median(ad), rel=0.01)
    assert got["p99_abs"] == pytest.approx(np.percentile(ad, 99), rel=0.02)
    assert got["max_abs"] == pytest.approx(ad.max(), rel=1e-6)


def test_float16_and_integer_tensors():
    ref = np.linspace(-3, 3, 50, dtype=np.float16)
    run = (ref + np.float16(0.01)).astype(np.float16)
    got = compare(ref, run)
    want = numpy_metrics(ref, run, 1e-3, 1e-2)
    assert got["rel_l2"] == pytest.approx(want["rel_l2"], rel=1e-4)
    ints = compare(np.arange(10, dtype=np.int32), np.arange(10, dtype=np.int32) + 1)
    assert ints["max_abs"] == 1.0


NORMAL_FLOATS = st.floats(-1e4, 1e4, width=32).filter(lambda v: v == 0 or abs(v) > 1e-20)


@settings(max_examples=40, deadline=None, database=None)
@given(arrays(np.float32, st.integers(1, 300), elements=NORMAL_FLOATS),
       st.floats(0.0, 0.5).filter(lambda s: abs(s - 1e-3) > 1e-9 and abs(s - 1e-2) > 1e-9))
def test_property_matches_numpy(ref, scale):
    # scale == atol/rtol would put a zero reference exactly on the allclose boundary, where float32
    # (the tensors' precision, numpy 2's rule for Python scalars) and this test's float64 disagree
    run = (ref * np.float32(1 + scale) + np.float32(scale)).astype(np.float32)
    if not np.any(ref):
        return
    got, want = compare(ref, run), numpy_metrics(ref, run, 1e-3, 1e-2)
    for name in ("max_abs", "mean_abs", "max_rel", "pass_fraction", "median_abs"):
        assert got[name] == pytest.approx(want[name], rel=1e-4, abs=1e-6), name


def test_stats_that_hide_a_nan_do_not_hide_it_from_the_metrics():
    ref = np.ones(100, dtype=np.float32)
    run = ref.copy()
    run[10] = np.nan
    got = PairKernel(Tolerances()).compare(ref, run, stats(ref), stats(ref))  # run's stats claim no NaN
    assert got["n_nan_new"] == 1 and math.isinf(got["max_abs"])


def test_scale_without_stored_stats_is_read_chunk_by_chunk_and_exact():
    """A layer's scale (max |ref|, RMS) without min/max/moments in the file: a chunked pass that
    skips NaN/Inf wherever they sit, equal to numpy's over the finite values."""
    x = np.random.default_rng(5).standard_normal(3 * metrics.CHUNK + 17).astype(np.float32)
    x[metrics.CHUNK + 3], x[-1], x[5] = np.nan, np.inf, -7.5
    finite = x[np.isfinite(x)].astype(np.float64)
    assert metrics._absmax(x, {}) == 7.5
    assert metrics._rms(x, {}) == pytest.approx(math.sqrt(np.mean(finite * finite)), rel=1e-12)
    assert metrics._absmax(np.full(4, np.nan, np.float32), {}) == 0.0 and metrics._rms(np.full(4, np.nan, np.float32), {}) == 0.0


def test_layer_stats_carry_the_stored_min_and_max(tmp_path):
    """The scale of every compared layer comes from /layers (one 256 MB layer's extra pass cost 0.3 s)."""
    from layerdiff.analyzer.runs.sources import LayerStats
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from tests.analyze_dumps import reference_arrays, write_dump

    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    with DumpFile(tmp_path / "ref.h5") as dump:
        stats = LayerStats(dump.layers)
        first = dump.layers.iloc[0]
        row = stats[int(first["order"])]
    assert row["min"] == pytest.approx(float(ref["conv1"].min())) and row["max"] == pytest.approx(float(ref["conv1"].max()))
