#include "mnn_backend.h"

#include <dlfcn.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "sysutil.h"

namespace ld {

bool mnn_cpu_has_fp16_arith() {
#if defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & (1UL << 10)) != 0;  // HWCAP_ASIMDHP
#else
    return false;
#endif
}

std::string mnn_backend_name(int type) {
    switch (type) {
        case MNN_FORWARD_CPU: return "cpu";
        case MNN_FORWARD_CPU_EXTENSION: return "cpu";  // what MNN reports for its CPU pipelines
        case MNN_FORWARD_OPENCL: return "opencl";
        case MNN_FORWARD_VULKAN: return "vulkan";
        case MNN_FORWARD_METAL: return "metal";
        case MNN_FORWARD_CUDA: return "cuda";
        case MNN_FORWARD_NN: return "nn";
        default: return "mnn-forward-" + std::to_string(type);
    }
}

const char* mnn_backend_library(const std::string& backend) {
    if (backend == "opencl") return "libMNN_CL.so";
    if (backend == "vulkan") return "libMNN_Vulkan.so";
    return nullptr;
}

// MNN builds with MNN_SEP_BUILD keep GPU backends in their own libraries that register
// themselves when loaded. A failure is not fatal: MNN then falls back to the CPU, which we record.
std::string mnn_load_backend_library(const std::string& backend) {
    const char* name = mnn_backend_library(backend);
    if (!name) return "";
    std::string beside = join_path(executable_dir(), name);
    if (dlopen(beside.c_str(), RTLD_NOW | RTLD_GLOBAL)) return "";
    if (dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return "";
    const char* why = dlerror();
    return why ? why : std::string("cannot load ") + name;
}

std::string mnn_effective_precision(const std::string& backend, const std::string& precision) {
    if (backend == "cpu") return precision == "low" && mnn_cpu_has_fp16_arith() ? "fp16" : "fp32";
    if (backend == "opencl") {
        if (precision == "low") return "fp16-storage+arith";
        return precision == "normal" ? "fp16-storage" : "fp32";
    }
    if (backend == "vulkan") return precision == "low" ? "fp16-storage+arith" : "fp32";
    return "unknown";
}

std::string mnn_dtype_name(const halide_type_t& type) {
    if (type.code == halide_type_float && type.bits == 32) return "float32";
    if (type.code == halide_type_float && type.bits == 16) return "float16";
    if (type.code == halide_type_int && type.bits == 32) return "int32";
    if (type.code == halide_type_int && type.bits == 8) return "int8";
    if (type.code == halide_type_uint && type.bits == 8) return "uint8";
    if (type.code == halide_type_int && type.bits == 64) return "int64";
    return "";
}

MNN::ScheduleConfig mnn_schedule(const std::string& backend, const std::string& precision, int threads,
                                 MNN::BackendConfig* backend_config) {
    MNN::ScheduleConfig schedule;
    schedule.type = backend == "opencl" ? MNN_FORWARD_OPENCL : backend == "vulkan" ? MNN_FORWARD_VULKAN : MNN_FORWARD_CPU;
    schedule.backupType = MNN_FORWARD_CPU;
    if (backend == "cpu") schedule.numThread = threads;  // for GPUs numThread is a tuning mode
    backend_config->precision = precision == "low"    ? MNN::BackendConfig::Precision_Low
                                : precision == "high" ? MNN::BackendConfig::Precision_High
                                                      : MNN::BackendConfig::Precision_Normal;
    schedule.backendConfig = backend_config;
    return schedule;
}

JsonObject mnn_options(const MNN::ScheduleConfig& schedule, const std::string& backend, const std::string& library_error) {
    JsonObject options;
    options.add("forward_type", static_cast<int>(schedule.type))
        .add("backup_type", static_cast<int>(schedule.backupType))
        .add("num_thread", schedule.numThread)
        .add("precision_mode", static_cast<int>(schedule.backendConfig->precision));
    if (mnn_backend_library(backend)) {
        options.add("backend_library", mnn_backend_library(backend)).add("backend_library_loaded", library_error.empty());
        if (!library_error.empty()) options.add("backend_library_error", library_error);
    }
    return options;
}

}  // namespace ld
