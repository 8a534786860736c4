"""ggml's Vulkan backend on the host's lavapipe: the same GGUF model on vulkan and on the CPU.

Marked `slow` and skipped unless a Vulkan build of layerdiff-ggml is already in the cache: that build
needs glslc (Debian `apt-get install glslc`) and compiles ggml's Vulkan shaders, too long for CI's cold
run (see the README's "What is verified where"). Build it once with
`python -m layerdiff.collector.engines.ggml.build --vulkan`, then run this file.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.ggml_support import dump_arrays, ggml_samples, run_ggml, vulkan_binary  # noqa: F401


@pytest.mark.slow
def test_vulkan_runs_every_node_it_can_and_says_where_each_ran(vulkan_binary, ggml_samples, tmp_path):
    runs = {}
    for backend, precision in (("cpu", "high"), ("vulkan", "high"), ("vulkan", "low")):
        out = tmp_path / f"{backend}-{precision}"
        proc = run_ggml(vulkan_binary, out, ggml_samples["tinyllama"], f"tokens={ggml_samples['tokens']}", backend, precision)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[(backend, precision)] = dump_arrays(out)
    header, vk, records = runs[("vulkan", "high")]
    assert header["backends_actual"] == ["vulkan", "cpu"]  # the token embedding runs on the CPU (Vulkan_Host)
    assert header["options"]["GGML_VK_DISABLE_F16"] is True and header["options"]["device"].startswith("llvmpipe")
    assert records["embd"].layout == "ggml/f32@Vulkan_Host"
    assert records["Qcur-0"].layout.endswith("@Vulkan0") and records["Qcur-0"].memory == "device"
    cpu = runs[("cpu", "high")][1]
    shared = [name for name in cpu if name in vk]
    assert len(shared) >= 0.9 * len(cpu)
    out = cpu["result_output"]
    assert np.abs(vk["result_output"] - out).max() < 1e-2 * np.abs(out).max()  # fp32 shaders: close to the CPU
    low = runs[("vulkan", "low")][1]
    assert np.isfinite(low["result_output"]).all()


@pytest.mark.slow
def test_collect_cpu_and_vulkan_in_one_sweep_analyzed_by_node_name(vulkan_binary, ggml_samples, tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(vulkan_binary)}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                           str(ggml_samples["tinyllama"]), "--input", str(ggml_samples["tokens"]), "--backend", "cpu,vulkan",
                           "--precision", "high,low", "-o", str(tmp_path / "runs"), "--no-report"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(tmp_path / "runs"), "-o",
                             str(tmp_path / "rep"), "--json"], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    runs = {r["run"]: r for r in json.loads(report.stdout)["runs"]}
    # llama.cpp keeps the token embedding on the CPU by design: recorded (vulkan+cpu), said, not a fallback
    assert set(runs) == {"cpu/high", "cpu/low", "vulkan/high", "vulkan/low"}
    vk = runs["vulkan/high"]
    assert vk["provenance"]["backend_actual"] == "vulkan+cpu"
    findings = json.loads(report.stdout)["findings"]
    assert not [f for f in findings if f["kind"] == "backend_fallback"]
    designed = [f for f in findings if f["kind"] == "cpu_by_design" and f["run"] == "vulkan/high"]
    assert len(designed) == 1 and designed[0]["numbers"]["cpu_nodes"] == ["embd:0"]
    assert vk["verdict"] in ("pass", "warn")  # fp32 shaders on f16 weights: within 1e-3 of the CPU
    layers = {layer["key"]: layer for layer in vk["layers"]}
    assert layers["attn_norm-0:0"]["max_abs"] == 0 and len(layers) >= 70
