"""Structural matching grows linearly with layers: value checks stay a few per match, and the
value screening (`layerdiff.analyzer.align.values`) gives the exact rel L2 wherever it can decide.

Timings are in tests/bench/bench_align_scaling.py; here the counts that make them linear are checked."""
from __future__ import annotations

import math

import numpy as np

from layerdiff.analyzer.align.byname import NameRules, align_layers
from layerdiff.analyzer.align.values import SCREEN, ValueErrors
from tests.scaling import expected, renamed_pair


def _aligned(blocks: int) -> tuple[dict[str, str], dict[str, str], ValueErrors, list[int]]:
    golden, ncnn, golden_tensors, ncnn_tensors = renamed_pair(blocks)
    reads = [0]

    def read(tensors):
        def one(row: int) -> np.ndarray:
            reads[0] += 1
            return tensors[row]
        return one

    errors = ValueErrors(read(golden_tensors), read(ncnn_tensors))
    result = align_layers(golden, ncnn, NameRules(), errors, fp32=True)
    got = dict(zip(result.matched["other_key"], result.matched["key"]))
    return got, expected(golden, ncnn), errors, reads


def test_renamed_blocks_all_match_their_golden_tensor_at_any_length():
    for blocks in (20, 200):
        got, want, _errors, _reads = _aligned(blocks)
        assert got == want, {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}


def test_ten_times_the_layers_asks_ten_times_the_values():
    _, _, small, small_reads = _aligned(20)
    _, _, large, large_reads = _aligned(200)
    assert large.pairs_asked <= 11 * small.pairs_asked
    assert large.exact_calls <= 11 * small.exact_calls
    assert large_reads[0] <= 11 * small_reads[0]


def test_value_errors_are_exact_where_they_can_decide_and_remembered():
    rng = np.random.default_rng(1)
    base = [rng.standard_normal(300_000).astype(np.float32) for _ in range(3)]
    other = [base[0] * (1 + 1e-3 * rng.standard_normal(base[0].size)).astype(np.float32),
             rng.standard_normal(300_000).astype(np.float32), base[2][:1000].copy()]
    reads = []
    errors = ValueErrors(lambda i: (reads.append(("a", i)), base[i])[1], lambda j: (reads.append(("b", j)), other[j])[1])
    exact = float(np.linalg.norm(base[0].astype(np.float64) - other[0]) / np.linalg.norm(base[0].astype(np.float64)))
    assert math.isclose(errors(0, 0), exact, rel_tol=1e-4)
    unrelated = float(np.linalg.norm(base[1].astype(np.float64) - other[1]) / np.linalg.norm(base[1].astype(np.float64)))
    assert errors(1, 1) > SCREEN and math.isclose(errors(1, 1), unrelated, rel_tol=0.1)
    assert errors(2, 2) == math.inf  # sizes differ
    count = len(reads)
    assert errors(0, 0) == errors(0, 0) and len(reads) == count  # answered from memory
    assert errors.exact_calls == 1  # only the pair that may agree read its full tensors twice
