// Op isolation for the MNN engine (--inject/--target): each target op runs alone as a sub-graph
// cut from the model with MNN's Express API, fed the reference's tensors. Needs libMNN_Express
// (or a libMNN with Express inside); without it the MNN engine still runs whole models.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine.h"

namespace ld {

class MnnIsolator {
public:
    virtual ~MnnIsolator() = default;
    virtual EngineFacts facts() const = 0;
    // Runs every target alone and dumps its output; returns the total ms. Throws HarnessError:
    // kExitBadArgs for a target that cannot be isolated (named in one line), kExitRun when MNN fails.
    virtual double isolate(const std::vector<std::string>& targets, const InjectSource& source, DumpWriter& out) = 0;
};

// Loads the model's graph and an MNN runtime for config.backend/precision (CPU as backup).
// Throws HarnessError(kExitModel) for an unreadable model, kExitBackend when MNN gives no runtime.
std::unique_ptr<MnnIsolator> make_mnn_isolator(const RunConfig& config);

}  // namespace ld
