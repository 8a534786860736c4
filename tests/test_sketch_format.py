"""Tensor summaries (analyzer/FORMATS.md §3): the C++ harness and the Python writer agree element by element,
and the estimates they give hold against the exact metrics of real dumps.

Real runs of a real pretrained network (PP-OCRv4 text detection from the rapidocr wheel, converted by pnnx):
the C++ harness built for the host and pip ncnn, at high and low (bf16 on x86) precision.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from layerdiff.analyzer.formats import sketchformat as sf
from layerdiff.analyzer.formats.rawdump import read_raw_dump
from layerdiff.analyzer.measure.estimate import estimate_against_tensor, estimate_layer
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances
from layerdiff.errors import DumpFormatError
from tests.sketch_support import det_model, dumps  # noqa: F401 (fixtures; they run host_harness)

pytestmark = pytest.mark.slow  # builds the host harness (cached) on first use
def test_mix64_is_splitmix64():
    """The published splitmix64 sequence from state 0 (its first outputs), so any language can check its hash."""
    first = sf.mix64(np.array([0, sf.GOLDEN], dtype=np.uint64))
    assert [int(v) for v in first] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    assert sf.mix64_int(0) == 0xE220A8397B1DCDAF


def test_sample_positions_one_per_stratum_increasing_and_shared():
    for numel in (4097, 10_000, 123_457, 1 << 24):
        positions = sf.sample_positions(numel)
        assert positions.size == sf.SAMPLE
        assert np.all(np.diff(positions) > 0) and positions[0] >= 0 and positions[-1] < numel
        strata = (np.arange(sf.SAMPLE) * numel) // sf.SAMPLE
        assert np.all(positions >= strata) and np.all(positions[:-1] < strata[1:])
        assert np.array_equal(positions, sf.sample_positions(numel))  # a function of the count alone
    assert np.array_equal(sf.sample_positions(100), np.arange(100))
    assert not np.array_equal(sf.sample_positions(10_000), sf.sample_positions(10_001)[: sf.SAMPLE])


def test_sketch_is_linear():
    """S(a) - S(b) = S(a - b): what lets two runs' sketches estimate their difference."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(50_000), rng.standard_normal(50_000)
    diff = sf.summarize(a).sketch - sf.summarize(b).sketch
    assert np.allclose(diff, sf.summarize(a - b).sketch, rtol=1e-9, atol=1e-9)


def test_cpp_and_python_summaries_agree_on_every_tensor(dumps):
    """The C++ harness's summary of each tensor equals the Python writer's summary of the bytes it wrote:
    the same sample (bit for bit, so the same positions), counts and range, and the same sketch within
    float64 rounding (so the same bucket and sign for every element)."""
    raw = read_raw_dump(dumps["cpp"])
    written = sf.read_summaries(dumps["cpp"])
    assert len(written.tensors) == len(raw.tensors) > 50 and not written.problems
    sketched = 0
    for tensor, array in raw.iter_arrays():
        mine, theirs = sf.summarize(array, tensor.order, tensor.name), written.tensors[tensor.order]
        assert theirs.name == tensor.name
        assert theirs.sample.tobytes() == mine.sample.tobytes(), tensor.name
        assert {k: theirs.stats[k] for k in sf.STAT_FIELDS} == {k: mine.stats[k] for k in sf.STAT_FIELDS}, tensor.name
        assert (theirs.stats["min"], theirs.stats["max"]) == (mine.stats["min"], mine.stats["max"])
        assert math.isclose(theirs.stats["sumsq"], mine.stats["sumsq"], rel_tol=1e-9)
        scale = math.sqrt(mine.stats["sumsq"]) or 1.0
        assert np.allclose(theirs.sketch, mine.sketch, rtol=1e-9, atol=1e-12 * scale), tensor.name
        sketched += not theirs.exact_sample
    assert sketched > 20


def test_python_engine_writes_the_same_summary_as_it_would_compute(dumps):
    raw = read_raw_dump(dumps["high"])
    written = sf.read_summaries(dumps["high"])
    for tensor, array in raw.iter_arrays():
        mine = sf.summarize(array)
        assert np.array_equal(written.tensors[tensor.order].sketch, mine.sketch)
        assert written.tensors[tensor.order].sample.tobytes() == mine.sample.tobytes()


def exact_and_estimated(dumps):
    """Per tensor name in both runs: the exact metrics (full tensors) and the estimate (summaries alone)."""
    high, low = read_raw_dump(dumps["high"]), read_raw_dump(dumps["low"])
    s_high, s_low = sf.read_summaries(dumps["high"]).by_name(), sf.read_summaries(dumps["low"]).by_name()
    kernel = PairKernel(Tolerances())
    low_by_name = {t.name: t for t in low.tensors}
    pairs = []
    for tensor in high.tensors:
        other = low_by_name.get(tensor.name)
        if other is None or other.shape != tensor.shape:
            continue
        a, b = high.read(tensor), low.read(other)
        diff = b.astype(np.float64) - a.astype(np.float64)
        exact = {"rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(a.astype(np.float64))),
                 "pass_fraction": float(np.mean(~((np.abs(diff) > 1e-3) & (np.abs(diff) > 1e-2 * np.abs(a))))),
                 "n_zero": int(np.count_nonzero(b == 0))}
        pairs.append((tensor.name, exact, estimate_layer(s_high[tensor.name], s_low[tensor.name], Tolerances(), kernel),
                      s_low[tensor.name]))
    return pairs


def test_sketch_rel_l2_within_its_stated_uncertainty_on_real_dumps(dumps):
    """bf16 against fp32 on every layer of a real network: the estimated rel L2 lies within 4 sigma of the
    exact one (numpy's, outside layerdiff) on every layer, and its typical error is the sketch's ~2%."""
    errors = []
    for name, exact, estimate, _ in exact_and_estimated(dumps):
        if not estimate["estimated"]:
            assert math.isclose(estimate["rel_l2"], exact["rel_l2"], rel_tol=1e-4, abs_tol=1e-9), name
            continue
        if exact["rel_l2"] == 0:  # the input: identical bytes give identical sketches
            assert estimate["rel_l2"] == 0, name
            continue
        gap = abs(estimate["rel_l2"] - exact["rel_l2"])
        assert gap <= 4 * estimate["rel_l2_sigma"] + 1e-9, (name, estimate["rel_l2"], exact["rel_l2"])
        errors.append(gap / exact["rel_l2"])
    assert len(errors) > 20
    assert float(np.median(errors)) < 0.03


def test_sample_allclose_share_and_zero_counts_on_real_dumps(dumps):
    """The sample's allclose share lies within 4 sigma (binomial) of the exact share; zero counts are exact."""
    for name, exact, estimate, summary in exact_and_estimated(dumps):
        assert summary.stats["n_zero"] == exact["n_zero"], name
        gap = abs(estimate["pass_fraction"] - exact["pass_fraction"])
        assert gap <= 4 * estimate["pass_fraction_sigma"] + 1e-12, (name, estimate["pass_fraction"], exact)


def test_estimate_against_a_full_reference_equals_summary_to_summary(dumps):
    high = read_raw_dump(dumps["high"])
    s_high, s_low = sf.read_summaries(dumps["high"]).by_name(), sf.read_summaries(dumps["low"]).by_name()
    tensor = max(high.tensors, key=lambda t: t.nbytes)
    full = estimate_against_tensor(high.read(tensor), s_low[tensor.name], Tolerances())
    both = estimate_layer(s_high[tensor.name], s_low[tensor.name], Tolerances())
    assert full["rel_l2"] == pytest.approx(both["rel_l2"], rel=1e-9)
    assert full["pass_fraction"] == both["pass_fraction"]


def test_new_nan_counts_make_the_estimate_infinite_and_exact():
    a = np.random.default_rng(0).standard_normal(20_000).astype(np.float32)
    b = a.copy()
    b[7] = np.nan  # almost surely not a sampled position: the counts alone must tell
    row = estimate_layer(sf.summarize(a), sf.summarize(b), Tolerances())
    assert row["n_nan_new"] == 1 and row["n_nonfinite_mismatch"] == 1
    assert row["rel_l2"] == math.inf and row["rel_l2_sigma"] == 0.0


def test_summary_round_trips_and_small_tensors_are_stored_whole(tmp_path):
    writer = sf.SummaryWriter(tmp_path)
    big = np.random.default_rng(1).standard_normal((3, 5000)).astype(np.float32)
    small = np.arange(10, dtype=np.float16)
    writer.add(0, "big", big)
    writer.add(1, "small", small)
    writer.close()
    assert (tmp_path / sf.SUMMARY_DATA).stat().st_size == sf.BUCKETS * 8 + sf.SAMPLE * 4 + 10 * 2
    read = sf.read_summaries(tmp_path)
    assert np.array_equal(read.tensors[0].sketch, sf.summarize(big).sketch)
    assert read.tensors[1].exact_sample and read.tensors[1].dtype == "float16"
    assert np.array_equal(read.tensors[1].sample, small)


@pytest.mark.parametrize("damage, says", [
    (lambda lines: [json.dumps({**json.loads(lines[0]), "buckets": 512})] + lines[1:], "512 buckets"),
    (lambda lines: [lines[0], lines[1].replace('"numel": 15000', '"numel": "15000"')], "non-negative integer"),
    (lambda lines: [lines[0], lines[1].replace('"sample_count": 4096', '"sample_count": 4000')], "sample_count 4000"),
    (lambda lines: ["{not json"] + lines[1:], "not valid JSON"),
])
def test_damaged_summary_is_one_line_naming_the_file(tmp_path, damage, says):
    writer = sf.SummaryWriter(tmp_path)
    writer.add(0, "t", np.ones((3, 5000), np.float32))
    writer.close()
    path = tmp_path / sf.SUMMARY_LINES
    path.write_text("\n".join(damage(path.read_text().splitlines())) + "\n")
    with pytest.raises(DumpFormatError, match=says) as err:
        sf.read_summaries(tmp_path)
    assert str(path) in str(err.value)


def test_summary_data_cut_short_keeps_the_tensors_before_the_cut(tmp_path):
    writer = sf.SummaryWriter(tmp_path)
    for order in range(3):
        writer.add(order, f"t{order}", np.full((2, 5000), order, np.float32))
    writer.close()
    data = tmp_path / sf.SUMMARY_DATA
    data.write_bytes(data.read_bytes()[:-100])
    read = sf.read_summaries(tmp_path)
    assert sorted(read.tensors) == [0, 1] and "past the end" in read.problems[0]
