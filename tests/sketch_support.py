"""Real dumps with tensor summaries for the sketch tests: PP-OCRv4 text detection (rapidocr's wheel, converted
by pnnx at 128x256) run by the C++ harness built for the host and by pip ncnn at high and low precision."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.corpus import MODELS, _nchw, convert_with_pnnx, text_image, wheel_file
from tests.test_harness_support import REPO, host_harness

SHAPE = "[1,3,128,256]f32"


@pytest.fixture(scope="module")
def det_model(tmp_path_factory):
    """PP-OCRv4 det as ncnn at 128x256, and a rendered text line as its input."""
    work = tmp_path_factory.mktemp("sketch-det")
    onnx = work / "ocr_det.onnx"
    onnx.write_bytes(wheel_file(MODELS[0]).read_bytes())
    param = convert_with_pnnx(onnx, SHAPE, work)
    image = _nchw(text_image(128, 256, "sketch 1024"), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    np.save(work / "in0.npy", image)
    return work, ["--engine", "ncnn", "--model", str(param), "--model", str(param.with_suffix(".bin")),
                  "--input", f"in0={work / 'in0.npy'}", "--backend", "cpu"]


def _pip_ncnn(args: list[str], precision: str, out) -> None:
    cmd = [sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", *args, "--precision", precision,
           "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def dumps(det_model):
    """Raw dumps: the C++ harness at high precision, pip ncnn at high and at low precision."""
    work, args = det_model
    cpp = subprocess.run([str(host_harness()), *args, "--precision", "high", "--out", str(work / "cpp")],
                         capture_output=True, text=True, timeout=300)
    assert cpp.returncode == 0, cpp.stderr
    _pip_ncnn(args, "high", work / "high")
    _pip_ncnn(args, "low", work / "low")
    return {name: work / name for name in ("cpp", "high", "low")}


@pytest.fixture(scope="module")
def gpu_dump(det_model):
    """pip ncnn on Vulkan (Mesa lavapipe) at low precision: fp16 storage and arithmetic on a GPU backend."""
    work, args = det_model
    _pip_ncnn([*args[:-1], "vulkan"], "low", work / "vulkan")
    return work / "vulkan"




@pytest.fixture(scope="module")
def ort_golden(det_model):
    """The ONNX model itself on ONNX Runtime: a golden whose layer names differ from ncnn's (pnnx renames them),
    so a comparison with an ncnn run aligns by structure."""
    work, _args = det_model
    cmd = [sys.executable, "-m", "layerdiff.collector.engines.ort.engine", "--engine", "onnxruntime",
           "--model", str(work / "ocr_det.onnx"), "--input", f"x={work / 'in0.npy'}", "--backend", "cpu",
           "--precision", "high", "--out", str(work / "ort")]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    return work / "ort"
