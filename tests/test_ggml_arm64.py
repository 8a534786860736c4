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
        ids = np.load(ggml_samples["tokens"])
        for dump in (a, b):  # llama.cpp's inp_tokens read back on each CPU, checked by the collector
            assert dump.attrs["input_fed_check"] == "equal"
            [(name, fed, layout, _axes)] = list(dump.inputs_fed())
            assert name == "tokens" and layout == "ggml/i32@CPU" and fed.tolist() == ids.tolist()
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


def test_seed_004_isolated_on_the_emulated_phone_cpu(arm64_binary, ggml_binary, ggml_samples, tmp_path):
    """`collect isolate --device arm64`: the aarch64 build under qemu rebuilds IM2COL and MUL_MAT from its own
    graph; fed the ARM cpu/high reference, IM2COL's f16 output overflows exactly where numpy says (ARM's fp16
    conversion rounds as x86's does) and MUL_MAT's f16 input is named, as on the x86 CPU."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    out = tmp_path / "runs"
    env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(ggml_binary)}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "arm64", "--model",
                           str(ggml_samples["conv2d"]), "--input", str(ggml_samples["conv_large"]), "--backend", "cpu",
                           "--precision", "high,normal", "-o", str(out), "--no-report"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "isolate", "--device", "arm64", "--model",
                           str(ggml_samples["conv2d"]), "--backend", "cpu", "--precision", "normal", "--ref",
                           str(out / "ggml_cpu_high_conv2d_large.h5"), "--layer", "conv.im2col:0", "--layer",
                           "conv.mul_mat:0", "-o", str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    x = np.load(ggml_samples["conv_large"])
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, ky:ky + 32, kx:kx + 32] for ky in range(3) for kx in range(3)], axis=1)
    with np.errstate(over="ignore"):
        overflow = int(np.isinf(cols.astype(np.float16)).sum())
    [iso] = out.glob("isolated_*.h5")
    with DumpFile(iso) as dump:
        assert dump.attrs["abi"] == "arm64-v8a"
        assert int((~np.isfinite(dump.tensor_by_key("conv.im2col:0"))).sum()) == overflow > 1000
        assert dump.provenance["raw_header"]["isolation"]["fed"]["conv.mul_mat"][0]["overflow"] == overflow
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(out), "-o", str(tmp_path / "rep"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(r for r in json.loads(proc.stdout)["runs"] if r["run"].endswith("cpu/normal"))
    verdicts = {f["layer"]: f["numbers"]["verdict"] for f in run["findings"] if f["kind"] == "isolation"}
    assert verdicts == {"conv.im2col:0": "kernel", "conv.mul_mat:0": "input_type"}
