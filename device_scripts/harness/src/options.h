// The command line of HARNESS_CLI.md, parsed and checked before anything is loaded, so a
// typo costs a clear one-line message (exit 2) rather than a half-written dump.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ld {

enum class Mode { Run, Version, Probe, Help };

struct Options {
    Mode mode = Mode::Run;
    std::string engine;
    std::vector<std::string> models;
    std::vector<std::pair<std::string, std::string>> inputs;  // (name, file)
    std::string backend;
    std::string precision;
    std::string out;
    int threads = 1;
    std::string layers;        // regex; empty = all
    int64_t max_bytes = -1;
    int repeat = 1;
    int64_t abort_after = -1;
    std::string inject_dir;
    std::vector<std::string> targets;
    std::vector<std::string> replace;  // with --inject: a whole run, these outputs overwritten (what-if)
};

// Throws HarnessError(kExitBadArgs) naming the offending argument.
Options parse_options(int argc, char** argv);
// Checks files and the output directory; throws HarnessError(kExitBadArgs).
void validate_options(const Options& options);
const char* usage_text();

}  // namespace ld
