#include "backends.h"

#include <cstdlib>

#include "errors.h"
#include "json.h"

#if LAYERDIFF_VULKAN
#include <vulkan/vulkan.h>
#endif

namespace ld {

GgmlPrecision precision_for(const std::string& precision) {
    GgmlPrecision p;
    if (precision == "high") {  // everything f32 that a user can make f32
        p.kv_type = GGML_TYPE_F32;
        p.vulkan_fp16 = false;
        p.im2col_type = GGML_TYPE_F32;  // ggml_conv_2d's graph rebuilt with an f32 IM2COL (ggml offers no switch)
    } else if (precision == "low") {  // what memory-starved phones run: -ctk q8_0 -ctv q8_0 -fa on
        p.kv_type = GGML_TYPE_Q8_0;
        p.flash_attn = true;
        p.conv_type = GGML_TYPE_F16;
    }  // normal: llama.cpp's defaults (f16 KV cache, fp16 on Vulkan where the device has it)
    return p;
}

void apply_precision_environment(const GgmlPrecision& p) {
    if (!p.vulkan_fp16) setenv("GGML_VK_DISABLE_F16", "1", 1);
    else unsetenv("GGML_VK_DISABLE_F16");
}

std::string choose_vulkan_device() {
#if LAYERDIFF_VULKAN
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, "layerdiff-ggml", 1, nullptr, 0, VK_API_VERSION_1_2};
    VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, nullptr, 0, &app, 0, nullptr, 0, nullptr};
    VkInstance instance = VK_NULL_HANDLE;
    if (vkCreateInstance(&info, nullptr, &instance) != VK_SUCCESS) return "";
    uint32_t count = 0;
    vkEnumeratePhysicalDevices(instance, &count, nullptr);
    std::vector<VkPhysicalDevice> devices(count);
    vkEnumeratePhysicalDevices(instance, &count, devices.data());
    int chosen = -1;
    std::string name;
    for (uint32_t pass = 0; pass < 2 && chosen < 0; ++pass) {  // pass 0: a GPU; pass 1: anything
        for (uint32_t i = 0; i < count && chosen < 0; ++i) {
            VkPhysicalDeviceProperties props;
            vkGetPhysicalDeviceProperties(devices[i], &props);
            bool gpu = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ||
                       props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
            if (pass == 1 || gpu) {
                chosen = static_cast<int>(i);
                name = props.deviceName;
            }
        }
    }
    vkDestroyInstance(instance, nullptr);
    if (chosen >= 0 && getenv("GGML_VK_VISIBLE_DEVICES") == nullptr) {
        setenv("GGML_VK_VISIBLE_DEVICES", std::to_string(chosen).c_str(), 1);
    }
    return name;
#else
    return "";
#endif
}

std::vector<std::string> built_backends() {
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) names.push_back(ggml_backend_reg_name(ggml_backend_reg_get(i)));
    return names;
}

namespace {

const char* registry_for(const std::string& backend) {
    if (backend == "vulkan") return "Vulkan";
    if (backend == "opencl") return "OpenCL";
    return "CPU";
}

}  // namespace

ggml_backend_dev_t device_for(const std::string& backend) {
    if (backend == "cpu") return nullptr;
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(registry_for(backend));
    if (reg == nullptr) {
        throw HarnessError(kExitBackend, "this ggml build has no " + std::string(registry_for(backend)) +
                                             " backend; build it with that backend (see device_scripts/ggml/README.md) or use --backend cpu");
    }
    if (ggml_backend_reg_dev_count(reg) == 0) {
        throw HarnessError(kExitBackend, "ggml's " + std::string(registry_for(backend)) +
                                             " backend found no device; install a driver or use --backend cpu");
    }
    return ggml_backend_reg_dev_get(reg, 0);
}

std::string backends_probe_json() {
    JsonObject out;
    out.add_raw("cpu", JsonObject().add("ok", true).str());
    for (const char* backend : {"opencl", "vulkan"}) {
        JsonObject entry;
        ggml_backend_reg_t reg = ggml_backend_reg_by_name(registry_for(backend));
        if (reg == nullptr) {
            entry.add("ok", false).add("reason", std::string("not built into this binary"));
        } else if (ggml_backend_reg_dev_count(reg) == 0) {
            entry.add("ok", false).add("reason", std::string("no device"));
        } else {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
            entry.add("ok", true).add("device", std::string(ggml_backend_dev_description(dev)));
        }
        out.add_raw(backend, entry.str());
    }
    return out.str();
}

}  // namespace ld
