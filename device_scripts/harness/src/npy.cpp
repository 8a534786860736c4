#include "npy.h"

#include <cstdio>
#include <cstring>

#include "errors.h"
#include "sha256.h"

namespace ld {
namespace {

[[noreturn]] void bad_npy(const std::string& path, const std::string& what) {
    throw HarnessError(kExitBadArgs, "input " + path + ": " + what +
                                         " (expected a little-endian float32 C-order .npy)");
}

// Returns the text after `'key':` in the header dict, or "" if the key is absent.
std::string value_after(const std::string& header, const std::string& key) {
    size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) return "";
    size_t colon = header.find(':', at);
    if (colon == std::string::npos) return "";
    size_t start = header.find_first_not_of(" ", colon + 1);
    return start == std::string::npos ? "" : header.substr(start);
}

}  // namespace

void parse_npy_header(const std::string& header, const std::string& path, std::string* descr,
                      bool* fortran_order, std::vector<int64_t>* shape) {
    std::string d = value_after(header, "descr");
    if (d.size() < 2 || (d[0] != '\'' && d[0] != '"')) bad_npy(path, "header has no descr");
    size_t end = d.find(d[0], 1);
    if (end == std::string::npos) bad_npy(path, "unterminated descr");
    *descr = d.substr(1, end - 1);

    std::string f = value_after(header, "fortran_order");
    if (f.rfind("False", 0) == 0) *fortran_order = false;
    else if (f.rfind("True", 0) == 0) *fortran_order = true;
    else bad_npy(path, "header has no fortran_order");

    std::string s = value_after(header, "shape");
    if (s.empty() || s[0] != '(') bad_npy(path, "header has no shape tuple");
    size_t close = s.find(')');
    if (close == std::string::npos) bad_npy(path, "unterminated shape tuple");
    shape->clear();
    std::string inner = s.substr(1, close - 1);
    size_t pos = 0;
    while (pos < inner.size()) {
        size_t comma = inner.find(',', pos);
        std::string item = inner.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t first = item.find_first_not_of(" ");
        if (first != std::string::npos) {
            char* stop = nullptr;
            long long dim = std::strtoll(item.c_str() + first, &stop, 10);
            if (stop == item.c_str() + first || dim < 0 || dim > (1LL << 40)) bad_npy(path, "bad shape entry '" + item + "'");
            shape->push_back(dim);
        }
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
}

NpyArray load_npy(const std::string& name, const std::string& path) {
    NpyArray array;
    array.name = name;
    array.file = path;
    array.sha256 = sha256_file(path, nullptr);
    FILE* file = std::fopen(path.c_str(), "rb");
    if (!file) bad_npy(path, "cannot open");
    unsigned char preamble[10];
    if (std::fread(preamble, 1, 8, file) != 8 || std::memcmp(preamble, "\x93NUMPY", 6) != 0) {
        std::fclose(file);
        bad_npy(path, "not a .npy file (bad magic)");
    }
    int major = preamble[6];
    size_t header_len = 0;
    if (major == 1) {
        if (std::fread(preamble, 1, 2, file) != 2) { std::fclose(file); bad_npy(path, "truncated header"); }
        header_len = preamble[0] | (preamble[1] << 8);
    } else if (major == 2 || major == 3) {
        if (std::fread(preamble, 1, 4, file) != 4) { std::fclose(file); bad_npy(path, "truncated header"); }
        header_len = preamble[0] | (preamble[1] << 8) | (preamble[2] << 16) | (size_t(preamble[3]) << 24);
    } else {
        std::fclose(file);
        bad_npy(path, "unsupported .npy version " + std::to_string(major));
    }
    if (header_len > (1u << 20)) { std::fclose(file); bad_npy(path, "header too large"); }
    std::string header(header_len, '\0');
    if (std::fread(&header[0], 1, header_len, file) != header_len) { std::fclose(file); bad_npy(path, "truncated header"); }

    std::string descr;
    bool fortran = false;
    try {
        parse_npy_header(header, path, &descr, &fortran, &array.shape);
    } catch (...) {
        std::fclose(file);
        throw;
    }
    if (descr != "<f4" || fortran) {
        std::fclose(file);
        bad_npy(path, "dtype " + descr + (fortran ? ", Fortran order" : ""));
    }
    uint64_t count = 1;
    for (int64_t dim : array.shape) count *= static_cast<uint64_t>(dim);
    if (count > (1ULL << 32)) { std::fclose(file); bad_npy(path, "too many elements"); }
    array.data.resize(count);
    size_t got = std::fread(array.data.data(), sizeof(float), count, file);
    std::fclose(file);
    if (got != count) bad_npy(path, "holds " + std::to_string(got) + " of " + std::to_string(count) + " values");
    return array;
}

}  // namespace ld
