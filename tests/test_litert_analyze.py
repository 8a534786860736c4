"""`collect --device local --backend cpu,gpu` on real mediapipe models, judged from results.json.

The verdicts are checked against numpy on the decoded outputs: a pass must mean the GPU's model
outputs match the CPU's, a fail that they do not.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.litert_models import tflite_model


def collect(out: Path, stem: str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                           str(tflite_model(stem)), "--backend", "cpu,gpu", "--precision", "high", "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: a run failed its verdict (pose)
    return json.loads((out / "report" / "results.json").read_text())


def gpu_entry(results: dict) -> dict:
    return next(r for r in results["runs"] if r["role"] != "reference")


def output_error(out: Path) -> float:
    """Worst rel L2 over the model outputs, straight from the two HDF5 files (numpy, no analyzer)."""
    [cpu], [gpu] = sorted(out.glob("litert_cpu_*.h5")), sorted(out.glob("litert_gpu_*.h5"))
    with DumpFile(cpu) as a, DumpFile(gpu) as b:
        consumed = {n for cell in a.layers["inputs"] for n in json.loads(cell)}
        outputs = [k for k, name in zip(a.layers["key"], a.layers["name"]) if name not in consumed]
        worst = 0.0
        for key in outputs:
            x, y = a.tensor_by_key(key).astype(np.float64), b.tensor_by_key(key).astype(np.float64)
            worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)))
    return worst


@pytest.mark.parametrize("stem, fused, zeros", [("face_detection_short_range", 10, 0), ("selfie_segmentation", 0, 3)])
def test_cpu_vs_gpu_passes_with_every_unobservable_tensor_marked(tmp_path, stem, fused, zeros):
    results = collect(tmp_path, stem)
    run = gpu_entry(results)
    assert output_error(tmp_path) < 1e-4  # numpy's judgement of the outputs: the same
    assert run["verdict"] == "pass", run["summary"]
    hidden = run["unmatched"]["only_in_reference"]
    assert len(hidden) == fused and all(u["why"].startswith("not observable on this backend") for u in hidden)
    marked = [layer for layer in run["layers"] if layer["status"] == "not_observable"]
    assert len(marked) == zeros and all(layer["op_type"] == "ADD" for layer in marked)
    assert not [layer for layer in run["layers"] if layer["status"] == "fail"]
    kinds = {f["kind"] for f in results["findings"]}
    assert not kinds & {"zero_collapse_origin", "error_growth", "first_divergence", "split_graph", "nondeterminism"}, kinds
    check = _plain_run(tmp_path)  # the app's graph, run twice, agrees with the observed run
    assert check["outputs"] and all(o["vs_observed"]["rel_l2"] <= 1e-5 and o["vs_second_plain_run"]["rel_l2"] == 0
                                    for o in check["outputs"])


def _plain_run(out: Path) -> dict:
    [gpu] = sorted(out.glob("litert_gpu_*.h5"))
    with DumpFile(gpu) as dump:
        return dump.provenance["raw_footer"]["plain_run"]


def test_pose_detection_split_is_named_with_its_first_divergent_tensor(tmp_path):
    results = collect(tmp_path, "pose_detection")
    run = gpu_entry(results)
    assert output_error(tmp_path) > 0.3  # numpy: the GPU's output is wrong
    assert run["verdict"] == "fail" and run["summary"]["backend_actual"] == "gpu+cpu"
    findings = {f["kind"]: f for f in results["findings"]}
    split = findings["split_graph"]
    assert "108 operators on the GPU and 183 on the CPU" in split["sentence"] and "DENSIFY" in split["sentence"]
    assert "On the CPU: layer(s) model_1/model/zero_padding2d/Pad (PAD) and 182 weight-decoding" in split["sentence"]
    assert split["numbers"]["cpu_layers"] == ["model_1/model/zero_padding2d/Pad"]
    first = findings["first_divergence"]
    assert first["op_type"] == "CONV_2D" and "conv2d_1/" in first["layer"]  # its weights come from the CPU's DENSIFY
    assert not [layer for layer in run["layers"] if layer["status"] == "not_observable"]  # real zeros stay failures
    # the wrong outputs are the app's too: the model run plainly gives the observed run's outputs
    assert all(o["vs_observed"]["compared"] and o["vs_observed"]["rel_l2"] <= 1e-5 for o in _plain_run(tmp_path)["outputs"])
