// --keep REGEX: the nodes `collect bisect` keeps in the reference configuration while the rest of the
// graph runs the requested backend/precision (docs/bisect.md). What "kept" can mean is what ggml really
// offers per node: on a GPU backend the scheduler pins the node to the CPU backend
// (ggml_backend_sched_set_tensor_backend); at a CPU precision the node is built in the type the
// high precision builds it in (the convolution graph: an f32 IM2COL, an f32 kernel for its MUL_MAT).
// The header records the pattern, the nodes it kept and every node it could have kept, so a caller
// learns the graph's movable nodes from a plain run that dumps nothing else.
#pragma once

#include <regex>
#include <string>
#include <vector>

namespace ld {

struct KeepNodes {
    bool given = false;
    std::string text;
    std::regex pattern;

    bool wants(const std::string& name) const { return given && std::regex_search(name, pattern); }
};

// What a --keep run did, for the header's options.keep.
struct KeepRecord {
    std::string how;                   // "precision" (CPU) or "pinned to the CPU backend" (GPU)
    std::vector<std::string> movable;  // every node --keep could name, in execution order
    std::vector<std::string> kept;     // the ones it named
};

}  // namespace ld
