"""The ggml engine on the `arm64` device: llama.cpp's static aarch64 build (ARMv8.2-A + fp16, what phones'
CPUs run) under qemu-aarch64, the same GGUF model as on the local CPU, analyzed together by node name.
The aarch64 binary is built once into the cache (cross-compiled with aarch64-linux-gnu-g++)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.ggml_support import dump_arrays, ggml_binary, ggml_samples, gguf_weights  # noqa: F401


@pytest.fixture(scope="module")
def arm64_binary():
    from layerdiff.collector.engines.ggml.build import GgmlSpec, ensure_built
    from layerdiff.collector.harness.buildprogress import PlainReporter

    return ensure_built(GgmlSpec("aarch64"), PlainReporter())


def _collect(device: str, out, model, inp, env_binary) -> None:
    env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(env_binary)}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", device, "--model", str(model),
                           "--input", str(inp), "--backend", "cpu", "--precision", "high", "-o", str(out),
                           "--no-report"], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_arm64_runs_ggml_fp16_kernels_and_aligns_with_the_local_cpu(arm64_binary, ggml_binary, ggml_samples, tmp_path):
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    _collect("arm64", tmp_path / "runs" / "arm64", ggml_samples["tinyllama"], ggml_samples["tokens"], ggml_binary)
    _collect("local", tmp_path / "runs" / "local", ggml_samples["tinyllama"], ggml_samples["tokens"], ggml_binary)
    [arm] = (tmp_path / "runs" / "arm64").glob("ggml_cpu_high_*.h5")
    [x86] = (tmp_path / "runs" / "local").glob("ggml_cpu_high_*.h5")
    with DumpFile(arm) as a, DumpFile(x86) as b:
        assert a.attrs["abi"] == "arm64-v8a" and a.attrs["soc"] == "cortex-a76"
        assert "cpu fp16 vector arithmetic" in a.attrs["precision_effective"]
        assert "fp16 vector" not in b.attrs["precision_effective"]
        assert list(a.layers["key"]) == list(b.layers["key"])  # the same graph, node for node
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(tmp_path / "runs"), "--ref", str(x86),
                           "-o", str(tmp_path / "rep"), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(r for r in json.loads(proc.stdout)["runs"] if r["role"] != "reference")
    layers = {layer["key"]: layer for layer in run["layers"]}
    assert layers["embd:0"]["max_abs"] == 0 and layers["attn_norm-0:0"]["rel_l2"] < 1e-6  # no f16 arithmetic yet
    assert layers["Qcur-0:0"]["rel_l2"] > 1e-5  # the first f16 matmul: fp16 accumulation on ARM
    assert run["first_divergence"]["layer"] is not None


def test_arm64_fp16_matmul_is_what_numpy_says_fp16_accumulation_gives(arm64_binary, ggml_samples, tmp_path):
    """Qcur-0 on the emulated core against numpy: f16 inputs, products and sums in f16 vs in f32."""
    out = tmp_path / "raw"
    proc = subprocess.run(["qemu-aarch64", "-cpu", "cortex-a76", str(arm64_binary), "--model", str(ggml_samples["tinyllama"]),
                           "--input", f"tokens={ggml_samples['tokens']}", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, a, _ = dump_arrays(out)
    w = gguf_weights(ggml_samples["tinyllama"])["blk.0.attn_q.weight"]
    x16 = a["attn_norm-0"].astype(np.float16).astype(np.float32)
    exact = x16.astype(np.float64) @ w.T.astype(np.float64)
    err_arm = np.abs(a["Qcur-0"] - exact).max()
    assert 1e-4 * np.abs(exact).max() < err_arm < 2e-2 * np.abs(exact).max()  # f16 accumulation: real, bounded


def test_a_core_without_fp16_is_refused_in_one_line(ggml_samples, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "arm64:cortex-a53", "--model",
                           str(ggml_samples["tinyllama"]), "--input", str(ggml_samples["tokens"]), "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "needs ARMv8.2 fp16, which cortex-a53 lacks" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
