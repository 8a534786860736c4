// The plain run beside the observed one (docs/fidelity.md): the model run as an app runs it, twice,
// its outputs compared with the observed run's (the footer's `plain_run`, analyzer/FORMATS.md section 1)
// and stored in <dump>/plain/ as a raw dump of their own, so the analyzer judges what the app gets.
#pragma once

#include <string>
#include <vector>

#include "dump_writer.h"
#include "engine.h"

namespace ld {

// Runs engine.plain_run() twice after the observed run written by `writer`, writes the first plain run's
// outputs into <writer dir>/plain/, and returns the footer's plain_run record (JSON); "" when the engine has
// no plain run. `header_json` is the observed run's header, reused for the plain dump.
std::string plain_run_check(Engine& engine, const std::vector<NpyArray>& inputs, const DumpWriter& writer,
                            const std::string& header_json);

}  // namespace ld
