// What the MNN engine's two modes (whole-model session, op isolation through MNN's Express API)
// share: the backend MNN really gives for our backend/precision words, the GPU backend library
// loading, and the facts a run header records, read from MNN rather than from a table. One place,
// so both modes and --probe resolve a backend the same way.
#pragma once

#include <string>
#include <vector>

#include <MNN/Interpreter.hpp>
#include <MNN/MNNForwardType.h>

#include "json.h"
#include "mnn_opencl.h"

namespace ld {

bool mnn_cpu_has_fp16_arith();
std::string mnn_backend_name(int forward_type);      // MNN_FORWARD_* -> cpu, opencl, vulkan, ...
const char* mnn_backend_library(const std::string& backend);  // libMNN_CL.so, libMNN_Vulkan.so or nullptr
std::string mnn_dtype_name(const halide_type_t& type);  // FORMATS.md dtype, "" if it has none

// The backend MNN resolves a request to, decided before any session exists.
//
// The probe rule (HARNESS_CLI.md): ask MNN for a runtime of the requested type with the CPU as
// backup (Interpreter::createRuntime, the resolution every session makes) and read back the type
// it created. MNN creates a GPU runtime only when its backend is registered (built into libMNN or
// loaded from libMNN_CL.so/libMNN_Vulkan.so) and finds a device it accepts (OpenCL: GPU-type
// devices only; Vulkan: a device with a queue it can use); otherwise it hands back the CPU.
struct MnnResolved {
    MNN::ScheduleConfig schedule;     // type = what MNN gives; numThread = CPU threads or GPU mode
    bool available = true;            // the requested type is what MNN gives
    std::string library;              // GPU requests: libMNN_CL.so/libMNN_Vulkan.so, or "libMNN.so (built in)"
    bool library_loaded = false;      // the backend's code is loaded (separate library or built in)
    std::string library_error;        // why it did not load ("" if it did or is not needed)
    std::string reason;               // !available: one line saying why (for --probe and options)
    OpenClDevice opencl;              // an OpenCL request MNN serves: the device it runs on
};

// Loads the GPU backend library if there is one, then resolves. When MNN has no runtime of the
// requested type, the schedule becomes a CPU schedule with `threads` threads (MNN's own fallback
// would run the CPU with numThread = the GPU mode, 4 by default). `backend_config` must outlive it.
MnnResolved mnn_resolve(const std::string& backend, const std::string& precision, int threads,
                        MNN::BackendConfig* backend_config);

// What a session really runs, read from MNN: the backend types of its pipelines
// (getSessionInfo BACKENDS, MNN_FORWARD_CPU_EXTENSION included), the CPU thread count of its first
// pipeline (THREAD_NUMBER), and the storage precision observed on one of its tensors.
struct MnnSessionFacts {
    std::vector<std::string> backends;  // never empty ("unknown" if MNN says nothing)
    int threads = -1;                   // -1: the pipeline runs on a GPU (numThread is its mode)
    std::string precision;              // precision_effective
};
MnnSessionFacts mnn_session_facts(MNN::Interpreter* net, MNN::Session* session, const std::string& precision);

// The header's `options` fields every MNN run records (schedule, backend library outcome, OpenCL device).
JsonObject mnn_options(const MnnResolved& resolved, const std::string& backend);

// Names the GPU backend and device of a resolved request, for options.placement's `adapter`.
std::string mnn_adapter(const MnnResolved& resolved, const std::string& backend);

}  // namespace ld
