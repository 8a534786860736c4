// The plain run beside the observed one (docs/fidelity.md): the model run as an app runs it, twice,
// its outputs compared with the observed run's (the footer's `plain_run`, analyzer/FORMATS.md section 1)
// and stored in <dump>/plain/ as a raw dump of their own, so the analyzer judges what the app gets.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dump_writer.h"

namespace ld {

// One model output of a plain run (the model run as an app runs it: no tensor observed), as float32
// in the shape the dump gives that output, under the name the dump gives it.
struct PlainOutput {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
};

// Calls `run_plain` twice after the observed run written by `writer` (which watched the outputs), writes the
// first plain run's outputs into <writer dir>/plain/, and returns the footer's plain_run record (JSON).
// `observing`: what the observed run does differently, in the engine's words. `header_json`: the observed
// run's header, reused for the plain dump.
std::string plain_run_check(const std::function<std::vector<PlainOutput>()>& run_plain, const std::string& observing,
                            const DumpWriter& writer, const std::string& header_json);

}  // namespace ld
