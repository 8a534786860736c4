"""`analyze` itself asks about a precision label its bytes contradict (the `precision_label` finding), on
real dumps: MNN's x86 wheel computes fp32 at every precision, so its cpu/high and cpu/low dumps are the
same bytes; relabelled the way the wheel used to label them (fp16), analyze must say both that the bytes
are fp32 and that two differently labelled runs are bit-identical, and say nothing on the true labels."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import h5py
import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile


def _analyze(folder) -> dict:
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(folder), "-o", str(folder / "rep"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _questions(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == "precision_label"]


def _two_mnn_runs(local_runs, folder):
    folder.mkdir()
    high, low = (shutil.copy(local_runs("convnet.mnn", "cpu", p), folder / f"mnn_{p}.h5") for p in ("high", "low"))
    with DumpFile(high) as a, DumpFile(low) as b:  # numpy's judgement: the two dumps are the same bytes
        assert all(np.array_equal(a.tensor(o), b.tensor(o), equal_nan=True) for o in a.layers["order"])
    return high, low


def test_true_labels_raise_no_question(local_runs, tmp_path):
    high, low = _two_mnn_runs(local_runs, tmp_path / "runs")
    with DumpFile(high) as a, DumpFile(low) as b:
        assert a.attrs["precision_effective"] == b.attrs["precision_effective"] == "fp32"
    assert _questions(_analyze(tmp_path / "runs")) == []


def test_fp16_label_on_fp32_bytes_and_identical_runs_are_questioned(local_runs, tmp_path):
    high, low = _two_mnn_runs(local_runs, tmp_path / "runs")
    with h5py.File(low, "r+") as f:  # the label MNN's x86 wheel used to write at cpu/low
        f.attrs["precision_effective"] = "fp16"
    doc = _analyze(tmp_path / "runs")
    questions = _questions(doc)
    assert len(questions) == 2, questions
    label, identical = sorted(questions, key=lambda f: "runs" in f["numbers"])
    assert label["severity"] == "warn" and label["numbers"]["label"] == "fp16" and label["numbers"]["measured"] == "fp32"
    assert "Provenance question" in label["sentence"] and "fp32 storage" in label["sentence"]
    assert identical["severity"] == "warn" and identical["numbers"]["labels"] == ["fp32", "fp16"]
    assert "bit-identical" in identical["sentence"]
    assert identical["numbers"]["sampled_values"] > 0
    low_run = next(r for r in doc["runs"] if r["provenance"]["precision_effective"] == "fp16")
    assert not low_run["first_divergence"]  # a provenance question, not a layer failure
