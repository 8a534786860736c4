#include "mnn_backend.h"

#include <dlfcn.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include <cstring>

#include <MNN/Tensor.hpp>

#include "sysutil.h"

namespace ld {
namespace {

const char* const kOpenClLibraries[] = {"libOpenCL.so", "libOpenCL.so.1", "/system/vendor/lib64/libOpenCL.so",
                                        "/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so", nullptr};
const char* const kVulkanLibraries[] = {"libvulkan.so", "libvulkan.so.1", nullptr};

MNNForwardType forward_type(const std::string& backend) {
    return backend == "opencl" ? MNN_FORWARD_OPENCL : backend == "vulkan" ? MNN_FORWARD_VULKAN : MNN_FORWARD_CPU;
}

// MNN_SEP_BUILD builds keep GPU backends in their own libraries, which register themselves with
// libMNN when loaded; a monolithic libMNN has them inside and there is nothing to load.
std::string load_backend_library(const char* name) {
    std::string beside = join_path(executable_dir(), name);
    if (dlopen(beside.c_str(), RTLD_NOW | RTLD_GLOBAL)) return "";
    if (dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return "";
    const char* why = dlerror();
    return why ? why : std::string("cannot load ") + name;
}

// The forward type MNN creates a runtime for when asked for `schedule` (its CPU backup otherwise).
int resolved_type(const MNN::ScheduleConfig& schedule) {
    StdoutToStderr quiet;  // MNN prints "Can't Find type=..." to stdout
    MNN::RuntimeInfo runtime = MNN::Interpreter::createRuntime({schedule});
    if (runtime.first.count(schedule.type)) return schedule.type;
    return runtime.first.empty() ? -1 : static_cast<int>(runtime.first.begin()->first);
}

std::string unavailable_reason(const std::string& backend, const MnnResolved& resolved) {
    const char* what = backend == "opencl" ? "OpenCL" : "Vulkan";
    std::string driver_error;
    if (!library_loadable_anywhere(backend == "opencl" ? kOpenClLibraries : kVulkanLibraries, &driver_error)) {
        return std::string("no ") + what + " driver: " + driver_error;
    }
    if (!resolved.library_loaded) {
        return resolved.library + " not loadable (" + resolved.library_error + ") and this libMNN has no " + what +
               " runtime built in";
    }
    return std::string("MNN created no ") + what + " runtime: no " + what + " device it accepts" +
           (backend == "opencl" ? " (MNN uses GPU-type OpenCL devices only)" : "");
}

// A value fp32 holds exactly and fp16 does not (it rounds to 1): written through the backend's
// own upload path into `tensor` and read back, it shows whether MNN stores the tensor in fp16.
// 1: rounded, 0: kept, -1: MNN would not copy (a tensor without a backend). The session's run
// overwrites the tensor afterwards.
int stores_fp16(const MNN::Tensor* tensor) {
    const float probe = 1.0f + 1.0f / 4096.0f;
    MNN::Tensor upload(tensor, MNN::Tensor::CAFFE);
    MNN::Tensor download(tensor, MNN::Tensor::CAFFE);
    float* values = upload.host<float>();
    for (int i = 0; i < upload.elementSize(); ++i) values[i] = probe;
    download.host<float>()[0] = 0.0f;
    if (!const_cast<MNN::Tensor*>(tensor)->copyFromHostTensor(&upload) || !tensor->copyToHostTensor(&download)) return -1;
    return download.host<float>()[0] != probe ? 1 : 0;
}

// The session's model outputs that can carry the observation: float, with elements.
const MNN::Tensor* observable_tensor(MNN::Interpreter* net, MNN::Session* session) {
    for (const auto& entry : net->getSessionOutputAll(session)) {
        const MNN::Tensor* t = entry.second;
        if (t && t->getType().code == halide_type_float && t->getType().bits == 32 && t->elementSize() > 0) return t;
    }
    return nullptr;
}

// What MNN does at the precision it was given: the observed storage, and the arithmetic MNN 3.6.1
// pairs with it per backend (CPU: fp16 storage means its ARMv8.2 fp16 backend, which also computes
// in fp16; OpenCL: kernels compute in half only at low (precision level 2); Vulkan: image storage
// only, fp16 arithmetic being limited to convolutions on Mali/Adreno).
std::string effective_precision(const std::string& backend, const std::string& precision, bool fp16_storage) {
    if (!fp16_storage) return "fp32";
    if (backend == "cpu") return "fp16";
    if (backend == "opencl") return precision == "low" ? "fp16-storage+arith" : "fp16-storage";
    return "fp16-storage";
}

}  // namespace

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
        case MNN_FORWARD_CPU_EXTENSION: return "cpu";  // MNN's AVX2 (x86) or ARMv8.2 fp16 CPU backend
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

std::string mnn_dtype_name(const halide_type_t& type) {
    if (type.code == halide_type_float && type.bits == 32) return "float32";
    if (type.code == halide_type_float && type.bits == 16) return "float16";
    if (type.code == halide_type_int && type.bits == 32) return "int32";
    if (type.code == halide_type_int && type.bits == 8) return "int8";
    if (type.code == halide_type_uint && type.bits == 8) return "uint8";
    if (type.code == halide_type_int && type.bits == 64) return "int64";
    return "";
}

MnnResolved mnn_resolve(const std::string& backend, const std::string& precision, int threads,
                        MNN::BackendConfig* backend_config) {
    MnnResolved resolved;
    MNN::ScheduleConfig& schedule = resolved.schedule;
    schedule.type = forward_type(backend);
    schedule.backupType = MNN_FORWARD_CPU;
    // For GPU types numThread is a mode word: MNN's default tuning mode (both GPUs accept it), and for
    // OpenCL the memory object LAYERDIFF_MNN_OPENCL_MEMORY names, if any (MNN picks by device otherwise).
    schedule.numThread = schedule.type == MNN_FORWARD_CPU ? threads : MNN_GPU_TUNING_WIDE;
    if (schedule.type == MNN_FORWARD_OPENCL) schedule.numThread |= mnn_opencl_memory_mode();
    backend_config->precision = precision == "low"    ? MNN::BackendConfig::Precision_Low
                                : precision == "high" ? MNN::BackendConfig::Precision_High
                                                      : MNN::BackendConfig::Precision_Normal;
    schedule.backendConfig = backend_config;
    if (schedule.type == MNN_FORWARD_CPU) return resolved;
    resolved.library = mnn_backend_library(backend);
    resolved.library_error = load_backend_library(resolved.library.c_str());
    resolved.library_loaded = resolved.library_error.empty();
    if (resolved_type(schedule) == schedule.type) {
        if (!resolved.library_loaded) {  // a monolithic libMNN: the backend is inside, nothing was missing
            resolved.library = "libMNN.so (built in)";
            resolved.library_loaded = true;
            resolved.library_error.clear();
        }
        if (backend == "opencl") resolved.opencl = mnn_opencl_device();
        return resolved;
    }
    resolved.available = false;
    resolved.reason = unavailable_reason(backend, resolved);
    schedule.type = MNN_FORWARD_CPU;  // what MNN would run, but with the CPU threads asked for
    schedule.numThread = threads;
    return resolved;
}

MnnSessionFacts mnn_session_facts(MNN::Interpreter* net, MNN::Session* session, const std::string& precision) {
    MnnSessionFacts facts;
    int types[16];
    for (int& t : types) t = -1;
    net->getSessionInfo(session, MNN::Interpreter::BACKENDS, types);
    for (int t : types) {
        if (t < 0) break;
        std::string name = mnn_backend_name(t);
        bool seen = false;
        for (const auto& n : facts.backends) seen = seen || n == name;
        if (!seen) facts.backends.push_back(name);
    }
    if (facts.backends.empty()) facts.backends.push_back("unknown");
    int threads = -1;
    if (facts.backends.front() == "cpu" && net->getSessionInfo(session, MNN::Interpreter::THREAD_NUMBER, &threads)) {
        facts.threads = threads;
    }
    const MNN::Tensor* tensor = observable_tensor(net, session);
    int fp16 = tensor ? stores_fp16(tensor) : -1;
    facts.precision = fp16 < 0 ? "unknown" : effective_precision(facts.backends.front(), precision, fp16 == 1);
    return facts;
}

JsonObject mnn_options(const MnnResolved& resolved, const std::string& backend) {
    JsonObject options;
    options.add("forward_type", static_cast<int>(resolved.schedule.type))
        .add("backup_type", static_cast<int>(resolved.schedule.backupType))
        .add(resolved.schedule.type == MNN_FORWARD_CPU ? "num_thread" : "gpu_mode", resolved.schedule.numThread)
        .add("precision_mode", static_cast<int>(resolved.schedule.backendConfig->precision));
    if (mnn_backend_library(backend)) {
        options.add("backend_library", resolved.library).add("backend_library_loaded", resolved.library_loaded);
        if (!resolved.library_error.empty()) options.add("backend_library_error", resolved.library_error);
        if (!resolved.available) options.add("fallback", "cpu: " + resolved.reason);
    }
    if (backend == "opencl" && resolved.available) options.add_raw("opencl_device", opencl_device_json(resolved.opencl).str());
    return options;
}

std::string mnn_adapter(const MnnResolved& resolved, const std::string& backend) {
    std::string adapter = backend == "opencl" ? "MNN OpenCL" : backend == "vulkan" ? "MNN Vulkan" : "MNN " + backend;
    const OpenClDevice& device = resolved.opencl;
    if (device.found) adapter += " on " + device.name + " (" + device.platform + ", " + device.memory + " memory)";
    return adapter;
}

}  // namespace ld
