"""Every output a model declares is judged, also one that another op consumes.

Basic Pitch (Spotify's audio-to-MIDI network, shipped in the basic-pitch wheel) declares three outputs:
note and onset posteriors [1, 172, 88] and the pitch contour [1, 172, 264], which the note branch also
reads. Taking "the layers nothing consumes" as the outputs judged two of them and never the contour.
"""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.onnx_emit import convert_many
from tests.analyze_dumps import reference_arrays, write_dump

MEMBER = "basic_pitch/saved_models/icassp_2022/nmp.onnx"
CONTOUR = "StatefulPartitionedCall:0"  # [1, 172, 264], also an input of the note branch
INPUT = "serving_default_input_2:0"


def basic_pitch_onnx() -> Path:
    try:
        path = Path(importlib.metadata.distribution("basic-pitch").locate_file(MEMBER))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("basic-pitch is not installed; run device_scripts/setup_host.sh --test") from None
    if not path.is_file():
        raise RuntimeError(f"basic-pitch does not ship {MEMBER} (tests/corpus-wheels.txt pins 0.4.0)")
    return path


def two_tones() -> np.ndarray:
    """Two seconds of audio at 22,050 Hz (the model's 43,844 samples): A4 then E5."""
    t = np.arange(43844, dtype=np.float32) / 22050
    audio = 0.3 * np.sin(2 * np.pi * 440 * t) * (t < 1.0) + 0.3 * np.sin(2 * np.pi * 660 * t) * (t >= 1.0)
    return audio.astype(np.float32).reshape(1, 43844, 1)


def contour_scaled(source: Path, target: Path, factor: float) -> None:
    """The model with its returned contour scaled by `factor` while the note branch still reads the
    original: a defect that reaches only the consumed output (as a converter's wrong epilogue would)."""
    model = onnx.load(str(source))
    for node in model.graph.node:
        if CONTOUR in node.output:
            node.name = "contour_raw"
        node.input[:] = ["contour_raw" if name == CONTOUR else name for name in node.input]
        node.output[:] = ["contour_raw" if name == CONTOUR else name for name in node.output]
    model.graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "contour_factor"))
    model.graph.node.append(helper.make_node("Mul", ["contour_raw", "contour_factor"], [CONTOUR], name=CONTOUR))
    onnx.save(model, str(target))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("basic_pitch")
    original = work / "nmp.onnx"
    shutil.copy(basic_pitch_onnx(), original)
    convert_many([(original, work / "nmp.mnn", False)])
    (work / "scaled").mkdir()
    scaled = work / "scaled" / "nmp.onnx"
    contour_scaled(original, scaled, 0.5)
    np.savez(work / "audio.npz", **{INPUT: two_tones()})
    device, out = LocalDevice(), {}
    for label, model_file in (("golden", original), ("mnn", work / "nmp.mnn"), ("scaled", scaled)):
        model = resolve_model(model_file)
        sets, errors = resolve_inputs([str(work / "audio.npz")], input_shapes(model))
        assert not errors, errors
        sets[0].label = "tones"
        outcome = collect_run(device, RunSpec(model, "cpu", "high", sets[0]), work / label)
        assert outcome.status == "done", outcome.message
        out[label] = outcome.paths[0]
    return out


def _output(path: Path, name: str) -> np.ndarray:
    with DumpFile(path) as dump:
        layers = dump.layers
        return dump.tensor(int(layers.loc[layers["name"] == name, "order"].iloc[-1]))


def test_the_dump_records_the_declared_outputs(runs):
    for label in ("golden", "mnn"):
        with DumpFile(runs[label]) as dump:
            assert sorted(dump.attrs["outputs"].strip("[]").replace('"', "").split(", ")) == \
                [f"StatefulPartitionedCall:{k}" for k in range(3)]


def test_every_declared_output_is_compared_consumed_or_not(runs, tmp_path):
    for label in ("golden", "mnn"):
        shutil.copy(runs[label], tmp_path / runs[label].name)
    analysis = analyze_paths([tmp_path])
    try:
        table = analysis.comparison.table
        outputs = set(table.loc[table["is_output"].astype(bool), "key"])
        assert outputs == {f"StatefulPartitionedCall:{k}:0" for k in range(3)}
        curve = [f.sentence for f in analysis.findings if f.kind == "error_curve"]
        assert not curve or "of 3 outputs" in curve[0]
    finally:
        analysis.close()


def test_a_change_only_the_consumed_output_shows_fails_the_run(runs, tmp_path):
    """The scaled model returns the contour halved; its note and onset outputs are the golden's."""
    golden, scaled = runs["golden"], runs["scaled"]
    a, b = _output(golden, CONTOUR), _output(scaled, CONTOUR)
    assert np.linalg.norm(b - a) / np.linalg.norm(a) == pytest.approx(0.5, rel=1e-5)  # numpy's own judgement
    for other in ("StatefulPartitionedCall:1", "StatefulPartitionedCall:2"):
        np.testing.assert_array_equal(_output(golden, other), _output(scaled, other))
    for path in (golden, scaled):
        shutil.copy(path, tmp_path / f"{path.parent.name}_{path.name}")
    analysis = analyze_paths([tmp_path], ref=tmp_path / f"golden_{golden.name}")
    try:
        (row,) = [r for r in analysis.summary.to_dict("records") if r["role"] == "compared"]
        assert row["verdict"] == "fail", row["verdict_reason"]
        assert CONTOUR in row["verdict_reason"]
    finally:
        analysis.close()


def _verdict(folder: Path, ref: Path) -> dict:
    analysis = analyze_paths([folder], ref=ref)
    try:
        (row,) = [r for r in analysis.summary.to_dict("records") if r["role"] == "compared"]
        return row
    finally:
        analysis.close()


def test_a_run_that_stopped_before_its_output_is_no_pass(tmp_path):
    """Every layer it dumped equals the reference's, but the harness died before `prob`."""
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    cut = {op: a for op, a in ref.items() if op != "prob"}
    write_dump(tmp_path / "cut.h5", cut, backend="vulkan", complete=False, exit_status=-11)
    row = _verdict(tmp_path, tmp_path / "ref.h5")
    assert row["verdict"] == "fail"
    assert "output prob:0: the run stopped before it (incomplete)" in row["verdict_reason"]


def test_an_incomplete_reference_or_a_set_aside_output_is_no_pass(tmp_path):
    ref = reference_arrays()
    (tmp_path / "a").mkdir()
    write_dump(tmp_path / "a" / "ref.h5", ref, complete=False, exit_status=-6)
    write_dump(tmp_path / "a" / "run.h5", ref, backend="vulkan")
    row = _verdict(tmp_path / "a", tmp_path / "a" / "ref.h5")
    assert row["verdict"] == "warn" and "the reference" in row["verdict_reason"] and "incomplete" in row["verdict_reason"]
    (tmp_path / "b").mkdir()
    write_dump(tmp_path / "b" / "ref.h5", ref)
    # an output whose bytes the run records in an order the analyzer cannot undo: set aside, not compared
    write_dump(tmp_path / "b" / "run.h5", ref, backend="vulkan", layouts={"prob": "tiled-8x8"})
    row = _verdict(tmp_path / "b", tmp_path / "b" / "ref.h5")
    assert row["verdict"] == "warn", row["verdict_reason"]
    assert "output prob:0 set aside (layout_mismatch" in row["verdict_reason"]
