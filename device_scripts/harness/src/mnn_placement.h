// Which ops of an MNN GPU session run on the GPU and which on MNN's CPU backup backend.
//
// Why: MNN creates an op on its backup backend (the CPU) whenever the GPU backend has no execution
// for it (no kernel for the op type, an int8 input, an OpenCL image larger than the device allows),
// and says so only in a debug build's log. getSessionInfo(BACKENDS) names the session's main backend
// alone, so a run that was half CPU looked like a pure GPU run. What is observable through the public
// API is where an op's outputs live: a GPU execution writes device tensors (no host pointer), the
// CPU backup writes host tensors (MNN then copies them to the GPU for the next op).
//
// How it is read without computing anything: one pass of runSessionWithCallBackInfo whose before-
// callback returns false (MNN skips the op) and whose after-callback looks at the op's outputs. The
// session must be resized to the run's inputs first (placement can depend on shapes).
#pragma once

#include <string>
#include <vector>

#include <MNN/Interpreter.hpp>

#include "json.h"
#include "mnn_model.h"

namespace ld {

struct MnnPlacedOp {
    std::string name;     // the op's key in the dump (output 0)
    std::string op_type;
    int index = 0;        // position among the session's ops
};

struct MnnPlacement {
    bool read = false;                // MNN went through the session (false: e.g. it could not resize it)
    int ops = 0;                      // ops with at least one non-empty output
    std::vector<MnnPlacedOp> cpu;     // those whose outputs are host tensors: run by the CPU backup
    bool split() const { return ops > 0 && !cpu.empty() && static_cast<int>(cpu.size()) < ops; }
    bool all_cpu() const { return ops > 0 && static_cast<int>(cpu.size()) == ops; }
};

MnnPlacement mnn_placement(MNN::Interpreter* net, MNN::Session* session, const MnnOps& ops);

// The header's options.placement (the fields the analyzer's split_graph finding reads, FORMATS.md):
// `adapter` names the GPU backend and device, `rejected` the op types MNN gave to the CPU.
JsonObject mnn_placement_json(const MnnPlacement& placement, const std::string& adapter);

}  // namespace ld
