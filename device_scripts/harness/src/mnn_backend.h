// What the MNN engine's two modes (whole-model session, op isolation through MNN's Express API)
// share: the mapping of our backend/precision words to MNN's schedule, the GPU backend library
// loading, and the names MNN's numbers stand for. One place, so both modes run the same backend.
#pragma once

#include <string>

#include <MNN/Interpreter.hpp>
#include <MNN/MNNForwardType.h>

#include "json.h"

namespace ld {

bool mnn_cpu_has_fp16_arith();
std::string mnn_backend_name(int forward_type);      // MNN_FORWARD_* -> cpu, opencl, vulkan, ...
const char* mnn_backend_library(const std::string& backend);  // libMNN_CL.so, libMNN_Vulkan.so or nullptr
// Loads the GPU backend library asked for (beside the executable first); "" or the loader's reason.
std::string mnn_load_backend_library(const std::string& backend);
// MNN does not report the arithmetic it chose; this is its documented per-backend mapping.
std::string mnn_effective_precision(const std::string& backend, const std::string& precision);
std::string mnn_dtype_name(const halide_type_t& type);  // FORMATS.md dtype, "" if it has none

// A schedule for our backend word with the CPU as backup; `backend_config` must outlive it.
MNN::ScheduleConfig mnn_schedule(const std::string& backend, const std::string& precision, int threads,
                                 MNN::BackendConfig* backend_config);
// The header's `options` fields every MNN run records (schedule, backend library outcome).
JsonObject mnn_options(const MNN::ScheduleConfig& schedule, const std::string& backend,
                       const std::string& library_error);

}  // namespace ld
