// Reads the .npy inputs the collector stages: little-endian float32, C order, format 1.0/2.0/3.0.
// Parsed by hand because the header is a tiny Python-literal dict and we want no dependency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ld {

struct NpyArray {
    std::string name;   // model input name it feeds
    std::string file;
    std::string sha256;
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// Throws HarnessError(kExitBadArgs) naming the file and what is wrong with it.
NpyArray load_npy(const std::string& name, const std::string& path);

// Exposed for tests of the header parser: parses the dict text of a .npy header.
void parse_npy_header(const std::string& header, const std::string& path, std::string* descr,
                      bool* fortran_order, std::vector<int64_t>* shape);

}  // namespace ld
