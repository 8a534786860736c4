"""ncnn's precision switches in one place: the Option flags per precision, and the per-layer feature mask.

The flags the host engine sets for `--precision` are layerdiff.vocabulary's; the feature mask (param key 31 on a
layer's line in the `.param` file) is how one layer opts out of them, which is what `collect fix`
writes. Both come from ncnn 1.0.20261020: `Option` in src/option.h, and `get_masked_option` in
src/net.cpp, which clears the options below for a layer whose mask has the bit set (and, while
loading, recreates a layer as its CPU implementation when bit 4 clears `use_vulkan_compute`).
"""
from __future__ import annotations

from enum import IntFlag

FEATMASK_KEY = 31  # the .param key ncnn reads as Layer::featmask (int; types 0, 1 and 2 are accepted)

# The Option flags per precision are layerdiff/vocabulary.py's `ncnn_precision_flags` (one table for
# the host engine, the C++ harness and the sample runners).


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
