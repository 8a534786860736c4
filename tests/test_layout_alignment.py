"""Layers held channels-last by one engine and channels-first by another are measured, after a
transpose the recorded layouts (or the shapes alone) decide, never the values.

Real models: mediapipe's pose and face landmark models (TFLite, run by LiteRT, which records `NHWC`)
against their MNN conversions (MNN's converter through `_tools`; MNN computes and dumps NCHW). The
permutation the analysis records is checked in numpy on runs computed from the same values (a
uniform image: the same input whatever order an engine reads its pixels in). Unit level: real HDF5
dumps written by the project's writer, one run holding NHWC and the other NCHW copies of the same
tensors, measure exactly 0 error; an axis order the shapes leave open is set aside, saying why.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.align.axes import axis_map
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from tests.litert_models import image_input, tflite_model

MEASURED = ("pass", "warn", "fail")
NHWC_TO_NCHW = "NCHW->NHWC (0,2,3,1)"  # how the MNN run's tensor is put in LiteRT's order
SIZES = {"pose_landmark_full": (1, 256, 256, 3), "face_landmark": (1, 192, 192, 3)}


def _convert(tflite: Path, out: Path) -> Path:
    code = ("import sys, _tools; _tools.mnnconvert(['mnnconvert', '-f', 'TFLITE', '--modelFile', sys.argv[1], "
            "'--MNNModel', sys.argv[2], '--bizCode', 'layerdiff'])")
    proc = subprocess.run([sys.executable, "-c", code, str(tflite), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.is_file(), (proc.stdout + proc.stderr)[-2000:]
    return out


def _collect(model: Path, image: np.ndarray, out: Path, label: str) -> Path:
    spec = RunSpec(resolve_model(model), "cpu", "high", InputSet(label, {"input_1": image}, label))
    outcome = collect_run(LocalDevice(), spec, out)
    assert outcome.status == "done", outcome.message
    return outcome.paths[0]


@pytest.fixture(scope="module")
def landmark_runs(tmp_path_factory):
    """{(stem, input): (LiteRT dump, MNN dump)} for a picture and for a uniform image."""
    work = tmp_path_factory.mktemp("landmarks")
    runs = {}
    for stem, shape in SIZES.items():
        mnn = _convert(tflite_model(stem), work / f"{stem}.mnn")
        for label, image in (("picture", image_input(shape)), ("uniform", np.full(shape, 0.5, np.float32))):
            out = work / f"{stem}_{label}"
            runs[stem, label] = (_collect(tflite_model(stem), image, out, label), _collect(mnn, image, out, label))
    return runs


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _layers(path: Path) -> int:
    with DumpFile(path) as dump:
        return len(dump.layers)


@pytest.mark.parametrize("stem", list(SIZES))
def test_landmark_models_are_measured_across_layouts(landmark_runs, stem):
    """At least 90% of LiteRT's layers are measured against MNN's, nearly all after NHWC -> NCHW."""
    litert, mnn = landmark_runs[stem, "picture"]
    table = analyze_paths([litert, mnn], ref=str(litert)).comparison.table
    measured = table[table["status"].isin(MEASURED)]
    assert len(measured) >= 0.9 * _layers(litert), table["status"].value_counts().to_dict()
    with DumpFile(litert) as dump:
        four_d = {k for k, s in zip(dump.layers["key"], dump.layers["shape"]) if len(json.loads(s)) == 4}
    permuted = measured[measured["permutation"] == NHWC_TO_NCHW]
    assert set(permuted["key"]) <= four_d and len(permuted) >= 0.9 * len(four_d & set(measured["key"]))
    unmoved = measured[(measured["permutation"] == "") & measured["key"].isin(four_d)]
    assert (unmoved["numel"] == 1).all(), list(unmoved["key"])  # a [1, 1, 1, 1] tensor moves no byte


def test_the_recorded_permutation_is_the_one_numpy_finds(landmark_runs):
    """Runs computed from the same values: numpy finds LiteRT's tensor transposed NHWC -> NCHW equal to
    MNN's (and not H and W swapped, nor the bytes as they lie); the analysis used that permutation
    and measures every layer it compares as passing."""
    litert, mnn = landmark_runs["pose_landmark_full", "uniform"]
    table = analyze_paths([litert, mnn], ref=str(litert)).comparison.table
    measured = table[table["status"].isin(MEASURED)]
    assert len(measured) >= 0.9 * _layers(litert) and set(measured["status"]) == {"pass"}
    with DumpFile(litert) as a, DumpFile(mnn) as b:
        held = dict(zip(b.layers["key"], b.layers["layout"]))
        # MNN holds the model's outputs channels-last; its dump moves their channels to axis 1 too
        assert {held[k] for k in measured[measured["permutation"] == NHWC_TO_NCHW]["run_key"]} == \
            {"NCHW (MNN NC4HW4)", "NCHW (MNN NHWC)"}
        checked = told_apart = 0
        for row in measured[measured["permutation"] == NHWC_TO_NCHW].itertuples():
            x, y = a.tensor_by_key(row.key), b.tensor_by_key(row.run_key)
            assert x.shape[1:] == y.shape[2:] + y.shape[1:2]
            assert _rel(x.transpose(0, 3, 1, 2), y) < 1e-3, row.key
            assert row.rel_l2 == pytest.approx(_rel(y.transpose(0, 2, 3, 1), x), rel=1e-3, abs=1e-7)
            checked += 1
            # the other orders are wrong wherever the values are not symmetric (a padded uniform image is)
            told_apart += _rel(x.transpose(0, 3, 2, 1), y) > 0.05 and _rel(x.reshape(y.shape), y) > 0.1
    assert checked >= 100 and told_apart >= 0.8 * checked, (checked, told_apart)


def test_a_flat_head_in_both_layouts_is_measured_as_the_same_bytes(landmark_runs):
    """face mesh's landmarks: [1, 1, 1, 1404] from LiteRT and [1, 1404, 1, 1] from MNN."""
    litert, mnn = landmark_runs["face_landmark", "uniform"]
    table = analyze_paths([litert, mnn], ref=str(litert)).comparison.table
    row = table[table["key"] == "conv2d_21:0"].iloc[0]
    assert (row["shape"], row["run_shape"], row["permutation"]) == ("[1, 1, 1, 1404]", "[1, 1404, 1, 1]", NHWC_TO_NCHW)
    with DumpFile(litert) as a, DumpFile(mnn) as b:
        x, y = a.tensor_by_key("conv2d_21:0"), b.tensor_by_key(row["run_key"])
    assert row["status"] == "pass" and row["rel_l2"] == pytest.approx(_rel(y, x), rel=1e-3, abs=1e-7)
    assert len(table[table["status"].isin(MEASURED)]) >= 0.9 * _layers(litert)


def test_the_report_shows_the_permutation_of_each_layer(landmark_runs, tmp_path):
    litert, mnn = landmark_runs["face_landmark", "picture"]
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli", str(litert), str(mnn), "--ref", str(litert),
                           "-o", str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    run = next(r for r in results["runs"] if r["role"] != "reference")
    assert sum(layer["permutation"] == NHWC_TO_NCHW for layer in run["layers"]) >= 80
    page = (tmp_path / "report" / "index.html").read_text()
    assert '"run_shape","permutation","reasons"' in page  # a column of the layer table
    assert page.count(f'"[1, 1, 1, 1404]","[1, 1404, 1, 1]","{NHWC_TO_NCHW}"') == 1


# --- unit level: real HDF5 dumps of the same tensors in two layouts ---------------------------------

HEADER = {"engine_version": "test", "backend_requested": "cpu", "backend_actual": "cpu", "precision_requested": "high",
          "precision_effective": "fp32", "threads": 1, "device_serial": "local", "device_model": "host",
          "model_name": "net", "model_sha256": "ab" * 32, "input_label": "x", "input_sha256": "cd" * 32, "harness": "tests"}


def _channels_last() -> list[tuple[str, np.ndarray, str]]:
    """(op, tensor, layout) as a channels-last engine records them."""
    rng = np.random.default_rng(7)
    return [("stem", rng.standard_normal((1, 6, 10, 4)).astype(np.float32), "NHWC"),
            ("cube", rng.standard_normal((1, 8, 8, 8)).astype(np.float32), "NHWC"),  # H == W == C: layouts settle it
            ("head", rng.standard_normal((1, 1, 1, 12)).astype(np.float32), "NHWC"),
            ("flat", rng.standard_normal((1, 12)).astype(np.float32), ""),
            ("seq", rng.standard_normal((2, 3, 5)).astype(np.float32), "graph"),  # no layout: the shapes decide
            ("square", rng.standard_normal((1, 6, 6, 4)).astype(np.float32), "")]  # no layout, H == W: ambiguous


def _channels_first(layers):
    moved = {"seq": (2, 0, 1)}
    return [(op, np.ascontiguousarray(t.transpose(moved.get(op, (0, 3, 1, 2)) if t.ndim > 2 else moved[op])
                                      if t.ndim > 2 else t),
             {"NHWC": "NCHW (MNN NC4HW4)", "graph": ""}.get(layout, layout)) for op, t, layout in layers]


def _write(path: Path, engine: str, layers) -> Path:
    with DumpWriter(path, {**HEADER, "engine": engine}) as writer:
        for order, (op, tensor, layout) in enumerate(layers):
            writer.add_tensor({"order": order, "op": op, "op_type": "Conv", "output_index": 0, "name": op,
                               "inputs": [layers[order - 1][0]] if order else [], "layout": layout}, tensor)
    return path


@pytest.mark.parametrize("reference", ["litert", "mnn"])
def test_the_same_tensors_in_nhwc_and_nchw_measure_exactly_zero(tmp_path, reference):
    last = _channels_last()
    first = _channels_first(last)
    assert first[-1][1].shape == (1, 4, 6, 6) and first[4][1].shape == (5, 2, 3)
    paths = {"litert": _write(tmp_path / "litert.h5", "litert", last), "mnn": _write(tmp_path / "mnn.h5", "mnn", first)}
    analysis = analyze_paths(list(paths.values()), ref=str(paths[reference]))
    rows = analysis.comparison.table.set_index("key")
    for key in ("stem:0", "cube:0", "head:0", "flat:0", "seq:0"):
        assert rows.loc[key, "status"] == "pass" and rows.loc[key, "rel_l2"] == 0 and rows.loc[key, "max_abs"] == 0, key
    forward = reference == "litert"
    assert rows.loc["stem:0", "permutation"] == (NHWC_TO_NCHW if forward else "NHWC->NCHW (0,3,1,2)")
    assert rows.loc["cube:0", "permutation"] == rows.loc["stem:0", "permutation"]
    assert rows.loc["flat:0", "permutation"] == ""
    assert rows.loc["seq:0", "permutation"] == ("by shape (1,2,0)" if forward else "by shape (2,0,1)")
    square = rows.loc["square:0"]
    assert square["status"] == "layout_mismatch" and square["permutation"] == ""
    assert "ambiguous axis order" in square["reasons"] and "in 2 ways" in square["reasons"]
    assert "axes of size 6" in square["reasons"]
    finding = next(f for f in analysis.findings if f.kind == "layout_mismatch")
    assert "square:0" in finding.sentence and "ambiguous" in finding.sentence
    assert not [f for f in analysis.findings if f.kind in ("first_divergence", "failure_source")]


def test_axis_maps_are_decided_from_layouts_then_shapes():
    assert axis_map("NHWC", (1, 8, 8, 8), "NCHW", (1, 8, 8, 8)).order == (0, 2, 3, 1)
    # a rank name that the shapes contradict (a channels-last ONNX graph recorded NCHW): shapes decide
    assert axis_map("NHWC", (1, 64, 32, 24), "NCHW", (1, 64, 32, 24)).status == "same"
    assert axis_map("NHWC", (1, 4, 4, 8), "", (1, 8, 4, 4)).status == "ambiguous"
    assert axis_map("NHWC", (1, 4, 5, 8), "", (1, 8, 4, 5)).text == "by shape (0,2,3,1)"
    assert axis_map("NC4HW4", (1, 8, 4, 5), "NCHW", (1, 8, 4, 5)).status == "layout"  # packed bytes: never compared
    assert axis_map("NHWC", (1, 4, 5, 8), "NCHW", (1, 8, 4, 6)).status == "mismatch"
    seq = np.arange(30, dtype=np.float32).reshape(2, 3, 5)
    other_rank = axis_map("", (2, 3, 5), "", (1, 5, 2, 3))  # ranks differ: the non-1 axes are ordered
    assert other_rank.text == "by shape, axes other than 1 (1,2,0)"
    assert np.array_equal(other_rank.apply(np.ascontiguousarray(seq.transpose(2, 0, 1))[None], seq.shape), seq)
    tensor = np.arange(160, dtype=np.float32).reshape(1, 4, 5, 8)
    mapping = axis_map("NHWC", (1, 4, 5, 8), "NCHW", (1, 8, 4, 5))
    assert np.array_equal(mapping.apply(np.ascontiguousarray(tensor.transpose(0, 3, 1, 2)), tensor.shape), tensor)
