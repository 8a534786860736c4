"""The golden workflow: `analyze RUNS --ref GOLDEN` with a foreign golden that records no input hash.

A golden made with ONNX Runtime (`.npz`, name -> array) carries no provenance. It must work as
`--ref` whether or not it is also an input, stand for the runs' input when there is only one, be
paired by `--ref-input LABEL` when there are several, and every run left out must say why with the
key the pairing used.
"""
from __future__ import annotations

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.cli.app import main
from tests.analyze_dumps import perturbed, reference_arrays, write_dump


def _golden(tmp_path, arrays):
    path = tmp_path / "golden.npz"
    np.savez(path, **arrays)
    return path


def _compared(analysis):
    return {row["run"]: row["verdict"] for row in analysis.summary.to_dict("records") if row["role"] == "compared"}


def test_ref_golden_not_among_inputs_stands_for_the_only_input(tmp_path):
    ref = reference_arrays()
    (tmp_path / "runs").mkdir()
    run = write_dump(tmp_path / "runs" / "vk.h5", perturbed(ref, 1e-5), backend="vulkan")
    golden = _golden(tmp_path, ref)
    for inputs in ([tmp_path / "runs"], [tmp_path / "runs", golden], [golden, run]):
        analysis = analyze_paths(inputs, ref=golden)
        try:
            assert analysis.comparison.plan.reference.names(golden)
            assert "records no input hash" in analysis.comparison.plan.reason
            assert list(_compared(analysis).values()) == ["pass"]
            assert not [p for p in analysis.problems if "not compared" in p]
        finally:
            analysis.close()


def test_several_inputs_need_ref_input_and_say_why_with_the_pairing_key(tmp_path, capsys):
    ref = reference_arrays()
    (tmp_path / "runs").mkdir()
    write_dump(tmp_path / "runs" / "cat.h5", perturbed(ref, 1e-5), input_label="cat", input_sha256="aa" * 32)
    write_dump(tmp_path / "runs" / "dog.h5", perturbed(ref, 2e-5), input_label="dog", input_sha256="bb" * 32)
    golden = _golden(tmp_path, ref)
    code = main([str(tmp_path / "runs"), "--ref", str(golden), "-o", str(tmp_path / "rep1")])
    err = capsys.readouterr().err
    assert code == 1 and "--ref-input" in err and "cat" in err and "dog" in err
    assert "sha256 aaaaaaaaaaaa" in err  # the key the pairing uses, not only the label

    analysis = analyze_paths([tmp_path / "runs"], ref=golden, ref_input="dog")
    try:
        compared = _compared(analysis)
        assert len(compared) == 1 and "dog" in next(iter(compared))
        why = [p for p in analysis.problems if "not compared" in p]
        assert len(why) == 1 and "cat (sha256 aaaaaaaaaaaa)" in why[0] and "--ref-input" in why[0]
    finally:
        analysis.close()

    code = main([str(tmp_path / "runs"), "--ref", str(golden), "--ref-input", "bbbbbbbb", "-o", str(tmp_path / "rep2")])
    assert code == 2 and (tmp_path / "rep2" / "index.html").exists()
    runs = (tmp_path / "rep2" / "runs.csv").read_text()  # the report says why too, with the pairing key
    assert "not compared" in runs and "cat (sha256 aaaaaaaaaaaa)" in runs
    capsys.readouterr()
    code = main([str(tmp_path / "runs"), "--ref", str(golden), "--ref-input", "cow", "-o", str(tmp_path / "rep3")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "--ref-input cow" in err and "cat, dog" in err


def test_without_ref_the_golden_engines_cpu_high_run_is_the_reference(tmp_path):
    """A mobile engine's cpu/high run listed first must not become the reference over the golden."""
    ref = reference_arrays()
    (tmp_path / "runs").mkdir()
    write_dump(tmp_path / "runs" / "a_mnn.h5", perturbed(ref, 0.3), engine="mnn")  # wrong, and first
    write_dump(tmp_path / "runs" / "b_ort.h5", ref, engine="onnxruntime")
    write_dump(tmp_path / "runs" / "c_ncnn_low.h5", perturbed(ref, 1e-5), precision="low")
    analysis = analyze_paths([tmp_path / "runs"])
    try:
        plan = analysis.comparison.plan
        assert plan.reference.attrs["engine"] == "onnxruntime"
        assert "golden (onnxruntime)" in plan.reason
        verdicts = {row["run"]: row["verdict"] for row in analysis.summary.to_dict("records") if row["role"] == "compared"}
        assert sorted(verdicts.values()) == ["fail", "pass"], verdicts
    finally:
        analysis.close()
