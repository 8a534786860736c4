// The OpenCL device an MNN OpenCL run really used, asked of the same OpenCL library MNN loaded.
//
// Why: MNN's public API says that a session runs on OpenCL but not on which device, whether that
// device has fp16 (MNN silently computes in fp32 without cl_khr_fp16, whatever the precision asked),
// or whether its tensors live in OpenCL buffers or images. A run's provenance needs all three: an
// "opencl" run on PoCL (a CPU OpenCL) and one on an Adreno are different experiments.
#pragma once

#include <string>

#include "json.h"

namespace ld {

struct OpenClDevice {
    bool found = false;
    std::string error;        // why nothing was found ("" when found)
    std::string library;      // the file MNN's dlopen resolved to (e.g. a vendor libOpenCL.so)
    std::string platform;     // CL_PLATFORM_NAME of platform 0 (MNN's default)
    std::string platform_version;
    std::string name;         // CL_DEVICE_NAME of the device MNN takes (platform 0, GPU list, index 0)
    std::string vendor;
    std::string version;      // CL_DEVICE_VERSION
    std::string driver;       // CL_DRIVER_VERSION
    std::string type;         // "GPU", "CPU", "ACCELERATOR", ... from CL_DEVICE_TYPE
    bool fp16 = false;        // MNN's rule: CL_DEVICE_HALF_FP_CONFIG != 0 and cl_khr_fp16 listed
    std::string memory;       // "buffer" or "image": what MNN stores tensors in on this device
    std::string memory_from;  // how `memory` was decided (MNN's rule, or LAYERDIFF_MNN_OPENCL_MEMORY)
};

// The GPU-mode bits for MNN's memory object when LAYERDIFF_MNN_OPENCL_MEMORY is buffer or image
// (0: MNN decides). Throws HarnessError(kExitBadArgs) for another value.
int mnn_opencl_memory_mode();

// Call after MNN created its OpenCL runtime (the library is loaded then). Never throws.
OpenClDevice mnn_opencl_device();

// The header's options.opencl_device object.
JsonObject opencl_device_json(const OpenClDevice& device);

}  // namespace ld
