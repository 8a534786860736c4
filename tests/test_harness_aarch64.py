"""The static aarch64 harness under qemu-user: real ARMv8.2 fp16 arithmetic, and a Cortex-A53.

`qemu-aarch64 -cpu max` reports fp16 (asimdhp) through getauxval, so ncnn's runtime dispatch takes
its fp16 kernels; `-cpu cortex-a53` has no fp16, so the same binary must run its fp32/bf16 paths
(an ARMv8.2-only build dies there with SIGILL).
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

from tests.test_harness_support import (
    aarch64_harness,
    arrays_by_key,
    check_well_formed,
    dump_model,
    host_harness,
    max_scaled_diff,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
    reason="needs qemu-user and g++-aarch64-linux-gnu (apt) to build and run the aarch64 harness",
)]


def qemu(cpu: str) -> list[str]:
    return ["qemu-aarch64", "-cpu", cpu, str(aarch64_harness())]


@pytest.fixture(scope="module")
def max_cpu() -> list[str]:
    return qemu("max")


@pytest.fixture(scope="module")
def a53() -> list[str]:
    return qemu("cortex-a53")


def probe(prefix: list[str]) -> dict:
    result = subprocess.run([*prefix, "--probe"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_binary_is_static_aarch64():
    """ELF machine 183 (AArch64) and no PT_INTERP program header: runs without any loader/libc."""
    data = aarch64_harness().read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # 64-bit
    assert struct.unpack_from("<H", data, 18)[0] == 183
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    assert 3 not in types  # PT_INTERP


def test_probe_under_cpu_max_reports_fp16_and_no_vulkan(max_cpu):
    info = probe(max_cpu)
    assert info["abi"] == "arm64-v8a"
    backends = info["engines"]["ncnn"]["backends"]
    assert backends["cpu"]["ok"] and backends["cpu"]["fp16"] and backends["cpu"]["low"] == "fp16-storage+arith"
    assert backends["vulkan"]["ok"] is False


def test_high_agrees_with_host_harness(max_cpu, tmp_path):
    arm = check_well_formed(dump_model(max_cpu, "convnet", "cpu", "high", tmp_path / "arm"))
    host = dump_model([str(host_harness())], "convnet", "cpu", "high", tmp_path / "host").dump()
    assert arm.header["precision_effective"] == "fp32"
    assert [t.name for t in arm.tensors] == [t.name for t in host.tensors]
    assert max_scaled_diff(arrays_by_key(arm), arrays_by_key(host)) <= 1e-4


def test_low_is_real_fp16_and_differs_from_high(max_cpu, tmp_path):
    high = arrays_by_key(dump_model(max_cpu, "convnet", "cpu", "high", tmp_path / "high").dump())
    low = check_well_formed(dump_model(max_cpu, "convnet", "cpu", "low", tmp_path / "low"))
    assert low.header["precision_effective"] == "fp16-storage+arith"
    diff = max_scaled_diff(arrays_by_key(low), high)
    assert 1e-4 < diff < 0.5


def test_overflow_sample_gives_inf_or_nan_at_low(max_cpu, tmp_path):
    high = dump_model(max_cpu, "overflow", "cpu", "high", tmp_path / "high").dump()
    assert all(np.isfinite(arr).all() for _, arr in high.iter_arrays())
    low = dump_model(max_cpu, "overflow", "cpu", "low", tmp_path / "low").dump()
    broken = [t.op for t, arr in low.iter_arrays() if not np.isfinite(arr).all()]
    assert "block2/amplify" in broken


def test_cortex_a53_runs_without_fp16(a53, tmp_path):
    backends = probe(a53)["engines"]["ncnn"]["backends"]
    assert backends["cpu"]["fp16"] is False and backends["cpu"]["low"] == "bf16-storage"
    low = check_well_formed(dump_model(a53, "convnet", "cpu", "low", tmp_path / "low"))
    assert low.header["precision_effective"] == "bf16-storage"
    assert all(np.isfinite(arr).all() for _, arr in low.iter_arrays())
