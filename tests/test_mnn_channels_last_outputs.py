"""A TFLite-origin MNN model's 3-D output is dumped in the graph's own order.

mediapipe's palm detector (palm_detection_lite, mediapipe 0.10.14's wheel) ends in a [1, 2016, 18] box
head that MNN holds channels-last. Copied through an NCHW host, MNN moved its last axis to axis 1 under
the same dims, so the dump held [1, 18, 2016] bytes labelled [1, 2016, 18] and MNN was judged FAIL
(rel L2 1.38) while MNN's own API gives LiteRT's values. The expectation here is LiteRT's own
interpreter, run with numpy outside layerdiff.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.onnx_emit import convert_many
from tests.litert_models import image_input

PALM = "mediapipe/modules/palm_detection/palm_detection_lite.tflite"


def _collect(model_file: Path, picture: np.ndarray, out: Path) -> Path:
    model = resolve_model(model_file)
    (name,) = input_shapes(model)
    outcome = collect_run(LocalDevice(), RunSpec(model, "cpu", "high", InputSet("palm", {name: picture}, "test")), out)
    assert outcome.status == "done", outcome.message
    return outcome.paths[0]


def _tensor(path: Path, name: str) -> tuple[np.ndarray, str]:
    with DumpFile(path) as dump:
        layers = dump.layers
        row = layers.loc[layers["name"] == name].iloc[-1]
        return dump.tensor(int(row["order"])), str(row["layout"])


@pytest.fixture(scope="module")
def palm(tmp_path_factory):
    work = tmp_path_factory.mktemp("palm")
    tflite = Path(importlib.metadata.distribution("mediapipe").locate_file(PALM))
    assert tflite.is_file(), f"mediapipe does not ship {PALM} (tests/corpus-wheels.txt pins 0.10.14)"
    mnn = work / "palm.mnn"
    convert_many([(tflite, mnn, False)], source_format="TFLITE")
    picture = image_input((1, 192, 192, 3))
    from ai_edge_litert.interpreter import Interpreter
    interpreter = Interpreter(model_path=str(tflite))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], picture)
    interpreter.invoke()
    own = {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
    return _collect(tflite, picture, work / "litert"), _collect(mnn, picture, work / "mnn"), own


def test_the_box_head_is_dumped_in_the_order_litert_gives_it(palm):
    _, mnn_run, own = palm
    boxes, layout = _tensor(mnn_run, "Identity")
    assert own["Identity"].shape == (1, 2016, 18) and boxes.shape == (1, 2016, 18), layout
    rel = np.linalg.norm(boxes - own["Identity"]) / np.linalg.norm(own["Identity"])
    assert rel < 1e-4, f"MNN's dumped box head differs from LiteRT's own output: rel L2 {rel:.3g} ({layout})"


def test_mnn_passes_against_litert_on_the_palm_detector(palm):
    litert_run, mnn_run, own = palm
    analysis = analyze_paths([litert_run, mnn_run], ref=litert_run)
    try:
        (row,) = [r for r in analysis.summary.to_dict("records") if r["role"] == "compared"]
    finally:
        analysis.close()
    assert row["verdict"] == "pass", row["verdict_reason"]
