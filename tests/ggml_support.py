"""Shared by the ggml engine's tests: the cached layerdiff-ggml binary, the seeded GGUF samples, a run."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.rawdump import read_raw_dump


@pytest.fixture(scope="session")
def ggml_binary() -> Path:
    """Built once into the cache (about 8 min on 2 cores the first time, then instant)."""
    from layerdiff.collector.engines.ggml.build import ensure_built
    from layerdiff.collector.harness.buildprogress import PlainReporter

    return ensure_built(reporter=PlainReporter())


@pytest.fixture(scope="session")
def ggml_samples(tmp_path_factory) -> dict[str, Path]:
    from layerdiff.samples.ggml_models import write_all

    return write_all(tmp_path_factory.mktemp("ggml-samples"))


def run_ggml(binary: Path, out: Path, model: Path, input_spec: str, backend: str = "cpu", precision: str = "high",
             *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), "--engine", "ggml", "--model", str(model), "--input", input_spec,
                           "--backend", backend, "--precision", precision, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300)


def dump_arrays(out: Path) -> tuple[dict, dict[str, np.ndarray], dict]:
    """(header, arrays by node name, tensor records by node name) of a raw dump."""
    dump = read_raw_dump(out)
    arrays, records = {}, {}
    for tensor, array in dump.iter_arrays():
        arrays[tensor.name] = array
        records[tensor.name] = tensor
    return dump.header, arrays, records


def gguf_weights(model: Path) -> dict[str, np.ndarray]:
    """The model's tensors as float32 numpy arrays (numpy order: ggml's ne reversed)."""
    import gguf

    reader = gguf.GGUFReader(model)
    return {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
            for t in reader.tensors}


def f16_weight_matmul_error(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> float:
    """max |out - x @ w.T| / max |x @ w.T| for an f16 weight `w`, against the closer of the two kernels ggml's CPU
    runs it with: the plain one rounds the activations to f16 first (its vec_dot_type), the AMX buffer's (a build
    with ggml's AMX kernels on a CPU with AMX, where ggml keeps f16 weights) keeps them f32. Both accumulate in f32."""
    w64 = w.astype(np.float64)
    errors = []
    for acts in (x.astype(np.float16).astype(np.float64), x.astype(np.float64)):
        exact = acts @ w64.T
        errors.append(float(np.abs(out.reshape(exact.shape) - exact).max() / np.abs(exact).max()))
    return min(errors)


@pytest.fixture(scope="module")
def vulkan_binary():
    """The cached ggml Vulkan build (lavapipe); its tests skip without one."""
    from layerdiff.collector.engines.ggml.build import GgmlSpec, binary_dir

    binary = binary_dir(GgmlSpec(vulkan=True)) / "layerdiff-ggml"
    if not binary.is_file():
        pytest.skip("no Vulkan build of layerdiff-ggml cached (python -m layerdiff.collector.engines.ggml.build --vulkan)")
    return binary
