"""Which C++ harness build runs ncnn on a phone (`Engine.harness_spec`).

A CPU-only run on an arm64 phone uses the static aarch64 binary (no NDK needed, runs under qemu too);
GPU backends need the NDK build for the phone's ABI; the host's ABI gets the host build with Vulkan on.
"""
from __future__ import annotations

from layerdiff.collector.harness.build import HarnessSpec, phone_target
from layerdiff.vocabulary import host_abi


def harness_spec(abi: str, backend: str, test_build: bool) -> HarnessSpec:
    if abi == "arm64-v8a" and backend == "cpu" and abi != host_abi():
        return HarnessSpec("aarch64", True, None, False, test_build)
    return HarnessSpec(phone_target(abi), True, None, True, test_build)
