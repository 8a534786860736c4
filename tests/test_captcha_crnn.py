"""A captcha reader (captcha-whisperer's CRNN + CTC, tests/corpus-wheels.txt) converted by pnnx to ncnn.

pnnx writes the bidirectional LSTM's reversed direction with ncnn's `Flip` layer, which the ncnn of the
arm64 device's aarch64 wheel predates: that ncnn only prints "layer Flip not exists or registered", loads
the rest and crashes (SIGSEGV) when it runs. The run is refused in one line naming the layer instead.
On the host's ncnn the model runs, and its text is ONNX Runtime's (greedy CTC, computed here with numpy).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from tests.corpus import CAPTCHA_MODEL, convert_corpus

LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_"  # 36 is the CTC blank


def ctc_text(logits: np.ndarray) -> str:
    """Greedy CTC: the best class per time step, repeats merged, blanks dropped."""
    best = np.asarray(logits, np.float64).reshape(20, 37).argmax(1)
    return "".join(LABELS[c] for i, c in enumerate(best) if c != 36 and (i == 0 or c != best[i - 1]))


@pytest.fixture(scope="module")
def captcha(tmp_path_factory):
    work = tmp_path_factory.mktemp("captcha")
    return convert_corpus(work, (CAPTCHA_MODEL,))["captcha_crnn"], work


def test_ncnn_reads_the_captcha_as_onnx_runtime_does(captcha):
    import onnxruntime as ort
    converted, work = captcha
    image = np.load(converted.inputs)["image"]
    expected = ort.InferenceSession(str(converted.onnx)).run(None, {"image": image})[0]
    model = resolve_model(converted.ncnn)
    sets, errors = resolve_inputs([str(converted.ncnn_inputs)], input_shapes(model))
    assert not errors
    outcome = collect_run(LocalDevice(), RunSpec(model, "cpu", "high", sets[0]), work / "runs")
    assert outcome.status == "done", outcome.message
    with DumpFile(outcome.paths[0]) as dump:
        layers = dump.layers
        logits = dump.tensor(int(layers.loc[layers["name"] == "out0", "order"].iloc[-1]))
    assert np.linalg.norm(logits.ravel() - expected.ravel()) / np.linalg.norm(expected) < 1e-4
    assert len(ctc_text(expected)) >= 3 and ctc_text(logits) == ctc_text(expected)


def test_an_ncnn_without_the_flip_layer_refuses_the_model_in_one_line(captcha):
    converted, work = captcha
    assert any(line.split()[:1] == ["Flip"] for line in converted.ncnn.read_text().splitlines())
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "arm64", "--model",
                           str(converted.ncnn), "--input", str(converted.ncnn_inputs), "--backend", "cpu",
                           "--precision", "low", "-o", str(work / "arm64"), "--no-report"],
                          capture_output=True, text=True, timeout=600)
    said = proc.stdout + proc.stderr
    assert "signal 11" not in said and "Traceback" not in said, said[-2000:]
    assert "ncnn does not know the layer type(s) Flip" in said, said[-2000:]
    (line,) = [ln for ln in said.splitlines() if "does not know the layer type" in ln]
    assert "ncnn 1.0." in line and str(converted.ncnn.name) in line
