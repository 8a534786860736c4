// What --backend and --precision mean for ggml, decided in one place so the header records exactly
// what was set. ggml lets a user choose: the device (CPU, or all layers offloaded to a Vulkan/OpenCL
// device), the KV cache type (f32, f16, q8_0), flash attention, and on Vulkan fp16 arithmetic.
#pragma once

#include <string>
#include <vector>

#include "ggml-backend.h"

namespace ld {

struct GgmlPrecision {
    ggml_type kv_type = GGML_TYPE_F16;
    bool flash_attn = false;
    bool vulkan_fp16 = true;      // GGML_VK_DISABLE_F16 unset
    ggml_type conv_type = GGML_TYPE_F32;    // kernel type of the convolution graph
    ggml_type im2col_type = GGML_TYPE_F16;  // ggml_conv_2d always builds an f16 IM2COL (for f32/f16 kernels)
};

GgmlPrecision precision_for(const std::string& precision);
// Call before any ggml backend starts: the Vulkan backend reads GGML_VK_DISABLE_F16 when it starts.
void apply_precision_environment(const GgmlPrecision& p);
// Before ggml's Vulkan backend starts: ggml takes only discrete/integrated GPUs by default and skips a
// CPU-type device (Mesa's lavapipe), so when GGML_VK_VISIBLE_DEVICES is unset this names the first GPU,
// else the first device. Returns the chosen device's name ("" when none or not a Vulkan build).
std::string choose_vulkan_device();
// The device running --backend (nullptr for cpu); throws HarnessError(kExitBackend) when this build
// or the host has none, naming what to do.
ggml_backend_dev_t device_for(const std::string& backend);
// Every registered backend with its devices, as a JSON object (--probe).
std::string backends_probe_json();
// "CPU", "Vulkan", ...: the registry names this binary was built with.
std::vector<std::string> built_backends();

}  // namespace ld
