// Exit codes and the one error type every part of the harness throws.
// Why: HARNESS_CLI.md promises distinct exit codes and exactly one "layerdiff-harness: ..." line
// on stderr; throwing a code with the message lets main() keep that promise in one place.
#pragma once

#include <stdexcept>
#include <string>

namespace ld {

enum ExitCode : int {
    kExitOk = 0,
    kExitBadArgs = 2,
    kExitModel = 3,
    kExitBackend = 4,
    kExitRun = 5,
    kExitWrite = 6,
};

class HarnessError : public std::runtime_error {
public:
    HarnessError(ExitCode code, const std::string& message)
        : std::runtime_error(message), code_(code) {}
    ExitCode code() const { return code_; }

private:
    ExitCode code_;
};

}  // namespace ld
