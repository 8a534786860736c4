"""`collect bisect` end to end: real ncnn runs (lavapipe for Vulkan) that dump only the model outputs,
the culprit checked against the analysis of fully dumped runs and against a numpy judgement."""
from __future__ import annotations

import json
import math

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines.harness_cli import split_key
from layerdiff.collector.engines.ncnn.options import HIGH_PRECISION_MASK
from layerdiff.collector.engines.ncnn.patch import write_patched
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.samples.catalog import reference
from tests.conftest import MODELS, SAMPLES
from tests.test_collect_cli import collect

OVERFLOW_INPUT = SAMPLES / "inputs" / "overflow.npy"


def _rel_l2(run: np.ndarray, ref: np.ndarray) -> float:
    run, ref = run.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    if not np.isfinite(run).all():
        return math.inf
    return float(np.linalg.norm(run - ref) / np.linalg.norm(ref))


def _prob(path) -> np.ndarray:
    """The one tensor of a dump that holds only the model's output."""
    with DumpFile(path) as dump:
        keys = list(dump.layers["key"])
        assert len(keys) == 1, (path, keys)
        return dump.tensor_by_key(keys[0])


def _analysis_culprit(tmp_path) -> str:
    """The layer the analysis of fully dumped vulkan/high and vulkan/low runs names first (Inf origin or
    failure source): what bisect must find without looking inside the model."""
    runs = tmp_path / "dumps"
    done = collect("--model", MODELS / "overflow.param", "--backend", "vulkan", "--precision", "high",
                   "--precision", "low", "--input", OVERFLOW_INPUT, "-o", runs)
    assert done.returncode == 0, done.stderr
    ref = runs / "ncnn_vulkan_high_overflow.h5"
    analysis = analyze_paths([ref, runs / "ncnn_vulkan_low_overflow.h5"], ref=ref)
    try:
        named = {f.kind: split_key(f.layer)[0] for f in analysis.findings
                 if f.kind in ("inf_origin", "failure_source") and f.layer}
    finally:
        analysis.close()
    assert named, "the dumped analysis names no Inf origin nor failure source"
    return named.get("inf_origin") or named["failure_source"]


def test_overflow_on_vulkan_low_names_the_analysis_culprit_from_outputs_alone(tmp_path):
    out = tmp_path / "bisect"
    done = collect("bisect", "--model", MODELS / "overflow.param", "--backend", "vulkan", "--precision", "low",
                   "--input", OVERFLOW_INPUT, "-o", out)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads((out / "bisect.json").read_text())
    culprits = [c["layer"] for c in doc["culprits"]]
    assert doc["status"] == "found" and culprits
    assert culprits[0] == _analysis_culprit(tmp_path) == "block2/amplify"
    assert f"{culprits[0]}: moving it to vulkan/low breaks the outputs" in done.stderr

    # nothing but the declared output was observed, in the reference and in every trial
    dumps = sorted(out.rglob("*.h5"))
    assert len(dumps) == doc["runs"] + doc["reference_runs"]
    for path in dumps:
        with DumpFile(path) as dump:
            assert list(dump.layers["key"]) == ["prob:0"], path

    # logarithmic: two bounding runs, then per culprit a binary search and one run to see if it is the last
    movable = doc["layers_movable"]
    assert movable == 13
    assert doc["runs"] <= 2 + len(culprits) * (math.ceil(math.log2(movable)) + 1)
    assert f"{doc['runs']} plain run(s) ({doc['runs']} trials) for 13 layers" in done.stderr

    # numpy's own verdicts: the failing run is off, and the model with the culprits kept is right
    ref = _prob(next((out / "reference").glob("*.h5")))
    assert _rel_l2(ref, reference("overflow")["prob:0"]) < 1e-4
    failing = _prob(out / "trials" / "trial1" / "ncnn_vulkan_low_overflow.h5")
    assert _rel_l2(failing, ref) > 0.1
    model = resolve_model(MODELS / "overflow.param")
    patched = write_patched(model.files, {op: int(HIGH_PRECISION_MASK["vulkan"]) for op in culprits}, tmp_path / "patched")
    again = collect("--model", patched[0], "--backend", "vulkan", "--precision", "low", "--input", OVERFLOW_INPUT,
                    "--layers", "^prob$", "-o", tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert _rel_l2(_prob(tmp_path / "again" / "ncnn_vulkan_low_overflow.h5"), ref) < 1e-2
    # ... and every culprit is needed: keeping all but one of them still fails
    for left_out in culprits:
        rest = {op: int(HIGH_PRECISION_MASK["vulkan"]) for op in culprits if op != left_out}
        partial = write_patched(model.files, rest, tmp_path / f"without-{left_out.replace('/', '_')}")
        run = collect("--model", partial[0], "--backend", "vulkan", "--precision", "low", "--input",
                      OVERFLOW_INPUT, "--layers", "^prob$", "-o", tmp_path / f"run-{left_out.replace('/', '_')}")
        assert run.returncode == 0, run.stderr
        assert _rel_l2(_prob(next((tmp_path / f"run-{left_out.replace('/', '_')}").glob("*.h5"))), ref) > 1e-2


def test_nothing_failing_is_said_in_one_line(tmp_path):
    """vulkan/high against cpu/high: both fp32, the outputs agree; one plain run, no search."""
    out = tmp_path / "bisect"
    done = collect("bisect", "--model", MODELS / "overflow.param", "--backend", "vulkan", "--precision", "high",
                   "--ref-config", "cpu/high", "--input", OVERFLOW_INPUT, "-o", out)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect: nothing fails: vulkan/high outputs are within 0.01 of cpu/high")
    doc = json.loads((out / "bisect.json").read_text())
    assert doc["status"] == "nothing_fails" and doc["runs"] == 1 and doc["culprits"] == []
    ref = _prob(out / "reference" / "ncnn_cpu_high_overflow.h5")
    assert _rel_l2(_prob(out / "trials" / "trial1" / "ncnn_vulkan_high_overflow.h5"), ref) < 1e-2


def test_engines_without_a_per_op_switch_refuse_in_one_line(tmp_path):
    done = collect("bisect", "--model", MODELS / "overflow.mnn", "--backend", "cpu", "--precision", "low",
                   "--input", OVERFLOW_INPUT, "-o", tmp_path / "mnn")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no layer can be moved alone" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "mnn").exists()  # refused before anything ran


def test_a_bad_reference_config_is_one_line(tmp_path):
    done = collect("bisect", "--model", MODELS / "overflow.param", "--backend", "vulkan", "--ref-config", "vulkan",
                   "--input", OVERFLOW_INPUT, "-o", tmp_path / "b")
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "--ref-config 'vulkan': give BACKEND/PRECISION" in done.stderr


def test_the_reference_itself_is_refused_in_one_line(tmp_path):
    done = collect("bisect", "--model", MODELS / "overflow.param", "--backend", "vulkan", "--precision", "high",
                   "--input", OVERFLOW_INPUT, "-o", tmp_path / "b")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "vulkan/high is the reference itself" in done.stderr


def test_several_inputs_and_several_culprits_on_underflow(tmp_path):
    """underflow on vulkan/low: on the dark input every layer after the gate holds values below fp16's
    normal range, so several layers must stay fp32; each trial runs every input."""
    out = tmp_path / "bisect"
    inputs = [SAMPLES / "inputs" / name for name in ("underflow.npy", "underflow_dim.npy", "underflow_dark.npy")]
    done = collect("bisect", "--model", MODELS / "underflow.param", "--backend", "vulkan", "--precision", "low",
                   *[a for path in inputs for a in ("--input", path)], "-o", out)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "bisect.json").read_text())
    culprits = [c["layer"] for c in doc["culprits"]]
    assert doc["status"] == "found" and culprits[0] == "gate/scale" and len(culprits) > 1
    trials = len(doc["trials"])
    assert doc["runs"] == 3 * trials and f"({trials} trials x 3 inputs)" in done.stderr
    movable = doc["layers_movable"]
    assert trials <= 2 + len(culprits) * (math.ceil(math.log2(movable)) + 1)
    # one trial kept exactly the culprits; numpy judges it within 1e-2 on every input, and the failing
    # run off on the dark one
    passing = next(n for n, t in enumerate(doc["trials"], start=1) if sorted(t["kept"]) == sorted(culprits))
    for label in ("underflow", "underflow_dim", "underflow_dark"):
        ref = _prob(out / "reference" / f"ncnn_vulkan_high_{label}.h5")
        assert _rel_l2(_prob(out / "trials" / f"trial{passing}" / f"ncnn_vulkan_low_{label}.h5"), ref) < 1e-2
    dark = _prob(out / "reference" / "ncnn_vulkan_high_underflow_dark.h5")
    assert _rel_l2(_prob(out / "trials" / "trial1" / "ncnn_vulkan_low_underflow_dark.h5"), dark) > 0.1
