// What a ggml run really did, known before the dump starts (the raw dump header's fields).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ld {

struct RunFacts {
    std::string engine_version;
    std::vector<std::string> backends_actual;  // cpu, vulkan, opencl: the buffers the nodes' outputs lived in
    std::string precision_effective;
    std::string options_json = "{}";
    int64_t nodes = 0;                         // graph nodes the scheduler computes (progress total)
};

// What the observed run does differently from the plain run (the footer's plain_run.observing).
constexpr const char* kGgmlObserving =
    "the scheduler's eval callback asks for every node, so each node is computed as a split of its own and handed "
    "back (a backend never fuses consecutive nodes); the plain run asks for none and the scheduler computes the "
    "graph whole, as an app's graph runs";

// "CPU" -> "cpu", "Vulkan0" -> "vulkan", "OpenCL" -> "opencl": ggml buffer names as backend words.
std::vector<std::string> backend_words(const std::map<std::string, int64_t>& per_buffer);

}  // namespace ld
