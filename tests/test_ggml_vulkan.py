"""ggml's Vulkan backend on this machine's lavapipe: the same GGUF model on vulkan and on the CPU.

Marked `slow` and skipped unless a Vulkan build of layerdiff-ggml is already in the cache: that build
needs glslc (Debian `apt-get install glslc`) and compiles ggml's Vulkan shaders, too long for CI's cold
run (see the README's "What is verified where"). Build it once with
`python -m layerdiff.collector.engines.ggml.build --vulkan`, then run this file.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.ggml_support import dump_arrays, ggml_samples, run_ggml  # noqa: F401


@pytest.fixture(scope="module")
def vulkan_binary():
    from layerdiff.collector.engines.ggml.build import GgmlSpec, binary_dir

    binary = binary_dir(GgmlSpec(vulkan=True)) / "layerdiff-ggml"
    if not binary.is_file():
        pytest.skip("no Vulkan build of layerdiff-ggml cached (python -m layerdiff.collector.engines.ggml.build --vulkan)")
    return binary


@pytest.mark.slow
def test_vulkan_runs_every_node_it_can_and_says_where_each_ran(vulkan_binary, ggml_samples, tmp_path):
    runs = {}
    for backend, precision in (("cpu", "high"), ("vulkan", "high"), ("vulkan", "low")):
        out = tmp_path / f"{backend}-{precision}"
        proc = run_ggml(vulkan_binary, out, ggml_samples["tinyllama"], f"tokens={ggml_samples['tokens']}", backend, precision)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[(backend, precision)] = dump_arrays(out)
    header, vk, records = runs[("vulkan", "high")]
    assert "vulkan" in header["backends_actual"] and header["options"]["GGML_VK_DISABLE_F16"] is True
    assert records["Qcur-0"].layout.endswith("@Vulkan0") and records["Qcur-0"].memory == "device"
    cpu = runs[("cpu", "high")][1]
    shared = [name for name in cpu if name in vk]
    assert len(shared) >= 0.9 * len(cpu)
    out = cpu["result_output"]
    assert np.abs(vk["result_output"] - out).max() < 1e-2 * np.abs(out).max()  # fp32 shaders: close to the CPU
    low = runs[("vulkan", "low")][1]
    assert np.isfinite(low["result_output"]).all()
