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
