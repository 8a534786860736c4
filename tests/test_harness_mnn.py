"""The C++ harness's MNN engine, built against the MNN named by $MNN_ROOT (include/ + lib/).

MNN's C++ libraries are not on PyPI, so these tests run only where a developer (or a CI step
with an MNN build) sets MNN_ROOT; the reference is the pymnn engine of the `local` device.
On this machine there is no OpenCL driver, which makes the silent CPU fallback observable.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from analyzer.rawdump import read_raw_dump
from collector.harness import HarnessSpec, ensure_built
from tests.test_harness_support import INPUTS, MODELS, REPO, arrays_by_key, check_well_formed, max_scaled_diff, run_harness

MNN_ROOT = os.environ.get("MNN_ROOT", "")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.path.isfile(os.path.join(MNN_ROOT, "include", "MNN", "Interpreter.hpp")),
    reason="set MNN_ROOT to an MNN build with include/ and lib/ to test the C++ MNN engine",
)]


@pytest.fixture(scope="module")
def harness() -> list[str]:
    return [str(ensure_built(HarnessSpec("host", with_ncnn=False, mnn_root=MNN_ROOT)))]


def mnn_args(stem: str, backend: str, precision: str) -> list[str]:
    return ["--engine", "mnn", "--model", str(MODELS / f"{stem}.mnn"), "--input", f"data={INPUTS / f'{stem}.npy'}",
            "--backend", backend, "--precision", precision]


def pymnn_dump(stem: str, backend: str, precision: str, out):
    cmd = [sys.executable, "-m", "collector.engines.mnn_engine", *mnn_args(stem, backend, precision), "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    return read_raw_dump(out)


def test_version_and_probe(harness):
    version = subprocess.run([*harness, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "(mnn " in version.stdout
    probe = json.loads(subprocess.run([*harness, "--probe"], capture_output=True, text=True).stdout)
    backends = probe["engines"]["mnn"]["backends"]
    assert backends["cpu"]["ok"] is True
    assert set(backends) == {"cpu", "opencl", "vulkan"}
    binary_dir = os.path.dirname(harness[0])  # MNN's libraries travel with the binary to the phone
    assert os.path.isfile(os.path.join(binary_dir, "libMNN.so"))


@pytest.mark.parametrize("stem", ["convnet", "overflow"])
def test_cpu_high_agrees_with_pymnn(harness, tmp_path, stem):
    run = run_harness(harness, mnn_args(stem, "cpu", "high"), tmp_path / "cxx")
    assert run.returncode == 0, run.stderr
    ours = check_well_formed(run)
    reference = pymnn_dump(stem, "cpu", "high", tmp_path / "py")
    assert [(t.op, t.op_type, t.output_index, t.shape) for t in ours.tensors] == \
        [(t.op, t.op_type, t.output_index, t.shape) for t in reference.tensors]
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    assert max_scaled_diff(arrays_by_key(ours), arrays_by_key(reference)) <= 1e-4
    assert ours.header["backends_actual"] == ["cpu"] and ours.header["precision_effective"] == "fp32"
    assert [t.inputs for t in ours.tensors] == [t.inputs for t in reference.tensors]  # same graph edges
    assert ours.tensors[0].op_type == "Raster" and ours.tensors[0].inputs == ["data"]  # layout conversion first


def test_opencl_without_driver_falls_back_to_cpu_and_says_so(harness, tmp_path):
    run = run_harness(harness, mnn_args("convnet", "opencl", "low"), tmp_path / "d")
    assert run.returncode == 0, run.stderr
    header = check_well_formed(run).header
    assert header["backend_requested"] == "opencl"
    assert header["backends_actual"] == ["cpu"]
    assert "backend_library_loaded" in header["options"]


def test_abort_after_leaves_partial_dump(harness, tmp_path):
    run = run_harness(harness, [*mnn_args("convnet", "cpu", "high"), "--abort-after", "3"], tmp_path / "d")
    assert run.returncode == -signal.SIGABRT
    dump = read_raw_dump(tmp_path / "d")
    assert dump.footer is None and len(dump.tensors) == 3
