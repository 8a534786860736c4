#include "mnn_opencl.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include <MNN/MNNForwardType.h>

#include "errors.h"

namespace ld {
namespace {

// OpenCL's C types and the few enum values used here: no OpenCL headers needed to build the harness.
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef struct _cl_platform_id* cl_platform_id;
typedef struct _cl_device_id* cl_device_id;
typedef cl_int (*GetPlatformIds)(cl_uint, cl_platform_id*, cl_uint*);
typedef cl_int (*GetDeviceIds)(cl_platform_id, uint64_t, cl_uint, cl_device_id*, cl_uint*);
typedef cl_int (*GetInfo)(void*, cl_uint, size_t, void*, size_t*);

const uint64_t kTypeCpu = 1u << 1, kTypeGpu = 1u << 2, kTypeAccelerator = 1u << 3;
const cl_uint kPlatformVersion = 0x0901, kPlatformName = 0x0902;
const cl_uint kDeviceType = 0x1000, kDeviceName = 0x102B, kDeviceVendor = 0x102C, kDriverVersion = 0x102D,
              kDeviceVersion = 0x102F, kDeviceExtensions = 0x1030, kDeviceHalfFpConfig = 0x1033;

// MNN 3.6.1's search order (source/backend/opencl/core/runtime/OpenCLWrapper.cpp): the first of these
// that is loaded in this process is the library MNN's OpenCL backend calls.
const char* const kMnnOpenClLibraries[] = {
#if defined(__ANDROID__)
    "libOpenCL.so", "libGLES_mali.so", "libmali.so", "libOpenCL-pixel.so",
#if defined(__aarch64__)
    "/system/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so", "/system/vendor/lib64/egl/libGLES_mali.so",
    "/system/lib64/egl/libGLES_mali.so",
#else
    "/system/vendor/lib/libOpenCL.so", "/system/lib/libOpenCL.so", "/system/vendor/lib/egl/libGLES_mali.so",
    "/system/lib/egl/libGLES_mali.so", "/system/vendor/lib/libPVROCL.so",
#endif
#else
    "/usr/lib/libOpenCL.so", "/usr/local/lib/libOpenCL.so", "/usr/local/lib/libpocl.so", "/usr/lib64/libOpenCL.so",
    "/usr/lib32/libOpenCL.so", "libOpenCL.so",
#endif
    nullptr};

void* loaded_opencl_library() {
    for (const char* const* name = kMnnOpenClLibraries; *name; ++name) {
        if (void* handle = dlopen(*name, RTLD_NOW | RTLD_NOLOAD)) return handle;
    }
    return nullptr;
}

std::string info_text(GetInfo get, void* object, cl_uint what) {
    size_t size = 0;
    if (get(object, what, 0, nullptr, &size) != 0 || size == 0) return "";
    std::vector<char> text(size + 1, '\0');
    if (get(object, what, size, text.data(), nullptr) != 0) return "";
    return std::string(text.data());
}

template <typename T>
T info_value(GetInfo get, void* object, cl_uint what) {
    T value{};
    return get(object, what, sizeof(T), &value, nullptr) == 0 ? value : T{};
}

std::string type_name(uint64_t type) {
    if (type & kTypeGpu) return "GPU";
    if (type & kTypeCpu) return "CPU";
    if (type & kTypeAccelerator) return "ACCELERATOR";
    return "OTHER";
}

// MNN 3.6.1 (OpenCLBackend::setGpuMode, OpenCLRuntime's GPU type): buffers on devices it classes as
// Mali (name) or Intel (vendor), images on everything else (Adreno, AMD, other), unless the GPU mode
// names one.
void decide_memory(OpenClDevice* device) {
    int forced = mnn_opencl_memory_mode();
    if (forced) {
        device->memory = forced == MNN_GPU_MEMORY_BUFFER ? "buffer" : "image";
        device->memory_from = "LAYERDIFF_MNN_OPENCL_MEMORY";
        return;
    }
    bool adreno = device->name.find("QUALCOMM Adreno") != std::string::npos || device->name.find("Qualcomm") != std::string::npos;
    bool mali = !adreno && device->name.find("Mali") != std::string::npos;
    bool amd = device->vendor.find("Advanced Micro Devices") != std::string::npos;
    bool intel = !adreno && !mali && !amd && device->vendor.find("Intel") != std::string::npos;
    device->memory = mali || intel ? "buffer" : "image";
    device->memory_from = "MNN's rule for this device (buffers on Mali and Intel-vendor devices, images elsewhere)";
}

}  // namespace

int mnn_opencl_memory_mode() {
    const char* value = std::getenv("LAYERDIFF_MNN_OPENCL_MEMORY");
    std::string mode = value ? value : "";
    if (mode.empty() || mode == "auto") return 0;
    if (mode == "buffer") return MNN_GPU_MEMORY_BUFFER;
    if (mode == "image") return MNN_GPU_MEMORY_IMAGE;
    throw HarnessError(kExitBadArgs, "LAYERDIFF_MNN_OPENCL_MEMORY=" + mode + ": use buffer, image or auto (MNN decides)");
}

OpenClDevice mnn_opencl_device() {
    OpenClDevice device;
    void* library = loaded_opencl_library();
    if (!library) {
        device.error = "no OpenCL library of MNN's search list is loaded";
        return device;
    }
    auto platforms_of = reinterpret_cast<GetPlatformIds>(dlsym(library, "clGetPlatformIDs"));
    auto devices_of = reinterpret_cast<GetDeviceIds>(dlsym(library, "clGetDeviceIDs"));
    auto platform_info = reinterpret_cast<GetInfo>(dlsym(library, "clGetPlatformInfo"));
    auto device_info = reinterpret_cast<GetInfo>(dlsym(library, "clGetDeviceInfo"));
    Dl_info where{};
    if (devices_of && dladdr(reinterpret_cast<void*>(devices_of), &where) && where.dli_fname) device.library = where.dli_fname;
    cl_platform_id platform = nullptr;
    cl_device_id first = nullptr;
    cl_uint count = 0;
    if (!platforms_of || !devices_of || !platform_info || !device_info) {
        device.error = "the loaded OpenCL library lacks clGetPlatformIDs/clGetDeviceIDs/clGet*Info";
    } else if (platforms_of(1, &platform, &count) != 0 || count == 0) {
        device.error = "clGetPlatformIDs found no platform";
    } else if (devices_of(platform, kTypeGpu, 1, &first, &count) != 0 || count == 0) {  // what MNN asks for
        device.error = "clGetDeviceIDs(CL_DEVICE_TYPE_GPU) found no device on platform 0";
    }
    if (!device.error.empty()) return device;
    device.found = true;
    device.platform = info_text(platform_info, platform, kPlatformName);
    device.platform_version = info_text(platform_info, platform, kPlatformVersion);
    device.name = info_text(device_info, first, kDeviceName);
    device.vendor = info_text(device_info, first, kDeviceVendor);
    device.version = info_text(device_info, first, kDeviceVersion);
    device.driver = info_text(device_info, first, kDriverVersion);
    device.type = type_name(info_value<uint64_t>(device_info, first, kDeviceType));
    bool half_config = info_value<uint64_t>(device_info, first, kDeviceHalfFpConfig) != 0;
    device.fp16 = half_config && info_text(device_info, first, kDeviceExtensions).find("cl_khr_fp16") != std::string::npos;
    decide_memory(&device);
    return device;
}

JsonObject opencl_device_json(const OpenClDevice& device) {
    JsonObject json;
    if (!device.found) return json.add("found", false).add("error", device.error);
    return json.add("platform", device.platform)
        .add("platform_version", device.platform_version)
        .add("name", device.name)
        .add("vendor", device.vendor)
        .add("type", device.type)
        .add("version", device.version)
        .add("driver", device.driver)
        .add("fp16", device.fp16)
        .add("memory", device.memory)
        .add("memory_from", device.memory_from)
        .add("library", device.library);
}

}  // namespace ld
