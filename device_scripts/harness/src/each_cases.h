// `--each FILE` (HARNESS_CLI.md): the runs one process makes, one JSON object a line,
// `{"out": DIR, "inputs": {NAME: FILE.npy}}`. The file comes from the collector but is read as
// untrusted text: its size, line length, case count, names and paths are all bounded, and any
// line that is not such an object stops the process before anything runs (exit 2, naming the line).
// A relative path in the file is relative to the file's own directory: the collector writes the file
// beside a run's dumps, so it holds the same names wherever the device keeps its files.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ld {

struct EachCase {
    std::string out;                                          // this run's raw dump directory
    std::vector<std::pair<std::string, std::string>> inputs;  // (model input name, .npy file)
};

// Throws HarnessError(kExitBadArgs) naming the file (and line) and what is wrong with it.
std::vector<EachCase> read_each_cases(const std::string& path);

}  // namespace ld
