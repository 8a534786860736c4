"""Verdicts weighed by impact: what reaches the outputs decides a run's verdict,
first divergence has one definition, and explanations fit the precisions involved."""
from __future__ import annotations

import math

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from tests.analyze_dumps import LAYERS, perturbed, reference_arrays, write_dump


def _summary(analysis):
    return {r["run"]: r for r in analysis.summary.to_dict("records") if r["role"] == "compared"}


def test_internal_divergence_that_does_not_reach_the_outputs_is_a_warning(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    inside = perturbed(ref, 0.5, ops=["pool"])  # one inner layer far off, every output exact
    write_dump(tmp_path / "vk.h5", inside, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (row,) = _summary(analysis).values()
        assert row["n_fail"] >= 1 and row["verdict"] == "warn"
        assert "no top-1 decision changes" in row["verdict_reason"]
        assert math.isnan(row["output_beyond_tolerance"])  # the only output is a score vector: judged by top-1
        assert row["first_divergence"] == "pool:0" and row["first_fail"] == "pool:0"
    finally:
        analysis.close()


def test_outputs_beyond_tolerance_or_a_changed_decision_fail_the_run(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    flipped = dict(ref)
    prob = ref["prob"].copy().reshape(-1)
    order = np.argsort(prob)
    prob[order[-1]], prob[order[-2]] = prob[order[-2]], prob[order[-1]]  # the top class changes
    flipped["prob"] = prob.reshape(ref["prob"].shape)
    write_dump(tmp_path / "cl.h5", flipped, backend="opencl", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (row,) = _summary(analysis).values()
        assert row["verdict"] == "fail" and ("top-1" in row["verdict_reason"] or "beyond" in row["verdict_reason"])
    finally:
        analysis.close()


def test_a_dense_output_is_judged_by_the_share_runs_csv_reports(tmp_path):
    layers = [LAYERS[0], ("mask", "Sigmoid", ["conv1"], (1, 1, 8, 9))]  # one channel: a mask, not class scores
    ref = {"conv1": reference_arrays()["conv1"],
           "mask": np.random.default_rng(3).uniform(0.0, 1.0, (1, 1, 8, 9)).astype(np.float32)}
    write_dump(tmp_path / "ref.h5", ref, layers=layers)
    run = {k: v.copy() for k, v in ref.items()}
    run["mask"].reshape(-1)[0] += np.float32(0.5)  # 1 of 72 values changed: 1.39% > 1%
    write_dump(tmp_path / "vk.h5", run, layers=layers, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (row,) = _summary(analysis).values()
        assert row["verdict"] == "fail" and "1.39% of output mask:0's elements" in row["verdict_reason"]
        assert abs(row["output_beyond_tolerance"] - 1 / 72) < 1e-9
    finally:
        analysis.close()


def test_first_divergence_is_the_first_warn_and_the_first_fail_is_named_apart(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    run = perturbed(ref, 0.03, ops=["relu1"])  # warns (rel L2 > 1e-2)
    run = perturbed(run, 0.5, ops=["pool"], seed=4)  # fails later
    write_dump(tmp_path / "vk.h5", run, backend="vulkan", precision="low")
    analysis = analyze_paths([tmp_path])
    try:
        (first,) = [f for f in analysis.findings if f.kind == "first_divergence"]
        assert first.layer == "relu1:0" and first.severity == "warn"
        assert first.numbers["first_fail"] == "pool:0" and "first layer that fails is pool:0" in first.sentence
        (row,) = _summary(analysis).values()
        assert (row["first_divergence"], row["first_fail"]) == ("relu1:0", "pool:0")
    finally:
        analysis.close()


def test_zeros_between_two_fp32_runs_are_not_called_fp16_underflow(tmp_path):
    ref = reference_arrays()
    ref["relu1"] = np.abs(ref["relu1"]) * 1e-5 + 1e-6  # values in fp16's underflow range
    write_dump(tmp_path / "ref.h5", ref)
    run = dict(ref)
    run["relu1"] = np.zeros_like(ref["relu1"])
    write_dump(tmp_path / "b.h5", run, backend="cpu", precision="normal", precision_effective="fp32")
    analysis = analyze_paths([tmp_path], ref=tmp_path / "ref.h5")
    try:
        (zero,) = [f for f in analysis.findings if f.kind == "zero_collapse_origin"]
        assert "not fp16 underflow" in zero.sentence and "fp32" in zero.sentence
    finally:
        analysis.close()


def test_an_all_zero_reference_met_within_atol_is_no_failure():
    from layerdiff.analyzer.findings.verdict import Thresholds, classify

    row = {"rel_l2": float("inf"), "max_abs": 5.6e-9, "n_nonfinite_mismatch": 0, "pass_fraction": 1.0}
    assert classify(row, Thresholds())[0] == "pass"
    assert classify({**row, "max_abs": 0.5}, Thresholds())[0] == "fail"


def test_layers_screened_as_passing_are_exactly_those_classify_passes_without_a_word():
    """The column-at-a-time screen a re-judge uses never passes a layer `classify` would flag, and it
    passes every clean layer with a finite error (else they would go through `classify` one by one again)."""
    from layerdiff.analyzer.findings.layerstatus import CLASSIFY_COLUMNS, _cells, surely_passing
    from layerdiff.analyzer.findings.verdict import Thresholds, classify

    rng = np.random.default_rng(7)
    values = {"rel_l2": [0.0, 1e-4, 0.01, 0.0100001, 0.05, 0.1, 0.3, math.inf, -math.inf, math.nan],
              "max_abs": [0.0, 1e-3, 0.5, math.nan],
              "pass_fraction": [1.0, 0.99, 0.98, 0.5, math.nan],
              "zero_collapse": [0.0, 0.05, 0.06, 0.5, 0.7, math.nan]}
    counts = [0, 0, 0, 0, 1, 7, 8, 9, math.nan]
    settings = [Thresholds(), Thresholds(warn_rel_l2=0.2, fail_rel_l2=0.05),
                Thresholds(warn_zero_collapse=0.6, fail_zero_collapse=0.1, min_pass_fraction=0.5)]
    for t in settings:
        rows = 4000
        columns = {c: _cells(c, [values[c][i] for i in rng.integers(0, len(values[c]), rows)] if c in values
                             else [counts[i] for i in rng.integers(0, len(counts), rows)])
                   for c in CLASSIFY_COLUMNS}
        screened = surely_passing(columns, rows, t)
        answers = [classify({c: cells[i] for c, cells in columns.items()}, t) for i in range(rows)]
        for i in np.flatnonzero(screened):
            assert answers[i] == ("pass", ""), {c: cells[i] for c, cells in columns.items()}
        silent = [i for i, answer in enumerate(answers) if answer == ("pass", "")]
        finite = [i for i in silent if columns["rel_l2"][i] != math.inf]  # inf within atol: left to classify
        assert finite and all(screened[i] for i in finite)
    partial = {"rel_l2": [0.0, 0.5]}  # columns a table lacks read as classify's defaults
    assert surely_passing(partial, 2, Thresholds()).tolist() == [True, False]
    assert surely_passing({"rel_l2": ["not a number", 0.0]}, 2, Thresholds()).tolist() == [False, False]
