// Small OS helpers (time, files, ABI, shared-library probing) kept out of the engine code.
#pragma once

#include <cstdint>
#include <string>

namespace ld {

std::string iso_utc_now();             // ISO-8601 UTC with milliseconds, e.g. 2026-01-01T00:00:00.000Z
double monotonic_ms();                 // steady clock in milliseconds
std::string build_abi();               // Android ABI name this binary was compiled for
bool file_readable(const std::string& path);
bool dir_absent_or_empty(const std::string& path);
void make_dirs(const std::string& path);  // mkdir -p; throws HarnessError(kExitWrite)
std::string join_path(const std::string& dir, const std::string& name);
std::string executable_dir();          // directory of the running executable ("" if unknown)
// dlopen-probe a library; returns "" when it loads, otherwise the loader's reason.
std::string library_load_error(const std::string& name);
bool library_loadable_anywhere(const char* const* candidates, std::string* reason);

// While alive, fd 1 goes to stderr: libraries that print to stdout (MNN's "Can't Find type=..."
// while it resolves a backend) must not mix with the harness's own stdout (--probe JSON, @@ld lines).
class StdoutToStderr {
public:
    StdoutToStderr();
    ~StdoutToStderr();
    StdoutToStderr(const StdoutToStderr&) = delete;
    StdoutToStderr& operator=(const StdoutToStderr&) = delete;

private:
    int saved_ = -1;
};

}  // namespace ld
