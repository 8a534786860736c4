"""`collect --repeat N --fresh-process`: each repeat in a harness process of its own, on any engine,
and the run-to-run spread as a finding (LiteRT's split pose_detection GPU graph; ncnn/MNN/ORT samples)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.run.fresh import single_run_argv
from tests.litert_models import tflite_model

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "models"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600)


def test_single_run_argv_points_each_process_at_its_own_directory():
    argv = ["--engine", "ncnn", "--model", "m.param", "--out", "/d/run/dump", "--repeat", "3", "--layers", "conv"]
    assert single_run_argv(argv, "/d/run", 2) == ["--engine", "ncnn", "--model", "m.param", "--out",
                                                  "/d/run/dump/r2", "--layers", "conv"]


@pytest.mark.parametrize("model", ["convnet.onnx", "convnet.param", "convnet.mnn"])
def test_every_host_engine_repeats_in_fresh_processes(tmp_path, model):
    done = cli("layerdiff.collector.cli", "--device", "local", "--model", str(SAMPLES / model), "--repeat", "2",
               "--fresh-process", "-o", str(tmp_path), "--no-report")
    assert done.returncode == 0, done.stderr[-1500:]
    files = sorted(tmp_path.glob("*_r*.h5"))
    assert [f.name[-6:] for f in files] == ["_r0.h5", "_r1.h5"]
    for k, path in enumerate(files):
        with DumpFile(path) as dump:
            assert dump.attrs["repeat"] == k and dump.provenance["fresh_process"] is True
            assert dump.stderr().count("(fresh process) ---") == 2


def test_pose_detection_gpu_spread_over_fresh_processes_is_a_finding(tmp_path):
    done = cli("layerdiff.collector.cli", "--device", "local", "--model", str(tflite_model("pose_detection")),
               "--backend", "gpu", "--precision", "high", "--repeat", "3", "--fresh-process", "-o", str(tmp_path / "runs"),
               "--no-report")
    assert done.returncode == 0, done.stderr[-1500:]
    files = sorted((tmp_path / "runs").glob("litert_gpu_high_*_r*.h5"))
    assert len(files) == 3
    outputs = []
    for path in files:
        with DumpFile(path) as dump:
            assert dump.attrs["backend_actual"] == "gpu+cpu"
            # three processes, each setting WebGPU up twice: the observed graph and the plain run (the footer's plain_run)
            assert dump.stderr().count("Selected adapter: SwiftShader") == 6
            outputs.append(dump.tensor_by_key("Identity:0"))
    spread = max(float(np.linalg.norm(o - outputs[0]) / np.linalg.norm(outputs[0])) for o in outputs)
    analyzed = cli("layerdiff.analyzer.cli.app", *map(str, files), "-o", str(tmp_path / "report"), "--json")
    doc = json.loads(analyzed.stdout)
    [finding] = [f for f in doc["findings"] if f["kind"] == "run_spread"]
    assert finding["numbers"]["repeats"] == 3 and finding["numbers"]["fresh_process"] is True
    assert finding["numbers"]["output_rel_l2_max"] == pytest.approx(spread, abs=1e-9)
    # Measured here (SwiftShader, ai-edge-litert 2.3.0): bit-identical across processes; the finding says so
    assert (finding["severity"] == "info") == (spread == 0.0)
