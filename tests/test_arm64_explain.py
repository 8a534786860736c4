"""MNN's own Arm82 fp16 kernels on the `arm64` device (qemu-user) flush a log-power front end's tiny
values to exact zeros, and its Log turns them into -65504 (saturated -Inf). The zeros hide from rel L2
(the Log's input passes at 0.002), so "Log breaks at this setting" would blame the op for its input:
the failure source must move to the layer where the zeros start and say why. Nothing is injected:
the model is built with the `onnx` helper API, converted by MNN's converter (`_tools`), collected with
`collect --device arm64` and analyzed with `analyze --json`, as a user would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from layerdiff.analyzer.formats.dumpfile import DumpFile

SHAPE = [1, 4, 16, 16]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600)


def _log_power_model() -> onnx.ModelProto:
    """energy (1x1 Conv) -> power (x*x) -> scaled (x 1e-5) -> logmel (Log) -> head (1x1 Conv)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.normal(size=(8, 4, 1, 1)) * 0.5).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.normal(size=(4, 8, 1, 1)) * 0.1).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "tiny")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["energy"], name="energy"),
             helper.make_node("Mul", ["energy", "energy"], ["power"], name="power"),
             helper.make_node("Mul", ["power", "tiny"], ["scaled"], name="scaled"),
             helper.make_node("Log", ["scaled"], ["logmel"], name="logmel"),
             helper.make_node("Conv", ["logmel", "w2"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "logpower", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with DumpFile(path) as dump:
        return {row.key: dump.tensor(row.order) for row in dump.layers.itertuples()}


def test_log_fed_fp16_zeros_moves_the_failure_source_to_where_they_start(tmp_path):
    onnx.save(_log_power_model(), tmp_path / "logpower.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(7).normal(size=SHAPE).astype(np.float32))
    convert = ("import sys, _tools; _tools.mnnconvert(['mnnconvert', '-f', 'ONNX', '--modelFile', sys.argv[1], "
               "'--MNNModel', sys.argv[2], '--bizCode', 'test'])")
    subprocess.run([sys.executable, "-c", convert, str(tmp_path / "logpower.onnx"), str(tmp_path / "logpower.mnn")],
                   check=True, capture_output=True, timeout=300)
    done = _cli("layerdiff.collector.cli", "--device", "arm64", "--model", str(tmp_path / "logpower.mnn"),
                "--input", str(tmp_path / "x.npy"), "--backend", "cpu", "--precision", "high,low",
                "-o", str(tmp_path / "runs"), "--no-report")
    assert done.returncode == 0, done.stderr
    high, low = (_tensors(tmp_path / "runs" / f"mnn_cpu_{p}_x.h5") for p in ("high", "low"))
    # numpy's judgement: `scaled` is where most exact zeros the reference lacks appear (its input `power`
    # has at most a stray one); they barely move rel L2; the Log's output there is far below the reference
    zeros = {k: int(np.count_nonzero((low[k] == 0) & (high[k] != 0))) for k in ("energy:0", "power:0", "scaled:0")}
    assert zeros["scaled:0"] > 50 and 2 * zeros["power:0"] < zeros["scaled:0"] and zeros["energy:0"] == 0
    ref, run = high["scaled:0"].astype(np.float64), low["scaled:0"].astype(np.float64)
    assert np.linalg.norm(run - ref) / np.linalg.norm(ref) < 0.01
    flushed = (low["scaled:0"] == 0) & (high["scaled:0"] != 0)
    assert (low["logmel:0"][flushed] < 10 * high["logmel:0"].min()).all()

    done = _cli("layerdiff.analyzer.cli.app", str(tmp_path / "runs"), "-o", str(tmp_path / "report"), "--json")
    assert done.returncode == 0, done.stderr
    findings = json.loads(done.stdout)["findings"]
    (source,) = [f for f in findings if f["kind"] == "failure_source"]
    assert source["layer"] == "scaled:0" and source["numbers"]["moved_from"] == "logmel:0"
    assert source["numbers"]["anomaly_count"] == zeros["scaled:0"]
    assert f"its input scaled:0 already holds {zeros['scaled:0']} exact zeros" in source["sentence"]
    assert "this op breaks" not in source["sentence"]
    assert not [f for f in findings if f["kind"] == "error_growth" and f["layer"] == "logmel:0"]
    (first,) = [f for f in findings if f["kind"] == "first_divergence"]  # where rel L2 jumps, with what it hides
    assert first["layer"] == "logmel:0" and first["numbers"]["anomalous_input"] == "scaled:0"
    assert "Its input scaled:0 already holds" in first["sentence"]
