"""ncnn's precision switches in one place: the Option flags per precision, and the per-layer feature mask.

The flags every ncnn runner sets for `--precision` are `ncnn_precision_flags` below (one table for the host
engine, the C++ harness, repro bundles and the sample runners); the feature mask (param key 31 on a
layer's line in the `.param` file) is how one layer opts out of them, which is what `collect fix`
writes. Both come from ncnn 1.0.20261020: `Option` in src/option.h, and `get_masked_option` in
src/net.cpp, which clears the options below for a layer whose mask has the bit set (and, while
loading, recreates a layer as its CPU implementation when bit 4 clears `use_vulkan_compute`).
"""
from __future__ import annotations

from enum import IntFlag

FEATMASK_KEY = 31  # the .param key ncnn reads as Layer::featmask (int; types 0, 1 and 2 are accepted)

# ncnn's Option flags per precision, as every ncnn runner sets them (the host engine, the C++ harness
# in device_scripts/harness/src/ncnn_engine.cpp, samples/runners.py; tests/test_vocabulary.py reads
# the C++ against this). Facts from ncnn 1.0.20261020 (src/option.h, src/net.cpp): `normal` leaves
# ncnn's defaults (fp16 packed/storage/arithmetic on, bf16 off); the CPU uses fp16 storage only where
# the core has it (asimdhp, or vfpv4 storage on 32-bit ARM) and bf16 storage otherwise, so `low` asks
# for exactly one of the two; `use_fp16_uniform` and `use_bf16_packed` are read by Vulkan only, and
# ncnn itself clears `use_fp16_uniform` when fp16 arithmetic is off.
NCNN_FP16_FLAGS = ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_fp16_uniform")
NCNN_BF16_FLAGS = ("use_bf16_storage", "use_bf16_packed")


def ncnn_precision_flags(precision: str, *, fp16: bool) -> dict[str, bool]:
    """The ncnn Option flags for `precision`; `fp16`: the backend has fp16 (Vulkan, or a CPU with fp16 storage)."""
    if precision == "high":
        return {flag: False for flag in NCNN_FP16_FLAGS + NCNN_BF16_FLAGS}
    if precision == "low":
        return {**{flag: fp16 for flag in NCNN_FP16_FLAGS}, **{flag: not fp16 for flag in NCNN_BF16_FLAGS}}
    return {}


def ncnn_cpu_has_fp16(ncnn) -> bool:
    """Whether ncnn's CPU kernels use fp16 storage on this core (the rule of ncnn's src/net.cpp)."""
    vfpv4 = getattr(ncnn, "cpu_support_arm_vfpv4", None)
    return bool(ncnn.cpu_support_arm_asimdhp()) or bool(vfpv4 and vfpv4() and _is_arm32())


def _is_arm32() -> bool:
    import platform

    machine = platform.machine().lower()
    return machine.startswith("armv") or machine == "arm"  # armv7l, armv8l (32-bit); aarch64/arm64 are not


class Feature(IntFlag):
    """Bits of ncnn's per-layer feature mask: a set bit turns these options off for that layer."""

    FP16_ARITHMETIC = 1 << 0  # use_fp16_arithmetic
    FP16_STORAGE = 1 << 1  # use_fp16_storage, use_fp16_packed
    BF16_STORAGE = 1 << 2  # use_bf16_storage, use_bf16_packed
    INT8 = 1 << 3  # use_int8_storage, use_int8_packed, use_int8_arithmetic
    VULKAN = 1 << 4  # use_vulkan_compute, use_tensor_storage: the layer runs on the CPU
    SGEMM = 1 << 5  # use_sgemm_convolution
    WINOGRAD = 1 << 6  # use_winograd_convolution
    SINGLE_THREAD = 1 << 7  # num_threads = 1


FP32_ON_CPU = Feature.FP16_ARITHMETIC | Feature.FP16_STORAGE | Feature.BF16_STORAGE

# The mask that keeps one layer at full (fp32) precision, per backend. On Vulkan the layer moves to
# the CPU: ncnn converts fp16/fp32 between layers only at CPU<->GPU transfers (upload/download) and
# in the CPU path, not between two Vulkan layers, so an fp32 Vulkan layer between fp16 ones would
# read fp16 buffers as fp32 (measured here: wrong outputs). On the CPU the per-layer casts exist.
HIGH_PRECISION_MASK: dict[str, Feature] = {"cpu": FP32_ON_CPU, "vulkan": FP32_ON_CPU | Feature.VULKAN}

# On the CPU a masked layer must be fed fp32: ncnn's convert_layout (src/net.cpp) casts a 16-bit
# input blob to fp32 only when the *layer's own* options still have fp16/bf16 storage (and the layer
# lacks it), so a layer masked to fp32 that reads a bf16/fp16 blob reads it as fp32 (measured here:
# garbage, then "pool allocator get wild" crashes). Every producer of a masked CPU layer (Split
# included, up to the model input) is therefore masked too. On Vulkan the masked layer runs on the
# CPU and its inputs are downloaded as fp32, so no such closure is needed.
CLOSED_UPSTREAM: dict[str, bool] = {"cpu": True, "vulkan": False}


def describe(mask: int) -> str:
    """'fp16_arithmetic|fp16_storage|...' for a mask, in bit order (for fix.json and sentences)."""
    return "|".join(f.name.lower() for f in Feature if mask & f) or "none"
